//! The summary of a trace in libtensile's own format, streamed record by record.
//!
//! Streams the records once, so multi-gigabyte traces need no more memory than their
//! live allocations. The figures that judge the interposer itself are here too: the
//! share of launches in which at least one allocation was resolved, and the share of
//! freed bytes that some launch was seen to touch; and the swap statistics the shim
//! writes at exit. Capture files (which hold none of this) are summarized by `model`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tensile_trace::{CopyKind, Record, Stats};

use super::library::LibraryWork;
use super::{bytes, ms, pct, write_top_kernels, KernelStats};

/// Running totals over a trace's records.
#[derive(Default)]
pub struct TraceSummary {
    records: u64,
    allocs: u64,
    alloc_bytes: u64,
    largest_alloc: u64,
    frees: u64,
    freed_bytes: u64,
    freed_bytes_seen: u64,
    live: HashMap<u64, (u64, bool)>,
    live_bytes: u64,
    peak_live_bytes: u64,
    launches: u64,
    launches_resolved: u64,
    accesses: u64,
    streams: HashSet<u64>,
    kernel_names: HashMap<u32, String>,
    kernel_of_launch: HashMap<u64, u32>,
    kernels: HashMap<u32, KernelStats>,
    copies: HashMap<CopyKind, (u64, u64)>,
    memsets: u64,
    syncs: u64,
    dropped: u64,
    ended: bool,
    span_ns: u64,
    /// Swap statistics records, in file order (the shim writes one at a clean exit).
    pub stats: Vec<Stats>,
    /// The library's own swaps, host time and plans (format 2).
    pub library: LibraryWork,
}

impl TraceSummary {
    /// Accounts for one record.
    pub fn add(&mut self, record: &Record) {
        self.records += 1;
        if let Some(t) = record.t_ns() {
            self.span_ns = self.span_ns.max(t);
        }
        match record {
            Record::Header(_) => {}
            Record::Stats(stats) => self.stats.push(stats.clone()),
            Record::Kernel(k) => {
                self.kernel_names.insert(k.id, k.name.clone());
            }
            Record::Alloc(a) => {
                self.allocs += 1;
                self.alloc_bytes += a.bytes;
                self.largest_alloc = self.largest_alloc.max(a.bytes);
                self.live.insert(a.id, (a.bytes, false));
                self.live_bytes += a.bytes;
                self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
                self.streams.insert(a.stream);
            }
            Record::Free(f) => {
                self.frees += 1;
                if let Some((bytes, seen)) = self.live.remove(&f.id) {
                    self.live_bytes -= bytes;
                    self.freed_bytes += bytes;
                    if seen {
                        self.freed_bytes_seen += bytes;
                    }
                }
            }
            Record::Launch(l) => {
                self.launches += 1;
                self.streams.insert(l.stream);
                self.accesses += l.accesses.len() as u64;
                let mut resolved = false;
                for access in &l.accesses {
                    if let Some(entry) = self.live.get_mut(&access.alloc) {
                        entry.1 = true;
                        resolved = true;
                    }
                }
                self.launches_resolved += u64::from(resolved);
                self.kernel_of_launch.insert(l.seq, l.kernel);
                self.kernels.entry(l.kernel).or_default().launches += 1;
            }
            Record::LaunchTime(t) => {
                if let Some(kernel) = self.kernel_of_launch.remove(&t.seq) {
                    self.kernels.entry(kernel).or_default().time(t.gpu_ns);
                }
            }
            Record::Copy(c) => {
                let entry = self.copies.entry(c.kind).or_default();
                entry.0 += 1;
                entry.1 += c.bytes;
            }
            Record::Memset(_) => self.memsets += 1,
            Record::Sync(_) => self.syncs += 1,
            Record::End(e) => {
                self.ended = true;
                self.dropped = e.dropped_records;
            }
            Record::Swap(_) | Record::Busy(_) | Record::Plan(_) => {
                self.library.add(record);
            }
        }
    }

    /// Whether the end marker was read.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The human-readable report.
    pub fn report(&self, top: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "records:  {} over {:.3} s",
            self.records,
            self.span_ns as f64 / 1e9
        );
        if self.dropped > 0 {
            let _ = writeln!(
                out,
                "dropped:  {} records (the recorder's queue was full)",
                self.dropped
            );
        }
        let _ = writeln!(
            out,
            "allocations: {} ({}), largest {}, peak live {}; frees: {}",
            self.allocs,
            bytes(self.alloc_bytes),
            bytes(self.largest_alloc),
            bytes(self.peak_live_bytes),
            self.frees
        );
        let _ = writeln!(
            out,
            "launches: {} on {} streams, {} kernels; with a resolved allocation: {}",
            self.launches,
            self.streams.len(),
            self.kernels.len(),
            pct(self.launches_resolved, self.launches)
        );
        let _ = writeln!(
            out,
            "freed bytes seen in some launch: {} of {}",
            pct(self.freed_bytes_seen, self.freed_bytes),
            bytes(self.freed_bytes)
        );
        let mut copies: Vec<_> = self.copies.iter().collect();
        copies.sort_by_key(|(kind, _)| format!("{kind:?}"));
        for (kind, (count, total)) in copies {
            let _ = writeln!(out, "copies {kind:?}: {count} ({})", bytes(*total));
        }
        let _ = writeln!(out, "memsets: {}; host syncs: {}", self.memsets, self.syncs);
        out.push_str(&stats_report(&self.stats));
        out.push_str(&self.library.report());
        write_top_kernels(
            &mut out,
            &self.kernels,
            |id| self.kernel_names.get(&id).map(String::as_str),
            top,
        );
        out
    }
}

/// The swap statistics lines of a report.
pub fn stats_report(stats: &[Stats]) -> String {
    if stats.is_empty() {
        return "swap statistics: none in this trace (the shim writes them when the program \
                exits cleanly)\n"
            .to_string();
    }
    let mut out = String::new();
    for (i, s) in stats.iter().enumerate() {
        let which = if stats.len() > 1 {
            format!(" ({} of {})", i + 1, stats.len())
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "swap statistics{which}: to host {}, to device {}; {} launches stalled for {} in \
             all; peak resident {}, host pool {}",
            bytes(s.bytes_to_host),
            bytes(s.bytes_to_device),
            s.stalled_launches,
            ms(s.stall_ns),
            bytes(s.peak_resident_bytes),
            bytes(s.host_pool_bytes)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_trace::*;

    fn alloc(id: u64, bytes: u64) -> Record {
        Record::Alloc(Alloc {
            t_ns: id,
            stream: 0,
            id,
            ptr: id << 30,
            bytes,
            kind: AllocKind::Async,
        })
    }

    fn launch(seq: u64, kernel: u32, allocs: &[u64]) -> Record {
        Record::Launch(Launch {
            t_ns: 100 + seq,
            stream: 7,
            seq,
            kernel,
            grid: [1; 3],
            block: [1; 3],
            smem: 0,
            accesses: allocs
                .iter()
                .map(|&alloc| Access {
                    alloc,
                    param_offset: 0,
                })
                .collect(),
        })
    }

    #[test]
    fn summary_counts_resolution_and_freed_bytes_seen() {
        let mut s = TraceSummary::default();
        let records = [
            Record::Kernel(KernelInfo {
                id: 1,
                name: "axpy".into(),
                nparams: 4,
            }),
            Record::Kernel(KernelInfo {
                id: 2,
                name: "fill".into(),
                nparams: 3,
            }),
            alloc(1, 1000),
            alloc(2, 3000),
            launch(0, 1, &[1]),
            launch(1, 2, &[]),
            Record::LaunchTime(LaunchTime {
                seq: 0,
                gpu_ns: 5_000_000,
            }),
            Record::LaunchTime(LaunchTime {
                seq: 1,
                gpu_ns: 1_000_000,
            }),
            Record::Free(Free {
                t_ns: 200,
                stream: 0,
                id: 1,
            }),
            Record::Free(Free {
                t_ns: 201,
                stream: 0,
                id: 2,
            }),
        ];
        for r in &records {
            s.add(r);
        }
        assert_eq!((s.launches, s.launches_resolved), (2, 1));
        assert_eq!((s.freed_bytes, s.freed_bytes_seen), (4000, 1000));
        assert_eq!(s.peak_live_bytes, 4000);
        let report = s.report(5);
        assert!(
            report.contains("with a resolved allocation: 50.00000%"),
            "{report}"
        );
        assert!(
            report.contains("freed bytes seen in some launch: 25.00000%"),
            "{report}"
        );
        let axpy = report.find("axpy").unwrap();
        let fill = report.find("fill").unwrap();
        assert!(axpy < fill, "kernels must be sorted by GPU time:\n{report}");
    }

    #[test]
    fn swap_statistics_are_reported_or_said_absent() {
        let mut s = TraceSummary::default();
        assert!(s.report(1).contains("swap statistics: none in this trace"));
        s.add(&Record::Stats(Stats {
            bytes_to_host: 3 << 20,
            bytes_to_device: 5 << 20,
            stalled_launches: 7,
            stall_ns: 2_500_000,
            peak_resident_bytes: 1 << 30,
            host_pool_bytes: 2 << 30,
        }));
        let report = s.report(1);
        assert!(
            report.contains("swap statistics: to host 3.00 MiB, to device 5.00 MiB"),
            "{report}"
        );
        assert!(
            report.contains("7 launches stalled for 2.500 ms in all"),
            "{report}"
        );
        assert!(report.contains("peak resident 1.00 GiB"), "{report}");
    }
}
