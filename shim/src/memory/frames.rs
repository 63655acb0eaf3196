//! Physical page frames: device frames within the budget, and the pinned host pool.
//!
//! A *frame* is one page of physical memory with an allocation (`cuMemCreate`) of its own.
//! The driver maps only whole allocations from offset 0: on the H200 (CUDA 13.0 driver) a
//! `cuMemMap` of one page of a 64 MiB allocation failed with `CUDA_ERROR_NOT_SUPPORTED`
//! (docs/gpu-results.md), so frames cannot be carved out of larger allocations, and a page
//! evicted alone needs an allocation of its own. A `cuMemCreate` of 2 MiB costs about 11 µs
//! (GPU_FACTS.md). Where frames are mapped at the arena is the manager's business; this
//! module keeps host frames in address order and hands out runs of them
//! ([`HostPool::regroup`]), so that a batch of pages is one copy.
//!
//! - [`DevicePool`]: device frames. It never creates more than the budget allows; that is
//!   the single place the device budget is enforced.
//! - [`HostPool`]: host-NUMA frames, each also mapped once, for good, into a *host window*
//!   virtual range, so swap copies are plain device-to-device copies between two virtual
//!   addresses. It grows ahead of need on a background thread (pinning 1 GiB takes ~0.6 s)
//!   up to its cap, and synchronously only as a last resort.
//!
//! Neither pool decides *which* page gets a frame; that is the manager's job.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use super::driver::{Driver, PhysHandle, PhysLocation};

/// Index of a device frame in its [`DevicePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevFrame(pub u32);

/// Index of a host frame in its [`HostPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostFrame(pub u32);

/// Device frames, one physical allocation each, never more than the budget.
///
/// One `cuMemCreate` per page, because the driver maps only whole allocations (see the
/// module's header): a page evicted alone must have an allocation of its own. A budget that
/// shrinks below what was created gives memory back to the driver (for other jobs on the
/// card) frame by frame, as frames become free ([`Self::release_free_frames`]).
pub struct DevicePool {
    page: usize,
    device: i32,
    budget_frames: usize,
    /// Frame index → its allocation; `None`: released, the frame retired (never free, never
    /// handed out again).
    handles: Vec<Option<PhysHandle>>,
    /// Frames not released.
    live_frames: usize,
    free: Vec<DevFrame>,
}

impl DevicePool {
    pub fn new(page: usize, device: i32, budget_bytes: usize) -> Self {
        Self {
            page,
            device,
            budget_frames: budget_bytes / page,
            handles: Vec::new(),
            live_frames: 0,
            free: Vec::new(),
        }
    }

    pub fn budget_frames(&self) -> usize {
        self.budget_frames
    }

    /// Changes the budget. Frames already created over a smaller budget stay created until
    /// [`Self::release_free_frames`] gives them back, and [`Self::take`] hands out none while
    /// the frames in use reach the budget.
    pub fn set_budget_frames(&mut self, frames: usize) {
        self.budget_frames = frames;
    }

    /// Frames owned by pages (created and not free).
    pub fn in_use(&self) -> usize {
        self.live_frames - self.free.len()
    }

    /// Frames created and not released (free or not): the device memory the process holds.
    pub fn created_frames(&self) -> usize {
        self.live_frames
    }

    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Frames still obtainable without evicting anything: free ones plus unused budget.
    pub fn available(&self) -> usize {
        self.budget_frames.saturating_sub(self.in_use())
    }

    /// A free frame, creating one if the budget has room. `Ok(None)` when the budget is used
    /// up (or the card refused more memory, which then becomes the budget).
    pub fn take(&mut self, driver: &dyn Driver) -> Result<Option<DevFrame>, CUresult> {
        if self.in_use() >= self.budget_frames {
            return Ok(None);
        }
        if let Some(f) = self.free.pop() {
            return Ok(Some(f));
        }
        if self.live_frames >= self.budget_frames {
            return Ok(None);
        }
        match driver.mem_create(self.page, PhysLocation::Device(self.device)) {
            Ok(h) => {
                let f = DevFrame(self.handles.len() as u32);
                self.handles.push(Some(h));
                self.live_frames += 1;
                Ok(Some(f))
            }
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                tracing::warn!(
                    held = self.live_frames * self.page,
                    "the device refused more memory; the budget shrinks to what is held"
                );
                self.budget_frames = self.live_frames;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn give(&mut self, f: DevFrame) {
        self.free.push(f);
    }

    /// The free frames (for consistency checks).
    pub fn free_list(&self) -> &[DevFrame] {
        &self.free
    }

    /// The physical allocation of a frame (one that is free or owned by a page: not
    /// released), mapped whole at offset 0.
    pub fn location(&self, f: DevFrame) -> (PhysHandle, usize) {
        let handle = self.handles[f.0 as usize].expect("a frame in use is not released");
        (handle, 0)
    }

    /// While more frames are created than the budget allows, releases free frames (free
    /// frames are mapped nowhere). Returns the frames given back.
    pub fn release_free_frames(&mut self, driver: &dyn Driver) -> usize {
        let mut given_back = 0;
        let mut kept = Vec::new();
        while self.live_frames > self.budget_frames {
            let Some(f) = self.free.pop() else { break };
            let Some(h) = self.handles[f.0 as usize] else {
                continue;
            };
            if let Err(e) = driver.mem_release(h) {
                tracing::warn!(
                    code = e,
                    "cuMemRelease of a device frame failed; it is kept"
                );
                kept.push(f);
                break;
            }
            self.handles[f.0 as usize] = None;
            self.live_frames -= 1;
            given_back += 1;
        }
        self.free.extend(kept);
        given_back
    }

    /// Releases every frame (all must be unmapped by now).
    pub fn release_all(&mut self, driver: &dyn Driver) {
        for h in self.handles.drain(..).flatten() {
            if let Err(e) = driver.mem_release(h) {
                tracing::warn!(code = e, "cuMemRelease of a device frame failed");
            }
        }
        self.free.clear();
        self.live_frames = 0;
    }
}

/// Settings of the host pool.
#[derive(Debug, Clone, Copy)]
pub struct HostPoolConfig {
    pub page: usize,
    pub device: i32,
    pub numa_node: i32,
    pub cap_bytes: usize,
    pub chunk_bytes: usize,
    /// Ask the grower for another chunk when fewer frames than this are free.
    pub low_water_frames: usize,
    /// Grow on a background thread (otherwise only synchronously, when empty).
    pub background: bool,
}

struct HostState {
    /// Frame index → (its allocation, its address in the host window).
    frames: Vec<(PhysHandle, CUdeviceptr)>,
    /// Free frames in address order (frame indices follow window addresses), so the lowest
    /// are handed out first and runs of free frames can be found.
    free: BTreeSet<HostFrame>,
    /// Bytes of the window promised to chunks (created or being created).
    reserved_bytes: usize,
    growing: bool,
    want_grow: bool,
    shutdown: bool,
    last_error: Option<CUresult>,
}

struct HostShared {
    driver: Arc<dyn Driver>,
    config: HostPoolConfig,
    window: CUdeviceptr,
    window_bytes: usize,
    state: Mutex<HostState>,
    changed: Condvar,
}

/// Why no host frame could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPoolError {
    /// The pool is at `TENSILE_HOST_MEMORY` and every frame is in use.
    CapReached { cap_bytes: usize },
    /// The driver refused to create or map pinned memory.
    Driver(CUresult),
}

/// The pinned host pool. Dropping it stops the grower; [`HostPool::release_all`] frees memory.
pub struct HostPool {
    shared: Arc<HostShared>,
    grower: Option<JoinHandle<()>>,
}

impl HostShared {
    fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates, maps and publishes one chunk of frames: `chunk_bytes` of the window, one
    /// allocation per frame (the driver maps only whole allocations). Called with `growing`
    /// set by the caller.
    fn grow_one(&self) -> Result<(), CUresult> {
        let c = self.config;
        let (offset, bytes) = {
            let mut s = self.lock();
            let bytes = c
                .chunk_bytes
                .min(self.window_bytes.saturating_sub(s.reserved_bytes));
            let bytes = bytes / c.page * c.page;
            if bytes == 0 {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            let off = s.reserved_bytes;
            s.reserved_bytes += bytes;
            (off, bytes)
        };
        let va = self.window + offset as u64;
        let result = self.create_frames(va, bytes / c.page);
        let mut s = self.lock();
        match result {
            Ok(handles) => {
                let first = s.frames.len() as u32;
                let n = handles.len() as u32;
                s.frames.extend(
                    handles
                        .into_iter()
                        .enumerate()
                        .map(|(i, h)| (h, va + (i * c.page) as u64)),
                );
                s.free.extend((first..first + n).map(HostFrame));
                s.last_error = None;
                Ok(())
            }
            Err(e) => {
                // Only one grower runs at a time, so the window tail is still ours to undo.
                s.reserved_bytes -= bytes;
                s.last_error = Some(e);
                Err(e)
            }
        }
    }

    /// `n` pinned host pages mapped one by one from `va` on, readable and writable by the
    /// device. All or nothing: on failure what was created is unmapped and released.
    fn create_frames(&self, va: CUdeviceptr, n: usize) -> Result<Vec<PhysHandle>, CUresult> {
        let c = self.config;
        let d = &*self.driver;
        let mut made: Vec<PhysHandle> = Vec::with_capacity(n);
        let mut created = || -> Result<(), CUresult> {
            for i in 0..n {
                let h = d.mem_create(c.page, PhysLocation::HostNuma(c.numa_node))?;
                if let Err(e) = d.mem_map(va + (i * c.page) as u64, c.page, 0, h) {
                    let _ = d.mem_release(h);
                    return Err(e);
                }
                made.push(h);
            }
            // One call for the whole run: it may span several allocations.
            d.mem_set_access(va, n * c.page, c.device)
        };
        match created() {
            Ok(()) => Ok(made),
            Err(e) => {
                for (i, h) in made.into_iter().enumerate() {
                    let _ = d.mem_unmap(va + (i * c.page) as u64, c.page);
                    let _ = d.mem_release(h);
                }
                Err(e)
            }
        }
    }

    fn grower_loop(self: Arc<Self>) {
        let mut s = self.lock();
        loop {
            while !s.shutdown && (!s.want_grow || s.growing) {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.shutdown {
                return;
            }
            s.want_grow = false;
            s.growing = true;
            drop(s);
            if let Err(e) = self.grow_one() {
                tracing::warn!(code = e, "growing the pinned host pool failed");
            }
            s = self.lock();
            s.growing = false;
            self.changed.notify_all();
        }
    }
}

impl HostPool {
    /// Reserves the host window (sized to the cap) and starts the grower if asked to.
    pub fn new(driver: Arc<dyn Driver>, config: HostPoolConfig) -> Result<Self, CUresult> {
        let window_bytes = config.cap_bytes / config.page * config.page;
        let window = if window_bytes > 0 {
            driver.mem_address_reserve(window_bytes, config.page)?
        } else {
            0
        };
        let shared = Arc::new(HostShared {
            driver,
            config,
            window,
            window_bytes,
            state: Mutex::new(HostState {
                frames: Vec::new(),
                free: BTreeSet::new(),
                reserved_bytes: 0,
                growing: false,
                want_grow: config.background && window_bytes > 0,
                shutdown: false,
                last_error: None,
            }),
            changed: Condvar::new(),
        });
        let grower = if config.background {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name("tensile-hostpool".into())
                .spawn(move || s.grower_loop())
                .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
            Some(h)
        } else {
            None
        };
        Ok(Self { shared, grower })
    }

    /// A free host frame; grows the pool synchronously only if it is empty.
    pub fn take(&self) -> Result<HostFrame, HostPoolError> {
        let sh = &self.shared;
        let mut s = sh.lock();
        loop {
            if let Some(f) = s.free.pop_first() {
                if s.free.len() < sh.config.low_water_frames
                    && sh.config.background
                    && s.reserved_bytes < sh.window_bytes
                {
                    s.want_grow = true;
                    sh.changed.notify_all();
                }
                return Ok(f);
            }
            if s.growing {
                s = sh.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if s.reserved_bytes + sh.config.page > sh.window_bytes {
                return Err(HostPoolError::CapReached {
                    cap_bytes: sh.window_bytes,
                });
            }
            s.growing = true;
            drop(s);
            let r = sh.grow_one();
            s = sh.lock();
            s.growing = false;
            sh.changed.notify_all();
            if let Err(e) = r {
                return Err(HostPoolError::Driver(e));
            }
        }
    }

    pub fn give(&self, f: HostFrame) {
        self.shared.lock().free.insert(f);
    }

    /// Trades `held` (frames taken for one batch of consecutive pages) for as many free
    /// frames in as few runs of consecutive frames as it finds, in address order: a batch of
    /// pages copied into a run of frames is one copy, and once swapped out it is mapped with
    /// one `cuMemMap` (when the run lies in one chunk). Looks at a bounded number of free
    /// frames, so a fragmented pool costs little. `held` comes back sorted.
    pub fn regroup(&self, held: &mut [HostFrame]) {
        const SCAN: usize = 4096;
        let n = held.len();
        if n < 2 {
            return;
        }
        let mut s = self.shared.lock();
        s.free.extend(held.iter().copied());
        // The first run of at least n frames, else the longest run seen.
        let (mut best, mut best_len) = (HostFrame(0), 0usize);
        let (mut start, mut len) = (HostFrame(0), 0usize);
        let mut prev: Option<HostFrame> = None;
        for &f in s.free.iter().take(SCAN) {
            if prev.is_some_and(|p| p.0 + 1 == f.0) {
                len += 1;
            } else {
                (start, len) = (f, 1);
            }
            if len > best_len {
                (best, best_len) = (start, len);
            }
            if best_len >= n {
                break;
            }
            prev = Some(f);
        }
        let mut out: Vec<HostFrame> = (best.0..best.0 + best_len.min(n) as u32)
            .map(HostFrame)
            .collect();
        for f in &out {
            s.free.remove(f);
        }
        while out.len() < n {
            // At least n frames are free: the ones just given back.
            let Some(f) = s.free.pop_first() else { break };
            out.push(f);
        }
        out.sort_unstable();
        // `out` has n frames (n were just given back); zip keeps this panic-free regardless.
        for (h, f) in held.iter_mut().zip(out) {
            *h = f;
        }
    }

    /// Address of the frame in the host window (a copy source or destination).
    pub fn window_address(&self, f: HostFrame) -> CUdeviceptr {
        self.shared.lock().frames[f.0 as usize].1
    }

    /// The physical allocation of a frame (for mapping it, whole, at an arena page).
    pub fn location(&self, f: HostFrame) -> (PhysHandle, usize) {
        (self.shared.lock().frames[f.0 as usize].0, 0)
    }

    /// Bytes of pinned memory created so far.
    pub fn size_bytes(&self) -> usize {
        let s = self.shared.lock();
        s.frames.len() * self.shared.config.page
    }

    pub fn free_frames(&self) -> usize {
        self.shared.lock().free.len()
    }

    /// The free frames and the number of frames created (for consistency checks).
    pub fn free_list(&self) -> (Vec<HostFrame>, usize) {
        let s = self.shared.lock();
        (s.free.iter().copied().collect(), s.frames.len())
    }

    /// Waits until no growth is in flight (for tests that count bytes).
    pub fn quiesce(&self) {
        let sh = &self.shared;
        let mut s = sh.lock();
        while s.growing || s.want_grow {
            if !sh.config.background {
                break;
            }
            s = sh.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn stop_grower(&mut self) {
        {
            let mut s = self.shared.lock();
            s.shutdown = true;
            self.shared.changed.notify_all();
        }
        if let Some(h) = self.grower.take() {
            let _ = h.join();
        }
    }

    /// Stops the grower, unmaps the window and releases every chunk. No frame may be mapped
    /// at an arena page any more.
    pub fn release_all(&mut self) {
        self.stop_grower();
        let sh = &self.shared;
        let mut s = sh.lock();
        let page = sh.config.page;
        for (h, va) in std::mem::take(&mut s.frames) {
            if let Err(e) = sh.driver.mem_unmap(va, page) {
                tracing::warn!(code = e, "cuMemUnmap of the host window failed");
            }
            if let Err(e) = sh.driver.mem_release(h) {
                tracing::warn!(code = e, "cuMemRelease of a host frame failed");
            }
        }
        s.frames.clear();
        s.free.clear();
        if sh.window_bytes > 0 {
            if let Err(e) = sh.driver.mem_address_free(sh.window, sh.window_bytes) {
                tracing::warn!(code = e, "cuMemAddressFree of the host window failed");
            }
        }
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        self.stop_grower();
    }
}
