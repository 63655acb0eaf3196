//! The shared-memory segment of one GPU and user: its layout, its name, and opening it with
//! every check a job or `tensile status` makes before trusting it.
//!
//! Layout (all little-endian, all fields atomics; docs/coordinator.md has the tables):
//!
//! ```text
//! [ Header: 256 B ][ JobSlot x slot_count: 1024 B each ][ pad to 4 KiB ]
//! [ event ring x slot_count: ring_bytes each ][ command area x slot_count: command_bytes each ]
//! ```
//!
//! Invariants:
//! - The coordinator initializes everything, then stores the magic with `Release`; a reader
//!   loads the magic with `Acquire` first and trusts nothing of a segment whose magic is not
//!   [`SEGMENT_MAGIC`].
//! - The magic and the layout version keep their offsets (0 and 8) in every version, so any
//!   version can tell any other that it is not the one it speaks.
//! - The geometry in the header is checked against the file's size and fixed limits before
//!   anything past the header is touched; afterwards every offset is computed from the
//!   checked geometry, never read from the segment.
//! - Every byte of the mapping is accessed through atomics, so a peer that writes garbage (or
//!   dies mid-write) cannot make this process's reads undefined, only wrong; readers validate
//!   what they read.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::process::{monotonic_ns, ProcessIdentity};
use crate::shm::{self, Access, Mapping, ShmFile, ShmMetadata};
use crate::slot::{JobSlot, JobSnapshot, SLOT_BYTES};

/// `TNSLSHM\0` read as a little-endian u64.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"TNSLSHM\0");

/// The layout this crate creates and reads; bumped on any incompatible change.
///
/// Fields taken from a slot's reserved bytes (which every segment of this version holds at
/// zero) do not bump it when 0 means "not said" and each side works without the other's:
/// `page_bytes`, `took_from`, and the rooms (`room_asked`, `room_in_force`). A coordinator
/// before the rooms plans every job with its own room and never says it, so a job of now
/// keeps its room as it is (as it did); a job before them asks nothing and reads nothing, so
/// a coordinator of now plans it with its own room. A bump would refuse either for nothing.
pub const LAYOUT_VERSION: u32 = 2;

/// Bytes of the header.
pub const HEADER_BYTES: usize = 256;

/// The most slots a segment may have.
pub const MAX_SLOTS: u32 = 1024;
/// Ring sizes accepted (powers of two).
pub const MIN_RING_BYTES: u64 = 4 << 10;
pub const MAX_RING_BYTES: u64 = 64 << 20;
/// Command area sizes accepted (multiples of 8).
pub const MIN_COMMAND_BYTES: u64 = 4 << 10;
pub const MAX_COMMAND_BYTES: u64 = crate::plan::MAX_PLAN_BYTES as u64;

/// The largest segment accepted (it is reserved in memory whole).
pub const MAX_SEGMENT_BYTES: u64 = 4 << 30;

/// The segment's header. Written by the coordinator; read by everyone.
#[repr(C)]
pub(crate) struct Header {
    /// [`SEGMENT_MAGIC`], stored last at creation.
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub slot_count: AtomicU32,
    pub total_bytes: AtomicU64,
    pub ring_bytes: AtomicU64,
    pub command_bytes: AtomicU64,
    pub coordinator_pid: AtomicU32,
    _reserved0: AtomicU32,
    pub coordinator_start_time: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the coordinator's last loop.
    pub heartbeat_ns: AtomicU64,
    _reserved: [AtomicU64; 24],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);

/// The sizes a segment is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Job slots: the most jobs one coordinator serves at once.
    pub slot_count: u32,
    /// Bytes of each job's event ring (a power of two).
    pub ring_bytes: u64,
    /// Bytes of each job's command area (a multiple of 8): the largest encoded plan.
    pub command_bytes: u64,
}

impl Default for Geometry {
    /// 16 jobs; a 1 MiB ring holds about 15 000 launch records, some 100 ms of a fast job
    /// between two drains of a coordinator that polls every 10 ms; a 2 MiB command area
    /// holds a plan of some 100 000 steps. 48 MiB in all, reserved at creation.
    fn default() -> Geometry {
        Geometry {
            slot_count: 16,
            ring_bytes: 1 << 20,
            command_bytes: 2 << 20,
        }
    }
}

impl Geometry {
    /// Checks the limits; the message says which is broken.
    pub fn check(&self) -> Result<(), String> {
        if self.slot_count == 0 || self.slot_count > MAX_SLOTS {
            return Err(format!(
                "{} job slots (1 to {MAX_SLOTS} accepted)",
                self.slot_count
            ));
        }
        if !self.ring_bytes.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&self.ring_bytes)
        {
            return Err(format!(
                "event rings of {} bytes (a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES})",
                self.ring_bytes
            ));
        }
        if !self.command_bytes.is_multiple_of(8)
            || !(MIN_COMMAND_BYTES..=MAX_COMMAND_BYTES).contains(&self.command_bytes)
        {
            return Err(format!(
                "command areas of {} bytes (a multiple of 8 from {MIN_COMMAND_BYTES} to {MAX_COMMAND_BYTES})",
                self.command_bytes
            ));
        }
        if self.total_bytes() > MAX_SEGMENT_BYTES {
            return Err(format!(
                "a segment of {} bytes (at most {MAX_SEGMENT_BYTES})",
                self.total_bytes()
            ));
        }
        Ok(())
    }

    /// Offset of the first ring: after the slots, on a 4 KiB boundary.
    pub fn rings_offset(&self) -> u64 {
        (HEADER_BYTES as u64 + u64::from(self.slot_count) * SLOT_BYTES as u64)
            .next_multiple_of(4096)
    }

    pub fn ring_offset(&self, slot: u32) -> u64 {
        self.rings_offset() + u64::from(slot) * self.ring_bytes
    }

    pub fn command_offset(&self, slot: u32) -> u64 {
        self.rings_offset()
            + u64::from(self.slot_count) * self.ring_bytes
            + u64::from(slot) * self.command_bytes
    }

    /// Bytes of the whole segment.
    pub fn total_bytes(&self) -> u64 {
        self.command_offset(self.slot_count)
    }
}

/// Why a segment cannot be created or used. Each message is one line naming the segment.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// Not a usable segment name.
    #[error(
        "{0:?} is not a coordinator name (letters, digits, '.', '_', '-'; 1 to 100 characters)"
    )]
    BadName(String),
    /// `O_EXCL` creation found the name taken.
    #[error("{path} already exists")]
    AlreadyExists { path: String },
    /// A live coordinator owns the segment.
    #[error("{path} belongs to coordinator pid {pid}, which is running")]
    CoordinatorRunning { path: String, pid: u32 },
    /// No segment by that name: no coordinator runs.
    #[error("{path} does not exist (no coordinator is running)")]
    NotFound { path: String },
    /// Another user's segment.
    #[error("{path} belongs to uid {owner}, not to this user (uid {us}); refused")]
    OtherOwner { path: String, owner: u32, us: u32 },
    /// Group or others may access it.
    #[error("{path} has mode {mode:o}, open to other users; refused")]
    OpenToOthers { path: String, mode: u32 },
    /// The creator has not finished (or died before finishing) writing the header.
    #[error("{path} is not initialized (its coordinator is starting, or died starting)")]
    NotReady { path: String },
    /// Something else lives under the name.
    #[error("{path} is not a libtensile segment (bad magic)")]
    BadMagic { path: String },
    /// A segment of another layout version.
    #[error("{path} has shared-memory layout version {found}; this libtensile speaks version {expected}")]
    VersionMismatch {
        path: String,
        found: u32,
        expected: u32,
    },
    /// The header's size is not the file's.
    #[error("{path}: the header says {header} bytes, the file has {file}")]
    SizeMismatch {
        path: String,
        header: u64,
        file: u64,
    },
    /// The header's geometry breaks a limit.
    #[error("{path}: bad geometry: {reason}")]
    BadGeometry { path: String, reason: String },
    /// The segment's coordinator is dead (killed, or crashed): a new one must replace it.
    #[error("{path} belongs to coordinator pid {pid}, which is no longer running")]
    CoordinatorGone { path: String, pid: u32 },
    /// Every slot is taken by a live job.
    #[error("{path}: all {slots} job slots are taken by running jobs")]
    NoFreeSlot { path: String, slots: u32 },
    /// A system call failed.
    #[error("{path}: {op}: {source}")]
    Os {
        path: String,
        op: &'static str,
        source: io::Error,
    },
}

/// The shared-memory object name of the segment `name` for this user: `tensile-<uid>-<name>`.
pub fn shm_name(name: &str) -> Result<String, SegmentError> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(SegmentError::BadName(name.to_string()));
    }
    Ok(format!("{}{name}", user_prefix()))
}

/// `tensile-<uid>-`: the prefix of every segment of this user.
pub fn user_prefix() -> String {
    format!("tensile-{}-", current_uid())
}

/// Path of a shared-memory object as a file (in [`shm::shm_dir`]), for messages.
pub fn shm_path(shm_name: &str) -> String {
    format!("{}/{shm_name}", shm::shm_dir_display())
}

/// The coordinator names (the part after the prefix) of this user's segments in
/// [`shm::shm_dir`], sorted.
pub fn list_names() -> Vec<String> {
    let prefix = user_prefix();
    let Ok(dir) = shm::shm_dir() else {
        return Vec::new();
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub(crate) fn current_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// A mapped segment whose header and geometry were checked.
#[derive(Debug)]
pub(crate) struct Segment {
    map: Mapping,
    geometry: Geometry,
    /// The shared-memory object name (`tensile-<uid>-<name>`).
    shm_name: String,
    /// `(dev, ino)` of the object, to tell whether its name was since given to another.
    identity: (u64, u64),
}

impl Segment {
    pub fn path(&self) -> String {
        shm_path(&self.shm_name)
    }

    pub fn shm_name(&self) -> &str {
        &self.shm_name
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_BYTES long (checked when it was made),
        // page-aligned, and Header is plain atomics valid for any bit pattern.
        unsafe { &*self.map.base().as_ptr().cast::<Header>() }
    }

    /// The slot `index` (< slot_count).
    pub fn slot(&self, index: u32) -> &JobSlot {
        assert!(
            index < self.geometry.slot_count,
            "slot {index} out of range"
        );
        let offset = HEADER_BYTES + index as usize * SLOT_BYTES;
        // SAFETY: the geometry was checked against the mapping's length, so the slot lies
        // inside it; the offset is a multiple of 64, and JobSlot is plain atomics valid for
        // any bit pattern.
        unsafe { &*self.map.base().as_ptr().add(offset).cast::<JobSlot>() }
    }

    /// The ring of slot `index` as words.
    pub fn ring_words(&self, index: u32) -> &[AtomicU64] {
        self.words(self.geometry.ring_offset(index), self.geometry.ring_bytes)
    }

    /// The command area of slot `index` as words.
    pub fn command_words(&self, index: u32) -> &[AtomicU64] {
        self.words(
            self.geometry.command_offset(index),
            self.geometry.command_bytes,
        )
    }

    fn words(&self, offset: u64, bytes: u64) -> &[AtomicU64] {
        assert!(
            offset + bytes <= self.map.len() as u64
                && offset.is_multiple_of(8)
                && bytes.is_multiple_of(8)
        );
        // SAFETY: the range lies inside the mapping (asserted), is 8-aligned (the base is
        // page-aligned), and AtomicU64 is valid for any bit pattern; all access is atomic.
        unsafe {
            std::slice::from_raw_parts(
                self.map
                    .base()
                    .as_ptr()
                    .add(offset as usize)
                    .cast::<AtomicU64>(),
                (bytes / 8) as usize,
            )
        }
    }

    /// Creates `shm_name` with `O_EXCL`, reserves its memory, initializes the header as
    /// `coordinator`'s, and stores the magic last.
    pub fn create(
        shm_name: &str,
        geometry: Geometry,
        coordinator: ProcessIdentity,
    ) -> Result<Segment, SegmentError> {
        let path = shm_path(shm_name);
        geometry
            .check()
            .map_err(|reason| SegmentError::BadGeometry {
                path: path.clone(),
                reason,
            })?;
        let file = ShmFile::create_exclusive(shm_name).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => SegmentError::AlreadyExists { path: path.clone() },
            _ => os(&path, "creating", e),
        })?;
        let total = geometry.total_bytes();
        let made = (|| {
            file.set_size(total)
                .map_err(|e| os(&path, "ftruncate", e))?;
            let meta = file.metadata().map_err(|e| os(&path, "fstat", e))?;
            let map = file
                .map(total as usize, Access::ReadWrite)
                .map_err(|e| os(&path, "mmap", e))?;
            let segment = Segment {
                map,
                geometry,
                shm_name: shm_name.to_string(),
                identity: (meta.dev, meta.ino),
            };
            // The creator first, before the (slower) reservation, so that another
            // coordinator finding the name taken sees at once who is making it.
            let h = segment.header();
            h.coordinator_pid.store(coordinator.pid, Ordering::Relaxed);
            h.coordinator_start_time
                .store(coordinator.start_time, Ordering::Relaxed);
            file.reserve(total)
                .map_err(|e| os(&path, "reserving its memory", e))?;
            Ok(segment)
        })();
        let segment = match made {
            Ok(s) => s,
            Err(e) => {
                let _ = shm::unlink(shm_name);
                return Err(e);
            }
        };
        let h = segment.header();
        h.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.slot_count.store(geometry.slot_count, Ordering::Relaxed);
        h.total_bytes.store(total, Ordering::Relaxed);
        h.ring_bytes.store(geometry.ring_bytes, Ordering::Relaxed);
        h.command_bytes
            .store(geometry.command_bytes, Ordering::Relaxed);
        h.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
        // Slots are zero (fresh memory): free, incarnation 0.
        h.magic.store(SEGMENT_MAGIC, Ordering::Release);
        Ok(segment)
    }

    /// Opens `shm_name` and checks owner, mode, magic, version, geometry and size.
    pub fn open(shm_name: &str, access: Access) -> Result<Segment, SegmentError> {
        let path = shm_path(shm_name);
        let file = ShmFile::open(shm_name, access).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => SegmentError::NotFound { path: path.clone() },
            _ => os(&path, "opening", e),
        })?;
        let meta = file.metadata().map_err(|e| os(&path, "fstat", e))?;
        check_ownership(&path, &meta)?;
        if meta.size < HEADER_BYTES as u64 {
            return Err(SegmentError::NotReady { path });
        }
        let header_map = file
            .map(HEADER_BYTES, access)
            .map_err(|e| os(&path, "mmap", e))?;
        // SAFETY: HEADER_BYTES are mapped, page-aligned; Header is plain atomics.
        let h = unsafe { &*header_map.base().as_ptr().cast::<Header>() };
        let geometry = check_header(&path, h, meta.size)?;
        drop(header_map);
        let map = file
            .map(meta.size as usize, access)
            .map_err(|e| os(&path, "mmap", e))?;
        let segment = Segment {
            map,
            geometry,
            shm_name: shm_name.to_string(),
            identity: (meta.dev, meta.ino),
        };
        // The header is read again from the full mapping: it may have changed in between
        // (a new segment under the same name has another inode, so it cannot be this one;
        // but a garbling peer can). Offsets come from `geometry`, not from it.
        check_header(&path, segment.header(), meta.size)?;
        Ok(segment)
    }

    /// The coordinator named in the header.
    pub fn coordinator(&self) -> ProcessIdentity {
        let h = self.header();
        ProcessIdentity {
            pid: h.coordinator_pid.load(Ordering::Relaxed),
            start_time: h.coordinator_start_time.load(Ordering::Relaxed),
        }
    }

    /// Snapshots of the slots held by jobs.
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        (0..self.geometry.slot_count)
            .filter_map(|i| self.slot(i).snapshot(i))
            .collect()
    }

    /// Whether `shm_name` still names this object (not one made since by a new coordinator).
    pub fn still_named(&self) -> bool {
        shm::identity_of(&self.shm_name).is_ok_and(|id| id == self.identity)
    }
}

fn os(path: &str, op: &'static str, source: io::Error) -> SegmentError {
    SegmentError::Os {
        path: path.to_string(),
        op,
        source,
    }
}

fn check_ownership(path: &str, meta: &ShmMetadata) -> Result<(), SegmentError> {
    let us = current_uid();
    if meta.uid != us {
        return Err(SegmentError::OtherOwner {
            path: path.to_string(),
            owner: meta.uid,
            us,
        });
    }
    if meta.mode & 0o077 != 0 {
        return Err(SegmentError::OpenToOthers {
            path: path.to_string(),
            mode: meta.mode,
        });
    }
    Ok(())
}

/// Reads the header in the order its writer made it: magic (Acquire) first, then the version,
/// then the geometry, checked against the limits and the file's size.
fn check_header(path: &str, h: &Header, file_size: u64) -> Result<Geometry, SegmentError> {
    let magic = h.magic.load(Ordering::Acquire);
    if magic == 0 {
        return Err(SegmentError::NotReady {
            path: path.to_string(),
        });
    }
    if magic != SEGMENT_MAGIC {
        return Err(SegmentError::BadMagic {
            path: path.to_string(),
        });
    }
    let found = h.layout_version.load(Ordering::Relaxed);
    if found != LAYOUT_VERSION {
        return Err(SegmentError::VersionMismatch {
            path: path.to_string(),
            found,
            expected: LAYOUT_VERSION,
        });
    }
    let geometry = Geometry {
        slot_count: h.slot_count.load(Ordering::Relaxed),
        ring_bytes: h.ring_bytes.load(Ordering::Relaxed),
        command_bytes: h.command_bytes.load(Ordering::Relaxed),
    };
    geometry
        .check()
        .map_err(|reason| SegmentError::BadGeometry {
            path: path.to_string(),
            reason,
        })?;
    let header_total = h.total_bytes.load(Ordering::Relaxed);
    if header_total != geometry.total_bytes() {
        return Err(SegmentError::BadGeometry {
            path: path.to_string(),
            reason: format!(
                "a total of {header_total} bytes where its sizes make {}",
                geometry.total_bytes()
            ),
        });
    }
    if header_total != file_size {
        return Err(SegmentError::SizeMismatch {
            path: path.to_string(),
            header: header_total,
            file: file_size,
        });
    }
    Ok(geometry)
}

/// What is at a name where a coordinator wants to create its segment.
#[derive(Debug)]
pub(crate) enum Occupant {
    /// A segment whose coordinator runs.
    Live { pid: u32 },
    /// Left behind: its coordinator is dead, or it never got its magic and its creator is
    /// dead (or it is too short to say who created it). Safe to unlink.
    Stale,
    /// Anything else (another version, another owner, garbage): not ours to remove.
    Foreign(SegmentError),
}

/// Classifies what is at `shm_name`, for [`crate::coordinator::CoordinatorSegment`].
pub(crate) fn occupant(shm_name: &str) -> Occupant {
    let path = shm_path(shm_name);
    let file = match ShmFile::open(shm_name, Access::ReadOnly) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Occupant::Stale,
        Err(e) => return Occupant::Foreign(os(&path, "opening", e)),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Occupant::Foreign(os(&path, "fstat", e)),
    };
    if let Err(e) = check_ownership(&path, &meta) {
        return Occupant::Foreign(e);
    }
    if meta.size < HEADER_BYTES as u64 {
        // A creator between shm_open and ftruncate, or one that died there. The former is a
        // matter of microseconds; the caller waits and asks again before calling it stale.
        return Occupant::Stale;
    }
    let map = match file.map(HEADER_BYTES, Access::ReadOnly) {
        Ok(m) => m,
        Err(e) => return Occupant::Foreign(os(&path, "mmap", e)),
    };
    // SAFETY: HEADER_BYTES are mapped, page-aligned; Header is plain atomics, only loaded.
    let h = unsafe { &*map.base().as_ptr().cast::<Header>() };
    let magic = h.magic.load(Ordering::Acquire);
    let creator = ProcessIdentity {
        pid: h.coordinator_pid.load(Ordering::Relaxed),
        start_time: h.coordinator_start_time.load(Ordering::Relaxed),
    };
    if magic != 0 && magic != SEGMENT_MAGIC {
        return Occupant::Foreign(SegmentError::BadMagic { path });
    }
    let version = h.layout_version.load(Ordering::Relaxed);
    if magic == SEGMENT_MAGIC && version != LAYOUT_VERSION {
        // Another version's coordinator may run; if it is dead its segment is stale all the
        // same, since no job of that version can be served by it.
        if creator.pid != 0 && creator.is_running() {
            return Occupant::Foreign(SegmentError::VersionMismatch {
                path,
                found: version,
                expected: LAYOUT_VERSION,
            });
        }
        return Occupant::Stale;
    }
    if creator.pid != 0 && creator.is_running() {
        if magic == 0 {
            return Occupant::Foreign(SegmentError::NotReady { path });
        }
        return Occupant::Live { pid: creator.pid };
    }
    Occupant::Stale
}
