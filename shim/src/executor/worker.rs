//! The executor's worker threads: carry out the moves the launch path decided, through the
//! memory manager's verbs, so that no launch waits for the manager's lock.
//!
//! One thread per verb. A prefetch may wait for room (for swap-outs in flight to land); the
//! swap-outs queued behind it are what makes that room, so they must not wait in the same
//! queue. (The host runs ahead of the device, so a prefetch often waits.)
//!
//! The queue is bounded: a launch path that finds it full drops the move and counts it
//! (the page is then served on demand, like anything the plan did not foresee). An error
//! from a verb is counted and logged once; the application never sees it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam::channel::{self, Receiver, Sender, TrySendError};
use tensile_driver_abi::CUresult;

use super::counters::Counters;

/// Moves waiting for the worker, at most.
pub const QUEUE_CAPACITY: usize = 4096;

/// Which verb a job calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    SwapOut,
    Prefetch,
}

/// The mechanism the worker drives: the memory manager's verbs (a fake in tests).
pub trait Mover: Send + Sync {
    /// Starts the swap-out of the device-resident pages of `ranges`, after their queued
    /// uses; returns the pages that started leaving.
    fn swap_out(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult>;
    /// Starts bringing every page `ranges` overlap to the device; returns the pages coming.
    fn prefetch(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult>;
    /// The page the mover moves (a swap-out moves only the whole pages of a piece).
    fn page_bytes(&self) -> u64 {
        super::PAGE_BYTES
    }
    /// Asks for physical units of at most `pages` pages from now on (`None`: the mover's
    /// own limit), so that a plan's pieces move alone.
    fn set_unit_pages(&self, _pages: Option<usize>) {}
    /// The mechanism's counters, for the executor's per-iteration account (debug level).
    fn memory_stats(&self) -> Option<crate::memory::MemoryStats> {
        None
    }
}

/// The moves of one trigger (one launch, one verb).
#[derive(Debug)]
pub struct Job {
    pub verb: Verb,
    pub ranges: Vec<(u64, usize)>,
    /// Plan steps these ranges carry out.
    pub steps: u64,
    /// The launch that triggered it, and when it was queued (for the thread's trace-level
    /// account of each job: how long it waited in the queue and ran).
    pub seq: u64,
    pub queued: std::time::Instant,
}

enum Msg {
    Job(Job),
    /// Answers once every job sent before it is done (tests, and flushing at exit).
    Flush(Sender<()>),
}

/// The sending ends, one per verb; each thread runs until its sender is gone.
#[derive(Debug)]
pub struct Worker {
    swap_out: Sender<Msg>,
    prefetch: Sender<Msg>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Job(j) => f.debug_tuple("Job").field(j).finish(),
            Msg::Flush(_) => f.write_str("Flush"),
        }
    }
}

impl Worker {
    /// Starts the threads. `None` (logged) if one cannot be spawned: the plan is not executed.
    pub fn start(mover: Arc<dyn Mover>, counters: Arc<Counters>) -> Option<Worker> {
        let spawn = |name: &str| -> Option<Sender<Msg>> {
            let (tx, rx) = channel::bounded(QUEUE_CAPACITY);
            let (mover, counters) = (Arc::clone(&mover), Arc::clone(&counters));
            match std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(rx, mover.as_ref(), &counters))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(
                        "tensile: cannot start the plan executor's thread `{name}` ({e}); \
                         swapping on demand"
                    );
                    None
                }
            }
        };
        // A thread already started stops when its sender is dropped with the `None`.
        let swap_out = spawn("tensile-out")?;
        let prefetch = spawn("tensile-in")?;
        Some(Worker { swap_out, prefetch })
    }

    /// Queues `job`; `false` if its queue is full (the caller counts the dropped steps).
    pub fn send(&self, job: Job) -> bool {
        let queue = match job.verb {
            Verb::SwapOut => &self.swap_out,
            Verb::Prefetch => &self.prefetch,
        };
        match queue.try_send(Msg::Job(job)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Waits (at most `patience` per queue) until every job queued before this call is done.
    pub fn flush(&self, patience: std::time::Duration) -> bool {
        [&self.swap_out, &self.prefetch].into_iter().all(|queue| {
            let (done, wait) = channel::bounded(1);
            queue
                .send_timeout(Msg::Flush(done), patience)
                .is_ok_and(|()| wait.recv_timeout(patience).is_ok())
        })
    }
}

fn run(rx: Receiver<Msg>, mover: &dyn Mover, counters: &Counters) {
    for msg in rx {
        let job = match msg {
            Msg::Job(job) => job,
            Msg::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let start = std::time::Instant::now();
        let result = match job.verb {
            Verb::SwapOut => mover.swap_out(&job.ranges),
            Verb::Prefetch => prefetch_each(mover, &job.ranges),
        };
        match result {
            Ok(pages) => {
                tracing::trace!(
                    "tensile: {:?} of launch {} waited {:.1} ms queued, ran {:.1} ms, {} pages",
                    job.verb,
                    job.seq,
                    (start - job.queued).as_secs_f64() * 1e3,
                    start.elapsed().as_secs_f64() * 1e3,
                    pages
                );
                counters.steps_done.fetch_add(job.steps, Ordering::Relaxed);
                let moved = match job.verb {
                    Verb::SwapOut => &counters.pages_out,
                    Verb::Prefetch => &counters.pages_in,
                };
                moved.fetch_add(pages as u64, Ordering::Relaxed);
            }
            Err(code) => {
                counters
                    .steps_failed
                    .fetch_add(job.steps, Ordering::Relaxed);
                if counters.verb_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "tensile: the plan's {} of {} range(s) failed with error {code}; \
                         those pages are served on demand (later failures are counted)",
                        match job.verb {
                            Verb::SwapOut => "swap-out",
                            Verb::Prefetch => "prefetch",
                        },
                        job.ranges.len()
                    );
                }
            }
        }
    }
}

/// Prefetches `ranges` one after another, in order. The manager brings a request in only
/// once it holds frames for all of it, and gives back what it took when it must wait: a
/// trigger's whole request (all the pieces the plan reads back at one launch, hundreds of
/// pages) waited for that many frames to be free at once, while the application's own
/// smaller requests took each frame as it came free and the copy engine sat idle. A range is
/// one piece of the plan: whole units of the manager, which map in whole (a piece cut
/// smaller still mapped its units whole, once per cut: ResNet-50 at 50% of its peak made
/// twice the remaps and ran at 1.37 times its prediction against 1.06).
fn prefetch_each(mover: &dyn Mover, ranges: &[(u64, usize)]) -> Result<usize, CUresult> {
    let mut coming = 0;
    for range in ranges {
        coming += mover.prefetch(std::slice::from_ref(range))?;
    }
    Ok(coming)
}
