//! A simulated card shared by processes (`TENSILE_SIM_CARD=NAME`): its capacity, its engines
//! and who holds how much of its memory live in one shared-memory file,
//! `/dev/shm/tensile-sim-<uid>-<NAME>`, so that jobs naming the same card compete for it as
//! they would for one GPU. With several simulated devices (`TENSILE_SIM_DEVICE_COUNT`), device
//! `d` > 0 is card `NAME.d` ([`device_card_name`]).
//!
//! # Layout ([`Segment`])
//! A header (magic, layout version, segment size), a process-shared robust mutex, and the
//! state it guards ([`CardState`]): the capacity in bytes, the engines' busy-until times
//! ([`Engines`], `CLOCK_MONOTONIC`, which every process reads alike) and a table of the
//! processes on the card, each `(pid, start time, device bytes charged)`. The card's used
//! memory is the sum of the table, so no total can disagree with it.
//!
//! # Opening
//! The file is created with `O_EXCL` and mode 0600 by the first process; every process (the
//! creator too) then takes an exclusive `flock` on it and, holding it, either initialises the
//! segment (the file is empty, or its magic is still zero: its creator died before finishing,
//! since the magic is written last and creators initialise under the same `flock`) or checks
//! the magic and version of the one there. A file that is not a card, or a card of another
//! layout version, is refused with one line naming it (cuInit fails with
//! `CUDA_ERROR_NO_DEVICE`); it is not overwritten, because a process of another simulator may be
//! using it. A file another user owns, or others may read, is refused the same way.
//!
//! # Joining, and processes that die
//! A joiner (under the `flock`) first sweeps the table: an entry whose process is gone
//! (`kill(pid, 0)` fails with `ESRCH`, it is a zombie, or its start time, field 22 of
//! `/proc/PID/stat`, differs: the pid was reused) is cleared, which gives its bytes back. If
//! no process is left, the card is stale and starts over: the joiner's capacity, idle engines.
//! Otherwise a joiner whose `TENSILE_SIM_DEVICE_MEMORY` differs says so in one line and uses
//! the card's. A process that finds the card full sweeps the same way before it fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`; `cuMemGetInfo` sweeps too, at most every 100 ms. A process
//! that exits normally leaves the table at exit. The file itself stays: a stale one is simply
//! reused.
//!
//! # The lock
//! A `pthread` mutex in the segment, `PTHREAD_PROCESS_SHARED` and `PTHREAD_MUTEX_ROBUST`: when
//! its holder dies, the next locker gets `EOWNERDEAD` and marks it consistent. That is sound
//! because every critical section writes fields that each stand alone (a busy-until time, one
//! entry's byte count; an entry half-written by a dying registrant has that process's pid and
//! is swept like it), so whatever a dead holder left is a state the card can be in. Critical
//! sections are a few integers long; the `/proc` reads of a sweep happen outside the lock.
//!
//! Processes on one card must share a pid namespace. Each prices its own copies with its own
//! rates (`TENSILE_SIM_TIMING` and the like): give every process on a card the same ones.

use std::cell::UnsafeCell;
use std::ffi::CString;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use tensile_driver_abi::*;

use crate::card::{self, Engines, MAX_KERNEL_SLOTS};

/// "TSIMCARD", little-endian: the first word of every card file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSIMCARD");
/// The layout version; a file of another version is refused.
pub const VERSION: u32 = 1;
/// The most processes one card holds at once.
pub const MAX_PROCESSES: usize = 64;

/// How often `cuMemGetInfo` may sweep dead processes off the card.
const INFO_SWEEP_INTERVAL_NS: u64 = 100_000_000;

/// One process on the card (`pid` 0: a free slot).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ProcessEntry {
    pid: i32,
    _pad: u32,
    /// Field 22 of `/proc/PID/stat`: tells a reused pid from the process that registered.
    start_time: u64,
    /// Device bytes this process has charged to the card.
    bytes: u64,
}

/// What the card's lock guards.
#[repr(C)]
pub struct CardState {
    capacity: u64,
    pub engines: Engines,
    processes: [ProcessEntry; MAX_PROCESSES],
}

impl CardState {
    fn used(&self) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.pid != 0)
            .fold(0u64, |sum, p| sum.saturating_add(p.bytes))
    }
}

/// The shared file's contents. The header words are at fixed offsets (0, 8, 12) in every
/// version, so that any version can read them.
#[repr(C)]
struct Segment {
    magic: AtomicU64,
    version: AtomicU32,
    size: AtomicU32,
    lock: UnsafeCell<libc::pthread_mutex_t>,
    state: UnsafeCell<CardState>,
}

const SEGMENT_SIZE: usize = std::mem::size_of::<Segment>();

// SAFETY: the segment is only touched through atomics (the header) and under its
// process-shared mutex (`state`); the mutex itself is made for concurrent use.
unsafe impl Sync for Segment {}

/// This process's handle on a shared card.
pub struct SharedCard {
    segment: &'static Segment,
    path: String,
    capacity: u64,
    slot: usize,
    pid: i32,
    start_time: u64,
    last_info_sweep_ns: AtomicU64,
}

impl std::fmt::Debug for SharedCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCard")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .field("slot", &self.slot)
            .finish()
    }
}

/// The card state, locked.
struct Locked<'a> {
    segment: &'a Segment,
}

impl Deref for Locked<'_> {
    type Target = CardState;
    fn deref(&self) -> &CardState {
        // SAFETY: the mutex is held for the guard's lifetime, so no other thread or process
        // touches the state meanwhile; the segment is mapped for the process's lifetime.
        unsafe { &*self.segment.state.get() }
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut CardState {
        // SAFETY: as in `deref`; the guard is borrowed mutably, so this is the only reference.
        unsafe { &mut *self.segment.state.get() }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: this thread locked the initialised mutex when the guard was made.
        unsafe { libc::pthread_mutex_unlock(self.segment.lock.get()) };
    }
}

fn lock(segment: &Segment) -> Locked<'_> {
    let mutex = segment.lock.get();
    // SAFETY: the mutex was initialised (process-shared, robust) before the magic was
    // published, and the segment stays mapped for the process's lifetime.
    let rc = unsafe { libc::pthread_mutex_lock(mutex) };
    match rc {
        0 => {}
        libc::EOWNERDEAD => {
            // Every field stands alone (module doc), so the state is usable as it is.
            // SAFETY: this thread owns the mutex now (EOWNERDEAD means it was acquired).
            unsafe { libc::pthread_mutex_consistent(mutex) };
            eprintln!(
                "tensile-simgpu: a process died holding the shared card's lock; taking the card \
                 as it left it"
            );
        }
        // Unreachable: the only way to make a robust mutex unrecoverable is to unlock it
        // without `pthread_mutex_consistent` after EOWNERDEAD, which the arm above never does.
        e => panic!(
            "the shared card's lock failed: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
    Locked { segment }
}

static CARDS: OnceLock<Vec<&'static SharedCard>> = OnceLock::new();

/// The shared card of `device` this process joined at `cuInit`, if any.
pub fn current(device: usize) -> Option<&'static SharedCard> {
    CARDS.get().and_then(|cards| cards.get(device)).copied()
}

/// The card name of `device` on card `name`: device 0's is the name itself (so processes
/// with one device and with several share it), device `d`'s is `NAME.d`.
pub fn device_card_name(name: &str, device: usize) -> String {
    if device == 0 {
        name.to_string()
    } else {
        format!("{name}.{device}")
    }
}

/// Opens (or creates) the cards of `devices` devices on card `name` and joins them;
/// `capacity` is this process's `TENSILE_SIM_DEVICE_MEMORY`, used for a card it creates. The
/// error is one line naming the file and the cause.
pub fn join(name: &str, devices: usize, capacity: u64) -> Result<Vec<&'static SharedCard>, String> {
    if let Some(cards) = CARDS.get() {
        return Ok(cards.clone());
    }
    let mut cards: Vec<&'static SharedCard> = Vec::with_capacity(devices);
    for device in 0..devices {
        match SharedCard::open(&device_card_name(name, device), capacity) {
            Ok(card) => cards.push(Box::leak(Box::new(card))),
            Err(why) => {
                for card in cards {
                    card.leave();
                }
                return Err(why);
            }
        }
    }
    let _ = CARDS.set(cards);
    // SAFETY: `leave_at_exit` is an `extern "C" fn()` that catches any panic.
    unsafe { libc::atexit(leave_at_exit) };
    Ok(CARDS.get().cloned().unwrap_or_default())
}

extern "C" fn leave_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        for card in CARDS.get().into_iter().flatten() {
            card.leave();
        }
    });
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn os_error(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

/// The path of card `name` for this user.
pub fn path_of(name: &str) -> String {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    format!("/dev/shm/tensile-sim-{uid}-{name}")
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != ".."
}

/// `(state, start time)` of process `pid` from `/proc/PID/stat`, or None if it has none.
fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the
    // last ')'. Field 3 is the state, field 22 the start time.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process that registered as `(pid, start_time)` is still running.
fn alive(pid: i32, start_time: u64) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 && errno() == libc::ESRCH {
        return false;
    }
    match proc_stat(pid) {
        Some((state, start)) => start == start_time && !matches!(state, 'Z' | 'X' | 'x'),
        None => false,
    }
}

/// Reads up to the header's 16 bytes at the start of `fd` (missing bytes read as zero).
fn read_header(fd: &OwnedFd) -> Result<(u64, u32, u32), String> {
    let mut buf = [0u8; 16];
    // SAFETY: `buf` is valid for 16 bytes of writes; `fd` is open.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(format!("cannot read it: {}", os_error(errno())));
    }
    let word = |at: usize, len: usize| {
        buf[at..at + len]
            .iter()
            .rev()
            .fold(0u64, |v, &b| v << 8 | b as u64)
    };
    Ok((word(0, 8), word(8, 4) as u32, word(12, 4) as u32))
}

fn file_size(fd: &OwnedFd) -> Result<(u64, libc::stat), String> {
    // SAFETY: an all-zero `stat` is a valid out-value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("cannot stat it: {}", os_error(errno())));
    }
    Ok((st.st_size as u64, st))
}

/// Opens the card file, creating it (mode 0600) if it does not exist.
fn open_file(path: &str) -> Result<OwnedFd, String> {
    let c_path = CString::new(path).map_err(|_| "the path holds a NUL byte".to_string())?;
    let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    loop {
        // SAFETY: a valid NUL-terminated path; plain flags.
        let fd =
            unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL, 0o600) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        if errno() != libc::EEXIST {
            return Err(format!("cannot create it: {}", os_error(errno())));
        }
        // SAFETY: as above.
        let fd = unsafe { libc::open(c_path.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        if errno() != libc::ENOENT {
            return Err(format!("cannot open it: {}", os_error(errno())));
        }
        // Removed between the two opens: create it again.
    }
}

/// Maps the (right-sized) card file.
fn map(fd: &OwnedFd) -> Result<&'static Segment, String> {
    // SAFETY: a shared mapping of a file this process opened, placed by the kernel; it is
    // never unmapped, so the reference below lives as long as the process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SEGMENT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map it: {}", os_error(errno())));
    }
    // SAFETY: page-aligned (so aligned for `Segment`), SEGMENT_SIZE bytes, mapped for good.
    Ok(unsafe { &*(p as *const Segment) })
}

/// Writes a fresh card into the mapped segment and publishes it (magic last).
fn initialise(segment: &'static Segment, capacity: u64) -> Result<(), String> {
    let raw = segment as *const Segment as *mut Segment;
    // SAFETY: the caller holds the file's flock and the magic is not yet published, so no
    // other process uses the segment; all-zero bytes are a valid `CardState` (and the
    // header's atomics), and the mutex is initialised below before any use.
    unsafe {
        std::ptr::write_bytes(raw.cast::<u8>(), 0, SEGMENT_SIZE);
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        let mut rc = libc::pthread_mutexattr_init(&mut attr);
        if rc == 0 {
            rc = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        }
        if rc == 0 {
            rc = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        }
        if rc == 0 {
            rc = libc::pthread_mutex_init(segment.lock.get(), &attr);
        }
        libc::pthread_mutexattr_destroy(&mut attr);
        if rc != 0 {
            return Err(format!("cannot make its lock: {}", os_error(rc)));
        }
        (*segment.state.get()).capacity = capacity;
    }
    segment.version.store(VERSION, Ordering::Relaxed);
    segment.size.store(SEGMENT_SIZE as u32, Ordering::Relaxed);
    segment.magic.store(MAGIC, Ordering::Release);
    Ok(())
}

/// Maps the card in `fd` (the caller holds its flock), initialising it if it is new or its
/// creator died before finishing.
fn map_card(fd: &OwnedFd, capacity: u64) -> Result<&'static Segment, String> {
    let (size, st) = file_size(fd)?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if st.st_uid != uid {
        return Err(format!("it belongs to uid {}, not {uid}", st.st_uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(format!(
            "its mode is {:o}; a card is private to its user (0600)",
            st.st_mode & 0o777
        ));
    }
    let (magic, version, header_size) = read_header(fd)?;
    if magic == 0 {
        let len = libc::off_t::try_from(SEGMENT_SIZE).map_err(|_| "segment too large")?;
        // SAFETY: `fd` is open for writing.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(format!("cannot size it: {}", os_error(errno())));
        }
        let segment = map(fd)?;
        initialise(segment, capacity)?;
        return Ok(segment);
    }
    if magic != MAGIC {
        return Err("it is not a simulated card (wrong magic); remove it".into());
    }
    if version == VERSION && header_size as usize == SEGMENT_SIZE && size != SEGMENT_SIZE as u64 {
        return Err(format!(
            "it is {size} bytes, a card of this version {SEGMENT_SIZE}; remove it once no \
             process uses it"
        ));
    }
    if version != VERSION || header_size as usize != SEGMENT_SIZE {
        return Err(format!(
            "it is a card of layout version {version} ({header_size} bytes), this simulator \
             makes version {VERSION} ({SEGMENT_SIZE} bytes); remove it once no process uses it"
        ));
    }
    let segment = map(fd)?;
    // Pairs with the creator's release store (the flock orders them already).
    segment.magic.load(Ordering::Acquire);
    Ok(segment)
}

/// Clears the entries of `segment` whose processes are gone, except slot `keep`; returns
/// how many. The `/proc` reads happen without the lock.
fn sweep(segment: &Segment, keep: Option<usize>) -> usize {
    let entries: Vec<(usize, ProcessEntry)> = lock(segment)
        .processes
        .iter()
        .enumerate()
        .filter(|&(i, p)| p.pid != 0 && Some(i) != keep)
        .map(|(i, p)| (i, *p))
        .collect();
    let dead: Vec<(usize, ProcessEntry)> = entries
        .into_iter()
        .filter(|(_, p)| !alive(p.pid, p.start_time))
        .collect();
    if dead.is_empty() {
        return 0;
    }
    let mut state = lock(segment);
    let mut cleared = 0;
    for (i, was) in dead {
        let entry = &mut state.processes[i];
        if entry.pid == was.pid && entry.start_time == was.start_time {
            *entry = ProcessEntry::default();
            cleared += 1;
        }
    }
    cleared
}

/// Takes `fd`'s exclusive flock. Closing the descriptor does not drop it while the file is
/// mapped (the mapping holds the open file too): [`unlock_file`] does.
fn flock_exclusive(fd: &OwnedFd) -> Result<(), String> {
    loop {
        // SAFETY: `fd` is open.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        if errno() != libc::EINTR {
            return Err(format!("cannot lock it: {}", os_error(errno())));
        }
    }
}

/// Drops `fd`'s flock.
fn unlock_file(fd: &OwnedFd) {
    // SAFETY: `fd` is open; unlocking cannot harm anything.
    unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_UN) };
}

impl SharedCard {
    fn open(name: &str, capacity: u64) -> Result<SharedCard, String> {
        if !valid_name(name) {
            return Err(format!(
                "TENSILE_SIM_CARD={name:?} is not a card name (letters, digits, '.', '_', '-')"
            ));
        }
        let path = path_of(name);
        let fd = open_file(&path).map_err(|e| format!("shared card {path}: {e}"))?;
        flock_exclusive(&fd).map_err(|e| format!("shared card {path}: {e}"))?;
        let joined = Self::join_locked(&fd, path, capacity);
        unlock_file(&fd);
        joined
    }

    /// Maps and joins the card in `fd`, whose flock the caller holds.
    fn join_locked(fd: &OwnedFd, path: String, capacity: u64) -> Result<SharedCard, String> {
        let in_file = |e: String| format!("shared card {path}: {e}");
        let segment = map_card(fd, capacity).map_err(in_file)?;
        let start_time = proc_stat(std::process::id() as i32)
            .map(|(_, start)| start)
            .ok_or_else(|| in_file("cannot read /proc/self/stat".into()))?;
        let pid = std::process::id() as i32;
        // Registration happens only under the flock, so after this sweep the live entries
        // stay live ones (or die, which later sweeps see) until this process is in.
        sweep(segment, None);
        let mut state = lock(segment);
        if state.processes.iter().all(|p| p.pid == 0) {
            // Stale (every process gone) or new: it starts over with this process's settings.
            state.capacity = capacity;
            state.engines.compute = [0; MAX_KERNEL_SLOTS];
            state.engines.to_device = 0;
            state.engines.to_host = 0;
        } else if state.capacity != capacity {
            eprintln!(
                "tensile-simgpu: shared card {path} has {} of device memory, not the {} of \
                 TENSILE_SIM_DEVICE_MEMORY; using the card's",
                human(state.capacity),
                human(capacity)
            );
        }
        let slot = state
            .processes
            .iter()
            .position(|p| p.pid == 0)
            .ok_or_else(|| in_file(format!("it has {MAX_PROCESSES} processes already")))?;
        state.processes[slot] = ProcessEntry {
            pid,
            _pad: 0,
            start_time,
            bytes: 0,
        };
        let card_capacity = state.capacity;
        drop(state);
        Ok(SharedCard {
            segment,
            path,
            capacity: card_capacity,
            slot,
            pid,
            start_time,
            last_info_sweep_ns: AtomicU64::new(0),
        })
    }

    /// The card's file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The card's capacity (fixed while any process is on it).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn own<'a>(&self, state: &'a mut Locked<'_>) -> Option<&'a mut ProcessEntry> {
        let entry = &mut state.processes[self.slot];
        (entry.pid == self.pid && entry.start_time == self.start_time).then_some(entry)
    }

    /// Charges `bytes` of device memory to this process, or `CUDA_ERROR_OUT_OF_MEMORY` if the
    /// card cannot hold them once the processes that died are swept off.
    pub fn charge(&self, bytes: u64) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        for attempt in 0..2 {
            if attempt == 1 && sweep(self.segment, Some(self.slot)) == 0 {
                break;
            }
            let mut state = lock(self.segment);
            let fits = state
                .used()
                .checked_add(bytes)
                .is_some_and(|total| total <= state.capacity);
            // A process that left the card (at exit) charges nothing more.
            let Some(entry) = self.own(&mut state) else {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            };
            if fits {
                entry.bytes += bytes;
                return Ok(());
            }
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Gives back `bytes` this process charged.
    pub fn uncharge(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut state = lock(self.segment);
        if let Some(entry) = self.own(&mut state) {
            entry.bytes = entry.bytes.saturating_sub(bytes);
        }
    }

    /// Device bytes free on the card (capacity less every process's charges), after sweeping
    /// dead processes if the last sweep for this is 100 ms old.
    pub fn free_bytes(&self) -> u64 {
        let now = card::now_ns();
        let last = self.last_info_sweep_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= INFO_SWEEP_INTERVAL_NS
            && self
                .last_info_sweep_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            sweep(self.segment, Some(self.slot));
        }
        let state = lock(self.segment);
        state.capacity.saturating_sub(state.used())
    }

    /// Runs `f` on the card's engines, under its lock.
    pub fn with_engines<R>(&self, f: impl FnOnce(&mut Engines) -> R) -> R {
        let mut state = lock(self.segment);
        f(&mut state.engines)
    }

    /// Leaves the card (at exit): this process's bytes go back to it.
    pub fn leave(&self) {
        let mut state = lock(self.segment);
        if let Some(entry) = self.own(&mut state) {
            *entry = ProcessEntry::default();
        }
    }

    /// Takes the card's lock and never returns: for tests of a process killed while holding it.
    pub fn hang_holding_lock(&self) -> ! {
        let _state = lock(self.segment);
        loop {
            std::thread::park();
        }
    }
}

/// `bytes` in binary units, for messages.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_alive_and_a_wrong_start_time_as_dead() {
        let pid = std::process::id() as i32;
        let (state, start) = proc_stat(pid).expect("own stat");
        assert_ne!(state, 'Z');
        assert!(alive(pid, start));
        assert!(
            !alive(pid, start + 1),
            "a reused pid is not the registered process"
        );
    }

    #[test]
    fn card_names_are_plain_file_names() {
        assert!(valid_name("job-a_1.x"));
        for bad in ["", ".", "..", "a/b", "a b", "ä"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_header_sits_at_fixed_offsets() {
        assert_eq!(std::mem::offset_of!(Segment, magic), 0);
        assert_eq!(std::mem::offset_of!(Segment, version), 8);
        assert_eq!(std::mem::offset_of!(Segment, size), 12);
        assert!(SEGMENT_SIZE < u32::MAX as usize);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
