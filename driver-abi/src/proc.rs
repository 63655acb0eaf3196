//! What `cuGetProcAddress(name, version, flags)` answers: the versioned symbol.
//!
//! `cuGetProcAddress` is asked by *base name* (`"cuMemAlloc"`) with the CUDA version the
//! caller was built against and a flag choosing the per-thread-default-stream variant. The
//! driver answers with the newest ABI of that name not newer than the version asked:
//! `("cuMemAlloc", 12000, 0)` is `cuMemAlloc_v2`, `("cuMemAlloc", 2000, 0)` is the 32-bit
//! `cuMemAlloc`, and `("cuMemcpyAsync", 12000, PER_THREAD)` is `cuMemcpyAsync_ptsz`. The
//! table is generated from `cudaTypedefs.h` (see `gen/gen_proc_table.py`).

use crate::proc_table::PROC_TABLE;
use crate::types::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

/// One row of the generated table: `PFN_<name>_v<version>[_ptds|_ptsz]` is `symbol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    /// Base name, as callers ask for it.
    pub name: &'static str,
    /// CUDA version (`major * 1000 + minor * 10`) that introduced this ABI.
    pub version: u32,
    /// Whether this is the per-thread-default-stream variant.
    pub per_thread: bool,
    /// The exported symbol that implements it.
    pub symbol: &'static str,
}

/// The answer to one `cuGetProcAddress` question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcLookup {
    /// The versioned symbol to return.
    Found(&'static ProcEntry),
    /// The name exists, but only in versions newer than the one asked for.
    VersionNotSufficient,
    /// No entry point has this name.
    NotFound,
}

/// Resolves `(name, version, flags)` the way the CUDA 13 driver does.
///
/// The per-thread variant is chosen when `flags` asks for it and one exists for that
/// version; entry points without a stream (e.g. `cuMemAlloc`) have only the default variant.
pub fn resolve_proc(name: &str, version: i32, flags: u64) -> ProcLookup {
    let start = PROC_TABLE.partition_point(|e| e.name < name);
    let rows = &PROC_TABLE[start..];
    let rows = &rows[..rows.partition_point(|e| e.name == name)];
    if rows.is_empty() {
        return ProcLookup::NotFound;
    }
    let newest = |per_thread: bool| {
        rows.iter()
            .filter(|e| e.per_thread == per_thread && i64::from(e.version) <= i64::from(version))
            .max_by_key(|e| e.version)
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let chosen = if per_thread {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    match chosen {
        Some(e) => ProcLookup::Found(e),
        None => ProcLookup::VersionNotSufficient,
    }
}

/// Every row of the table, sorted by (name, per_thread, version).
pub fn proc_table() -> &'static [ProcEntry] {
    PROC_TABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, version: i32, flags: u64) -> &'static str {
        match resolve_proc(name, version, flags) {
            ProcLookup::Found(e) => e.symbol,
            other => panic!("{name} {version} {flags}: {other:?}"),
        }
    }

    #[test]
    fn versioned_names_follow_cuda_typedefs() {
        assert_eq!(sym("cuMemAlloc", 12000, 0), "cuMemAlloc_v2");
        assert_eq!(sym("cuMemAlloc", 2000, 0), "cuMemAlloc");
        assert_eq!(sym("cuMemFree", 13000, 2), "cuMemFree_v2");
        assert_eq!(sym("cuLaunchKernel", 13000, 0), "cuLaunchKernel");
        assert_eq!(sym("cuLaunchKernel", 13000, 2), "cuLaunchKernel_ptsz");
        assert_eq!(sym("cuMemcpyHtoD", 13000, 2), "cuMemcpyHtoD_v2_ptds");
        assert_eq!(sym("cuMemcpyHtoD", 13000, 1), "cuMemcpyHtoD_v2");
        assert_eq!(sym("cuMemAllocAsync", 11020, 2), "cuMemAllocAsync_ptsz");
        assert_eq!(sym("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
        assert_eq!(sym("cuCtxCreate", 13000, 0), "cuCtxCreate_v4");
        assert_eq!(
            sym("cuStreamGetCaptureInfo", 11030, 2),
            "cuStreamGetCaptureInfo_v2_ptsz"
        );
    }

    #[test]
    fn unknown_and_too_new_are_told_apart() {
        assert_eq!(
            resolve_proc("cuNoSuchThing", 13000, 0),
            ProcLookup::NotFound
        );
        assert_eq!(
            resolve_proc("cuMemAllocAsync", 11000, 0),
            ProcLookup::VersionNotSufficient
        );
    }

    #[test]
    fn every_lookup_libcudart_makes_resolves() {
        let data = include_str!("../tests/data/cudart-13.5-driver-lookups.txt");
        let mut asked = 0;
        for line in data
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let mut f = line.split_whitespace();
            let (name, version, flags) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let version: i32 = version.parse().unwrap();
            let flags: u64 = flags.parse().unwrap();
            let found = resolve_proc(name, version, flags);
            // A few of libcudart's look-ups are for entry points newer than the driver version
            // it was told (13000) or than the header; those must be told apart, not crash.
            assert_ne!(found, ProcLookup::NotFound, "{line}");
            asked += 1;
        }
        assert!(asked > 400, "only {asked} lookups read");
    }
}
