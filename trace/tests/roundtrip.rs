//! Round trips, cut files, and foreign files.

use std::io::Write;

use proptest::prelude::*;
use tensile_trace::*;

fn header() -> Header {
    Header {
        format_version: FORMAT_VERSION,
        pid: 4242,
        start_unix_ns: 1_700_000_000_000_000_000,
        producer: "libtensile test".into(),
        command: "python train.py".into(),
    }
}

fn sample_records() -> Vec<Record> {
    vec![
        Record::Kernel(KernelInfo {
            id: 1,
            name: "_Z4axpyfPKfPfm".into(),
            nparams: 4,
        }),
        Record::Alloc(Alloc {
            t_ns: 10,
            stream: 0,
            id: 1,
            ptr: 0x7f00_0000_0000,
            bytes: 1 << 20,
            kind: AllocKind::Sync,
        }),
        Record::Alloc(Alloc {
            t_ns: 11,
            stream: 0x55,
            id: 2,
            ptr: 0x7f00_0010_0000,
            bytes: 4096,
            kind: AllocKind::Async,
        }),
        Record::Copy(Copy {
            t_ns: 12,
            stream: 0x55,
            kind: CopyKind::HostToDevice,
            dst: 1,
            src: 0,
            bytes: 1 << 20,
            asynchronous: true,
        }),
        Record::Launch(Launch {
            t_ns: 13,
            stream: 0x55,
            seq: 0,
            kernel: 1,
            grid: [64, 1, 1],
            block: [256, 1, 1],
            smem: 0,
            accesses: vec![
                Access {
                    alloc: 1,
                    param_offset: 8,
                },
                Access {
                    alloc: 2,
                    param_offset: 16,
                },
            ],
        }),
        Record::LaunchTime(LaunchTime {
            seq: 0,
            gpu_ns: 12_345,
        }),
        Record::Memset(Memset {
            t_ns: 14,
            stream: 0,
            dst: 2,
            bytes: 4096,
            asynchronous: false,
        }),
        Record::Sync(Sync {
            t_ns: 15,
            scope: SyncScope::Stream(0x55),
        }),
        Record::Sync(Sync {
            t_ns: 16,
            scope: SyncScope::Context,
        }),
        Record::Free(Free {
            t_ns: 17,
            stream: 0x55,
            id: 2,
        }),
        Record::Swap(Swap {
            t_ns: 18,
            dir: SwapDir::ToHost,
            cause: SwapCause::Reserve,
            pages: 8,
            bytes: 7 << 21,
            runs: vec![(0x7f00_0000_0000, 5), (0x7f00_0140_0000, 3)],
        }),
        Record::Busy(Busy {
            t_ns: 19,
            dur_ns: 1_500,
            kind: BusyKind::Stall,
            thread: 4243,
            pages: 3,
        }),
        Record::Plan(PlanChange {
            t_ns: 20,
            version: 1,
            launches: 400,
            change: PlanChangeKind::Loaded {
                applies_from: 444,
                page_bytes: 2 << 20,
                plan: vec![1, 2, 3],
            },
        }),
        Record::Plan(PlanChange {
            t_ns: 21,
            version: 1,
            launches: 900,
            change: PlanChangeKind::Dropped {
                reason: "kernel 7 at position 3, the plan has 5".into(),
            },
        }),
        Record::Stats(Stats {
            bytes_to_host: 1,
            bytes_to_device: 2,
            ..Stats::default()
        }),
    ]
}

fn write_trace(records: &[Record], end: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out, &header()).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    if end {
        w.finish(End {
            t_ns: 99,
            dropped_records: 0,
        })
        .unwrap();
    } else {
        // What a crashed recorder leaves: complete frames, no End record.
        w.flush().unwrap();
    }
    out
}

#[test]
fn every_record_kind_round_trips() {
    let records = sample_records();
    let bytes = write_trace(&records, true);
    let mut reader = Reader::new(bytes.as_slice()).unwrap();
    assert_eq!(reader.header(), &header());
    let back: Vec<Record> = reader.by_ref().map(|r| r.unwrap()).collect();
    assert_eq!(&back[..records.len()], &records[..]);
    assert_eq!(
        back.last(),
        Some(&Record::End(End {
            t_ns: 99,
            dropped_records: 0
        }))
    );
    assert!(reader.finished_cleanly());
}

#[test]
fn a_cut_anywhere_yields_the_complete_prefix_then_truncated() {
    let records = sample_records();
    let bytes = write_trace(&records, true);
    // Offsets of frame ends, found by re-reading prefixes: every cut point must give exactly
    // the records whose frames fit, then one Truncated error (or nothing at a frame boundary).
    let header_len = {
        let mut w = Writer::new(Vec::new(), &header()).unwrap();
        w.flush().unwrap();
        w.finish(End {
            t_ns: 0,
            dropped_records: 0,
        })
        .unwrap()
        .len()
            - frame_len(&Record::End(End {
                t_ns: 0,
                dropped_records: 0,
            }))
    };
    let mut boundaries = vec![header_len];
    for r in records.iter().chain([&Record::End(End {
        t_ns: 99,
        dropped_records: 0,
    })]) {
        boundaries.push(boundaries.last().unwrap() + frame_len(r));
    }
    assert_eq!(*boundaries.last().unwrap(), bytes.len());
    for cut in 0..bytes.len() {
        let prefix = &bytes[..cut];
        match Reader::new(prefix) {
            Err(TraceError::NotATrace) => assert!(cut < 8, "cut {cut}"),
            Err(TraceError::Truncated { records_read: 0 }) => {
                assert!(cut < header_len, "cut {cut}")
            }
            Err(e) => panic!("cut {cut}: unexpected {e}"),
            Ok(reader) => {
                assert!(cut >= header_len);
                let complete = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
                let items: Vec<_> = reader.collect();
                let ok: Vec<&Record> = items.iter().filter_map(|r| r.as_ref().ok()).collect();
                assert_eq!(ok.len(), complete, "cut {cut}");
                assert_eq!(
                    ok.iter().map(|r| (*r).clone()).collect::<Vec<_>>()[..],
                    records[..complete]
                );
                let at_boundary = boundaries.contains(&cut);
                match items.last() {
                    Some(Err(TraceError::Truncated { records_read })) => {
                        assert!(!at_boundary, "cut {cut}");
                        assert_eq!(*records_read, complete as u64 + 1);
                    }
                    _ => assert!(at_boundary, "cut {cut}: mid-frame cut not reported"),
                }
            }
        }
    }
}

fn frame_len(record: &Record) -> usize {
    let payload = postcard::to_allocvec(record).unwrap().len();
    let varint = if payload < 128 {
        1
    } else if payload < 16384 {
        2
    } else {
        3
    };
    varint + payload + 4
}

#[test]
fn a_trace_without_end_reads_but_is_not_clean() {
    let records = sample_records();
    let bytes = write_trace(&records, false);
    let mut reader = Reader::new(bytes.as_slice()).unwrap();
    assert_eq!(reader.by_ref().filter(|r| r.is_ok()).count(), records.len());
    assert!(!reader.finished_cleanly());
}

#[test]
fn foreign_and_newer_files_are_refused_clearly() {
    assert!(matches!(
        Reader::new(&b"# capture v1: A t stream"[..]),
        Err(TraceError::NotATrace)
    ));
    assert!(matches!(Reader::new(&b""[..]), Err(TraceError::NotATrace)));
    let mut bytes = write_trace(&sample_records(), true);
    bytes[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    match Reader::new(bytes.as_slice()) {
        Err(e @ TraceError::UnsupportedVersion { .. }) => {
            assert_eq!(
                e.to_string(),
                format!(
                    "trace format version {} is not supported (this build reads versions 1 to {})",
                    FORMAT_VERSION + 1,
                    FORMAT_VERSION
                )
            );
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    bytes[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert!(matches!(
        Reader::new(bytes.as_slice()),
        Err(TraceError::UnsupportedVersion { found: 0, .. })
    ));
}

#[test]
fn a_version_1_file_reads_as_it_was_written() {
    // Version 2 only added records at the end of `Record`: a file of version 1 holds none of
    // them, and each of its records decodes as before.
    let old: Vec<Record> = sample_records()
        .into_iter()
        .filter(|r| !matches!(r, Record::Swap(_) | Record::Busy(_) | Record::Plan(_)))
        .collect();
    let mut bytes = write_trace(&old, true);
    bytes[8..10].copy_from_slice(&OLDEST_READ_VERSION.to_le_bytes());
    assert_eq!(OLDEST_READ_VERSION, 1);
    let reader = Reader::new(bytes.as_slice()).unwrap();
    let read: Vec<Record> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(read.len(), old.len() + 1);
    assert_eq!(&read[..old.len()], &old[..]);
}

#[test]
fn a_flipped_bit_is_reported_as_corruption() {
    let bytes = write_trace(&sample_records(), true);
    let mut damaged = bytes.clone();
    let at = bytes.len() - 30;
    damaged[at] ^= 0x10;
    let reader = Reader::new(damaged.as_slice()).unwrap();
    let last = reader.last().unwrap();
    assert!(matches!(last, Err(TraceError::Corrupt { .. })), "{last:?}");
}

#[test]
fn open_reads_gzipped_and_plain_files() {
    let dir = std::env::temp_dir().join(format!("tensile-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = write_trace(&sample_records(), true);
    let plain = dir.join("t.trace");
    std::fs::write(&plain, &bytes).unwrap();
    let gz = dir.join("t.trace.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&bytes).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for path in [&plain, &gz] {
        let reader = Reader::open(path).unwrap();
        let n = reader.collect::<Result<Vec<_>, _>>().unwrap().len();
        assert_eq!(n, sample_records().len() + 1, "{}", path.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn arb_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            1u64..,
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(t_ns, stream, id, ptr, bytes)| Record::Alloc(Alloc {
                t_ns,
                stream,
                id,
                ptr,
                bytes,
                kind: AllocKind::Pool
            })),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            prop::collection::vec((any::<u64>(), any::<u32>()), 0..40)
        )
            .prop_map(|(t_ns, seq, kernel, acc)| Record::Launch(Launch {
                t_ns,
                stream: 7,
                seq,
                kernel,
                grid: [1, 2, 3],
                block: [4, 5, 6],
                smem: 7,
                accesses: acc
                    .into_iter()
                    .map(|(alloc, param_offset)| Access {
                        alloc,
                        param_offset
                    })
                    .collect(),
            })),
        (any::<u32>(), ".{0,300}").prop_map(|(id, name)| Record::Kernel(KernelInfo {
            id,
            name,
            nparams: 3
        })),
    ]
}

proptest! {
    #[test]
    fn random_records_round_trip(records in prop::collection::vec(arb_record(), 0..50)) {
        let bytes = write_trace(&records, true);
        let back: Vec<Record> = Reader::new(bytes.as_slice()).unwrap().map(|r| r.unwrap()).collect();
        prop_assert_eq!(&back[..records.len()], &records[..]);
    }
}

#[test]
fn a_cut_gzipped_trace_is_truncated_after_the_records_it_kept() {
    // Enough records that the compressed stream is cut well after its first block.
    let records: Vec<Record> = (0..40).flat_map(|_| sample_records()).collect();
    let bytes = write_trace(&records, true);
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    enc.write_all(&bytes).unwrap();
    let gz = enc.finish().unwrap();
    let dir = std::env::temp_dir().join(format!("tensile-trace-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.trace.gz");
    std::fs::write(&path, &gz[..gz.len() * 6 / 10]).unwrap();
    let mut reader = Reader::open(&path).unwrap();
    let kept = reader.by_ref().take_while(Result::is_ok).count() as u64;
    assert!(kept > 10, "only {kept} records before the cut");
    // The error came out of take_while; read it again from a fresh reader to check its kind.
    let last = Reader::open(&path).unwrap().last().unwrap();
    match last {
        Err(TraceError::Truncated { records_read }) => {
            assert_eq!(records_read, kept + 1, "the header counts as a record")
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
