//! What a session's statements use of the server, as `weir_catalog.sessions` shows it: the
//! working memory they hold in the query pool now and at most, and the CPU time of the threads
//! their plans run on (finished plans' and, read live from their threads' clocks, running
//! ones').

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One session's use of memory and CPU time.
#[derive(Debug, Default)]
pub struct Usage {
    held: AtomicUsize,
    peak: AtomicUsize,
    cpu: Mutex<Cpu>,
}

#[derive(Debug, Default)]
struct Cpu {
    /// The CPU time of plans' threads that have ended.
    ended: Duration,
    /// The CPU clocks of the threads running the session's plans now, by a number of their own.
    running: Vec<(u64, libc::clockid_t)>,
    next: u64,
}

impl Usage {
    /// The session's statements reserved `bytes` more of the query pool.
    pub fn grow(&self, bytes: usize) {
        let held = self
            .held
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        self.peak.fetch_max(held, Ordering::Relaxed);
    }

    /// The session's statements freed `bytes` of what they reserved.
    pub fn shrink(&self, bytes: usize) {
        let _ = (self.held).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
            Some(h.saturating_sub(bytes))
        });
    }

    /// What the session's statements hold of the query pool now.
    pub fn memory(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The most its statements held at once since the session started.
    pub fn memory_peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The CPU time its plans' threads have taken, the running ones' included.
    pub fn cpu(&self) -> Duration {
        let cpu = locked(&self.cpu);
        // A running thread is in `running` until it has added its time to `ended`, under
        // this lock: its clock is read only while it lives.
        cpu.running
            .iter()
            .map(|(_, clock)| clock_time(*clock))
            .fold(cpu.ended, |sum, t| sum + t)
    }

    /// Counts the CPU time of the calling thread as the session's until the guard returned is
    /// dropped (on the same thread).
    pub fn count_this_thread(self: &Arc<Self>) -> Counted {
        let Some(clock) = this_thread_clock() else {
            return Counted(None);
        };
        let mut cpu = locked(&self.cpu);
        cpu.next += 1;
        let id = cpu.next;
        cpu.running.push((id, clock));
        Counted(Some((self.clone(), id, clock)))
    }
}

/// A thread whose CPU time counts as a session's: see [`Usage::count_this_thread`].
#[derive(Debug)]
pub struct Counted(Option<(Arc<Usage>, u64, libc::clockid_t)>);

impl Drop for Counted {
    fn drop(&mut self) {
        let Some((usage, id, clock)) = self.0.take() else {
            return;
        };
        let mut cpu = locked(&usage.cpu);
        cpu.running.retain(|(i, _)| *i != id);
        cpu.ended += clock_time(clock);
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The calling thread's CPU clock, which other threads may read while it lives.
fn this_thread_clock() -> Option<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `pthread_self` is the calling thread, and `clock` is a valid place to write.
    let failed = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
    (failed == 0).then_some(clock)
}

/// The time on `clock`; zero when it cannot be read.
fn clock_time(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid place to write; an invalid clock is reported, not undefined.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_held_and_its_peak_kept() {
        let u = Usage::default();
        u.grow(100);
        u.grow(50);
        u.shrink(120);
        assert_eq!((u.memory(), u.memory_peak()), (30, 150));
        u.shrink(100);
        assert_eq!(u.memory(), 0);
    }

    #[test]
    fn a_threads_cpu_time_counts_while_it_runs_and_after() {
        let u = Arc::new(Usage::default());
        let (started, running) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let usage = u.clone();
        let thread = std::thread::spawn(move || {
            let _counted = usage.count_this_thread();
            let spin = crate::clock::monotonic();
            while spin.elapsed() < Duration::from_millis(50) {
                std::hint::black_box(spin.elapsed());
            }
            started.send(()).unwrap();
            stopped.recv().unwrap();
        });
        running.recv().unwrap();
        let live = u.cpu();
        assert!(live >= Duration::from_millis(10), "{live:?}");
        stop.send(()).unwrap();
        thread.join().unwrap();
        assert!(u.cpu() >= live);
        assert!(locked(&u.cpu).running.is_empty());
    }
}
