//! Physical memory: device units within the budget, and the pinned host pool.
//!
//! The driver maps only whole allocations from offset 0: on the H200 (CUDA 13.0 driver) a
//! `cuMemMap` of one page of a 64 MiB allocation failed with `CUDA_ERROR_NOT_SUPPORTED`
//! (docs/gpu-results.md). And the VMM calls cost per mapping, not per byte. So device memory
//! comes in *units*, one allocation of one or more pages each, mapped whole at consecutive
//! arena pages; a page's *frame* is its page of a unit. Pinned host memory comes in single
//! frames, an allocation each, and in host units of several pages ([`HostPool::take_unit`])
//! for pages that leave the device together. Where frames are mapped at the arena is the
//! manager's business; this module keeps single host frames in address order and hands out
//! runs of them ([`HostPool::regroup`]), so that a batch of pages is one copy.
//!
//! - [`DevicePool`]: device units. It never creates more than the budget allows; that is
//!   the single place the device budget is enforced.
//! - [`HostPool`]: host-NUMA frames, each also mapped once, for good, into a *host window*
//!   virtual range, so swap copies are plain device-to-device copies between two virtual
//!   addresses. It grows ahead of need on a background thread (pinning 1 GiB takes ~0.6 s)
//!   up to its cap, and synchronously only as a last resort.
//!
//! Neither pool decides *which* page gets a frame; that is the manager's job.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use super::driver::{Driver, PhysHandle, PhysLocation};

/// A device frame: page `offset` of the device allocation `unit` of a [`DevicePool`].
///
/// The driver maps only whole allocations, so the pages of one allocation (a *unit*) are
/// mapped together, at consecutive arena pages in offset order, and unmapped together; the
/// manager keeps them moving together (docs/memory.md, "Units").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevFrame {
    pub unit: u32,
    pub offset: u32,
}

/// Index of a host frame in its [`HostPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostFrame(pub u32);

/// One device allocation: `pages` frames, mapped whole.
#[derive(Debug, Clone, Copy)]
struct DevUnit {
    handle: PhysHandle,
    pages: u32,
    /// Frames of it owned by pages; 0: the unit is free (unless handed over).
    owned: u32,
    /// Mapped at a page still leaving the device as well as at the pages read back into it
    /// (`manager/handover.rs`): given back meanwhile, it is *parked* (in use, not free) until
    /// [`DevicePool::end_hand_over`], so that it is neither released nor its index reused
    /// while a page's state names it.
    handed_over: bool,
    /// Still mapped at the pages of a dead unit dropped for its frames, whose unmap the
    /// manager left to the operation that took them (`manager/first_backing.rs`). Free
    /// meanwhile only if that operation failed and gave it back: it is then not released,
    /// since a mapped allocation's memory stays held until its unmap, and the process would
    /// hold more than the budget.
    still_mapped: bool,
}

/// Device memory within the budget, in units of one or more pages, each its own physical
/// allocation (`cuMemCreate`).
///
/// The VMM calls cost per mapping, not per byte (docs/gpu-results.md: a 64-page allocation is
/// mapped, given access and unmapped 40 times cheaper per page than 64 one-page ones), so pages
/// that move together get one unit of their size: a unit is created on demand (about 10 µs,
/// plus 0.2 µs per page, on the H200) and kept, free, for the next request of its size; free
/// units of other sizes are released to make room within the budget (about 10 µs each). A
/// budget that shrinks below what was created gives memory back to the driver (for other
/// jobs on the card) as units become free ([`Self::release_free_frames`]).
pub struct DevicePool {
    page: usize,
    device: i32,
    budget_frames: usize,
    /// Unit index → the unit; `None`: released (the index is reused, see `vacant`).
    units: Vec<Option<DevUnit>>,
    vacant: Vec<u32>,
    /// Pages of the units not released.
    created: usize,
    /// Free units by size in pages.
    free: BTreeMap<u32, Vec<u32>>,
    free_pages: usize,
    /// Times the device refused more memory (the first is logged as a warning).
    refusals: u64,
}

impl DevicePool {
    pub fn new(page: usize, device: i32, budget_bytes: usize) -> Self {
        Self {
            page,
            device,
            budget_frames: budget_bytes / page,
            units: Vec::new(),
            vacant: Vec::new(),
            created: 0,
            free: BTreeMap::new(),
            free_pages: 0,
            refusals: 0,
        }
    }

    pub fn budget_frames(&self) -> usize {
        self.budget_frames
    }

    /// Changes the budget. Units already created over a smaller budget stay created until
    /// [`Self::release_free_frames`] gives them back, and [`Self::take_unit`] hands out none
    /// while the frames in use reach the budget.
    pub fn set_budget_frames(&mut self, frames: usize) {
        self.budget_frames = frames;
    }

    /// Frames owned by pages (created and not in a free unit).
    pub fn in_use(&self) -> usize {
        self.created - self.free_pages
    }

    /// Frames created and not released (free or not): the device memory the process holds.
    pub fn created_frames(&self) -> usize {
        self.created
    }

    pub fn free_frames(&self) -> usize {
        self.free_pages
    }

    /// Frames still obtainable without evicting anything: free ones plus unused budget (a
    /// free unit of another size is released and its memory created again at the size
    /// asked for).
    pub fn available(&self) -> usize {
        self.budget_frames.saturating_sub(self.in_use())
    }

    /// A free one-page frame, creating one if the budget has room.
    pub fn take(&mut self, driver: &dyn Driver) -> Result<Option<DevFrame>, CUresult> {
        Ok(self.take_unit(driver, 1)?.map(|(f, _)| f))
    }

    /// Whether a new unit of `pages` frames fits the budget beside every unit created, free
    /// ones included (then [`Self::take_unit`] releases none to make it).
    pub fn can_create(&self, pages: usize) -> bool {
        self.created + pages <= self.budget_frames
    }

    /// A free unit of exactly `pages` frames, if there is one (no driver call).
    pub fn take_free_unit(&mut self, pages: usize) -> Option<(DevFrame, usize)> {
        let n = u32::try_from(pages).ok()?;
        let u = self.free.get_mut(&n).and_then(Vec::pop)?;
        self.free.retain(|_, v| !v.is_empty());
        self.free_pages -= pages;
        if let Some(unit) = self.units[u as usize].as_mut() {
            unit.owned = n;
        }
        Some((DevFrame { unit: u, offset: 0 }, pages))
    }

    /// Takes the free unit `first` starts back out of the free list (no driver call); false
    /// if it is not free.
    pub fn take_free_unit_at(&mut self, first: DevFrame) -> bool {
        let Some(unit) = self
            .units
            .get_mut(first.unit as usize)
            .and_then(Option::as_mut)
        else {
            return false;
        };
        let Some(list) = self.free.get_mut(&unit.pages) else {
            return false;
        };
        let Some(i) = list.iter().position(|&u| u == first.unit) else {
            return false;
        };
        list.swap_remove(i);
        self.free.retain(|_, v| !v.is_empty());
        self.free_pages -= unit.pages as usize;
        unit.owned = unit.pages;
        true
    }

    /// A unit of `pages` frames (its first frame and its size, for [`Self::frames`]): a free
    /// one of that size, or a new one, releasing free units of other sizes to make room.
    /// `Ok(None)` when the budget has no room (or the card refused more memory, which then
    /// becomes the budget).
    pub fn take_unit(
        &mut self,
        driver: &dyn Driver,
        pages: usize,
    ) -> Result<Option<(DevFrame, usize)>, CUresult> {
        let n = u32::try_from(pages).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        if pages == 0 || self.in_use() + pages > self.budget_frames {
            return Ok(None);
        }
        if let Some(unit) = self.take_free_unit(pages) {
            return Ok(Some(unit));
        }
        // Room for a new allocation: free units of other sizes go back to the driver.
        while self.created + pages > self.budget_frames {
            if !self.release_one_free(driver) {
                return Ok(None);
            }
        }
        match driver.mem_create(pages * self.page, PhysLocation::Device(self.device)) {
            Ok(handle) => {
                let unit = DevUnit {
                    handle,
                    pages: n,
                    owned: n,
                    handed_over: false,
                    still_mapped: false,
                };
                let u = match self.vacant.pop() {
                    Some(u) => {
                        self.units[u as usize] = Some(unit);
                        u
                    }
                    None => {
                        self.units.push(Some(unit));
                        (self.units.len() - 1) as u32
                    }
                };
                self.created += pages;
                Ok(Some((DevFrame { unit: u, offset: 0 }, pages)))
            }
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                // On a shared card this recurs while other jobs shrink to their grants (the
                // planning thread raises the budget to the grant again, once a second).
                self.refusals += 1;
                if self.refusals == 1 {
                    tracing::warn!(
                        held = self.created * self.page,
                        "the device refused more memory; the budget shrinks to what is held \
                         (later refusals are logged at debug level)"
                    );
                } else {
                    tracing::debug!(
                        held = self.created * self.page,
                        refusals = self.refusals,
                        "the device refused more memory again"
                    );
                }
                self.budget_frames = self.created;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The frames of the unit `first` starts, in page order.
    pub fn frames(first: DevFrame, pages: usize) -> impl Iterator<Item = DevFrame> {
        (0..pages as u32).map(move |offset| DevFrame {
            unit: first.unit,
            offset,
        })
    }

    /// Gives a page's frame back; once every frame of its unit is back (the unit is mapped
    /// nowhere by then), the unit is free.
    pub fn give(&mut self, f: DevFrame) {
        let Some(unit) = self.units.get_mut(f.unit as usize).and_then(Option::as_mut) else {
            debug_assert!(false, "a frame of a released unit: {f:?}");
            return;
        };
        debug_assert!(unit.owned > 0, "{f:?} given back twice");
        unit.owned = unit.owned.saturating_sub(1);
        if unit.owned == 0 && !unit.handed_over {
            let pages = unit.pages;
            self.free.entry(pages).or_default().push(f.unit);
            self.free_pages += pages as usize;
        }
    }

    /// Marks the unit of `f` handed over: its frames, once given back, stay parked until
    /// [`Self::end_hand_over`].
    pub fn hand_over(&mut self, f: DevFrame) {
        if let Some(unit) = self.units.get_mut(f.unit as usize).and_then(Option::as_mut) {
            unit.handed_over = true;
        }
    }

    /// Ends the hand-over of the unit of `f`: parked, it is free now.
    pub fn end_hand_over(&mut self, f: DevFrame) {
        let Some(unit) = self.units.get_mut(f.unit as usize).and_then(Option::as_mut) else {
            debug_assert!(false, "a frame of a released unit: {f:?}");
            return;
        };
        unit.handed_over = false;
        if unit.owned == 0 {
            let pages = unit.pages;
            self.free.entry(pages).or_default().push(f.unit);
            self.free_pages += pages as usize;
        }
    }

    /// Whether the unit of `f` is handed over and every frame of it given back (for
    /// consistency checks).
    pub fn is_parked(&self, f: DevFrame) -> bool {
        self.units
            .get(f.unit as usize)
            .and_then(Option::as_ref)
            .is_some_and(|u| u.handed_over && u.owned == 0)
    }

    /// Every frame of the free units (for consistency checks).
    pub fn free_list(&self) -> Vec<DevFrame> {
        self.free
            .iter()
            .flat_map(|(&pages, units)| {
                units.iter().flat_map(move |&u| {
                    Self::frames(DevFrame { unit: u, offset: 0 }, pages as usize)
                })
            })
            .collect()
    }

    /// The physical allocation of a frame's unit (free or owned: not released) and the
    /// unit's size in pages. It is mapped whole, its first page at the frame's page less
    /// `f.offset`.
    pub fn unit(&self, f: DevFrame) -> (PhysHandle, usize) {
        let unit = self.units[f.unit as usize].expect("a frame in use is not released");
        (unit.handle, unit.pages as usize)
    }

    /// Marks the unit of `f` still mapped at other pages than its owners' (or no longer).
    pub fn set_still_mapped(&mut self, f: DevFrame, still_mapped: bool) {
        if let Some(unit) = self.units.get_mut(f.unit as usize).and_then(Option::as_mut) {
            unit.still_mapped = still_mapped;
        }
    }

    /// Releases one free unit not still mapped ([`DevUnit::still_mapped`]), the largest;
    /// false if there is none.
    fn release_one_free(&mut self, driver: &dyn Driver) -> bool {
        let units = &self.units;
        let releasable = |u: &u32| units[*u as usize].is_some_and(|x| !x.still_mapped);
        let Some((pages, i)) = self
            .free
            .iter()
            .rev()
            .find_map(|(&pages, list)| list.iter().rposition(releasable).map(|i| (pages, i)))
        else {
            return false;
        };
        let list = self.free.get_mut(&pages).expect("found above");
        let u = list.swap_remove(i);
        if list.is_empty() {
            self.free.remove(&pages);
        }
        let Some(unit) = self.units[u as usize] else {
            debug_assert!(false, "a released unit was free");
            return false;
        };
        if let Err(e) = driver.mem_release(unit.handle) {
            tracing::warn!(code = e, "cuMemRelease of a device unit failed; it is kept");
            self.free.entry(pages).or_default().push(u);
            return false;
        }
        self.free_pages -= pages as usize;
        self.units[u as usize] = None;
        self.vacant.push(u);
        self.created -= pages as usize;
        true
    }

    /// While more frames are created than the budget allows, releases free units (free units
    /// are mapped nowhere). Returns the frames given back.
    pub fn release_free_frames(&mut self, driver: &dyn Driver) -> usize {
        let before = self.created;
        while self.created > self.budget_frames {
            if !self.release_one_free(driver) {
                break;
            }
        }
        before - self.created
    }

    /// Releases every unit (all must be unmapped by now).
    pub fn release_all(&mut self, driver: &dyn Driver) {
        for unit in self.units.drain(..).flatten() {
            if let Err(e) = driver.mem_release(unit.handle) {
                tracing::warn!(code = e, "cuMemRelease of a device unit failed");
            }
        }
        self.vacant.clear();
        self.free.clear();
        self.free_pages = 0;
        self.created = 0;
    }
}

/// A cap on pinned host memory shared by several host pools: those of one process's memory
/// managers, one per device. Each pool's own window is the whole cap, so one device may use
/// all of it; together they never pin more. (Pinned memory cannot be paged out: a process
/// whose devices each pinned the default half of the host's memory could take all of it.)
#[derive(Debug)]
pub struct SharedHostCap {
    cap_bytes: usize,
    held_bytes: AtomicUsize,
}

impl SharedHostCap {
    pub const fn new(cap_bytes: usize) -> SharedHostCap {
        SharedHostCap {
            cap_bytes,
            held_bytes: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` of the cap if they fit.
    fn try_take(&self, bytes: usize) -> bool {
        self.held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&h| h <= self.cap_bytes)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        let _ = self
            .held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes))
            });
    }

    /// Bytes the pools sharing it hold or have promised.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Acquire)
    }

    /// The cap, in bytes.
    pub fn cap_bytes(&self) -> usize {
        self.cap_bytes
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
    /// A cap this pool shares with other pools of the process (`None`: its window alone).
    pub shared_cap: Option<&'static SharedHostCap>,
}

/// Takes a unit of the largest size out of free units kept by size: `(size, unit)`.
fn pop_largest(free: &mut BTreeMap<u32, Vec<u32>>) -> Option<(u32, u32)> {
    let mut entry = free.last_entry()?;
    let size = *entry.key();
    let unit = entry.get_mut().pop();
    if entry.get().is_empty() {
        entry.remove();
    }
    unit.map(|u| (size, u))
}

/// One host frame: its allocation (a single page, or a host unit shared by its frames).
#[derive(Debug, Clone, Copy)]
struct HostFrameInfo {
    handle: PhysHandle,
    /// The unit's first frame and size in pages (itself and 1 for a single frame).
    first: u32,
    pages: u32,
}

struct HostState {
    /// Frame index (its page in the host window) → the frame; `None`: nothing there.
    frames: Vec<Option<HostFrameInfo>>,
    /// Frames in existence.
    created: usize,
    /// Free single frames in address order, so the lowest are handed out first and runs of
    /// free frames can be found.
    free: BTreeSet<HostFrame>,
    /// Host units (allocations of several pages): first frame → frames owned by pages.
    unit_owned: HashMap<u32, u32>,
    /// Free host units by size in pages: their first frames.
    free_units: BTreeMap<u32, Vec<u32>>,
    /// Window pages not promised to any frame: start → length, and the untouched tail from
    /// `window_used` on.
    window_holes: BTreeMap<u32, u32>,
    window_used: u32,
    /// The cap shared with other pools, and this pool's page: every window page taken is
    /// taken from it too.
    shared_cap: Option<(&'static SharedHostCap, usize)>,
    growing: bool,
    want_grow: bool,
    /// Sizes of host units asked of the grower ([`HostPool::request_unit`]).
    wanted_units: Vec<u32>,
    shutdown: bool,
    last_error: Option<CUresult>,
}

impl HostState {
    /// Promises `pages` consecutive window pages (first fit, then the tail); their first.
    /// `None` when the window has no such run, or the cap shared with other pools no room.
    fn take_window(&mut self, pages: u32, window_pages: u32) -> Option<u32> {
        if let Some((cap, page)) = self.shared_cap {
            if !cap.try_take(pages as usize * page) {
                return None;
            }
        }
        let taken = self.take_window_run(pages, window_pages);
        if taken.is_none() {
            if let Some((cap, page)) = self.shared_cap {
                cap.give(pages as usize * page);
            }
        }
        taken
    }

    fn take_window_run(&mut self, pages: u32, window_pages: u32) -> Option<u32> {
        let hole = self
            .window_holes
            .iter()
            .find(|&(_, &len)| len >= pages)
            .map(|(&start, &len)| (start, len));
        if let Some((start, len)) = hole {
            self.window_holes.remove(&start);
            if len > pages {
                self.window_holes.insert(start + pages, len - pages);
            }
            return Some(start);
        }
        if self.window_used + pages <= window_pages {
            self.window_used += pages;
            return Some(self.window_used - pages);
        }
        None
    }

    /// Gives window pages back (coalescing with the holes around them and the tail).
    fn give_window(&mut self, start: u32, pages: u32) {
        if let Some((cap, page)) = self.shared_cap {
            cap.give(pages as usize * page);
        }
        let (mut start, mut pages) = (start, pages);
        if let Some((&s, &l)) = self.window_holes.range(..start).next_back() {
            if s + l == start {
                self.window_holes.remove(&s);
                start = s;
                pages += l;
            }
        }
        if let Some(l) = self.window_holes.remove(&(start + pages)) {
            pages += l;
        }
        if start + pages == self.window_used {
            self.window_used = start;
        } else {
            self.window_holes.insert(start, pages);
        }
    }

    /// Window pages that can still be promised: those free in the window, and no more than
    /// the cap shared with other pools has left.
    fn window_free_pages(&self, window_pages: u32) -> u32 {
        let free = self.window_unpromised_pages(window_pages);
        match self.shared_cap {
            Some((cap, page)) => {
                let left = cap.cap_bytes().saturating_sub(cap.held_bytes()) / page.max(1);
                free.min(u32::try_from(left).unwrap_or(u32::MAX))
            }
            None => free,
        }
    }

    /// Window pages no frame or unit holds or was promised.
    fn window_unpromised_pages(&self, window_pages: u32) -> u32 {
        window_pages - self.window_used + self.window_holes.values().sum::<u32>()
    }

    fn publish(&mut self, first: u32, pages: u32, handles: &[PhysHandle]) {
        let end = (first + pages) as usize;
        if self.frames.len() < end {
            self.frames.resize(end, None);
        }
        for i in 0..pages {
            let info = if handles.len() == 1 && pages > 1 {
                HostFrameInfo {
                    handle: handles[0],
                    first,
                    pages,
                }
            } else {
                HostFrameInfo {
                    handle: handles[i as usize],
                    first: first + i,
                    pages: 1,
                }
            };
            self.frames[(first + i) as usize] = Some(info);
        }
        self.created += pages as usize;
    }
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

/// The part of the host pool that pins memory, for a thread that holds none of the
/// manager's locks ([`HostPool::refill_handle`]): an operation that finds no free frame or
/// host unit lets go of the manager's lock, has this make one, and starts over.
#[derive(Clone)]
pub struct HostPoolRefill(Arc<HostShared>);

impl HostPoolRefill {
    /// Returns once `at_least` single frames are free or the pool cannot grow: waits for the
    /// grower's chunk, or grows the pool itself.
    pub fn frames(&self, at_least: usize) {
        if let Err(e) = self.0.until_frames_free(self.0.lock(), at_least) {
            tracing::debug!(?e, "no host frame to be had");
        }
    }

    /// Makes free host units of `pages` frames until `at_least` of that size are free, for
    /// the next [`HostPool::take_free_unit`]s (fewer if the window has no room or the driver
    /// refuses: the operation then takes single frames).
    pub fn unit(&self, pages: usize, at_least: usize) {
        if let Some(n) = u32::try_from(pages).ok().filter(|&n| n > 1) {
            drop(self.0.make_free_unit(self.0.lock(), n, at_least));
        }
    }
}

/// The pinned host pool. Dropping it stops the grower; [`HostPool::release_all`] frees memory.
///
/// Single frames (one allocation per page) are grown ahead of need in chunks; *host units*
/// (one allocation of several pages, whose frames are mapped at the arena together, as one
/// mapping) are made on demand for pages that leave the device together
/// ([`HostPool::take_unit`]) and kept, free, for the next request of their size.
pub struct HostPool {
    shared: Arc<HostShared>,
    grower: Option<JoinHandle<()>>,
}

impl HostShared {
    fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn window_pages(&self) -> u32 {
        (self.window_bytes / self.config.page) as u32
    }

    fn frame_va(&self, f: u32) -> CUdeviceptr {
        self.window + f as u64 * self.config.page as u64
    }

    /// Creates, maps and publishes one chunk of single frames: up to `chunk_bytes` of the
    /// window, one allocation per frame. Called with `growing` set by the caller.
    fn grow_one(&self) -> Result<(), CUresult> {
        let c = self.config;
        let first_pages = {
            let mut s = self.lock();
            let want = (c.chunk_bytes / c.page).max(1) as u32;
            let room = s.window_free_pages(self.window_pages());
            let pages = want.min(room);
            let mut got = None;
            // The largest run the window has, up to a chunk.
            let mut n = pages;
            while n > 0 {
                if let Some(first) = s.take_window(n, self.window_pages()) {
                    got = Some((first, n));
                    break;
                }
                n /= 2;
            }
            got
        };
        let Some((first, pages)) = first_pages else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        let result = self.create_frames(self.frame_va(first), pages as usize);
        let mut s = self.lock();
        match result {
            Ok(handles) => {
                s.publish(first, pages, &handles);
                s.free.extend((first..first + pages).map(HostFrame));
                s.last_error = None;
                Ok(())
            }
            Err(e) => {
                s.give_window(first, pages);
                s.last_error = Some(e);
                Err(e)
            }
        }
    }

    /// Returns (with the lock) once a single frame is free: waits for a growth in flight, or
    /// grows the pool by a chunk (the lock released meanwhile). `Err` when the cap is reached
    /// and nothing can be released, or the driver refuses.
    fn until_frames_free<'a>(
        &'a self,
        mut s: MutexGuard<'a, HostState>,
        at_least: usize,
    ) -> Result<MutexGuard<'a, HostState>, HostPoolError> {
        loop {
            if s.free.len() >= at_least.max(1) {
                return Ok(s);
            }
            if s.growing {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if s.window_free_pages(self.window_pages()) == 0 && !self.release_one_free_unit(&mut s)
            {
                return Err(HostPoolError::CapReached {
                    cap_bytes: self.window_bytes,
                });
            }
            s.growing = true;
            drop(s);
            let r = self.grow_one();
            s = self.lock();
            s.growing = false;
            self.changed.notify_all();
            r.map_err(HostPoolError::Driver)?;
        }
    }

    /// Makes free host units of `n` pages until `at_least` of them are free (waiting for a
    /// growth in flight first; the lock released while pinning). It stops early if the window
    /// has no room or the driver refuses: whoever wanted one takes single frames.
    fn make_free_unit<'a>(
        &'a self,
        mut s: MutexGuard<'a, HostState>,
        n: u32,
        at_least: usize,
    ) -> MutexGuard<'a, HostState> {
        loop {
            while s.growing {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.free_units.get(&n).map_or(0, Vec::len) >= at_least.max(1) {
                return s;
            }
            s.growing = true;
            drop(s);
            let made = self.create_unit(n);
            s = self.lock();
            s.growing = false;
            self.changed.notify_all();
            match made {
                Ok(Some(first)) => {
                    s.unit_owned.remove(&first);
                    s.free_units.entry(n).or_default().push(first);
                }
                Ok(None) => return s,
                Err(e) => {
                    tracing::debug!(code = e, pages = n, "creating a host unit failed");
                    return s;
                }
            }
        }
    }

    /// Creates one host unit of `pages` pages mapped into the window; its first frame.
    /// Called with `growing` set by the caller. `Ok(None)`: no room in the window.
    fn create_unit(&self, pages: u32) -> Result<Option<u32>, CUresult> {
        let c = self.config;
        let first = {
            let mut s = self.lock();
            let window = self.window_pages();
            match s.take_window(pages, window) {
                Some(f) => f,
                None => {
                    // Free units of other sizes go back to the driver to make room.
                    let mut found = None;
                    while found.is_none() && self.release_one_free_unit(&mut s) {
                        found = s.take_window(pages, window);
                    }
                    match found {
                        Some(f) => f,
                        None => return Ok(None),
                    }
                }
            }
        };
        let d = &*self.driver;
        let va = self.frame_va(first);
        let bytes = pages as usize * c.page;
        let made = (|| {
            let h = d.mem_create(bytes, PhysLocation::HostNuma(c.numa_node))?;
            if let Err(e) = d.mem_map(va, bytes, 0, h) {
                let _ = d.mem_release(h);
                return Err(e);
            }
            if let Err(e) = d.mem_set_access(va, bytes, c.device) {
                let _ = d.mem_unmap(va, bytes);
                let _ = d.mem_release(h);
                return Err(e);
            }
            Ok(h)
        })();
        let mut s = self.lock();
        match made {
            Ok(h) => {
                s.publish(first, pages, &[h]);
                s.unit_owned.insert(first, pages);
                Ok(Some(first))
            }
            Err(e) => {
                s.give_window(first, pages);
                Err(e)
            }
        }
    }

    /// Releases one free host unit (the largest) and gives its window pages back; false if
    /// none is free.
    fn release_one_free_unit(&self, s: &mut HostState) -> bool {
        let Some((pages, first)) = pop_largest(&mut s.free_units) else {
            return false;
        };
        let Some(info) = s.frames[first as usize] else {
            return false;
        };
        let bytes = pages as usize * self.config.page;
        let d = &*self.driver;
        if let Err(e) = d
            .mem_unmap(self.frame_va(first), bytes)
            .and_then(|()| d.mem_release(info.handle))
        {
            tracing::warn!(code = e, "releasing a free host unit failed; it is kept");
            s.free_units.entry(pages).or_default().push(first);
            return false;
        }
        for i in first..first + pages {
            s.frames[i as usize] = None;
        }
        s.unit_owned.remove(&first);
        s.created -= pages as usize;
        s.give_window(first, pages);
        true
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

    /// Has the grower make a free unit of `n` pages, unless it was asked already.
    fn want_unit(&self, s: &mut HostState, n: u32) {
        if !s.wanted_units.contains(&n) {
            s.wanted_units.push(n);
            self.changed.notify_all();
        }
    }

    fn grower_loop(self: Arc<Self>) {
        let mut s = self.lock();
        loop {
            while !s.shutdown && ((!s.want_grow && s.wanted_units.is_empty()) || s.growing) {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.shutdown {
                return;
            }
            // Host units asked for first: an eviction ahead of need waits for one.
            if let Some(n) = s.wanted_units.pop() {
                s = self.make_free_unit(s, n, 1);
                continue;
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
        let window_bytes = (config.cap_bytes / config.page).min(u32::MAX as usize) * config.page;
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
                created: 0,
                free: BTreeSet::new(),
                unit_owned: HashMap::new(),
                free_units: BTreeMap::new(),
                window_holes: BTreeMap::new(),
                window_used: 0,
                shared_cap: config.shared_cap.map(|c| (c, config.page)),
                growing: false,
                want_grow: config.background && window_bytes > 0,
                wanted_units: Vec::new(),
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

    /// A handle through which a thread holding none of the manager's locks makes what
    /// [`Self::try_take`] and [`Self::take_free_unit`] could not give (growing the pool pins
    /// memory: about 0.5 ms per page on the H100).
    pub fn refill_handle(&self) -> HostPoolRefill {
        HostPoolRefill(self.shared.clone())
    }

    /// A free single host frame, without waiting or growing the pool here: `Ok(None)` when
    /// none is free but the pool can grow (the grower is asked to; [`HostPoolRefill::frames`]
    /// makes sure of it), `Err` when the cap is reached and nothing can be released.
    pub fn try_take(&self) -> Result<Option<HostFrame>, HostPoolError> {
        let sh = &self.shared;
        let mut s = sh.lock();
        let can_grow = sh.window_pages() > 0
            && (s.window_free_pages(sh.window_pages()) > 0 || !s.free_units.is_empty());
        if let Some(f) = s.free.pop_first() {
            if s.free.len() < sh.config.low_water_frames && sh.config.background && can_grow {
                s.want_grow = true;
                sh.changed.notify_all();
            }
            return Ok(Some(f));
        }
        if !can_grow && !s.growing {
            return Err(HostPoolError::CapReached {
                cap_bytes: sh.window_bytes,
            });
        }
        if sh.config.background {
            s.want_grow = true;
            sh.changed.notify_all();
        }
        Ok(None)
    }

    /// Whether the pool grows on a background thread.
    pub fn grows_in_background(&self) -> bool {
        self.shared.config.background
    }

    /// Free single frames (not counting free units).
    pub fn free_single_frames(&self) -> usize {
        self.shared.lock().free.len()
    }

    /// Asks the grower for a free host unit of `pages` frames (for the next
    /// [`Self::take_free_unit`] of that size); false if there is no grower.
    pub fn request_unit(&self, pages: usize) -> bool {
        let sh = &self.shared;
        let Some(n) = u32::try_from(pages).ok().filter(|&n| n > 1) else {
            return false;
        };
        if !sh.config.background {
            return false;
        }
        sh.want_unit(&mut sh.lock(), n);
        true
    }

    /// How many host units of `pages` frames are free.
    pub fn free_units(&self, pages: usize) -> usize {
        let Ok(n) = u32::try_from(pages) else {
            return 0;
        };
        self.shared.lock().free_units.get(&n).map_or(0, Vec::len)
    }

    /// A free host unit of `pages` frames (its first), never making one. Taking the last
    /// free unit of its size asks the grower for another, where the window has room for it
    /// without giving back units of other sizes: the next eviction of that size then finds
    /// one instead of pinning it on its own thread (356 µs per 2 MiB page on the H100). The
    /// plans' swap-out worker pinned 20 to 40 pages an iteration that way in ResNet-50's
    /// rerun at 30% of its peak, long after the first iterations.
    pub fn take_free_unit(&self, pages: usize) -> Option<HostFrame> {
        let n = u32::try_from(pages).ok().filter(|&n| n > 1)?;
        let sh = &self.shared;
        let mut s = sh.lock();
        let first = s.free_units.get_mut(&n).and_then(Vec::pop)?;
        s.free_units.retain(|_, v| !v.is_empty());
        s.unit_owned.insert(first, n);
        if sh.config.background
            && !s.free_units.contains_key(&n)
            && s.window_free_pages(sh.window_pages()) >= n
        {
            sh.want_unit(&mut s, n);
        }
        Some(HostFrame(first))
    }

    /// A free single host frame; grows the pool synchronously only if it is empty.
    pub fn take(&self) -> Result<HostFrame, HostPoolError> {
        let sh = &self.shared;
        let mut s = sh.until_frames_free(sh.lock(), 1)?;
        let f = s.free.pop_first().expect("a frame is free");
        if s.free.len() < sh.config.low_water_frames
            && sh.config.background
            && s.window_free_pages(sh.window_pages()) > 0
        {
            s.want_grow = true;
            sh.changed.notify_all();
        }
        Ok(f)
    }

    /// A host unit of `pages` frames (its first; the others follow it): a free one of that
    /// size, or a new one (pinned now, synchronously: about 0.4 ms per page on the H200).
    /// `None` when none can be had (no room under the cap, or the driver refused): the caller
    /// then takes single frames.
    pub fn take_unit(&self, pages: usize) -> Option<HostFrame> {
        if let Some(first) = self.take_free_unit(pages) {
            return Some(first);
        }
        let n = u32::try_from(pages).ok().filter(|&n| n > 1)?;
        drop(self.shared.make_free_unit(self.shared.lock(), n, 1));
        // (Only the manager takes frames, under its own lock: what was made is still free.)
        self.take_free_unit(pages)
    }

    /// Gives a page's frame back: a single frame is free at once; a unit once every frame
    /// of it is back (it is mapped at the arena nowhere by then).
    pub fn give(&self, f: HostFrame) {
        let mut s = self.shared.lock();
        let Some(info) = s.frames.get(f.0 as usize).copied().flatten() else {
            debug_assert!(false, "give of an unknown host frame {f:?}");
            return;
        };
        if info.pages == 1 {
            s.free.insert(f);
            return;
        }
        let Some(owned) = s.unit_owned.get_mut(&info.first) else {
            debug_assert!(false, "{f:?} of a free host unit given back");
            return;
        };
        *owned = owned.saturating_sub(1);
        if *owned == 0 {
            s.unit_owned.remove(&info.first);
            s.free_units.entry(info.pages).or_default().push(info.first);
        }
    }

    /// The host unit of a frame, as its first frame and size in pages (a single frame is a
    /// unit of one page).
    pub fn unit_of(&self, f: HostFrame) -> (HostFrame, usize) {
        let s = self.shared.lock();
        match s.frames.get(f.0 as usize).copied().flatten() {
            Some(info) => (HostFrame(info.first), info.pages as usize),
            None => (f, 1),
        }
    }

    /// Trades `held` (single frames taken for one batch of consecutive pages) for as many
    /// free single frames in as few runs of consecutive frames as it finds, in address
    /// order: a batch of pages copied into a run of frames is one copy. Looks at a bounded
    /// number of free frames, so a fragmented pool costs little. `held` comes back sorted.
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
        self.shared.frame_va(f.0)
    }

    /// The physical allocation of a frame's unit (to map it, whole, at the arena page of the
    /// unit's first frame).
    pub fn location(&self, f: HostFrame) -> (PhysHandle, usize) {
        let s = self.shared.lock();
        let info = s.frames[f.0 as usize].expect("a host frame in use exists");
        (info.handle, 0)
    }

    /// Bytes of pinned memory created so far.
    pub fn size_bytes(&self) -> usize {
        self.shared.lock().created * self.shared.config.page
    }

    /// Free single frames and frames of free units.
    pub fn free_frames(&self) -> usize {
        let s = self.shared.lock();
        s.free.len()
            + s.free_units
                .iter()
                .map(|(&p, v)| p as usize * v.len())
                .sum::<usize>()
    }

    /// The free frames (singles and those of free units) and the number of frames created
    /// (for consistency checks).
    pub fn free_list(&self) -> (Vec<HostFrame>, usize) {
        let s = self.shared.lock();
        let mut out: Vec<HostFrame> = s.free.iter().copied().collect();
        for (&pages, firsts) in &s.free_units {
            for &f in firsts {
                out.extend((f..f + pages).map(HostFrame));
            }
        }
        (out, s.created)
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

    /// Stops the grower, unmaps the window and releases every allocation. No frame may be
    /// mapped at an arena page any more.
    pub fn release_all(&mut self) {
        self.stop_grower();
        let sh = &self.shared;
        let mut s = sh.lock();
        let page = sh.config.page;
        let frames = std::mem::take(&mut s.frames);
        for (i, info) in frames.into_iter().enumerate() {
            let Some(info) = info.filter(|info| info.first as usize == i) else {
                continue;
            };
            let bytes = info.pages as usize * page;
            if let Err(e) = sh.driver.mem_unmap(sh.frame_va(info.first), bytes) {
                tracing::warn!(code = e, "cuMemUnmap of the host window failed");
            }
            if let Err(e) = sh.driver.mem_release(info.handle) {
                tracing::warn!(code = e, "cuMemRelease of host memory failed");
            }
        }
        s.free.clear();
        s.free_units.clear();
        s.unit_owned.clear();
        s.created = 0;
        // The whole window goes: what it had promised goes back to the shared cap.
        let window_pages = sh.window_pages();
        let promised = window_pages - s.window_unpromised_pages(window_pages);
        if let Some((cap, page)) = s.shared_cap.take() {
            cap.give(promised as usize * page);
        }
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::memory::fake::{FakeConfig, FakeDriver, Progress};

    const PAGE: usize = 2 << 20;

    fn pool(window_pages: usize) -> HostPool {
        pool_with(window_pages, true, None)
    }

    fn pool_with(
        window_pages: usize,
        background: bool,
        shared_cap: Option<&'static SharedHostCap>,
    ) -> HostPool {
        let fake = Arc::new(FakeDriver::new(FakeConfig {
            device_capacity: 1 << 40,
            host_capacity: 1 << 40,
            progress: Progress::Immediate,
        }));
        HostPool::new(
            fake,
            HostPoolConfig {
                page: PAGE,
                device: 0,
                numa_node: 0,
                cap_bytes: window_pages * PAGE,
                chunk_bytes: PAGE,
                low_water_frames: 0,
                background,
                shared_cap,
            },
        )
        .unwrap()
    }

    /// A pool of `window_pages` that grows only when asked, sharing `cap` with others.
    fn pool_sharing(window_pages: usize, cap: &'static SharedHostCap) -> HostPool {
        pool_with(window_pages, false, Some(cap))
    }

    #[test]
    fn pools_that_share_a_cap_never_pin_more_than_it_together() {
        // Two devices' pools, each of which could hold 8 pages, under a process cap of 5.
        let cap: &'static SharedHostCap = Box::leak(Box::new(SharedHostCap::new(5 * PAGE)));
        let mut a = pool_sharing(8, cap);
        let b = pool_sharing(8, cap);
        let from_a: Vec<HostFrame> = (0..3).map(|_| a.take().expect("under the cap")).collect();
        for _ in 0..2 {
            b.take().expect("under the cap");
        }
        assert_eq!(cap.held_bytes(), 5 * PAGE);
        assert!(
            matches!(b.take(), Err(HostPoolError::CapReached { .. })),
            "b's own window has room, the process's cap has none"
        );
        assert!(matches!(a.take(), Err(HostPoolError::CapReached { .. })));
        // A frame given back stays pinned in its pool: taken again there, not by the other.
        a.give(from_a[0]);
        assert!(matches!(b.take(), Err(HostPoolError::CapReached { .. })));
        assert!(a.take().is_ok());
        // A pool that lets its memory go gives its share back to the others.
        a.release_all();
        assert_eq!(cap.held_bytes(), 2 * PAGE);
        assert_eq!(
            (0..3).filter(|_| b.take().is_ok()).count(),
            3,
            "b grows into what a gave back"
        );
        assert_eq!(cap.held_bytes(), 5 * PAGE);
        assert!(matches!(b.take(), Err(HostPoolError::CapReached { .. })));
    }

    /// Waits (up to 5 s) until `pool` has `n` free units of `pages`.
    fn free_units_reach(pool: &HostPool, pages: usize, n: usize) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if pool.free_units(pages) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn taking_the_last_free_unit_of_a_size_has_the_grower_make_another() {
        let pool = pool(64);
        assert!(pool.request_unit(4));
        assert!(free_units_reach(&pool, 4, 1));
        let first = pool.take_free_unit(4).expect("the unit asked for");
        assert!(
            free_units_reach(&pool, 4, 1),
            "a spare of the size just taken is made in the background"
        );
        // The first unit back makes two free: taking one of them asks for nothing.
        for i in 0..4 {
            pool.give(HostFrame(first.0 + i));
        }
        assert_eq!(pool.free_units(4), 2);
        assert!(pool.take_free_unit(4).is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.free_units(4), 1, "one left free: no spare asked");
    }

    #[test]
    fn no_spare_is_made_where_the_window_has_no_room_for_it() {
        // A window of 6 pages: one unit of 4 fits, a second does not.
        let pool = pool(6);
        assert!(pool.request_unit(4));
        assert!(free_units_reach(&pool, 4, 1));
        assert!(pool.take_free_unit(4).is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.free_units(4), 0);
        // (The grower's first chunk of single frames is a page.)
        assert!(pool.size_bytes() <= 5 * PAGE, "{}", pool.size_bytes());
    }
}
