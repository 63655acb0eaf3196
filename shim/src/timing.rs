//! GPU durations of traced launches (`LaunchTime` records), measured with event pairs.
//!
//! Only when tracing: every launch is bracketed by two events recorded on its stream (from
//! a pool, so steady state creates none). Finished pairs are collected without waiting, on
//! later launches and after the host waited for the device (syncs, synchronous copies), and
//! turned into `LaunchTime { seq, gpu_ns }`. Nothing is collected at exit (the driver may be
//! half torn down by then): a launch after the program's last wait has no time, which the
//! trace format allows.
//!
//! This module only measures; the launch hook decides when.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Mutex;

use tensile_driver_abi::{CUcontext, CUevent, CUresult, CUstream, CUDA_SUCCESS, CU_EVENT_DEFAULT};
use tensile_trace::{LaunchTime, Record};

use crate::real::{fn_ptr, RealDriver};
use crate::real_memory::{PfnExchangeCaptureMode, RelaxedCapture};
use crate::recorder::RecordSink;

type EventCreate = unsafe extern "C" fn(*mut CUevent, u32) -> CUresult;
type EventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
type EventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
type EventElapsed = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
type EventDestroy = unsafe extern "C" fn(CUevent) -> CUresult;
type CtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;

/// At most this many launches wait for their times; older ones are given up.
const MAX_PENDING: usize = 1 << 16;
/// Events kept for reuse.
const MAX_FREE: usize = 1024;

#[derive(Clone, Copy)]
struct Api {
    create: EventCreate,
    record: EventRecord,
    record_ptsz: Option<EventRecord>,
    query: EventQuery,
    elapsed: EventElapsed,
    destroy: EventDestroy,
    current: CtxGetCurrent,
    /// `cuThreadExchangeStreamCaptureMode`, if the driver has it: [`Timing::collect`] queries
    /// events, which in global capture mode would invalidate another thread's capture.
    exchange: Option<PfnExchangeCaptureMode>,
}

/// Two events of one context.
#[derive(Clone, Copy)]
struct Pair {
    ctx: usize,
    start: usize,
    end: usize,
}

/// A launch being timed: its events are recorded around it.
#[derive(Clone, Copy)]
pub struct Started {
    pair: Pair,
}

struct Pending {
    seq: u64,
    pair: Pair,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Pending>,
    free: Vec<Pair>,
}

/// Launch timing for one process.
pub struct Timing {
    api: Api,
    state: Mutex<State>,
}

impl std::fmt::Debug for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Timing")
    }
}

impl Timing {
    /// Timing over the real driver's event functions; `None` if it lacks one.
    pub fn new(driver: &RealDriver) -> Option<Timing> {
        // SAFETY: each name is looked up in the driver, whose functions of these names have
        // these C signatures (cuda.h).
        let api = unsafe {
            let elapsed = fn_ptr::<EventElapsed>(driver.symbol(c"cuEventElapsedTime_v2"))
                .or_else(|| fn_ptr::<EventElapsed>(driver.symbol(c"cuEventElapsedTime")))?;
            Api {
                create: fn_ptr(driver.symbol(c"cuEventCreate"))?,
                record: fn_ptr(driver.symbol(c"cuEventRecord"))?,
                record_ptsz: fn_ptr(driver.symbol(c"cuEventRecord_ptsz")),
                query: fn_ptr(driver.symbol(c"cuEventQuery"))?,
                elapsed,
                destroy: fn_ptr(driver.symbol(c"cuEventDestroy_v2"))?,
                current: fn_ptr(driver.symbol(c"cuCtxGetCurrent"))?,
                exchange: fn_ptr(driver.symbol(c"cuThreadExchangeStreamCaptureMode")),
            }
        };
        Some(Timing {
            api,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_on(&self, event: usize, stream: CUstream, per_thread: bool) -> CUresult {
        let record = if per_thread {
            self.api.record_ptsz.unwrap_or(self.api.record)
        } else {
            self.api.record
        };
        // SAFETY: an event of the current context and the application's own stream.
        unsafe { record(event as CUevent, stream) }
    }

    /// Takes a pair of events of the current context and records the first on `stream`
    /// (`per_thread`: a null stream is the per-thread default stream). `None` if events
    /// cannot be made (no current context, or an error): the launch is then not timed.
    pub fn start(&self, stream: CUstream, per_thread: bool) -> Option<Started> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { (self.api.current)(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
            return None;
        }
        let ctx = ctx as usize;
        let reused = {
            let mut st = self.lock();
            st.free
                .iter()
                .rposition(|p| p.ctx == ctx)
                .map(|i| st.free.swap_remove(i))
        };
        let pair = match reused {
            Some(p) => p,
            None => {
                let (mut a, mut b): (CUevent, CUevent) =
                    (std::ptr::null_mut(), std::ptr::null_mut());
                // SAFETY: valid out-pointers; a context is current.
                let ok = unsafe {
                    (self.api.create)(&mut a, CU_EVENT_DEFAULT) == CUDA_SUCCESS
                        && (self.api.create)(&mut b, CU_EVENT_DEFAULT) == CUDA_SUCCESS
                };
                if !ok {
                    self.destroy(a as usize, b as usize);
                    return None;
                }
                Pair {
                    ctx,
                    start: a as usize,
                    end: b as usize,
                }
            }
        };
        if self.record_on(pair.start, stream, per_thread) != CUDA_SUCCESS {
            self.recycle(pair);
            return None;
        }
        Some(Started { pair })
    }

    /// Records the second event after the launch `seq` was queued (or gives the events
    /// back if the launch failed, `seq == None`), then collects finished times into `rec`.
    pub fn finish(
        &self,
        started: Started,
        stream: CUstream,
        per_thread: bool,
        seq: Option<u64>,
        rec: &RecordSink,
    ) {
        let pair = started.pair;
        match seq {
            Some(seq) if self.record_on(pair.end, stream, per_thread) == CUDA_SUCCESS => {
                let mut st = self.lock();
                if st.pending.len() >= MAX_PENDING {
                    if let Some(old) = st.pending.pop_front() {
                        drop(st);
                        self.recycle(old.pair);
                        st = self.lock();
                    }
                }
                st.pending.push_back(Pending { seq, pair });
            }
            _ => self.recycle(pair),
        }
        self.collect(rec);
    }

    /// Records the times of every launch whose events have completed, oldest first,
    /// stopping at the first one still running. Never waits.
    pub fn collect(&self, rec: &RecordSink) {
        // An event query is an "unsafe" call during another thread's global-mode capture.
        let _relaxed = RelaxedCapture::enter(self.api.exchange);
        loop {
            let next = {
                let mut st = self.lock();
                let Some(front) = st.pending.front() else {
                    return;
                };
                // SAFETY: a live event of this pool.
                if unsafe { (self.api.query)(front.pair.end as CUevent) } != CUDA_SUCCESS {
                    return;
                }
                st.pending.pop_front()
            };
            let Some(done) = next else { return };
            let mut ms = 0f32;
            // SAFETY: two live, completed events of one context.
            let r = unsafe {
                (self.api.elapsed)(
                    &mut ms,
                    done.pair.start as CUevent,
                    done.pair.end as CUevent,
                )
            };
            if r == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0 {
                rec.record(Record::LaunchTime(LaunchTime {
                    seq: done.seq,
                    gpu_ns: (f64::from(ms) * 1e6) as u64,
                }));
            }
            self.recycle(done.pair);
        }
    }

    fn recycle(&self, pair: Pair) {
        let mut st = self.lock();
        if st.free.len() < MAX_FREE {
            st.free.push(pair);
        } else {
            drop(st);
            self.destroy(pair.start, pair.end);
        }
    }

    fn destroy(&self, a: usize, b: usize) {
        for e in [a, b] {
            if e != 0 {
                // SAFETY: an event this pool created and no longer uses.
                unsafe { (self.api.destroy)(e as *mut c_void) };
            }
        }
    }
}
