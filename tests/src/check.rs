//! Comparing a trace with what the workload says it did.
//!
//! Trace records name allocations by id and kernels by number; [`normalize`] turns them
//! back into [`Expect`] values (ids to the pointers their `Alloc` records gave, kernel
//! numbers to names), so a trace and a workload's expectation lines compare directly.

use std::collections::HashMap;
use std::path::Path;

use tensile_trace::{AllocKind, CopyKind, Reader, Record, SyncScope, TraceError};

use crate::expect::Expect;

/// Everything read back from a trace file.
#[derive(Debug)]
pub struct TraceFile {
    pub records: Vec<Record>,
    pub finished_cleanly: bool,
    /// The error that ended reading, if it did not end cleanly.
    pub error: Option<TraceError>,
}

/// Reads every record of the trace at `path` (the header record first).
pub fn read_trace(path: &Path) -> TraceFile {
    let mut reader =
        Reader::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut records = vec![Record::Header(reader.header().clone())];
    let mut error = None;
    for r in reader.by_ref() {
        match r {
            Ok(r) => records.push(r),
            Err(e) => error = Some(e),
        }
    }
    TraceFile {
        records,
        finished_cleanly: reader.finished_cleanly(),
        error,
    }
}

fn alloc_kind(k: AllocKind) -> &'static str {
    match k {
        AllocKind::Sync => "sync",
        AllocKind::Pitch => "pitch",
        AllocKind::Async => "async",
        AllocKind::Pool => "pool",
    }
}

fn copy_kind(k: CopyKind) -> &'static str {
    match k {
        CopyKind::HostToDevice => "htod",
        CopyKind::DeviceToHost => "dtoh",
        CopyKind::DeviceToDevice => "dtod",
        CopyKind::Any => "any",
    }
}

/// The trace's events as expectations, in trace order. Panics on a record that names an
/// unknown allocation or kernel (a trace must define both before use).
pub fn normalize(records: &[Record]) -> Vec<Expect> {
    let mut ptr_of: HashMap<u64, u64> = HashMap::new();
    let mut kernel_name: HashMap<u32, String> = HashMap::new();
    let ptr = |ptr_of: &HashMap<u64, u64>, id: u64| -> u64 {
        if id == 0 {
            0
        } else {
            *ptr_of
                .get(&id)
                .unwrap_or_else(|| panic!("allocation id {id} used before its Alloc record"))
        }
    };
    let mut out = Vec::new();
    for r in records {
        match r {
            Record::Kernel(k) => {
                kernel_name.insert(k.id, k.name.clone());
            }
            Record::Alloc(a) => {
                assert!(
                    ptr_of.insert(a.id, a.ptr).is_none(),
                    "allocation id {} reused",
                    a.id
                );
                out.push(Expect::Alloc {
                    ptr: a.ptr,
                    bytes: a.bytes,
                    kind: alloc_kind(a.kind).into(),
                    stream: a.stream,
                });
            }
            Record::Free(f) => out.push(Expect::Free {
                ptr: ptr(&ptr_of, f.id),
                stream: f.stream,
            }),
            Record::Launch(l) => {
                let mut accesses: Vec<(u64, u32)> = l
                    .accesses
                    .iter()
                    .map(|a| (ptr(&ptr_of, a.alloc), a.param_offset))
                    .collect();
                accesses.sort_unstable();
                out.push(Expect::Launch {
                    kernel: kernel_name
                        .get(&l.kernel)
                        .unwrap_or_else(|| {
                            panic!("kernel {} launched before its Kernel record", l.kernel)
                        })
                        .clone(),
                    stream: l.stream,
                    grid: l.grid,
                    block: l.block,
                    smem: l.smem,
                    accesses,
                });
            }
            Record::Copy(c) => out.push(Expect::Copy {
                kind: copy_kind(c.kind).into(),
                dst: ptr(&ptr_of, c.dst),
                src: ptr(&ptr_of, c.src),
                bytes: c.bytes,
                asynchronous: c.asynchronous,
                stream: c.stream,
            }),
            Record::Memset(m) => out.push(Expect::Memset {
                dst: ptr(&ptr_of, m.dst),
                bytes: m.bytes,
                asynchronous: m.asynchronous,
                stream: m.stream,
            }),
            Record::Sync(s) => out.push(match s.scope {
                SyncScope::Stream(h) => Expect::Sync {
                    scope: "stream".into(),
                    handle: h,
                },
                SyncScope::Event(h) => Expect::Sync {
                    scope: "event".into(),
                    handle: h,
                },
                SyncScope::Context => Expect::Sync {
                    scope: "ctx".into(),
                    handle: 0,
                },
            }),
            // What the library did is not what the program asked for.
            Record::Header(_)
            | Record::LaunchTime(_)
            | Record::Stats(_)
            | Record::End(_)
            | Record::Swap(_)
            | Record::Busy(_)
            | Record::Plan(_) => {}
        }
    }
    out
}

/// Expectations with launch accesses sorted (the order a workload lists them in is free).
pub fn canonical(mut e: Vec<Expect>) -> Vec<Expect> {
    for x in &mut e {
        if let Expect::Launch { accesses, .. } = x {
            accesses.sort_unstable();
        }
    }
    e
}

/// Compares in order; on a mismatch, says where and shows the neighbourhood.
pub fn compare_in_order(got: &[Expect], want: &[Expect]) -> Result<(), String> {
    let first_diff = got.iter().zip(want).position(|(g, w)| g != w);
    match first_diff {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!(
            "the trace has {} events, the workload expected {}; first unmatched: {:?}",
            got.len(),
            want.len(),
            got.get(want.len())
                .map(|e| e.to_string())
                .or(want.get(got.len()).map(|e| e.to_string()))
        )),
        Some(i) => {
            let show = |v: &[Expect]| {
                v[i.saturating_sub(2)..(i + 3).min(v.len())]
                    .iter()
                    .map(|e| format!("    {e}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            Err(format!(
                "event #{i} differs\n  trace:\n{}\n  expected:\n{}",
                show(got),
                show(want)
            ))
        }
    }
}

/// Compares as multisets (for workloads whose threads interleave).
pub fn compare_unordered(got: &[Expect], want: &[Expect]) -> Result<(), String> {
    let mut g: Vec<String> = got.iter().map(|e| e.to_string()).collect();
    let mut w: Vec<String> = want.iter().map(|e| e.to_string()).collect();
    g.sort();
    w.sort();
    if g == w {
        return Ok(());
    }
    let missing: Vec<&String> = w.iter().filter(|x| !g.contains(x)).take(5).collect();
    let extra: Vec<&String> = g.iter().filter(|x| !w.contains(x)).take(5).collect();
    Err(format!(
        "{} traced vs {} expected; missing from the trace: {missing:?}; not expected: {extra:?}",
        g.len(),
        w.len()
    ))
}

/// The swap statistics a run wrote into its trace at `path` (which is removed afterwards).
/// Panics if the trace has no `Stats` record: every run of the shim writes one at exit.
pub fn trace_stats(path: &Path) -> tensile_trace::Stats {
    let t = read_trace(path);
    let _ = std::fs::remove_file(path);
    t.records
        .iter()
        .find_map(|r| match r {
            Record::Stats(s) => Some(s.clone()),
            _ => None,
        })
        .expect("the trace has a Stats record")
}
