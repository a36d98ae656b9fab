//! Running one executor run with the rayon pool's workers kept awake.
//!
//! Algorithm. [`run_hot`] runs its body on a worker of the current rayon pool (a
//! `rayon::scope`, so the run's parallel steps fork from that worker's own deque) and, for the
//! body's duration, every other worker of the pool runs a spinner: a loop of
//! `rayon::yield_now` (take one pending job of the pool, stolen or injected, and run it) and a
//! `pause` when there was none, until the body returns. Otherwise, between two parallel steps of
//! a decode step (a few serial microseconds: a norm, a RoPE, a top-k), an idle worker goes to
//! sleep on a condition variable after about 32 rounds of `sched_yield` and the next step waits
//! for the futex wake-up. ggml's CPU thread pool does the like (`ggml-cpu.c`, `ggml_barrier`,
//! `ggml_graph_compute_poll_for_work`).
//!
//! Contract. The spinner of the body's own worker returns at once (spinning there, while it
//! waits for a stolen job, would never let the body resume). Every `OS_YIELD_ROUNDS` idle rounds
//! a spinner yields to the OS, so an oversubscribed pool does not starve the body. The body's end
//! is signalled by a guard's `Drop`, so a panicking body stops the spinners and the scope
//! rethrows the panic. Nothing spins between runs: between requests or tokens, workers sleep.
//! One run at a time has spinners, process-wide: a second run's spinner could otherwise take the
//! first run's work, meet the first run's spinner inside it and wait there for ever (two sessions
//! stepping at once in one process did deadlock so). A caller outside the pool waits its turn;
//! one on a pool worker (a run inside a run, or a pool job) must not block a worker, so while
//! another run holds the spinners it runs its body plainly, without them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Held by the run whose spinners are up (module note).
static SPINNERS: Mutex<()> = Mutex::new(());

/// The right to start spinners: waited for outside the pool, tried on a worker.
fn spinners_turn() -> Option<MutexGuard<'static, ()>> {
    if rayon::current_thread_index().is_none() {
        return Some(SPINNERS.lock().unwrap_or_else(|p| p.into_inner()));
    }
    match SPINNERS.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Idle rounds of a spinner between two `sched_yield`s: where the pool has more threads than
/// the machine has free cores, the body's thread still gets the CPU within a few tens of
/// microseconds (a round is a search of the pool's queues and a `pause`).
const OS_YIELD_ROUNDS: u32 = 256;

/// Sets the flag when dropped: the body has returned or unwound.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `body` on a worker of the current rayon pool (the global pool outside any `install`)
/// while the pool's other workers spin, taking the body's parallel work as soon as it is
/// queued (module note). Returns what `body` returns; a panic in `body` propagates after the
/// spinners have stopped.
pub fn run_hot<R: Send>(body: impl FnOnce() -> R + Send) -> R {
    run_hot_reporting(body).0
}

/// [`run_hot`], and whether the run had the spinners.
fn run_hot_reporting<R: Send>(body: impl FnOnce() -> R + Send) -> (R, bool) {
    let Some(_turn) = spinners_turn() else {
        return (body(), false);
    };
    let done = AtomicBool::new(false);
    let out = rayon::scope(|s| {
        let own = rayon::current_thread_index();
        let done = &done;
        s.spawn_broadcast(move |_, ctx| {
            if Some(ctx.index()) == own {
                return;
            }
            let mut idle = 0u32;
            while !done.load(Ordering::Acquire) {
                #[cfg(test)]
                tests::SPIN_ROUNDS.with(|r| r.set(r.get() + 1));
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    idle = 0;
                } else {
                    idle = idle.wrapping_add(1);
                    if idle.is_multiple_of(OS_YIELD_ROUNDS) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        });
        let _done = Done(done);
        body()
    });
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    #[test]
    fn the_body_runs_once_on_a_worker_and_its_result_comes_back() {
        for threads in [1, 2, 3] {
            let got = pool(threads).install(|| {
                run_hot(|| {
                    assert!(rayon::current_thread_index().is_some());
                    (0..1000u64).into_par_iter().sum::<u64>()
                })
            });
            assert_eq!(got, 499_500, "{threads} threads");
        }
    }

    /// Parallel work of the body reaches the other workers (through their spinners), and a
    /// one-thread pool neither deadlocks nor loses work.
    #[test]
    fn other_workers_take_the_bodys_parallel_work() {
        for threads in [1, 2] {
            let seen = Mutex::new(HashSet::new());
            pool(threads).install(|| {
                run_hot(|| {
                    for _ in 0..50 {
                        (0..64).into_par_iter().for_each(|_| {
                            let t = std::time::Instant::now();
                            while t.elapsed() < std::time::Duration::from_micros(20) {
                                std::hint::spin_loop();
                            }
                            let me = rayon::current_thread_index();
                            seen.lock().expect("lock").insert(me);
                        });
                    }
                })
            });
            assert_eq!(seen.into_inner().expect("lock").len(), threads);
        }
    }

    thread_local! {
        /// Rounds of this thread's spinner loops (the spinner counts them in test builds).
        pub(super) static SPIN_ROUNDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// While the body waits without parallel work, the other worker keeps running its spinner
    /// (thousands of rounds in the wait; without the spinner it would sleep on a condition
    /// variable and run none). After the run it runs none. Counted in rounds, not CPU time, so
    /// that a machine busy with other tests cannot fail it.
    #[test]
    fn the_other_worker_spins_while_the_body_runs_and_not_after() {
        let other_rounds = || -> u64 {
            let own = rayon::current_thread_index();
            rayon::broadcast(|ctx| (ctx.index(), SPIN_ROUNDS.with(|r| r.get())))
                .into_iter()
                .filter(|&(i, _)| Some(i) != own)
                .map(|(_, n)| n)
                .sum()
        };
        let wait = std::time::Duration::from_millis(200);
        let p = pool(2);
        // On a worker, a run gets no spinners while another test's run holds them: try again.
        let during = (0..1000)
            .find_map(|_| {
                let (during, spun) = p.install(|| {
                    run_hot_reporting(|| {
                        let before = other_rounds();
                        std::thread::sleep(wait);
                        other_rounds() - before
                    })
                });
                spun.then_some(during)
            })
            .expect("a run with the spinners");
        assert!(during >= 100, "other worker's spinner ran {during} rounds");
        let after = p.install(|| {
            let before = other_rounds();
            std::thread::sleep(wait);
            other_rounds() - before
        });
        assert_eq!(after, 0, "other worker's spinner ran after the run");
    }

    /// Two threads running bodies on the global pool at once (two sessions stepping in one
    /// process) both finish.
    #[test]
    fn concurrent_runs_from_two_threads_finish() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for _ in 0..300 {
                    run_hot(|| {
                        (0..64).into_par_iter().for_each(|_| {
                            let t = std::time::Instant::now();
                            while t.elapsed() < std::time::Duration::from_micros(5) {
                                std::hint::spin_loop();
                            }
                        })
                    });
                }
                let _ = tx.send(());
            });
        }
        for _ in 0..2 {
            rx.recv_timeout(std::time::Duration::from_secs(120))
                .expect("a thread's runs never finished (deadlock)");
        }
    }

    /// A panicking body stops the spinners and the panic reaches the caller (no hang).
    #[test]
    fn a_panicking_body_propagates_its_panic() {
        let got = std::panic::catch_unwind(|| {
            pool(2).install(|| run_hot(|| -> u32 { panic!("body failed") }))
        });
        assert!(got.is_err());
        assert_eq!(pool(2).install(|| run_hot(|| 7)), 7);
    }
}
