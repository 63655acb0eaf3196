//! Kernel parameter layouts, and the scan of a launch's parameters for device pointers.
//!
//! A launch passes its arguments either as `kernelParams` (an array of pointers, one per
//! parameter, each to that parameter's value) or as one packed buffer in `extra`
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER`). The driver tells each parameter's offset and size in
//! the device-side buffer (`cuKernelGetParamInfo`, `cuFuncGetParamInfo`). Device pointers
//! are 8 bytes and 8-byte aligned in that buffer, so the candidates are exactly the
//! 8-aligned 8-byte words inside a parameter, struct parameters included (PyTorch passes
//! arrays of pointers by value). [`ParamLayout`] precomputes those words once per kernel;
//! the scan then reads each one and asks the [`Snapshot`] whether it points into a live
//! allocation.
//!
//! This module does not query the driver itself (see [`crate::kernels`]) and does not know
//! what the accesses are used for.

use std::ffi::c_void;

use tensile_driver_abi::{
    CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END,
};
use tensile_trace::Access;

use crate::alloc_index::{Range, Snapshot};

/// Where a scan puts what it resolved: a launch's trace wants the allocation ids and
/// parameter offsets ([`Access`]), the memory manager wants the byte ranges. Generic so that
/// each caller pays only for what it keeps.
pub trait AccessSink {
    /// One parameter word that points into the live allocation `range`.
    fn push(&mut self, access: Access, range: Range);
}

impl AccessSink for Vec<Access> {
    #[inline]
    fn push(&mut self, access: Access, _range: Range) {
        Vec::push(self, access);
    }
}

/// Where one parameter lives in the device-side parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    pub offset: u32,
    pub size: u32,
}

/// One candidate pointer word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    /// Which parameter (index into `kernelParams`).
    param: u32,
    /// Byte offset of the word inside that parameter's value.
    within: u32,
    /// Byte offset of the word in the packed parameter buffer.
    buffer_offset: u32,
}

/// The scan plan of one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    params: Box<[ParamInfo]>,
    words: Box<[Word]>,
    /// False when the driver could not describe the parameters: only the packed `extra`
    /// form can then be scanned (every word of the buffer).
    known: bool,
}

/// The most `extra` entries read before giving up on finding `CU_LAUNCH_PARAM_END`: the
/// array is tiny in practice, and a malformed one must not make the scan run away.
const MAX_EXTRA_ENTRIES: usize = 16;

/// The largest packed buffer scanned without a layout (the driver limits parameters to
/// 32 KiB).
const MAX_PACKED_BYTES: usize = 32 << 10;

impl ParamLayout {
    /// The layout of a kernel whose parameters are `params`, in parameter order.
    pub fn new(params: Vec<ParamInfo>) -> Self {
        let mut words = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let start = u64::from(p.offset);
            let end = start + u64::from(p.size);
            let mut w = start.next_multiple_of(8);
            while w + 8 <= end {
                words.push(Word {
                    param: i as u32,
                    within: (w - start) as u32,
                    buffer_offset: w as u32,
                });
                w += 8;
            }
        }
        ParamLayout {
            params: params.into(),
            words: words.into(),
            known: true,
        }
    }

    /// The layout of a kernel the driver could not describe.
    pub fn unknown() -> Self {
        ParamLayout {
            params: Box::new([]),
            words: Box::new([]),
            known: false,
        }
    }

    /// Whether the driver described the parameters.
    pub fn is_known(&self) -> bool {
        self.known
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// The number of candidate pointer words.
    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Appends to `out` one [`Access`] per candidate word of a launch's arguments that
    /// points into a live allocation, in parameter-buffer order.
    ///
    /// # Safety
    /// `kernel_params` and `extra` must be what the application passed to the launch and
    /// must satisfy the driver's contract for this kernel: `kernel_params`, when not null,
    /// holds one valid pointer per parameter, each to at least that parameter's size in
    /// bytes; `extra`, when not null, is a `CU_LAUNCH_PARAM_END`-terminated list whose
    /// buffer is valid for the size it states.
    pub unsafe fn scan(
        &self,
        kernel_params: *const *const c_void,
        extra: *const *const c_void,
        allocs: &Snapshot,
        out: &mut impl AccessSink,
    ) {
        if allocs.is_empty() {
            return;
        }
        if !kernel_params.is_null() {
            // SAFETY: forwarded from the caller.
            unsafe { self.scan_kernel_params(kernel_params, allocs, out) }
        } else if !extra.is_null() {
            // SAFETY: forwarded from the caller.
            if let Some((buf, size)) = unsafe { packed_buffer(extra) } {
                // SAFETY: `packed_buffer` returned the buffer and size the caller gave.
                unsafe { self.scan_packed(buf, size, allocs, out) }
            }
        }
    }

    /// # Safety
    /// As [`ParamLayout::scan`], with `kernel_params` not null.
    #[inline]
    unsafe fn scan_kernel_params(
        &self,
        kernel_params: *const *const c_void,
        allocs: &Snapshot,
        out: &mut impl AccessSink,
    ) {
        for w in self.words.iter() {
            // SAFETY: the array has one entry per parameter and `w.param` is a parameter
            // index of this layout.
            let value = unsafe { *kernel_params.add(w.param as usize) };
            if value.is_null() {
                continue;
            }
            // SAFETY: the parameter's value is at least `size` bytes and the word lies in
            // `[within, within + 8) ⊆ [0, size)`; the host copy need not be aligned.
            let word = unsafe {
                value
                    .cast::<u8>()
                    .add(w.within as usize)
                    .cast::<u64>()
                    .read_unaligned()
            };
            if let Some(range) = allocs.find(word) {
                let access = Access {
                    alloc: range.id,
                    param_offset: w.buffer_offset,
                };
                out.push(access, range);
            }
        }
    }

    /// # Safety
    /// `buf` must be valid for reads of `size` bytes.
    unsafe fn scan_packed(
        &self,
        buf: *const u8,
        size: usize,
        allocs: &Snapshot,
        out: &mut impl AccessSink,
    ) {
        let mut check = |offset: usize| {
            // SAFETY: `offset + 8 <= size` at every call site and `buf` is valid for `size`.
            let word = unsafe { buf.add(offset).cast::<u64>().read_unaligned() };
            if let Some(range) = allocs.find(word) {
                let access = Access {
                    alloc: range.id,
                    param_offset: offset as u32,
                };
                out.push(access, range);
            }
        };
        if self.known {
            for w in self.words.iter() {
                let offset = w.buffer_offset as usize;
                if offset + 8 <= size {
                    check(offset);
                }
            }
        } else {
            let size = size.min(MAX_PACKED_BYTES);
            let mut offset = 0;
            while offset + 8 <= size {
                check(offset);
                offset += 8;
            }
        }
    }
}

/// The packed parameter buffer and its size from a launch's `extra` list.
///
/// # Safety
/// `extra` must be a valid `CU_LAUNCH_PARAM_END`-terminated list of (marker, value) pairs
/// (read at most `MAX_EXTRA_ENTRIES` pairs deep); the size value, when present, must
/// point to a `size_t`.
pub unsafe fn packed_buffer(extra: *const *const c_void) -> Option<(*const u8, usize)> {
    let mut buf: *const u8 = std::ptr::null();
    let mut size: Option<usize> = None;
    let mut i = 0;
    while i < 2 * MAX_EXTRA_ENTRIES {
        // SAFETY: within the terminated list, by the caller's contract.
        let marker = unsafe { *extra.add(i) } as usize;
        match marker {
            CU_LAUNCH_PARAM_END => break,
            CU_LAUNCH_PARAM_BUFFER_POINTER => {
                // SAFETY: a marker is followed by its value.
                buf = unsafe { *extra.add(i + 1) }.cast();
            }
            CU_LAUNCH_PARAM_BUFFER_SIZE => {
                // SAFETY: a marker is followed by its value, here a pointer to a size_t.
                let p = unsafe { *extra.add(i + 1) }.cast::<usize>();
                if !p.is_null() {
                    // SAFETY: as above.
                    size = Some(unsafe { p.read_unaligned() });
                }
            }
            // An unknown marker: its value shape is unknown, so stop rather than guess.
            _ => break,
        }
        i += 2;
    }
    match (buf.is_null(), size) {
        (false, Some(size)) => Some((buf, size)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc_index::{AllocIndex, Range};

    fn index() -> AllocIndex {
        let ix = AllocIndex::default();
        ix.insert(Range {
            start: 0x7000_0000,
            len: 0x1000,
            id: 1,
        });
        ix.insert(Range {
            start: 0x7000_2000,
            len: 0x1000,
            id: 2,
        });
        ix.insert(Range {
            start: 0x7000_4000,
            len: 0x10,
            id: 3,
        });
        ix
    }

    #[test]
    fn words_are_the_aligned_pointer_slots_of_each_param() {
        // (u64 ptr, i32 n, struct { ptr, ptr, i32 } by value (align 8, size 24), f32, u64)
        let l = ParamLayout::new(vec![
            ParamInfo { offset: 0, size: 8 },
            ParamInfo { offset: 8, size: 4 },
            ParamInfo {
                offset: 16,
                size: 24,
            },
            ParamInfo {
                offset: 40,
                size: 4,
            },
            ParamInfo {
                offset: 48,
                size: 8,
            },
        ]);
        let words: Vec<(u32, u32, u32)> = l
            .words
            .iter()
            .map(|w| (w.param, w.within, w.buffer_offset))
            .collect();
        assert_eq!(
            words,
            vec![(0, 0, 0), (2, 0, 16), (2, 8, 24), (2, 16, 32), (4, 0, 48)]
        );
    }

    #[test]
    fn an_unaligned_param_contributes_only_whole_aligned_words() {
        // A 20-byte blob at offset 4 spans [4, 24): its whole aligned words are [8, 16) and [16, 24).
        let l = ParamLayout::new(vec![ParamInfo {
            offset: 4,
            size: 20,
        }]);
        let words: Vec<(u32, u32)> = l
            .words
            .iter()
            .map(|w| (w.within, w.buffer_offset))
            .collect();
        assert_eq!(words, vec![(4, 8), (12, 16)]);
    }

    #[test]
    fn kernel_params_form_finds_pointers_and_interior_pointers() {
        let ix = index();
        let l = ParamLayout::new(vec![
            ParamInfo { offset: 0, size: 8 },
            ParamInfo { offset: 8, size: 8 },
            ParamInfo {
                offset: 16,
                size: 4,
            },
            ParamInfo {
                offset: 24,
                size: 32,
            },
        ]);
        let a: u64 = 0x7000_0000;
        let b: u64 = 0x7000_2ff8; // interior of 2
        let n: u32 = 0x7000_0000; // a 4-byte value is never a pointer
        let s: [u64; 4] = [
            0x7000_4008,
            0xdead,
            0x7000_1000, /* one past 1: no */
            0x7000_0010,
        ];
        let params: [*const c_void; 4] = [
            (&a as *const u64).cast(),
            (&b as *const u64).cast(),
            (&n as *const u32).cast(),
            s.as_ptr().cast(),
        ];
        let mut out = Vec::new();
        // SAFETY: every pointer points to a value of the declared size.
        unsafe { l.scan(params.as_ptr(), std::ptr::null(), &ix.snapshot(), &mut out) };
        let got: Vec<(u64, u32)> = out.iter().map(|a| (a.alloc, a.param_offset)).collect();
        assert_eq!(got, vec![(1, 0), (2, 8), (3, 24), (1, 48)]);
    }

    #[test]
    fn extra_packed_form_uses_the_layout_and_the_stated_size() {
        let ix = index();
        let l = ParamLayout::new(vec![
            ParamInfo { offset: 0, size: 8 },
            ParamInfo { offset: 8, size: 4 },
            ParamInfo {
                offset: 16,
                size: 8,
            },
        ]);
        let mut buf = [0u64; 3];
        buf[0] = 0x7000_2000;
        buf[1] = 0x7000_0000; // falls in param 1's padding after its 4 bytes: not scanned
        buf[2] = 0x7000_4000;
        let extra = |size: &usize| -> [*const c_void; 5] {
            [
                CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
                buf.as_ptr().cast(),
                CU_LAUNCH_PARAM_BUFFER_SIZE as *const c_void,
                (size as *const usize).cast(),
                CU_LAUNCH_PARAM_END as *const c_void,
            ]
        };
        let scan = |layout: &ParamLayout, size: usize| {
            let mut out = Vec::new();
            let list = extra(&size);
            // SAFETY: a well-formed extra list over a live buffer of at least `size` bytes.
            unsafe { layout.scan(std::ptr::null(), list.as_ptr(), &ix.snapshot(), &mut out) };
            out.iter()
                .map(|a| (a.alloc, a.param_offset))
                .collect::<Vec<_>>()
        };
        assert_eq!(scan(&l, 24), vec![(2, 0), (3, 16)]);
        // A stated size shorter than the layout stops the scan there.
        assert_eq!(scan(&l, 16), vec![(2, 0)]);
        // Without a layout every word of the buffer is a candidate.
        assert_eq!(
            scan(&ParamLayout::unknown(), 24),
            vec![(2, 0), (1, 8), (3, 16)]
        );
    }

    #[test]
    fn malformed_extra_lists_are_ignored() {
        let buf = [0x7000_0000u64];
        let no_size: [*const c_void; 3] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
            buf.as_ptr().cast(),
            CU_LAUNCH_PARAM_END as *const c_void,
        ];
        // SAFETY: a terminated list.
        assert!(unsafe { packed_buffer(no_size.as_ptr()) }.is_none());
        let unknown_marker: [*const c_void; 3] = [
            0x77 as *const c_void,
            buf.as_ptr().cast(),
            CU_LAUNCH_PARAM_END as *const c_void,
        ];
        // SAFETY: a terminated list.
        assert!(unsafe { packed_buffer(unknown_marker.as_ptr()) }.is_none());
    }
}
