//! The event queue: a min-heap keyed by `(time_ns, sequence)`. Ties are broken by the order events were
//! scheduled, never by hash or address order, so a run is reproducible bit for bit.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::forward::ForwardStep;

/// Virtual or wall time in integer nanoseconds since the core was created: exact comparisons, no drift.
pub type TimeNs = u64;

/// The last time the core's clock reaches: 2^63 - 1 ns (about 292 years). Times are `u64`, but Python keeps
/// them in signed 64-bit arrays and msgpack ints, so work that would end later is an error
/// (`Core::check_time`), not a wrap or a traceback; `u64::MAX` stays a "no limit" argument to `advance_until`.
pub const END_NS: TimeNs = i64::MAX as TimeNs;

/// What happens when an event fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The next flow of a transfer group finishes. Each group has at most one pending entry (kept in an
    /// indexed heap and moved when its rate changes), so rate changes leave no stale entries behind.
    Group { group: u32 },
    /// A user timer.
    Timer { tag: u64 },
    /// A storage I/O has waited out its latency and starts moving bytes.
    IoStart { io: u32 },
    /// A port's token bucket runs dry (stale unless `version` matches).
    BucketEmpty { port: u32, version: u64 },
    /// A latency-sensitive transfer has waited out the FIFO backlog of its lane and starts moving bytes
    /// (`id` indexes the core's waiting transfers).
    Queued { id: u32 },
    /// A zero-byte transfer: completes without touching any port.
    Empty { tag: u64, lane: u8 },
    /// A compute delay of a forward pass has passed (attention of a rank, or the shared phase).
    Forward { forward: u32, step: ForwardStep },
    /// A forward pass that took no time at all completes (it finished the instant it was submitted).
    ForwardDone { forward: u32 },
    /// A decode step group's wake-up (`decode.rs`; stale unless `number` is its live one).
    DecodeWake { node: u32, group: u32, number: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    t_ns: TimeNs,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.t_ns, self.seq).cmp(&(other.t_ns, other.seq))
    }
}

/// Pending events in time order: one-shot events in a heap, group completions in an indexed heap.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<Entry>>,
    groups: IndexedHeap,
    next_seq: u64,
}

impl EventQueue {
    pub fn push(&mut self, t_ns: TimeNs, kind: EventKind) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Entry { t_ns, seq, kind }));
    }

    /// Schedule (or move) the completion event of `group` to `t_ns`.
    pub fn schedule_group(&mut self, group: u32, t_ns: TimeNs) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.groups.set(group, (t_ns, seq));
    }

    /// Drop the pending completion event of `group`, if any.
    pub fn cancel_group(&mut self, group: u32) {
        self.groups.remove(group);
    }

    fn top(&self) -> Option<(TimeNs, u64, bool)> {
        let one_shot = self.heap.peek().map(|Reverse(e)| (e.t_ns, e.seq, false));
        let group = self.groups.peek().map(|((t, seq), _)| (t, seq, true));
        match (one_shot, group) {
            (Some(a), Some(b)) => Some(if (b.0, b.1) < (a.0, a.1) { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Time of the earliest entry (it may be stale; the caller skips those when popping).
    pub fn peek_time(&self) -> Option<TimeNs> {
        self.top().map(|(t, _, _)| t)
    }

    /// Kind of the earliest entry, to check whether it is stale before popping.
    pub fn peek_kind(&self) -> Option<EventKind> {
        match self.top()? {
            (_, _, true) => self.groups.peek().map(|(_, group)| EventKind::Group { group }),
            _ => self.heap.peek().map(|Reverse(e)| e.kind),
        }
    }

    pub fn pop(&mut self) -> Option<(TimeNs, EventKind)> {
        match self.top()? {
            (t, _, true) => {
                let (_, group) = self.groups.pop().expect("peeked");
                Some((t, EventKind::Group { group }))
            }
            _ => self.heap.pop().map(|Reverse(e)| (e.t_ns, e.kind)),
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len() + self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A binary min-heap of `(key, id)` with at most one entry per id, whose key can be moved in place.
#[derive(Debug, Default)]
struct IndexedHeap {
    items: Vec<((TimeNs, u64), u32)>,
    /// Position of each id in `items`, or ABSENT.
    pos: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

impl IndexedHeap {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn peek(&self) -> Option<((TimeNs, u64), u32)> {
        self.items.first().copied()
    }

    fn set(&mut self, id: u32, key: (TimeNs, u64)) {
        if self.pos.len() <= id as usize {
            self.pos.resize(id as usize + 1, ABSENT);
        }
        match self.pos[id as usize] {
            ABSENT => {
                self.items.push((key, id));
                self.pos[id as usize] = (self.items.len() - 1) as u32;
                self.sift_up(self.items.len() - 1);
            }
            i => {
                let old = self.items[i as usize].0;
                self.items[i as usize].0 = key;
                if key < old {
                    self.sift_up(i as usize);
                } else {
                    self.sift_down(i as usize);
                }
            }
        }
    }

    fn remove(&mut self, id: u32) {
        let Some(&i) = self.pos.get(id as usize) else { return };
        if i == ABSENT {
            return;
        }
        let i = i as usize;
        let last = self.items.len() - 1;
        self.swap(i, last);
        self.items.pop();
        self.pos[id as usize] = ABSENT;
        if i < self.items.len() {
            self.sift_down(i);
            self.sift_up(i);
        }
    }

    fn pop(&mut self) -> Option<((TimeNs, u64), u32)> {
        let top = self.peek()?;
        self.remove(top.1);
        Some(top)
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.items.swap(a, b);
        self.pos[self.items[a].1 as usize] = a as u32;
        self.pos[self.items[b].1 as usize] = b as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.items[i].0 >= self.items[parent].0 {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.items.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < n && self.items[l].0 < self.items[best].0 {
                best = l;
            }
            if r < n && self.items[r].0 < self.items[best].0 {
                best = r;
            }
            if best == i {
                break;
            }
            self.swap(i, best);
            i = best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_pop_in_scheduling_order() {
        let mut q = EventQueue::default();
        q.push(5, EventKind::Timer { tag: 1 });
        q.push(3, EventKind::Timer { tag: 2 });
        q.push(5, EventKind::Timer { tag: 3 });
        q.push(3, EventKind::Timer { tag: 4 });
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        let tags: Vec<u64> = order
            .iter()
            .map(|(_, k)| match k {
                EventKind::Timer { tag } => *tag,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(tags, vec![2, 4, 1, 3]);
        assert_eq!(order.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![3, 3, 5, 5]);
    }

    #[test]
    fn group_events_move_and_interleave_with_one_shots_by_sequence() {
        let mut q = EventQueue::default();
        q.schedule_group(7, 10);
        q.push(10, EventKind::Timer { tag: 1 });
        q.schedule_group(3, 4);
        q.schedule_group(3, 12); // moved later: no stale entry left at 4
        q.schedule_group(9, 1);
        q.cancel_group(9);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some((10, EventKind::Group { group: 7 })));
        assert_eq!(q.pop(), Some((10, EventKind::Timer { tag: 1 })));
        assert_eq!(q.pop(), Some((12, EventKind::Group { group: 3 })));
        assert!(q.pop().is_none());
    }

    proptest::proptest! {
        #[test]
        fn indexed_heap_pops_in_key_order(ops in proptest::collection::vec((0u32..20, 0u64..100, proptest::bool::ANY), 0..200)) {
            let mut h = IndexedHeap::default();
            let mut model = std::collections::BTreeMap::new();
            for (seq, (id, t, keep)) in ops.into_iter().enumerate() {
                if keep {
                    h.set(id, (t, seq as u64));
                    model.insert(id, (t, seq as u64));
                } else {
                    h.remove(id);
                    model.remove(&id);
                }
            }
            let mut want: Vec<_> = model.into_iter().map(|(id, k)| (k, id)).collect();
            want.sort();
            let got: Vec<_> = std::iter::from_fn(|| h.pop()).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
