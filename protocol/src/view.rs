//! A read-only look at a segment, for `tensile status`: it maps the segment `PROT_READ`, so
//! it can change nothing, and only ever loads.

use std::sync::atomic::Ordering;

use crate::process::{monotonic_ns, ProcessIdentity};
use crate::segment::{shm_name, Geometry, Segment, SegmentError};
use crate::shm::Access;
use crate::slot::JobSnapshot;

/// The coordinator as its segment's header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorInfo {
    pub process: ProcessIdentity,
    /// Whether that process still runs.
    pub running: bool,
    /// Nanoseconds since its last heartbeat.
    pub heartbeat_age_ns: u64,
}

/// A segment opened read-only.
#[derive(Debug)]
pub struct SegmentView {
    segment: Segment,
}

impl SegmentView {
    /// Opens the segment of coordinator `name` with the checks a job makes.
    pub fn open(name: &str) -> Result<SegmentView, SegmentError> {
        let shm = shm_name(name)?;
        Ok(SegmentView {
            segment: Segment::open(&shm, Access::ReadOnly)?,
        })
    }

    pub fn path(&self) -> String {
        self.segment.path()
    }

    pub fn geometry(&self) -> Geometry {
        self.segment.geometry()
    }

    pub fn coordinator(&self) -> CoordinatorInfo {
        let process = self.segment.coordinator();
        CoordinatorInfo {
            process,
            running: process.is_running(),
            heartbeat_age_ns: monotonic_ns()
                .saturating_sub(self.segment.header().heartbeat_ns.load(Ordering::Relaxed)),
        }
    }

    /// The slots held by jobs.
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        self.segment.jobs()
    }
}
