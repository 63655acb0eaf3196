//! Memory pools (`CUmemoryPool`): where stream-ordered allocations are accounted.
//!
//! Simplification (documented in the README): a pool caches nothing. Memory freed with
//! `cuMemFreeAsync` goes back to the device when the free executes on its stream, so
//! "reserved" always equals "used", the release threshold is stored and reported but has no
//! effect, and `cuMemPoolTrimTo` has nothing to trim.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tensile_driver_abi::*;

pub const ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
pub const ATTR_REUSE_ALLOW_OPPORTUNISTIC: i32 = 2;
pub const ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
pub const ATTR_RELEASE_THRESHOLD: i32 = 4;
pub const ATTR_RESERVED_MEM_CURRENT: i32 = 5;
pub const ATTR_RESERVED_MEM_HIGH: i32 = 6;
pub const ATTR_USED_MEM_CURRENT: i32 = 7;
pub const ATTR_USED_MEM_HIGH: i32 = 8;
pub const ATTR_ALLOCATION_TYPE: i32 = 9;
pub const ATTR_EXPORT_HANDLE_TYPES: i32 = 10;
pub const ATTR_LOCATION_ID: i32 = 11;
pub const ATTR_LOCATION_TYPE: i32 = 12;
pub const ATTR_MAX_POOL_SIZE: i32 = 13;

/// A value of a pool attribute: `int` or `cuuint64_t` in C, depending on the attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrValue {
    Int(i32),
    U64(u64),
}

#[derive(Debug)]
pub struct Pool {
    pub location: CUmemLocation,
    pub max_size: u64,
    reuse: Mutex<[i32; 3]>,
    release_threshold: AtomicU64,
    used: AtomicU64,
    used_high: AtomicU64,
    reserved_high: AtomicU64,
}

impl Pool {
    pub fn new(location: CUmemLocation, max_size: u64) -> Self {
        Self {
            location,
            max_size,
            reuse: Mutex::new([1, 1, 1]),
            release_threshold: AtomicU64::new(0),
            used: AtomicU64::new(0),
            used_high: AtomicU64::new(0),
            reserved_high: AtomicU64::new(0),
        }
    }

    /// Whether the value of `attr` is an `int` (else a `cuuint64_t`); None if unknown.
    pub fn attr_is_int(attr: i32) -> Option<bool> {
        match attr {
            1..=3 | 9..=12 => Some(true),
            4..=8 | 13 => Some(false),
            _ => None,
        }
    }

    pub fn allocated(&self, bytes: u64) {
        let now = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.used_high.fetch_max(now, Ordering::Relaxed);
        self.reserved_high.fetch_max(now, Ordering::Relaxed);
    }

    pub fn freed(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn get(&self, attr: i32) -> Result<AttrValue, CUresult> {
        let used = self.used.load(Ordering::Relaxed);
        Ok(match attr {
            1..=3 => AttrValue::Int(
                self.reuse.lock().unwrap_or_else(|e| e.into_inner())[attr as usize - 1],
            ),
            ATTR_RELEASE_THRESHOLD => {
                AttrValue::U64(self.release_threshold.load(Ordering::Relaxed))
            }
            ATTR_RESERVED_MEM_CURRENT | ATTR_USED_MEM_CURRENT => AttrValue::U64(used),
            ATTR_RESERVED_MEM_HIGH => AttrValue::U64(self.reserved_high.load(Ordering::Relaxed)),
            ATTR_USED_MEM_HIGH => AttrValue::U64(self.used_high.load(Ordering::Relaxed)),
            ATTR_ALLOCATION_TYPE => AttrValue::Int(CU_MEM_ALLOCATION_TYPE_PINNED as i32),
            ATTR_EXPORT_HANDLE_TYPES => AttrValue::Int(0),
            ATTR_LOCATION_ID => AttrValue::Int(self.location.id),
            ATTR_LOCATION_TYPE => AttrValue::Int(self.location.type_ as i32),
            ATTR_MAX_POOL_SIZE => AttrValue::U64(self.max_size),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// Sets a settable attribute; the high-water marks may only be reset to 0.
    pub fn set(&self, attr: i32, value: AttrValue) -> Result<(), CUresult> {
        match (attr, value) {
            (1..=3, AttrValue::Int(v)) => {
                self.reuse.lock().unwrap_or_else(|e| e.into_inner())[attr as usize - 1] = v;
            }
            (ATTR_RELEASE_THRESHOLD, AttrValue::U64(v)) => {
                self.release_threshold.store(v, Ordering::Relaxed)
            }
            (ATTR_RESERVED_MEM_HIGH, AttrValue::U64(0)) => self
                .reserved_high
                .store(self.used.load(Ordering::Relaxed), Ordering::Relaxed),
            (ATTR_USED_MEM_HIGH, AttrValue::U64(0)) => self
                .used_high
                .store(self.used.load(Ordering::Relaxed), Ordering::Relaxed),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}
