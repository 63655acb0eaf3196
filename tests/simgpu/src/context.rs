//! Contexts: the owner of streams, the sticky error, and the legacy default stream's
//! synchronization rules; plus each thread's stack of current contexts.
//!
//! Legacy default stream: an item queued on it first waits for everything already queued on
//! the context's blocking streams, and an item queued on a blocking stream first waits for
//! everything already queued on the legacy stream. Non-blocking streams do neither. All
//! submissions of a context go through one lock so those snapshots are consistent.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

use tensile_driver_abi::*;

use crate::memory::AddressSpace;
use crate::ops::Op;
use crate::stream::{Dependency, Stream, StreamKind};

pub struct Context {
    pub id: u64,
    /// The device (ordinal) the context belongs to.
    pub device: usize,
    pub primary: bool,
    pub flags: AtomicU32,
    /// The sticky error (0 = none), shared with this context's stream workers.
    pub fault: Arc<AtomicU32>,
    pub destroyed: AtomicBool,
    pub legacy: Arc<Stream>,
    space: &'static AddressSpace,
    /// Every other stream of the context (user and per-thread), for synchronization.
    streams: Mutex<Vec<Weak<Stream>>>,
    per_thread: Mutex<HashMap<ThreadId, Arc<Stream>>>,
    submit: Mutex<()>,
}

static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

fn thread_error(_: std::io::Error) -> CUresult {
    CUDA_ERROR_OUT_OF_MEMORY
}

impl Context {
    pub fn new(
        primary: bool,
        flags: u32,
        space: &'static AddressSpace,
        device: usize,
    ) -> Result<Arc<Self>, CUresult> {
        let fault = Arc::new(AtomicU32::new(0));
        let ctx = Arc::new_cyclic(|weak: &Weak<Context>| Context {
            id: NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed),
            device,
            primary,
            flags: AtomicU32::new(flags),
            fault: fault.clone(),
            destroyed: AtomicBool::new(false),
            legacy: Stream::new(StreamKind::Legacy, 0, 0, weak.clone(), fault.clone()),
            space,
            streams: Mutex::new(Vec::new()),
            per_thread: Mutex::new(HashMap::new()),
            submit: Mutex::new(()),
        });
        ctx.legacy.start(space, device).map_err(thread_error)?;
        Ok(ctx)
    }

    /// The sticky error, if the context is broken.
    pub fn check(&self) -> Result<(), CUresult> {
        match self.fault.load(Ordering::Acquire) {
            0 => Ok(()),
            code => Err(code),
        }
    }

    /// A new user stream.
    pub fn create_stream(
        self: &Arc<Self>,
        flags: u32,
        priority: i32,
    ) -> Result<Arc<Stream>, CUresult> {
        let s = Stream::spawn(
            StreamKind::User,
            flags,
            priority,
            Arc::downgrade(self),
            self.fault.clone(),
            self.space,
            self.device,
        )
        .map_err(thread_error)?;
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&s));
        Ok(s)
    }

    /// The calling thread's per-thread default stream, created on first use.
    pub fn per_thread_stream(self: &Arc<Self>) -> Result<Arc<Stream>, CUresult> {
        let me = std::thread::current().id();
        let mut map = self.per_thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(&me) {
            return Ok(s.clone());
        }
        let s = Stream::spawn(
            StreamKind::PerThread,
            0,
            0,
            Arc::downgrade(self),
            self.fault.clone(),
            self.space,
            self.device,
        )
        .map_err(thread_error)?;
        map.insert(me, s.clone());
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&s));
        Ok(s)
    }

    fn other_streams(&self) -> Vec<Arc<Stream>> {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.iter().filter_map(Weak::upgrade).collect()
    }

    /// Queues `op` on `stream` (a stream of this context) with the legacy-stream waits and
    /// `extra` waits; returns its ticket.
    pub fn submit(&self, stream: &Arc<Stream>, extra: Vec<Dependency>, op: Op) -> u64 {
        let _order = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let mut waits = extra;
        let mut wait_on = |s: &Arc<Stream>| {
            let (submitted, completed) = s.progress();
            if submitted > completed {
                waits.push(Dependency::Stream(s.clone(), submitted));
            }
        };
        match stream.kind {
            StreamKind::Legacy => {
                for s in self.other_streams() {
                    if s.is_blocking() {
                        wait_on(&s);
                    }
                }
            }
            _ if stream.is_blocking() => wait_on(&self.legacy),
            _ => {}
        }
        stream.push(waits, op)
    }

    /// Waits for everything queued on every stream of the context.
    pub fn synchronize(&self) {
        self.legacy.synchronize();
        for s in self.other_streams() {
            s.synchronize();
        }
    }

    /// Stops every worker once its queue is drained.
    pub fn shut_down(&self) {
        self.destroyed.store(true, Ordering::Release);
        self.legacy.shutdown();
        for s in self.other_streams() {
            s.shutdown();
        }
        self.per_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

thread_local! {
    /// The calling thread's context stack; the top is current.
    static CURRENT: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
}

/// The current context, if any and not destroyed.
pub fn current() -> Result<Arc<Context>, CUresult> {
    current_raw()
        .filter(|c| !c.destroyed.load(Ordering::Acquire))
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// The current context without the destroyed check (for `cuCtxGetCurrent`).
///
/// During thread exit (an `atexit` handler, a thread-local destructor) the stack is gone
/// and the thread has no current context, as on the real driver: never a panic.
pub fn current_raw() -> Option<Arc<Context>> {
    CURRENT
        .try_with(|c| c.borrow().last().cloned())
        .ok()
        .flatten()
}

/// `cuCtxSetCurrent`: replaces the top of the stack (pops it for `None`).
pub fn set_current(ctx: Option<Arc<Context>>) {
    let _ = CURRENT.try_with(|c| {
        let mut stack = c.borrow_mut();
        stack.pop();
        if let Some(ctx) = ctx {
            stack.push(ctx);
        }
    });
}

pub fn push_current(ctx: Arc<Context>) {
    let _ = CURRENT.try_with(|c| c.borrow_mut().push(ctx));
}

pub fn pop_current() -> Option<Arc<Context>> {
    CURRENT.try_with(|c| c.borrow_mut().pop()).ok().flatten()
}

/// Removes `ctx` from the calling thread's stack (after `cuCtxDestroy`).
pub fn forget(ctx: &Arc<Context>) {
    let _ = CURRENT.try_with(|c| c.borrow_mut().retain(|x| !Arc::ptr_eq(x, ctx)));
}
