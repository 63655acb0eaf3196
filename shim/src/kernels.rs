//! What the shim knows about each kernel handle: a trace id, a name, a parameter layout.
//!
//! A launch passes a `CUfunction` or, with library-based loading (every CUDA 12+/13
//! runtime), a `CUkernel` cast to one. The first launch of a handle asks the driver for its
//! name and parameter layout ([`describe`]); every later launch finds them in a
//! thread-local direct-mapped cache without touching shared state beyond one atomic load.
//!
//! Entries are leaked (`&'static`): there is one per distinct kernel handle a process
//! launches (hundreds to a few thousand), and leaking them is what lets the launch path
//! hold them without reference counting. Unloading a module or library invalidates every
//! entry (a new kernel may get the address of an unloaded one); the handles launched again
//! afterwards are described again and get new ids, and the old entries stay leaked.
//!
//! This module does not scan parameters (see [`crate::params`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::RwLock;

use tensile_driver_abi::{CUresult, CUDA_SUCCESS};

use crate::params::{ParamInfo, ParamLayout};

/// One kernel handle as the shim knows it.
#[derive(Debug)]
pub struct KernelMeta {
    /// Trace id, unique within the process.
    pub id: u32,
    /// The name the driver reports (mangled), or `"<unknown>"`.
    pub name: String,
    /// How to scan its parameters.
    pub layout: ParamLayout,
}

/// What the driver said about a handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    pub name: Option<String>,
    pub layout: ParamLayout,
}

/// `cuKernelGetParamInfo` / `cuFuncGetParamInfo`.
pub type ParamInfoFn = unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> CUresult;
/// `cuKernelGetName` / `cuFuncGetName`.
pub type NameFn = unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> CUresult;

/// The driver functions [`describe`] uses; each may be missing from an old driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct Introspection {
    pub kernel_param_info: Option<ParamInfoFn>,
    pub func_param_info: Option<ParamInfoFn>,
    pub kernel_name: Option<NameFn>,
    pub func_name: Option<NameFn>,
}

/// More parameters than the driver's 32 KiB parameter space can hold: a driver that keeps
/// answering past this is not describing a real kernel.
const MAX_PARAMS: usize = 32 << 10;

/// Asks the driver about `handle`, treating it first as a `CUkernel` and then as a
/// `CUfunction` (the kernel form fails on functions and vice versa).
///
/// # Safety
/// `handle` must be a handle the application is launching (the driver validates it; the
/// functions in `with` must be the real driver's).
pub unsafe fn describe(with: &Introspection, handle: *mut c_void) -> Description {
    // SAFETY: forwarded from the caller.
    let layout = [with.kernel_param_info, with.func_param_info]
        .into_iter()
        .flatten()
        .find_map(|f| unsafe { param_layout(f, handle) })
        .unwrap_or_else(ParamLayout::unknown);
    // SAFETY: forwarded from the caller.
    let name = [with.kernel_name, with.func_name]
        .into_iter()
        .flatten()
        .find_map(|f| unsafe { name(f, handle) });
    Description { name, layout }
}

/// The layout from one of the param-info functions; `None` if it does not accept the handle.
///
/// # Safety
/// As [`describe`].
unsafe fn param_layout(info: ParamInfoFn, handle: *mut c_void) -> Option<ParamLayout> {
    let mut params = Vec::new();
    for i in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the driver validates the handle and the index.
        let r = unsafe { info(handle, i, &mut offset, &mut size) };
        if r != CUDA_SUCCESS {
            break;
        }
        let (Ok(offset), Ok(size)) = (u32::try_from(offset), u32::try_from(size)) else {
            return None;
        };
        params.push(ParamInfo { offset, size });
    }
    // Zero parameters is indistinguishable from "not my kind of handle"; the caller tries
    // the other form, and a kernel without parameters has nothing to scan either way.
    (!params.is_empty()).then(|| ParamLayout::new(params))
}

/// # Safety
/// As [`describe`].
unsafe fn name(get: NameFn, handle: *mut c_void) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: valid out-pointer; the driver validates the handle.
    let r = unsafe { get(&mut p, handle) };
    if r != CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: on success the driver returns a NUL-terminated string it owns.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Every registry gets distinct generation numbers from this counter, so a thread-local
/// cache entry can never be mistaken for another registry's (tests and benches make many).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Copy)]
struct Slot {
    handle: usize,
    generation: u64,
    meta: *const KernelMeta,
}

const LOCAL_SLOTS: usize = 64;
const EMPTY: Slot = Slot {
    handle: 0,
    generation: 0,
    meta: std::ptr::null(),
};

thread_local! {
    static LOCAL: RefCell<[Slot; LOCAL_SLOTS]> = const { RefCell::new([EMPTY; LOCAL_SLOTS]) };
}

fn slot_of(handle: usize) -> usize {
    // Handles are at least 8-aligned heap addresses; mix the bits above that.
    ((handle >> 4) ^ (handle >> 10)) % LOCAL_SLOTS
}

/// The kernel handles of the process.
#[derive(Debug)]
pub struct KernelRegistry {
    map: RwLock<HashMap<usize, &'static KernelMeta>>,
    generation: AtomicU64,
    next_id: AtomicU32,
}

impl Default for KernelRegistry {
    fn default() -> Self {
        KernelRegistry {
            map: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(GENERATIONS.fetch_add(1, Ordering::Relaxed)),
            next_id: AtomicU32::new(1),
        }
    }
}

impl KernelRegistry {
    /// The entry for `handle`, describing it with `describe` the first time.
    ///
    /// `announce` is called exactly once per new entry, before any thread can obtain it:
    /// the recorder writes the kernel's trace record there, so it always precedes the
    /// kernel's first launch record.
    #[inline]
    pub fn get(
        &self,
        handle: usize,
        describe: impl FnOnce() -> Description,
        announce: impl FnOnce(&KernelMeta),
    ) -> &'static KernelMeta {
        let generation = self.generation.load(Ordering::Acquire);
        let i = slot_of(handle);
        let hit = LOCAL.with_borrow(|slots| {
            let s = slots[i];
            (s.handle == handle && s.generation == generation && !s.meta.is_null())
                .then_some(s.meta)
        });
        if let Some(meta) = hit {
            // SAFETY: slots only ever hold leaked, never-freed entries.
            return unsafe { &*meta };
        }
        let meta = self.get_shared(handle, describe, announce);
        LOCAL.with_borrow_mut(|slots| {
            slots[i] = Slot {
                handle,
                generation,
                meta,
            };
        });
        meta
    }

    #[cold]
    fn get_shared(
        &self,
        handle: usize,
        describe: impl FnOnce() -> Description,
        announce: impl FnOnce(&KernelMeta),
    ) -> &'static KernelMeta {
        let found = self
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .copied();
        if let Some(meta) = found {
            return meta;
        }
        // Describe outside the lock: it calls into the driver.
        let d = describe();
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some(meta) = map.get(&handle) {
            return meta;
        }
        let meta: &'static KernelMeta = Box::leak(Box::new(KernelMeta {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            name: d.name.unwrap_or_else(|| "<unknown>".to_owned()),
            layout: d.layout,
        }));
        announce(meta);
        map.insert(handle, meta);
        meta
    }

    /// Forgets every handle (after a module or library unload).
    pub fn invalidate(&self) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.clear();
        self.generation.store(
            GENERATIONS.fetch_add(1, Ordering::Relaxed),
            Ordering::Release,
        );
    }

    /// The name of the kernel with trace id `id`, if a handle of it is known (a scan: for
    /// error messages).
    #[cold]
    pub fn name_of(&self, id: u32) -> Option<String> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.values().find(|m| m.id == id).map(|m| m.name.clone())
    }

    /// Every kernel known, as its trace record announced it, by id (for a new listener that
    /// missed the announcements).
    #[cold]
    pub fn announced(&self) -> Vec<tensile_trace::KernelInfo> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut kernels: Vec<_> = map
            .values()
            .map(|m| tensile_trace::KernelInfo {
                id: m.id,
                name: m.name.clone(),
                nparams: m.layout.params().len() as u32,
            })
            .collect();
        drop(map);
        // Several handles (one per loaded module) may share a kernel's id.
        kernels.sort_by_key(|k| k.id);
        kernels.dedup_by_key(|k| k.id);
        kernels
    }

    /// The number of handles currently known.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no handle is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn desc(n: u32) -> Description {
        Description {
            name: Some(format!("k{n}")),
            layout: ParamLayout::new(vec![ParamInfo {
                offset: 0,
                size: 8 * n,
            }]),
        }
    }

    #[test]
    fn describes_and_announces_each_handle_once() {
        let reg = KernelRegistry::default();
        let described = Cell::new(0);
        let announced = Cell::new(0);
        let get = |h: usize, n: u32| {
            reg.get(
                h,
                || {
                    described.set(described.get() + 1);
                    desc(n)
                },
                |_| announced.set(announced.get() + 1),
            )
        };
        let a = get(0x1000, 1);
        let b = get(0x2000, 2);
        let a2 = get(0x1000, 9);
        assert!(std::ptr::eq(a, a2));
        assert_ne!(a.id, b.id);
        assert_eq!((a.name.as_str(), b.name.as_str()), ("k1", "k2"));
        assert_eq!(a.layout.word_count(), 1);
        assert_eq!((described.get(), announced.get()), (2, 2));

        // Another thread misses its own cache but finds the shared entry.
        std::thread::scope(|s| {
            s.spawn(|| {
                let a3 = reg.get(
                    0x1000,
                    || panic!("described again"),
                    |_| panic!("announced again"),
                );
                assert!(std::ptr::eq(a, a3));
            });
        });
    }

    #[test]
    fn invalidation_gives_reused_handles_new_ids() {
        let reg = KernelRegistry::default();
        let a = reg.get(0x1000, || desc(1), |_| {});
        reg.invalidate();
        assert!(reg.is_empty());
        let b = reg.get(0x1000, || desc(3), |_| {});
        assert_ne!(a.id, b.id);
        assert_eq!(b.layout.word_count(), 3);
    }

    #[test]
    fn registries_do_not_share_thread_local_entries() {
        let r1 = KernelRegistry::default();
        let r2 = KernelRegistry::default();
        let a = r1.get(0x1000, || desc(1), |_| {});
        let b = r2.get(0x1000, || desc(2), |_| {});
        assert_eq!(a.name, "k1");
        assert_eq!(b.name, "k2");
        assert_eq!(r1.get(0x1000, || desc(5), |_| {}).name, "k1");
    }

    const KERNEL: usize = 0x1000;
    const FUNCTION: usize = 0x2000;

    /// A fake driver that knows one 2-parameter `CUkernel` and one 3-parameter `CUfunction`.
    unsafe extern "C" fn param_info(
        expect: usize,
        nparams: usize,
        h: *mut c_void,
        i: usize,
        o: *mut usize,
        s: *mut usize,
    ) -> CUresult {
        if h as usize != expect || i >= nparams {
            return 1;
        }
        // SAFETY: `describe` passes valid out-pointers.
        unsafe {
            *o = i * 8;
            *s = 8;
        }
        CUDA_SUCCESS
    }
    unsafe extern "C" fn kernel_info(
        h: *mut c_void,
        i: usize,
        o: *mut usize,
        s: *mut usize,
    ) -> CUresult {
        // SAFETY: forwarded.
        unsafe { param_info(KERNEL, 2, h, i, o, s) }
    }
    unsafe extern "C" fn func_info(
        h: *mut c_void,
        i: usize,
        o: *mut usize,
        s: *mut usize,
    ) -> CUresult {
        // SAFETY: forwarded.
        unsafe { param_info(FUNCTION, 3, h, i, o, s) }
    }
    unsafe extern "C" fn func_name(n: *mut *const c_char, h: *mut c_void) -> CUresult {
        if h as usize != FUNCTION {
            return 400;
        }
        // SAFETY: `describe` passes a valid out-pointer.
        unsafe { *n = c"my_function".as_ptr() };
        CUDA_SUCCESS
    }

    #[test]
    fn describe_tries_the_kernel_form_then_the_function_form() {
        let with = Introspection {
            kernel_param_info: Some(kernel_info),
            func_param_info: Some(func_info),
            kernel_name: None,
            func_name: Some(func_name),
        };
        // SAFETY: the fake driver accepts any handle value.
        let k = unsafe { describe(&with, KERNEL as *mut c_void) };
        assert_eq!(k.layout.params().len(), 2);
        assert_eq!(k.name, None);
        // SAFETY: as above.
        let f = unsafe { describe(&with, FUNCTION as *mut c_void) };
        assert_eq!(f.layout.params().len(), 3);
        assert_eq!(f.name.as_deref(), Some("my_function"));
        // SAFETY: as above.
        let unknown = unsafe { describe(&with, 0x3000 as *mut c_void) };
        assert!(!unknown.layout.is_known());
        // SAFETY: as above.
        let nothing = unsafe { describe(&Introspection::default(), KERNEL as *mut c_void) };
        assert!(!nothing.layout.is_known());
    }
}
