//! Access tracking: the live allocations, the kernels, and which allocations each launch,
//! copy and memset touches, with the trace records that describe them.
//!
//! The hooks call in here around forwarding a call to the driver; this module never calls
//! the driver itself except to describe a kernel handle the first time it is launched. It
//! is the seam where the memory manager (issue #4) slots in: it receives the resolved
//! accesses between [`Tracker::resolve_launch`] and the forward.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use tensile_trace::{
    Access, Alloc, AllocKind, Copy, CopyKind, Free, KernelInfo, Launch, Memset, Record,
};

use crate::alloc_index::{AllocIndex, Range};
use crate::kernels::{self, Description, Introspection, KernelMeta, KernelRegistry};
use crate::params::AccessSink;
use crate::recorder::RecordSink;

/// Everything the process has allocated and launched, as far as the shim saw it.
#[derive(Debug)]
pub struct Tracker {
    pub allocs: AllocIndex,
    pub kernels: KernelRegistry,
    introspection: Introspection,
    next_alloc_id: AtomicU64,
    next_seq: AtomicU64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
}

/// The geometry and stream of one launch, for its trace record.
#[derive(Debug, Clone, Copy)]
pub struct LaunchShape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: u64,
}

impl Tracker {
    /// A tracker that describes kernels with `introspection`.
    pub fn new(introspection: Introspection) -> Self {
        Tracker {
            allocs: AllocIndex::default(),
            kernels: KernelRegistry::default(),
            introspection,
            next_alloc_id: AtomicU64::new(1),
            next_seq: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
        }
    }

    /// A successful allocation of `bytes` at `ptr`; returns its id.
    pub fn allocated(
        &self,
        rec: Option<&RecordSink>,
        t_ns: u64,
        stream: u64,
        ptr: u64,
        bytes: u64,
        kind: AllocKind,
    ) -> u64 {
        let id = self.next_alloc_id.fetch_add(1, Ordering::Relaxed);
        let displaced = self.allocs.insert(Range {
            start: ptr,
            len: bytes,
            id,
        });
        for stale in displaced {
            // The driver handed out memory the shim still thought live: its free went
            // through a path the shim does not manage. Close it in the trace too.
            tracing::debug!(
                "allocation {} at {:#x} was freed behind the shim's back",
                stale.id,
                stale.start
            );
            self.sub_live(stale.len);
            if let Some(rec) = rec {
                rec.record(Record::Free(Free {
                    t_ns,
                    stream,
                    id: stale.id,
                }));
            }
        }
        let live = self.live_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(live, Ordering::Relaxed);
        if let Some(rec) = rec {
            rec.record(Record::Alloc(Alloc {
                t_ns,
                stream,
                id,
                ptr,
                bytes,
                kind,
            }));
        }
        id
    }

    fn sub_live(&self, bytes: u64) {
        let _ = self
            .live_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
    }

    /// Takes the allocation starting at `ptr` out of the index before its free is
    /// forwarded (so no launch can resolve it once the driver may reuse the memory).
    /// `None`: the shim never saw it, and the free goes to the driver untouched.
    pub fn begin_free(&self, ptr: u64) -> Option<Range> {
        self.allocs.remove(ptr)
    }

    /// Ends a free begun with [`Tracker::begin_free`]: on success it is recorded, on
    /// failure the allocation is live again.
    pub fn end_free(
        &self,
        rec: Option<&RecordSink>,
        t_ns: u64,
        stream: u64,
        range: Range,
        ok: bool,
    ) {
        if !ok {
            self.allocs.insert(range);
            return;
        }
        self.sub_live(range.len);
        if let Some(rec) = rec {
            rec.record(Record::Free(Free {
                t_ns,
                stream,
                id: range.id,
            }));
        }
    }

    /// What a listener joining mid-run needs to read the records that follow: a `Kernel`
    /// record per known kernel, then an `Alloc` record per live allocation (stamped `t_ns`,
    /// on the null stream: where each was made is not kept).
    ///
    /// Records already on their way may repeat some of these or free one of them; a reader
    /// of a live stream drops what it cannot place.
    #[cold]
    pub fn state_records(&self, t_ns: u64) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .kernels
            .announced()
            .into_iter()
            .map(Record::Kernel)
            .collect();
        let allocs = self.allocs.snapshot();
        let mut live: Vec<Range> = allocs.iter().collect();
        // In the order they were made, as a stream from the start would have had them.
        live.sort_by_key(|r| r.id);
        records.extend(live.into_iter().map(|r| {
            Record::Alloc(Alloc {
                t_ns,
                stream: 0,
                id: r.id,
                ptr: r.start,
                bytes: r.len,
                kind: AllocKind::Sync,
            })
        }));
        records
    }

    /// The id of the allocation containing `addr`, or 0 (host or untracked memory).
    #[inline]
    pub fn alloc_id_of(&self, addr: u64) -> u64 {
        self.allocs.snapshot().find_id(addr).unwrap_or(0)
    }

    /// The kernel behind `f` and, appended to `out`, the allocations its arguments point
    /// into. A kernel seen for the first time is described by the driver and, when
    /// tracing, announced with a `Kernel` record.
    ///
    /// # Safety
    /// `kernel_params` and `extra` as for [`crate::params::ParamLayout::scan`]; `f` is the
    /// handle the application is launching.
    #[inline]
    pub unsafe fn resolve_launch(
        &self,
        rec: Option<&RecordSink>,
        f: *mut c_void,
        kernel_params: *const *const c_void,
        extra: *const *const c_void,
        out: &mut impl AccessSink,
    ) -> &'static KernelMeta {
        // SAFETY: `f` is being launched, so it is a handle of this driver.
        let describe = || unsafe { kernels::describe(&self.introspection, f) };
        // SAFETY: as above; `describe_with` is only used by tests and the benchmark.
        unsafe { self.resolve_launch_with(rec, f, kernel_params, extra, out, describe) }
    }

    /// [`Tracker::resolve_launch`] with a custom way to describe new kernels.
    ///
    /// # Safety
    /// As [`Tracker::resolve_launch`].
    #[inline]
    pub unsafe fn resolve_launch_with(
        &self,
        rec: Option<&RecordSink>,
        f: *mut c_void,
        kernel_params: *const *const c_void,
        extra: *const *const c_void,
        out: &mut impl AccessSink,
        describe: impl FnOnce() -> Description,
    ) -> &'static KernelMeta {
        let announce = |meta: &KernelMeta| {
            if let Some(rec) = rec {
                rec.record(Record::Kernel(KernelInfo {
                    id: meta.id,
                    name: meta.name.clone(),
                    nparams: meta.layout.params().len() as u32,
                }));
            }
        };
        let kernel = self.kernels.get(f as usize, describe, announce);
        let allocs = self.allocs.snapshot();
        // SAFETY: forwarded from the caller.
        unsafe { kernel.layout.scan(kernel_params, extra, &allocs, out) };
        kernel
    }

    /// Numbers a launch the driver accepted and, with a sink, records it; returns its
    /// sequence number (`Launch::seq`). Launches are numbered whether or not anything is
    /// recorded, so that the plan executor's positions and a trace's `seq` are one numbering.
    #[inline]
    pub fn launched(
        &self,
        rec: Option<&RecordSink>,
        t_ns: u64,
        kernel: &KernelMeta,
        shape: LaunchShape,
        accesses: &[Access],
    ) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if let Some(rec) = rec {
            rec.record(Record::Launch(Launch {
                t_ns,
                stream: shape.stream,
                seq,
                kernel: kernel.id,
                grid: shape.grid,
                block: shape.block,
                smem: shape.shared_mem_bytes,
                accesses: accesses.to_vec(),
            }));
        }
        seq
    }

    /// The number the next accepted launch will get (another thread's launch may take it
    /// first).
    #[inline]
    pub fn next_launch_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Records a copy the driver accepted; `dst`/`src` are device addresses (`None` for
    /// host memory).
    #[allow(clippy::too_many_arguments)]
    pub fn copied(
        &self,
        rec: &RecordSink,
        t_ns: u64,
        stream: u64,
        kind: CopyKind,
        dst: Option<u64>,
        src: Option<u64>,
        bytes: u64,
        asynchronous: bool,
    ) {
        let snapshot = self.allocs.snapshot();
        let id = |a: Option<u64>| a.and_then(|a| snapshot.find_id(a)).unwrap_or(0);
        rec.record(Record::Copy(Copy {
            t_ns,
            stream,
            kind,
            dst: id(dst),
            src: id(src),
            bytes,
            asynchronous,
        }));
    }

    /// Records a memset the driver accepted.
    pub fn memset(
        &self,
        rec: &RecordSink,
        t_ns: u64,
        stream: u64,
        dst: u64,
        bytes: u64,
        asynchronous: bool,
    ) {
        rec.record(Record::Memset(Memset {
            t_ns,
            stream,
            dst: self.alloc_id_of(dst),
            bytes,
            asynchronous,
        }));
    }

    /// Bytes in live tracked allocations now.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// The most bytes ever live in tracked allocations at once.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// Launches numbered so far.
    pub fn launches(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{ParamInfo, ParamLayout};

    fn two_pointer_kernel() -> Description {
        Description {
            name: Some("k".into()),
            layout: ParamLayout::new(vec![
                ParamInfo { offset: 0, size: 8 },
                ParamInfo { offset: 8, size: 8 },
            ]),
        }
    }

    #[test]
    fn launches_resolve_live_allocations_only() {
        let t = Tracker::new(Introspection::default());
        let a = t.allocated(None, 0, 0, 0x10_0000, 256, AllocKind::Sync);
        let b = t.allocated(None, 0, 0, 0x20_0000, 256, AllocKind::Async);
        assert_ne!(a, b);
        assert_eq!(t.live_bytes(), 512);

        let (pa, pb): (u64, u64) = (0x10_0000 + 16, 0x20_0000);
        let params: [*const c_void; 2] = [(&pa as *const u64).cast(), (&pb as *const u64).cast()];
        let mut out = Vec::new();
        // SAFETY: two 8-byte parameters, as the layout says.
        let k = unsafe {
            t.resolve_launch_with(
                None,
                0x1234 as *mut c_void,
                params.as_ptr(),
                std::ptr::null(),
                &mut out,
                two_pointer_kernel,
            )
        };
        assert_eq!(k.name, "k");
        assert_eq!(
            out,
            vec![
                Access {
                    alloc: a,
                    param_offset: 0
                },
                Access {
                    alloc: b,
                    param_offset: 8
                }
            ]
        );

        let r = t.begin_free(0x20_0000).unwrap();
        t.end_free(None, 0, 0, r, true);
        assert_eq!(t.live_bytes(), 256);
        assert_eq!(t.peak_bytes(), 512);
        out.clear();
        // SAFETY: as above.
        unsafe {
            t.resolve_launch_with(
                None,
                0x1234 as *mut c_void,
                params.as_ptr(),
                std::ptr::null(),
                &mut out,
                || unreachable!(),
            )
        };
        assert_eq!(
            out,
            vec![Access {
                alloc: a,
                param_offset: 0
            }]
        );
    }

    #[test]
    fn a_failed_free_keeps_the_allocation() {
        let t = Tracker::new(Introspection::default());
        let a = t.allocated(None, 0, 0, 0x10_0000, 256, AllocKind::Pitch);
        let r = t.begin_free(0x10_0000).unwrap();
        assert_eq!(t.alloc_id_of(0x10_0000), 0);
        t.end_free(None, 0, 0, r, false);
        assert_eq!(t.alloc_id_of(0x10_00ff), a);
        assert_eq!(t.live_bytes(), 256);
        assert!(t.begin_free(0x10_0001).is_none());
    }

    #[test]
    fn state_records_name_the_kernels_then_the_live_allocations_in_order_made() {
        let t = Tracker::new(Introspection::default());
        // Made at falling addresses, so address order and the order made differ.
        let a = t.allocated(None, 0, 0, 0x30_0000, 256, AllocKind::Sync);
        let b = t.allocated(None, 0, 0, 0x20_0000, 512, AllocKind::Async);
        let c = t.allocated(None, 0, 0, 0x10_0000, 128, AllocKind::Sync);
        let r = t.begin_free(0x20_0000).unwrap();
        t.end_free(None, 0, 0, r, true);
        let p: u64 = 0x30_0000;
        let params: [*const c_void; 2] = [(&p as *const u64).cast(), (&p as *const u64).cast()];
        let mut out = Vec::new();
        // SAFETY: two 8-byte parameters, as the layout says.
        unsafe {
            t.resolve_launch_with(
                None,
                0x1234 as *mut c_void,
                params.as_ptr(),
                std::ptr::null(),
                &mut out,
                two_pointer_kernel,
            )
        };
        let records = t.state_records(77);
        let Record::Kernel(k) = &records[0] else {
            panic!("the kernel first: {records:?}");
        };
        assert_eq!((k.name.as_str(), k.nparams), ("k", 2));
        let allocs: Vec<(u64, u64, u64, u64)> = records[1..]
            .iter()
            .map(|r| match r {
                Record::Alloc(x) => (x.id, x.ptr, x.bytes, x.t_ns),
                other => panic!("an allocation: {other:?}"),
            })
            .collect();
        assert_eq!(
            allocs,
            vec![(a, 0x30_0000, 256, 77), (c, 0x10_0000, 128, 77)]
        );
        assert!(b > a && c > b);
    }
}
