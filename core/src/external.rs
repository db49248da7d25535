//! Work the core hands out instead of modelling it: a data plane that moves real bytes (the host backend)
//! marks which transfers and storage I/Os are its own ([`ExternalRule`]); the core still applies every rule
//! around them -- a storage node's queue and latency, a latency fault's wait, a forward pass's
//! dependencies, a decode group's write-backs and all-to-all -- but where it would start a flow it hands
//! the work out ([`External`]) and waits until the plane says it ended (`Core::complete_externals`).
//! So one implementation of those rules drives real bytes and modelled ones alike.

use crate::lanes::Lane;
use crate::network::{Owner, PortId};
use crate::storage::{IoKind, NodeId};
use crate::TimeNs;

/// Which work is external: a transfer whose path has ports of two different domains (e.g. nodes: it leaves
/// its node), and every storage I/O of a listed storage node.
#[derive(Clone, Debug, Default)]
pub struct ExternalRule {
    /// Each port's domain; `-1` (or a port past the end): none, it never makes a transfer external.
    pub port_domains: Vec<i64>,
    /// Per storage node: whether its I/Os are external.
    pub storage_nodes: Vec<bool>,
}

impl ExternalRule {
    /// Whether a transfer along `path` is external.
    pub fn transfer(&self, path: &[PortId]) -> bool {
        if self.port_domains.is_empty() {
            return false;
        }
        let mut first = -1;
        for &p in path {
            let d = self.port_domains.get(p as usize).copied().unwrap_or(-1);
            if d >= 0 {
                if first < 0 {
                    first = d;
                } else if d != first {
                    return true;
                }
            }
        }
        false
    }

    /// Whether the I/Os of storage node `node` are external.
    pub fn storage(&self, node: NodeId) -> bool {
        self.storage_nodes.get(node as usize).copied().unwrap_or(false)
    }
}

/// What the work handed out is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExternalKind {
    Transfer,
    Io(IoKind),
}

/// A piece of work handed out: move `size_bytes` on `lane` along `path` (for an I/O: its storage path, with
/// the storage node and the `(context, first block, blocks)` extents it was given), then
/// `Core::complete_externals([id])`. `start_ns` is when it was asked for (an I/O: issued, before its queue
/// and latency; a transfer: submitted, before a latency fault's wait), as its completion's start will be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct External {
    pub id: u64,
    pub kind: ExternalKind,
    pub path: Vec<PortId>,
    pub lane: Lane,
    pub size_bytes: u64,
    pub storage_node: Option<NodeId>,
    pub extents: Vec<(u64, u64, u64)>,
    pub start_ns: TimeNs,
}

/// External work in flight: whose it is, to finish it as its flow would have.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InFlight {
    pub owner: Owner,
    pub start_ns: TimeNs,
    pub lane: Lane,
    pub size_bytes: u64,
}

/// The work handed out and not completed yet, by id (ids reused, last freed first, so runs replay).
#[derive(Default)]
pub(crate) struct Externals {
    pub rule: ExternalRule,
    slots: Vec<Option<InFlight>>,
    free: Vec<u64>,
    /// Handed out since the last `Core::take_external`.
    pub out: Vec<External>,
}

impl Externals {
    pub fn insert(&mut self, work: InFlight) -> u64 {
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(work);
                id
            }
            None => {
                self.slots.push(Some(work));
                (self.slots.len() - 1) as u64
            }
        }
    }

    /// The work `id` ended: its record (None if `id` is not in flight).
    pub fn remove(&mut self, id: u64) -> Option<InFlight> {
        let work = self.slots.get_mut(id as usize)?.take()?;
        self.free.push(id);
        Some(work)
    }

    pub fn live(&self, id: u64) -> bool {
        self.slots.get(id as usize).is_some_and(|s| s.is_some())
    }

    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_is_external_when_it_leaves_its_domain() {
        let rule = ExternalRule { port_domains: vec![-1, 0, 0, 1], storage_nodes: vec![false, true] };
        assert!(!rule.transfer(&[0, 1, 2]));
        assert!(rule.transfer(&[1, 3]));
        assert!(!rule.transfer(&[0, 3]));
        assert!(!rule.transfer(&[9, 1]));
        assert!(rule.storage(1) && !rule.storage(0) && !rule.storage(5));
        assert!(!ExternalRule::default().transfer(&[0, 1]));
    }
}
