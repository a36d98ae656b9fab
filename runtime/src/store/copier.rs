//! The read-ahead's copy worker (issue 34): one thread per loaded model's slot memory, started by
//! the first copy queued and ended when the memory drops, that makes the copies the expert
//! store's read-ahead asks for beside the steps and past their end, so that no step waits for
//! a copy it issued.
//!
//! Algorithm. [`Copier::queue`] appends a copy of one slot (its key: MoE layer and slot), with
//! its [`CopyTicket`], to a FIFO under a mutex and wakes the worker, which sleeps on a condition
//! variable while the queue is empty (it never spins). The worker takes the first copy, skips it
//! when its ticket was cancelled, else marks it running, makes it outside the lock and records
//! on the ticket how it ended. One thread makes them in the order queued, so two copies into one
//! slot never overlap: a slot may take a new copy while an older one into it is still queued.
//! Any other writer of a slot first clears it ([`Copier::clear`]: its queued copies cancelled,
//! the running one waited for); [`Copier::settle`] does that for every slot. Dropping the copier
//! cancels the queue and joins the worker after the copy it is making, if any.

use super::StoreError;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// A copy for the worker to make: writes one slot, or says why it cannot.
pub type CopyJob = Box<dyn FnOnce() -> Result<(), StoreError> + Send>;

/// A slot: (MoE layer, slot).
pub type SlotKey = (usize, usize);

/// How a queued copy stands ([`CopyTicket::poll`]).
#[derive(Debug)]
pub enum CopyEnd {
    /// Queued or being made.
    Pending,
    /// Made: the slot holds the expert.
    Done,
    /// Failed; the error the first time it is polled, `None` after.
    Failed(Option<StoreError>),
    /// Cancelled before it started: the slot was not written by it.
    Cancelled,
}

/// The state of one queued copy, shared by the worker and whoever queued it.
#[derive(Debug)]
pub struct CopyTicket(Mutex<CopyState>);

#[derive(Debug)]
enum CopyState {
    Queued,
    Running,
    Done,
    Failed(Option<StoreError>),
    Cancelled,
}

impl CopyTicket {
    fn new() -> Arc<CopyTicket> {
        Arc::new(CopyTicket(Mutex::new(CopyState::Queued)))
    }

    fn state(&self) -> MutexGuard<'_, CopyState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the copy stands now; never waits (the lock is held only to change or read it).
    /// A failure's error is handed out once.
    pub fn poll(&self) -> CopyEnd {
        match &mut *self.state() {
            CopyState::Queued | CopyState::Running => CopyEnd::Pending,
            CopyState::Done => CopyEnd::Done,
            CopyState::Failed(e) => CopyEnd::Failed(e.take()),
            CopyState::Cancelled => CopyEnd::Cancelled,
        }
    }

    /// Whether the worker is making the copy now (a write of its slot would wait for it).
    pub fn running(&self) -> bool {
        matches!(*self.state(), CopyState::Running)
    }

    /// Cancels the copy unless it started.
    fn cancel(&self) {
        let mut s = self.state();
        if matches!(*s, CopyState::Queued) {
            *s = CopyState::Cancelled;
        }
    }

    /// Marks the copy running; false when it was cancelled.
    fn start(&self) -> bool {
        let mut s = self.state();
        if matches!(*s, CopyState::Queued) {
            *s = CopyState::Running;
            true
        } else {
            false
        }
    }

    fn end(&self, done: Result<(), StoreError>) {
        *self.state() = match done {
            Ok(()) => CopyState::Done,
            Err(e) => CopyState::Failed(Some(e)),
        };
    }
}

/// The queue and what the worker is doing, under one lock.
struct Jobs {
    queued: VecDeque<(SlotKey, Arc<CopyTicket>, CopyJob)>,
    /// The slot the worker is writing.
    running: Option<SlotKey>,
    /// The copier dropped: the worker ends once its queue is empty.
    stop: bool,
}

impl Jobs {
    /// Cancels and drops the queued copies `which` selects.
    fn cancel(&mut self, which: impl Fn(SlotKey) -> bool) {
        self.queued.retain(|(key, ticket, _)| {
            let hit = which(*key);
            if hit {
                ticket.cancel();
            }
            !hit
        });
    }
}

struct Queue {
    jobs: Mutex<Jobs>,
    /// Signalled when a copy is queued or the copier drops (the worker waits on it).
    wake: Condvar,
    /// Signalled when the worker ends a copy or finds the queue empty.
    ended: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits, the lock released meanwhile, until `busy` no longer holds.
    fn wait_while<'a>(
        &self,
        jobs: MutexGuard<'a, Jobs>,
        busy: impl FnMut(&mut Jobs) -> bool,
    ) -> MutexGuard<'a, Jobs> {
        self.ended
            .wait_while(jobs, busy)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The copy worker of one slot memory (the module note).
pub struct Copier {
    queue: Arc<Queue>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The worker thread's name.
    name: &'static str,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobs = self.queue.lock();
        f.debug_struct("Copier")
            .field("queued", &jobs.queued.len())
            .field("running", &jobs.running)
            .finish()
    }
}

impl Default for Copier {
    fn default() -> Self {
        Copier::new()
    }
}

impl Copier {
    /// A copier with no thread yet (the first [`Copier::queue`] starts it), its thread named
    /// `aubier-read-ahead`.
    pub fn new() -> Copier {
        Copier::named("aubier-read-ahead")
    }

    /// [`Copier::new`] with the thread named `name`.
    pub fn named(name: &'static str) -> Copier {
        Copier {
            name,
            queue: Arc::new(Queue {
                jobs: Mutex::new(Jobs {
                    queued: VecDeque::new(),
                    running: None,
                    stop: false,
                }),
                wake: Condvar::new(),
                ended: Condvar::new(),
            }),
            worker: Mutex::new(None),
        }
    }

    /// Queues `job`, a copy into slot `key`, after every copy queued before; returns its ticket.
    /// When the worker cannot be started, the ticket says so (failed, the spawn's error).
    ///
    /// The caller guarantees what the job's own safety needs: nobody reads the slot until the
    /// ticket says done, and nobody but this worker writes it meanwhile except after
    /// [`Copier::clear`]ing it.
    pub fn queue(&self, key: SlotKey, job: CopyJob) -> Arc<CopyTicket> {
        let ticket = CopyTicket::new();
        let mut worker = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        if worker.is_none() {
            let queue = Arc::clone(&self.queue);
            match std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || work(&queue))
            {
                Ok(handle) => *worker = Some(handle),
                Err(e) => {
                    ticket.end(Err(StoreError::Slot {
                        layer: key.0,
                        slot: key.1,
                        reason: format!("the {} thread cannot start: {e}", self.name),
                    }));
                    return ticket;
                }
            }
        }
        drop(worker);
        self.queue
            .lock()
            .queued
            .push_back((key, Arc::clone(&ticket), job));
        self.queue.wake.notify_one();
        ticket
    }

    /// Jobs queued and not yet started.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.lock().queued.len()
    }

    /// Makes slot `key` free of copies: cancels those queued into it and waits for the one
    /// being made into it, if any (blocked on a condition variable, not spinning).
    pub fn clear(&self, key: SlotKey) {
        let mut jobs = self.queue.lock();
        jobs.cancel(|k| k == key);
        let _idle = self.queue.wait_while(jobs, |j| j.running == Some(key));
    }

    /// Makes every slot free of copies: with `cancel` the queued ones are cancelled, else made;
    /// then waits until the worker is idle.
    pub fn settle(&self, cancel: bool) {
        let mut jobs = self.queue.lock();
        if cancel {
            jobs.cancel(|_| true);
        }
        let _idle = self
            .queue
            .wait_while(jobs, |j| j.running.is_some() || !j.queued.is_empty());
    }
}

impl Drop for Copier {
    /// Cancels the queued copies and joins the worker once its copy is made.
    fn drop(&mut self) {
        {
            let mut jobs = self.queue.lock();
            jobs.cancel(|_| true);
            jobs.stop = true;
        }
        self.queue.wake.notify_all();
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = worker {
            // The worker catches a copy's panic, so it ends by returning.
            let _ = handle.join();
        }
    }
}

/// The worker: makes the queued copies in order until the copier drops.
fn work(queue: &Queue) {
    let mut jobs = queue.lock();
    loop {
        if let Some((key, ticket, job)) = jobs.queued.pop_front() {
            if !ticket.start() {
                continue;
            }
            jobs.running = Some(key);
            drop(jobs);
            let done = std::panic::catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|_| {
                Err(StoreError::Slot {
                    layer: key.0,
                    slot: key.1,
                    reason: "the copy panicked".into(),
                })
            });
            ticket.end(done);
            jobs = queue.lock();
            jobs.running = None;
            queue.ended.notify_all();
            continue;
        }
        queue.ended.notify_all();
        if jobs.stop {
            return;
        }
        jobs = queue
            .wake
            .wait(jobs)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// A job that waits for `go` before it counts itself into `made`.
    fn gated(go: mpsc::Receiver<()>, made: &Arc<AtomicUsize>) -> CopyJob {
        let made = Arc::clone(made);
        Box::new(move || {
            let _ = go.recv();
            made.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }

    fn counted(made: &Arc<AtomicUsize>) -> CopyJob {
        let made = Arc::clone(made);
        Box::new(move || {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }

    #[test]
    fn copies_run_in_order_and_report_their_end() {
        let c = Copier::new();
        let order = Arc::new(Mutex::new(Vec::new()));
        let tickets: Vec<_> = (0..5)
            .map(|i| {
                let order = Arc::clone(&order);
                c.queue(
                    (0, i % 2),
                    Box::new(move || {
                        order.lock().expect("order").push(i);
                        if i == 3 {
                            Err(StoreError::Plan("bad".into()))
                        } else {
                            Ok(())
                        }
                    }),
                )
            })
            .collect();
        c.settle(false);
        assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
        for (i, t) in tickets.iter().enumerate() {
            match (i, t.poll()) {
                (3, CopyEnd::Failed(Some(StoreError::Plan(_)))) => {
                    assert!(matches!(t.poll(), CopyEnd::Failed(None)));
                }
                (3, other) => panic!("copy 3: {other:?}"),
                (_, CopyEnd::Done) => {}
                (_, other) => panic!("copy {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn clearing_a_slot_cancels_its_queued_copies_and_waits_for_its_running_one() {
        let c = Copier::new();
        let made = Arc::new(AtomicUsize::new(0));
        let (go, gate) = mpsc::channel();
        let (started, is_running) = mpsc::channel();
        let job = gated(gate, &made);
        let running = c.queue(
            (1, 0),
            Box::new(move || {
                let _ = started.send(());
                job()
            }),
        );
        let queued_same = c.queue((1, 0), counted(&made));
        let queued_other = c.queue((1, 1), counted(&made));
        is_running
            .recv()
            .expect("the worker started the first copy");
        // Let the running copy end from another thread while `clear` waits for it.
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let _ = go.send(());
        });
        c.clear((1, 0));
        assert!(matches!(running.poll(), CopyEnd::Done));
        assert!(matches!(queued_same.poll(), CopyEnd::Cancelled));
        opener.join().expect("opener");
        c.settle(false);
        assert!(matches!(queued_other.poll(), CopyEnd::Done));
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn dropping_the_copier_cancels_the_queue_and_joins_the_worker() {
        let made = Arc::new(AtomicUsize::new(0));
        let (go, gate) = mpsc::channel();
        let c = Copier::new();
        let first = c.queue((0, 0), gated(gate, &made));
        let rest: Vec<_> = (1..4).map(|s| c.queue((0, s), counted(&made))).collect();
        let _ = go.send(());
        drop(c);
        // The first copy started or not: either way it ended, and nothing runs after the drop.
        let n = made.load(Ordering::SeqCst);
        assert!(!matches!(first.poll(), CopyEnd::Pending));
        assert!(rest.iter().all(|t| !matches!(t.poll(), CopyEnd::Pending)));
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(made.load(Ordering::SeqCst), n, "a copy ran after the drop");
    }

    #[test]
    fn a_panicking_copy_fails_its_ticket_and_the_worker_goes_on() {
        let c = Copier::new();
        let made = Arc::new(AtomicUsize::new(0));
        let bad = c.queue((0, 0), Box::new(|| panic!("copy")));
        let good = c.queue((0, 1), counted(&made));
        c.settle(false);
        assert!(matches!(
            bad.poll(),
            CopyEnd::Failed(Some(StoreError::Slot { .. }))
        ));
        assert!(matches!(good.poll(), CopyEnd::Done));
    }
}
