//! An in-memory stand-in for the driver, for unit and property tests of the memory manager.
//!
//! What it models, faithfully enough to catch the bugs that matter here:
//! - **VMM**: reservations, physical allocations (`Vec<u8>`, device or host-NUMA, counted
//!   against capacities), mappings at page granularity with access flags. Data lives in the
//!   physical allocation, so a range unmapped and mapped elsewhere keeps its bytes.
//! - **Streams and events**: every stream is a queue executed in order; a record completes
//!   when it executes; a wait blocks its queue until the awaited record has executed. In
//!   [`Progress::Immediate`] mode work runs as it is submitted; in [`Progress::Manual`] mode it
//!   stays queued until the test (or a synchronize call) runs it, so tests can interleave
//!   streams and hold work in flight.
//! - **Misuse detection**: an access to an unmapped or inaccessible address is recorded as a
//!   *fault*; mapping or unmapping a range that queued work still touches is recorded as a
//!   *violation* (on a GPU that is a race that corrupts data). Tests assert both lists empty.
//! - **Failure injection** per call kind, and call counters (to prove a fast path makes no
//!   driver call).
//!
//! It is not a GPU simulator: there are no kernels, only test "kernels" that write, read or
//! fill a range ([`FakeDriver::app_write`] and friends).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tensile_driver_abi::{
    CUdeviceptr, CUresult, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY,
};

use super::driver::{Driver, Event, PhysHandle, PhysLocation, Stream};

/// When queued work executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Each operation executes as it is submitted.
    Immediate,
    /// Operations wait until [`FakeDriver::step`], [`FakeDriver::run_all`] or a synchronize.
    Manual,
}

/// The driver calls the fake counts and can fail on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeCall {
    AddressReserve,
    CreateDevice,
    CreateHost,
    Release,
    Map,
    Unmap,
    SetAccess,
    Memcpy,
    StreamCreate,
    StreamSynchronize,
    StreamWaitEvent,
    EventCreate,
    EventRecord,
    EventQuery,
    EventSynchronize,
    MemGetInfo,
}

/// Capacities and progress mode of a [`FakeDriver`].
#[derive(Debug, Clone, Copy)]
pub struct FakeConfig {
    pub device_capacity: usize,
    pub host_capacity: usize,
    pub progress: Progress,
}

/// Where a test read's bytes arrive once it has executed.
#[derive(Debug, Clone, Default)]
pub struct ReadSlot(Arc<Mutex<Option<Vec<u8>>>>);

impl ReadSlot {
    /// The bytes read, or `None` while the read is still queued (or faulted).
    pub fn get(&self) -> Option<Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

enum Op {
    Copy { dst: u64, src: u64, len: usize },
    HtoD { dst: u64, src: usize, len: usize },
    DtoH { dst: usize, src: u64, len: usize },
    Write { dst: u64, data: Vec<u8> },
    Read { src: u64, len: usize, out: ReadSlot },
    Fill { dst: u64, len: usize, byte: u8 },
    Record { event: usize, gen: u64 },
    Wait { event: usize, gen: u64 },
}

impl Op {
    /// Device ranges the operation touches.
    fn ranges(&self) -> [(u64, usize); 2] {
        match self {
            Op::Copy { dst, src, len } => [(*dst, *len), (*src, *len)],
            Op::HtoD { dst, len, .. } => [(*dst, *len), (0, 0)],
            Op::DtoH { src, len, .. } => [(*src, *len), (0, 0)],
            Op::Write { dst, data } => [(*dst, data.len()), (0, 0)],
            Op::Read { src, len, .. } => [(*src, *len), (0, 0)],
            Op::Fill { dst, len, .. } => [(*dst, *len), (0, 0)],
            Op::Record { .. } | Op::Wait { .. } => [(0, 0), (0, 0)],
        }
    }
}

struct Phys {
    data: Vec<u8>,
    device: bool,
    released: bool,
    mappings: usize,
}

struct Mapping {
    size: usize,
    handle: u64,
    offset: usize,
    access: bool,
}

#[derive(Default)]
struct EventState {
    recorded_gen: u64,
    completed_gen: u64,
}

struct State {
    config: FakeConfig,
    next_id: u64,
    next_va: u64,
    phys: HashMap<u64, Phys>,
    reservations: BTreeMap<u64, usize>,
    mappings: BTreeMap<u64, Mapping>,
    streams: BTreeMap<usize, VecDeque<Op>>,
    events: HashMap<usize, EventState>,
    faults: Vec<String>,
    violations: Vec<String>,
    failures: HashMap<FakeCall, VecDeque<CUresult>>,
    calls: HashMap<FakeCall, u64>,
    device_used: usize,
    device_peak: usize,
    host_used: usize,
    /// Physical allocations exported as file descriptors (`mem_export_fd`), in order.
    exported: Vec<u64>,
}

/// The fake driver. Cheap to share: wrap it in an `Arc` and hand clones to the manager.
pub struct FakeDriver {
    state: Mutex<State>,
    /// Calls held at a closed gate ([`Self::close_gate`]), with whether one is waiting there:
    /// for tests of what other threads can do meanwhile.
    gates: Mutex<HashMap<FakeCall, bool>>,
    gates_changed: std::sync::Condvar,
}

impl FakeDriver {
    pub fn new(config: FakeConfig) -> Self {
        let mut streams = BTreeMap::new();
        streams.insert(0, VecDeque::new());
        Self {
            state: Mutex::new(State {
                config,
                next_id: 1,
                next_va: 0x10_0000_0000,
                phys: HashMap::new(),
                reservations: BTreeMap::new(),
                mappings: BTreeMap::new(),
                streams,
                events: HashMap::new(),
                faults: Vec::new(),
                violations: Vec::new(),
                failures: HashMap::new(),
                calls: HashMap::new(),
                device_used: 0,
                device_peak: 0,
                host_used: 0,
                exported: Vec::new(),
            }),
            gates: Mutex::new(HashMap::new()),
            gates_changed: std::sync::Condvar::new(),
        }
    }

    /// Makes every call of this kind from now on wait, before doing anything, until
    /// [`Self::open_gate`]; [`Self::waiting_at`] says whether one is waiting. Implemented for
    /// `cuMemMap`, `cuMemUnmap`, `cuEventSynchronize` and `cuMemCreate` of host memory.
    pub fn close_gate(&self, call: FakeCall) {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(call, false);
    }

    /// Lets the waiting and later calls of this kind through.
    pub fn open_gate(&self, call: FakeCall) {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&call);
        self.gates_changed.notify_all();
    }

    /// Whether a call of this kind is waiting at its closed gate.
    pub fn waiting_at(&self, call: FakeCall) -> bool {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&call)
            .copied()
            .unwrap_or(false)
    }

    fn pass_gate(&self, call: FakeCall) {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(waiting) = gates.get_mut(&call) {
            *waiting = true;
            gates = self
                .gates_changed
                .wait(gates)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; keep reporting.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next call of this kind fail with `code` (queued: several calls fail in turn).
    pub fn fail_next(&self, call: FakeCall, code: CUresult) {
        self.lock()
            .failures
            .entry(call)
            .or_default()
            .push_back(code);
    }

    /// Drops every failure still queued by [`Self::fail_next`].
    pub fn clear_failures(&self) {
        self.lock().failures.clear();
    }

    pub fn set_progress(&self, progress: Progress) {
        let mut s = self.lock();
        s.config.progress = progress;
        if progress == Progress::Immediate {
            s.run_until(|_| false);
        }
    }

    /// How many times a call of this kind was made (failed calls included).
    pub fn calls(&self, call: FakeCall) -> u64 {
        self.lock().calls.get(&call).copied().unwrap_or(0)
    }

    /// Accesses to unmapped or inaccessible memory, in order.
    pub fn faults(&self) -> Vec<String> {
        self.lock().faults.clone()
    }

    /// The physical allocations exported so far (`mem_export_fd`), in order.
    pub fn exported(&self) -> Vec<PhysHandle> {
        self.lock()
            .exported
            .iter()
            .map(|&h| PhysHandle(h))
            .collect()
    }

    /// Remaps of ranges that queued work still touched, and synchronizes that could never end.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Device bytes held in physical allocations now, and at most so far.
    pub fn device_bytes(&self) -> (usize, usize) {
        let s = self.lock();
        (s.device_used, s.device_peak)
    }

    /// Host-NUMA bytes held in physical allocations now.
    pub fn host_bytes(&self) -> usize {
        self.lock().host_used
    }

    /// Number of operations still queued on all streams.
    pub fn queued(&self) -> usize {
        self.lock().streams.values().map(VecDeque::len).sum()
    }

    /// Executes the head operation of `stream` if it can run; returns whether it did.
    pub fn step(&self, stream: Stream) -> bool {
        self.lock().run_head(stream.0)
    }

    /// Runs every queue until all are empty or blocked.
    pub fn run_all(&self) {
        self.lock().run_until(|_| false);
    }

    /// Test kernel: writes `data` at `dst`, in stream order.
    pub fn app_write(
        &self,
        stream: Stream,
        dst: CUdeviceptr,
        data: Vec<u8>,
    ) -> Result<(), CUresult> {
        self.lock().submit(stream.0, Op::Write { dst, data })
    }

    /// Test kernel: reads `len` bytes at `src`, in stream order.
    pub fn app_read(
        &self,
        stream: Stream,
        src: CUdeviceptr,
        len: usize,
    ) -> Result<ReadSlot, CUresult> {
        let out = ReadSlot::default();
        self.lock().submit(
            stream.0,
            Op::Read {
                src,
                len,
                out: out.clone(),
            },
        )?;
        Ok(out)
    }

    /// Test memset: fills `len` bytes at `dst` with `byte`, in stream order.
    pub fn app_fill(
        &self,
        stream: Stream,
        dst: CUdeviceptr,
        len: usize,
        byte: u8,
    ) -> Result<(), CUresult> {
        self.lock().submit(stream.0, Op::Fill { dst, len, byte })
    }
}

impl State {
    fn enter(&mut self, call: FakeCall) -> Result<(), CUresult> {
        *self.calls.entry(call).or_insert(0) += 1;
        match self.failures.get_mut(&call).and_then(VecDeque::pop_front) {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn submit(&mut self, stream: usize, op: Op) -> Result<(), CUresult> {
        let queue = self
            .streams
            .get_mut(&stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        queue.push_back(op);
        if self.config.progress == Progress::Immediate {
            self.run_until(|_| false);
        }
        Ok(())
    }

    /// Runs runnable heads round-robin until `done` holds or nothing can run.
    fn run_until(&mut self, done: impl Fn(&State) -> bool) {
        loop {
            if done(self) {
                return;
            }
            let ids: Vec<usize> = self.streams.keys().copied().collect();
            let mut progressed = false;
            for id in ids {
                while self.run_head(id) {
                    progressed = true;
                    if done(self) {
                        return;
                    }
                }
            }
            if !progressed {
                return;
            }
        }
    }

    fn run_head(&mut self, stream: usize) -> bool {
        let runnable = match self.streams.get(&stream).and_then(VecDeque::front) {
            None => false,
            Some(Op::Wait { event, gen }) => self
                .events
                .get(event)
                .is_none_or(|e| e.completed_gen >= *gen),
            Some(_) => true,
        };
        if !runnable {
            return false;
        }
        let Some(op) = self.streams.get_mut(&stream).and_then(VecDeque::pop_front) else {
            return false;
        };
        self.execute(op);
        true
    }

    fn execute(&mut self, op: Op) {
        match op {
            Op::Copy { dst, src, len } => {
                if let Some(bytes) = self.read(src, len) {
                    self.write(dst, &bytes);
                }
            }
            Op::HtoD { dst, src, len } => {
                // SAFETY: the caller of `memcpy_htod_async` promised the buffer stays valid
                // until the copy executes, which is now.
                let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, len) }.to_vec();
                self.write(dst, &bytes);
            }
            Op::DtoH { dst, src, len } => {
                if let Some(bytes) = self.read(src, len) {
                    // SAFETY: the caller of `memcpy_dtoh_async` promised the buffer stays
                    // valid and untouched until the copy executes, which is now.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, len) };
                }
            }
            Op::Write { dst, data } => self.write(dst, &data),
            Op::Read { src, len, out } => {
                if let Some(bytes) = self.read(src, len) {
                    *out.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
                }
            }
            Op::Fill { dst, len, byte } => self.write(dst, &vec![byte; len]),
            Op::Record { event, gen } => {
                if let Some(e) = self.events.get_mut(&event) {
                    e.completed_gen = e.completed_gen.max(gen);
                }
            }
            Op::Wait { .. } => {}
        }
    }

    /// Splits `addr..addr+len` into (handle, offset, len) pieces through the mappings.
    fn resolve(&self, addr: u64, len: usize) -> Result<Vec<(u64, usize, usize)>, String> {
        let mut pieces = Vec::new();
        let mut at = addr;
        let end = addr + len as u64;
        while at < end {
            let Some((&base, m)) = self.mappings.range(..=at).next_back() else {
                return Err(format!("access to unmapped address {at:#x}"));
            };
            let m_end = base + m.size as u64;
            if at >= m_end {
                return Err(format!("access to unmapped address {at:#x}"));
            }
            if !m.access {
                return Err(format!("access to {at:#x} without access rights"));
            }
            let n = (end.min(m_end) - at) as usize;
            pieces.push((m.handle, m.offset + (at - base) as usize, n));
            at += n as u64;
        }
        Ok(pieces)
    }

    fn read(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        match self.resolve(addr, len) {
            Ok(pieces) => {
                let mut out = Vec::with_capacity(len);
                for (h, off, n) in pieces {
                    let p = &self.phys[&h];
                    out.extend_from_slice(&p.data[off..off + n]);
                }
                Some(out)
            }
            Err(e) => {
                self.faults.push(format!("read: {e}"));
                None
            }
        }
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) {
        match self.resolve(addr, bytes.len()) {
            Ok(pieces) => {
                let mut done = 0;
                for (h, off, n) in pieces {
                    if let Some(p) = self.phys.get_mut(&h) {
                        p.data[off..off + n].copy_from_slice(&bytes[done..done + n]);
                    }
                    done += n;
                }
            }
            Err(e) => self.faults.push(format!("write: {e}")),
        }
    }

    /// Records a violation if queued work touches `ptr..ptr+size`.
    fn check_no_queued_work(&mut self, what: &str, ptr: u64, size: usize) {
        let end = ptr + size as u64;
        let hit = self.streams.iter().find_map(|(sid, q)| {
            q.iter().find_map(|op| {
                op.ranges()
                    .into_iter()
                    .find(|&(a, n)| n > 0 && a < end && ptr < a + n as u64)
                    .map(|_| *sid)
            })
        });
        if let Some(sid) = hit {
            self.violations.push(format!(
                "{what} of {ptr:#x}+{size:#x} while stream {sid:#x} has queued work on it"
            ));
        }
    }

    fn in_reservation(&self, ptr: u64, size: usize) -> bool {
        self.reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &n)| ptr + size as u64 <= b + n as u64)
    }

    /// The mappings exactly covering `ptr..ptr+size`, or `None` if there is a gap or a
    /// mapping sticks out.
    fn covering(&self, ptr: u64, size: usize) -> Option<Vec<u64>> {
        let end = ptr + size as u64;
        let mut at = ptr;
        let mut keys = Vec::new();
        for (&base, m) in self.mappings.range(ptr..end) {
            if base != at {
                return None;
            }
            at = base + m.size as u64;
            keys.push(base);
        }
        (at == end && !keys.is_empty()).then_some(keys)
    }

    fn drop_phys_if_dead(&mut self, handle: u64) {
        let dead = self
            .phys
            .get(&handle)
            .is_some_and(|p| p.released && p.mappings == 0);
        if dead {
            if let Some(p) = self.phys.remove(&handle) {
                if p.device {
                    self.device_used -= p.data.len();
                } else {
                    self.host_used -= p.data.len();
                }
            }
        }
    }
}

impl Driver for FakeDriver {
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> Result<CUdeviceptr, CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::AddressReserve)?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(1 << 21) as u64;
        let base = s.next_va.div_ceil(align) * align;
        s.next_va = base + size as u64 + (1 << 21);
        s.reservations.insert(base, size);
        Ok(base)
    }

    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<(), CUresult> {
        let mut s = self.lock();
        if s.reservations.get(&ptr) != Some(&size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if s.mappings.range(ptr..ptr + size as u64).next().is_some() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        s.reservations.remove(&ptr);
        Ok(())
    }

    fn mem_create(&self, size: usize, location: PhysLocation) -> Result<PhysHandle, CUresult> {
        let device = matches!(location, PhysLocation::Device(_));
        if !device {
            self.pass_gate(FakeCall::CreateHost);
        }
        let mut s = self.lock();
        s.enter(if device {
            FakeCall::CreateDevice
        } else {
            FakeCall::CreateHost
        })?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if device {
            if s.device_used + size > s.config.device_capacity {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            s.device_used += size;
            s.device_peak = s.device_peak.max(s.device_used);
        } else {
            if s.host_used + size > s.config.host_capacity {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            s.host_used += size;
        }
        let h = s.id();
        // Fresh memory is not zero on a GPU; a recognisable pattern makes lost data visible.
        let data = vec![(h as u8) | 0x80; size];
        s.phys.insert(
            h,
            Phys {
                data,
                device,
                released: false,
                mappings: 0,
            },
        );
        Ok(PhysHandle(h))
    }

    /// A descriptor of `/dev/null` stands for the memory: nothing reads it in the tests.
    fn mem_export_fd(&self, handle: PhysHandle) -> Result<std::os::fd::OwnedFd, CUresult> {
        let mut s = self.lock();
        match s.phys.get(&handle.0) {
            Some(p) if p.device && !p.released => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        s.exported.push(handle.0);
        let null = std::fs::File::open("/dev/null").map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        Ok(null.into())
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::Release)?;
        match s.phys.get_mut(&handle.0) {
            Some(p) if !p.released => p.released = true,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        s.drop_phys_if_dead(handle.0);
        Ok(())
    }

    fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: PhysHandle,
    ) -> Result<(), CUresult> {
        self.pass_gate(FakeCall::Map);
        let mut s = self.lock();
        s.enter(FakeCall::Map)?;
        let fits = s
            .phys
            .get(&handle.0)
            .is_some_and(|p| !p.released && offset + size <= p.data.len());
        if size == 0 || !fits || !s.in_reservation(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The real driver maps only whole allocations (tests/simgpu's `map`).
        if offset != 0 || s.phys.get(&handle.0).is_some_and(|p| p.data.len() != size) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let end = ptr + size as u64;
        let overlaps = s
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&b, m)| b + m.size as u64 > ptr);
        if overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        s.check_no_queued_work("map", ptr, size);
        s.mappings.insert(
            ptr,
            Mapping {
                size,
                handle: handle.0,
                offset,
                access: false,
            },
        );
        if let Some(p) = s.phys.get_mut(&handle.0) {
            p.mappings += 1;
        }
        Ok(())
    }

    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<(), CUresult> {
        self.pass_gate(FakeCall::Unmap);
        let mut s = self.lock();
        s.enter(FakeCall::Unmap)?;
        // The driver documents that the range must be *the* range that was mapped (it
        // cannot unmap part of a mapping); whether one call may cover several mappings is
        // not documented, so the fake refuses that too and the manager never relies on it.
        let keys = s
            .covering(ptr, size)
            .filter(|k| k.len() == 1)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        s.check_no_queued_work("unmap", ptr, size);
        for k in keys {
            if let Some(m) = s.mappings.remove(&k) {
                if let Some(p) = s.phys.get_mut(&m.handle) {
                    p.mappings -= 1;
                }
                s.drop_phys_if_dead(m.handle);
            }
        }
        Ok(())
    }

    fn mem_set_access(&self, ptr: CUdeviceptr, size: usize, _device: i32) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::SetAccess)?;
        let keys = s.covering(ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        for k in keys {
            if let Some(m) = s.mappings.get_mut(&k) {
                m.access = true;
            }
        }
        Ok(())
    }

    fn memcpy_dtod_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::Memcpy)?;
        s.submit(
            stream.0,
            Op::Copy {
                dst,
                src,
                len: bytes,
            },
        )
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::Memcpy)?;
        s.submit(
            stream.0,
            Op::HtoD {
                dst,
                src: src as usize,
                len: bytes,
            },
        )
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::Memcpy)?;
        s.submit(
            stream.0,
            Op::DtoH {
                dst: dst as usize,
                src,
                len: bytes,
            },
        )
    }

    fn stream_create(&self) -> Result<Stream, CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::StreamCreate)?;
        let id = s.id() as usize;
        s.streams.insert(id, VecDeque::new());
        Ok(Stream(id))
    }

    fn stream_destroy(&self, stream: Stream) -> Result<(), CUresult> {
        let mut s = self.lock();
        // Like the driver, destroying a stream lets its queued work finish first.
        s.run_until(|st| st.streams.get(&stream.0).is_none_or(VecDeque::is_empty));
        if stream.0 == 0 || s.streams.remove(&stream.0).is_none() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        Ok(())
    }

    fn stream_synchronize(&self, stream: Stream) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::StreamSynchronize)?;
        if !s.streams.contains_key(&stream.0) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        s.run_until(|st| st.streams.get(&stream.0).is_none_or(VecDeque::is_empty));
        if s.streams.get(&stream.0).is_some_and(|q| !q.is_empty()) {
            s.violations.push(format!(
                "stream_synchronize({:#x}) would never return",
                stream.0
            ));
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(())
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::StreamWaitEvent)?;
        let gen = s
            .events
            .get(&event.0)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .recorded_gen;
        s.submit(
            stream.0,
            Op::Wait {
                event: event.0,
                gen,
            },
        )
    }

    fn event_create(&self) -> Result<Event, CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::EventCreate)?;
        let id = s.id() as usize;
        s.events.insert(id, EventState::default());
        Ok(Event(id))
    }

    fn event_destroy(&self, event: Event) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.events
            .remove(&event.0)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn event_record(&self, event: Event, stream: Stream) -> Result<(), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::EventRecord)?;
        if !s.streams.contains_key(&stream.0) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let e = s
            .events
            .get_mut(&event.0)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        e.recorded_gen += 1;
        let gen = e.recorded_gen;
        s.submit(
            stream.0,
            Op::Record {
                event: event.0,
                gen,
            },
        )
    }

    fn event_query(&self, event: Event) -> Result<bool, CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::EventQuery)?;
        let e = s.events.get(&event.0).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(e.completed_gen >= e.recorded_gen)
    }

    fn event_synchronize(&self, event: Event) -> Result<(), CUresult> {
        self.pass_gate(FakeCall::EventSynchronize);
        let mut s = self.lock();
        s.enter(FakeCall::EventSynchronize)?;
        let done = |st: &State| {
            st.events
                .get(&event.0)
                .is_none_or(|e| e.completed_gen >= e.recorded_gen)
        };
        if !s.events.contains_key(&event.0) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        s.run_until(done);
        if !done(&s) {
            s.violations.push(format!(
                "event_synchronize({:#x}) would never return",
                event.0
            ));
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(())
    }

    fn mem_get_info(&self) -> Result<(usize, usize), CUresult> {
        let mut s = self.lock();
        s.enter(FakeCall::MemGetInfo)?;
        let cap = s.config.device_capacity;
        Ok((cap.saturating_sub(s.device_used), cap))
    }

    fn mem_granularity(&self, _loc: PhysLocation) -> Result<usize, CUresult> {
        // Any multiple of the OS page is accepted; the address reservations align to 2 MiB.
        Ok(2 << 20)
    }
}
