//! Streams: one worker thread per stream executes its queue in order, so the host API
//! returns at once and work on different streams really overlaps.
//!
//! Each queued item carries the dependencies it must wait for before running (another
//! stream's progress, for legacy-default-stream semantics, or an event record, for
//! `cuStreamWaitEvent`). Dependencies always refer to work submitted earlier, so the waits
//! cannot form a cycle. A stream counts items submitted and completed; synchronizing waits
//! until `completed` reaches the count taken at the call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use crate::capture::Capture;
use crate::context::Context;
use crate::event::Event;
use crate::memory::AddressSpace;
use crate::ops::Op;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// The legacy default stream (`NULL`, `CU_STREAM_LEGACY`).
    Legacy,
    /// A thread's per-thread default stream (blocking).
    PerThread,
    /// Created with `cuStreamCreate*`.
    User,
}

/// Something a queued item waits for before it runs.
pub enum Dependency {
    /// The stream has completed at least this many items.
    Stream(Arc<Stream>, u64),
    /// The event's record of this generation has completed.
    Event(Arc<Event>, u64),
}

struct Item {
    waits: Vec<Dependency>,
    op: Op,
    /// When the host queued it, on the card's clock.
    queued_ns: u64,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    submitted: u64,
    completed: u64,
    /// When the latest completed item ended on the card's clock (see `run`).
    virtual_end: u64,
    shutdown: bool,
}

pub struct Stream {
    pub kind: StreamKind,
    pub flags: u32,
    pub priority: i32,
    pub id: u64,
    pub ctx: Weak<Context>,
    fault: Arc<AtomicU32>,
    queue: Mutex<Queue>,
    cv: Condvar,
    /// The capture sequence this stream is in, if any (see [`crate::capture`]).
    capture: Mutex<Option<Arc<Capture>>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream#{}({:?})", self.id, self.kind)
    }
}

impl Stream {
    /// Creates a stream whose worker is not started yet (see [`Stream::start`]).
    pub fn new(
        kind: StreamKind,
        flags: u32,
        priority: i32,
        ctx: Weak<Context>,
        fault: Arc<AtomicU32>,
    ) -> Arc<Self> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Arc::new(Stream {
            kind,
            flags,
            priority,
            id,
            ctx,
            fault,
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            capture: Mutex::new(None),
        })
    }

    /// Starts the worker thread.
    pub fn start(
        self: &Arc<Self>,
        space: &'static AddressSpace,
        device: usize,
    ) -> Result<(), std::io::Error> {
        let worker = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("simgpu-stream-{}", self.id))
            .spawn(move || worker.run(space, device))?;
        Ok(())
    }

    /// Creates a stream and starts its worker.
    pub fn spawn(
        kind: StreamKind,
        flags: u32,
        priority: i32,
        ctx: Weak<Context>,
        fault: Arc<AtomicU32>,
        space: &'static AddressSpace,
        device: usize,
    ) -> Result<Arc<Self>, std::io::Error> {
        let s = Self::new(kind, flags, priority, ctx, fault);
        s.start(space, device)?;
        Ok(s)
    }

    pub fn is_blocking(&self) -> bool {
        self.flags & tensile_driver_abi::CU_STREAM_NON_BLOCKING == 0
    }

    /// The stream's active capture sequence, if it is capturing.
    pub fn capture(&self) -> Option<Arc<Capture>> {
        self.capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts (`Some`) or ends (`None`) capturing; returns the previous capture.
    pub fn set_capture(&self, c: Option<Arc<Capture>>) -> Option<Arc<Capture>> {
        std::mem::replace(
            &mut *self.capture.lock().unwrap_or_else(|e| e.into_inner()),
            c,
        )
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `op` after `waits`; returns its ticket (the `submitted` count including it).
    pub fn push(&self, waits: Vec<Dependency>, op: Op) -> u64 {
        let mut q = self.lock();
        q.items.push_back(Item {
            waits,
            op,
            queued_ns: crate::card::now_ns(),
        });
        q.submitted += 1;
        self.cv.notify_all();
        q.submitted
    }

    /// (submitted, completed).
    pub fn progress(&self) -> (u64, u64) {
        let q = self.lock();
        (q.submitted, q.completed)
    }

    /// Blocks until the item with `ticket` (and everything before it) has completed.
    pub fn wait_for(&self, ticket: u64) {
        self.wait_for_end(ticket);
    }

    /// [`Self::wait_for`], returning when the work up to `ticket` ended on the card's clock (at
    /// the latest: the end of the latest completed item).
    fn wait_for_end(&self, ticket: u64) -> u64 {
        let mut q = self.lock();
        while q.completed < ticket {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.virtual_end
    }

    /// Blocks until everything submitted so far has completed.
    pub fn synchronize(&self) {
        let ticket = self.progress().0;
        self.wait_for(ticket);
    }

    pub fn is_idle(&self) -> bool {
        let (s, c) = self.progress();
        s == c
    }

    /// Lets the worker finish what is queued and exit.
    pub fn shutdown(&self) {
        let mut q = self.lock();
        q.shutdown = true;
        self.cv.notify_all();
    }

    ///
    /// Each item runs from when it is *ready* on the card's clock: queued, the item before it
    /// ended, and what it waits for ended, whichever is latest; not from when this thread gets
    /// to it. So the simulator's own cost per operation (running a twin, mapping fresh memory,
    /// waking threads) does not add up from one operation to the next while the modelled
    /// durations leave room for it.
    fn run(self: Arc<Self>, space: &'static AddressSpace, device: usize) {
        let mut last_end = 0u64;
        loop {
            let item = {
                let mut q = self.lock();
                loop {
                    if let Some(item) = q.items.pop_front() {
                        break item;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            let mut ready = item.queued_ns.max(last_end);
            for dep in &item.waits {
                let end = match dep {
                    Dependency::Stream(s, ticket) => s.wait_for_end(*ticket),
                    Dependency::Event(e, generation) => {
                        e.wait_generation(*generation);
                        e.virtual_time()
                    }
                };
                ready = ready.max(end);
            }
            let jitter = crate::config::jitter_delay();
            if !jitter.is_zero() {
                std::thread::sleep(jitter);
                ready = ready.max(crate::card::now_ns());
            }
            let broken = self.fault.load(Ordering::Acquire) != 0;
            let logged = if crate::engine_log::on() {
                item.op.log_kind(space)
            } else {
                None
            };
            // A panic inside an operation must not kill the worker (its waiters would hang):
            // it breaks the context like a fault.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                item.op.execute(space, device, broken, ready)
            }));
            let failure = match outcome {
                Ok(Ok(end)) => {
                    last_end = end;
                    if let Some((kind, bytes)) = logged {
                        crate::engine_log::item(kind, self.id, item.queued_ns, ready, end, bytes);
                    }
                    None
                }
                Ok(Err(f)) => Some((f.code, f.message)),
                Err(_) => Some((
                    tensile_driver_abi::CUDA_ERROR_UNKNOWN,
                    "internal panic".into(),
                )),
            };
            if failure.is_some() {
                last_end = ready.max(crate::card::now_ns());
            }
            if let Some((code, message)) = failure {
                if self
                    .fault
                    .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    eprintln!(
                        "tensile-simgpu: stream {}: {message}; context is now broken",
                        self.id
                    );
                }
            }
            let mut q = self.lock();
            q.completed += 1;
            q.virtual_end = last_end;
            self.cv.notify_all();
        }
    }
}
