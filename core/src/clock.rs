//! Wall-clock mode: the core's time follows the wall clock (optionally scaled), and a pacer thread sleeps
//! until the next event is due and then makes a file descriptor readable, so an event loop (asyncio's
//! `add_reader`) wakes exactly when the data plane has something to report. Virtual mode needs none of it.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::events::TimeNs;

/// Maps wall time to core time: `core_ns = elapsed_wall_ns * time_scale` (2.0 runs the cluster twice as
/// fast as real time).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    start: Instant,
    time_scale: f64,
}

impl WallClock {
    pub fn new(time_scale: f64) -> Self {
        Self::started(time_scale, 0)
    }

    /// A clock that has already run `elapsed_ns` of wall time (a process joining a run: its clock reads
    /// what the others' do). Past what the machine's monotonic clock can go back to, it starts now.
    pub fn started(time_scale: f64, elapsed_ns: u64) -> Self {
        let now = Instant::now();
        let start = now.checked_sub(Duration::from_nanos(elapsed_ns)).unwrap_or(now);
        Self { start, time_scale }
    }

    pub fn now_ns(&self) -> TimeNs {
        (self.start.elapsed().as_nanos() as f64 * self.time_scale) as TimeNs
    }

    pub fn time_scale(&self) -> f64 {
        self.time_scale
    }

    /// The wall instant at which core time `t_ns` is reached; beyond what an `Instant` can hold (centuries
    /// away at a small time scale), a century from the start, which is as good as never.
    pub fn instant_of(&self, t_ns: TimeNs) -> Instant {
        let wall = Duration::from_nanos((t_ns as f64 / self.time_scale).ceil() as u64);
        let century = Duration::from_secs(100 * 365 * 86_400);
        self.start.checked_add(wall.min(century)).unwrap_or(self.start)
    }
}

#[derive(Default)]
struct PacerState {
    deadline: Option<Instant>,
    stop: bool,
}

struct Shared {
    state: Mutex<PacerState>,
    wake: Condvar,
}

/// Sleeps until a deadline, then writes one byte to a socket whose other end the owner polls.
pub struct Pacer {
    shared: Arc<Shared>,
    reader: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Pacer {
    pub fn new() -> std::io::Result<Self> {
        let (reader, mut writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let shared = Arc::new(Shared { state: Mutex::new(PacerState::default()), wake: Condvar::new() });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("dualpath-pacer".into()).spawn(move || {
            let mut state = theirs.state.lock().expect("pacer lock");
            loop {
                if state.stop {
                    return;
                }
                match state.deadline {
                    None => state = theirs.wake.wait(state).expect("pacer lock"),
                    Some(deadline) => {
                        let now = Instant::now();
                        if now >= deadline {
                            state.deadline = None;
                            // A full socket already says "wake up"; losing this byte is harmless.
                            match writer.write(&[1]) {
                                Ok(_) => {}
                                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                                Err(_) => return,
                            }
                        } else {
                            state = theirs.wake.wait_timeout(state, deadline - now).expect("pacer lock").0;
                        }
                    }
                }
            }
        })?;
        Ok(Self { shared, reader, thread: Some(thread) })
    }

    /// Wake the reader at `deadline` (None: no event pending). Replaces any earlier deadline.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        let mut state = self.shared.state.lock().expect("pacer lock");
        state.deadline = deadline;
        self.shared.wake.notify_one();
    }

    /// The descriptor that becomes readable when the deadline passes.
    pub fn fd(&self) -> RawFd {
        self.reader.as_raw_fd()
    }

    /// Consume pending wake-up bytes so the descriptor stops being readable.
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        while let Ok(n) = (&self.reader).read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.shared.state.lock().expect("pacer lock").stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(p: &Pacer) -> bool {
        let mut buf = [0u8; 1];
        (&p.reader).read(&mut buf).map(|n| n > 0).unwrap_or(false)
    }

    #[test]
    fn pacer_signals_after_deadline_not_before() {
        let p = Pacer::new().unwrap();
        p.set_deadline(Some(Instant::now() + Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(10));
        assert!(!readable(&p), "woke before the deadline");
        std::thread::sleep(Duration::from_millis(100));
        assert!(readable(&p), "did not wake after the deadline");
    }

    #[test]
    fn clearing_the_deadline_cancels_the_wakeup() {
        let p = Pacer::new().unwrap();
        p.set_deadline(Some(Instant::now() + Duration::from_millis(30)));
        p.set_deadline(None);
        std::thread::sleep(Duration::from_millis(80));
        assert!(!readable(&p));
    }

    #[test]
    fn a_far_core_time_maps_to_a_far_instant_without_overflow() {
        // u64::MAX ns at the smallest time scale is 5.8e14 s of wall time: more than an Instant holds.
        let c = WallClock::new(1e-6);
        let far = c.instant_of(u64::MAX);
        assert!(far >= c.start + Duration::from_secs(365 * 86_400), "{far:?}");
    }

    #[test]
    fn wall_clock_scales_time() {
        let late = WallClock::started(2.0, 3_000_000_000);
        assert!((6_000_000_000..7_000_000_000).contains(&late.now_ns()), "{}", late.now_ns());
        let c = WallClock::new(10.0);
        std::thread::sleep(Duration::from_millis(20));
        let t = c.now_ns();
        assert!(t >= 200_000_000, "{t}");
        assert!(c.instant_of(1_000_000_000) >= c.start + Duration::from_millis(100));
    }
}
