//! Importers: the shared capture traces, the project's own format, and every way a file can be
//! wrong (foreign, truncated, malformed, inconsistent), each reported by kind and place.

use std::io::Write;
use std::path::{Path, PathBuf};

use tensile_analyzer::import::{load, LoadError, LoadOptions, Location};
use tensile_analyzer::model::{CopyDir, OpKind, SourceFormat, SyncScope};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let file = std::fs::File::open(path).unwrap();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut out).unwrap();
    out
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    // Cargo's scratch directory for integration tests, inside the target directory.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("import");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Counts the lines of each record letter in a capture text.
fn count(text: &str, tag: &str) -> usize {
    text.lines()
        .filter(|l| l.split(' ').next() == Some(tag))
        .count()
}

#[test]
fn shared_traces_load_completely() {
    for name in ["mlp.trace.gz", "resnet50.trace.gz", "bert.trace.gz"] {
        let path = data(name);
        let text = String::from_utf8(gunzip(&path)).unwrap();
        let trace = load(&path, LoadOptions::default()).unwrap();
        assert_eq!(trace.format, SourceFormat::CaptureV1);
        assert!(trace.complete, "{name} ends with '# end'");
        assert_eq!(trace.allocations.len(), count(&text, "A"), "{name}");
        assert_eq!(trace.launch_count(), count(&text, "K"), "{name}");
        assert_eq!(
            trace.ops.len(),
            count(&text, "K") + count(&text, "C"),
            "{name}"
        );
        assert_eq!(trace.syncs.len(), count(&text, "S"), "{name}");
        assert_eq!(trace.kernels.len(), count(&text, "N"), "{name}");
        let frees = trace
            .allocations
            .iter()
            .filter(|a| a.free.is_some())
            .count();
        assert_eq!(frees, count(&text, "F"), "{name}");
        // Every launch in these traces got a duration.
        let timed = trace.ops.iter().filter(|o| o.gpu_ns.is_some()).count();
        assert_eq!(timed, count(&text, "D"), "{name}");
    }
}

#[test]
fn capture_fields_are_parsed_exactly() {
    let text = "# capture v1: test\n\
N 7 2 my_kernel\n\
A 100 (nil) 5 7f0000000000 4096\n\
A 110 0x1234 6 7f0000001000 8192\n\
C 120 (nil) h2d 5 0 4096\n\
K 130 0x1234 9 7 2,1,1 128,1,1 0 5@0 6@8 5@16\n\
D 9 777\n\
S 140 0x1234\n\
S 150 all\n\
F 160 (nil) 5\n\
# end\n";
    let path = temp_file("exact.trace", text.as_bytes());
    let t = load(&path, LoadOptions::default()).unwrap();
    assert!(t.complete);
    assert_eq!(t.kernels[0].name, "my_kernel");
    assert_eq!(t.kernels[0].nparams, 2);
    assert_eq!(t.allocations[0].ptr, 0x7f00_0000_0000);
    assert_eq!(t.allocations[1].stream, 0x1234);
    assert_eq!(t.allocations[1].bytes, 8192);
    assert_eq!(t.ops.len(), 2);
    assert_eq!(
        t.ops[0].kind,
        OpKind::Copy {
            dir: CopyDir::HostToDevice
        }
    );
    assert_eq!(t.ops[0].touches, vec![0]);
    assert_eq!(t.ops[1].kind, OpKind::Launch { kernel: 7 });
    assert_eq!(t.ops[1].touches, vec![0, 1], "sorted, deduplicated");
    assert_eq!(t.ops[1].gpu_ns, Some(777));
    assert_eq!(t.ops[1].seq, 9);
    assert_eq!(t.syncs[0].scope, SyncScope::Stream(0x1234));
    assert_eq!(t.syncs[1].scope, SyncScope::Device);
    assert_eq!(t.syncs[1].before_op, 2);
    let freed = t.allocations[0].free.unwrap();
    assert_eq!((freed.t_ns, freed.before_op), (160, 2));
    assert!(t.allocations[1].free.is_none());
}

#[test]
fn gzipped_and_plain_capture_give_the_same_model() {
    let gz = data("mlp.trace.gz");
    let plain = temp_file("mlp.trace", &gunzip(&gz));
    let a = load(&gz, LoadOptions::default()).unwrap();
    let b = load(&plain, LoadOptions::default()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn truncated_gzip_is_reported_and_can_be_salvaged() {
    let bytes = std::fs::read(data("mlp.trace.gz")).unwrap();
    let cut = temp_file("cut.trace.gz", &bytes[..bytes.len() / 2]);
    match load(&cut, LoadOptions::default()) {
        Err(LoadError::Truncated {
            at: Location::Line(n),
            ..
        }) => assert!(n > 100, "line {n}"),
        other => panic!("expected Truncated, got {other:?}"),
    }
    let partial = load(
        &cut,
        LoadOptions {
            allow_truncated: true,
        },
    )
    .unwrap();
    let full = load(&data("mlp.trace.gz"), LoadOptions::default()).unwrap();
    assert!(!partial.complete);
    assert!(partial.ops.len() > 100 && partial.ops.len() < full.ops.len());
    // Same ops in the same order (durations of the last launches arrive after the cut).
    let same = partial
        .ops
        .iter()
        .zip(&full.ops)
        .all(|(a, b)| a.kind == b.kind && a.t_ns == b.t_ns && a.touches == b.touches);
    assert!(same, "the salvaged prefix differs from the full trace");
}

#[test]
fn text_cut_mid_line_is_truncated_at_that_line() {
    let text = gunzip(&data("mlp.trace.gz"));
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').take(50).collect();
    let mut cut = lines[..49].join(&b'\n');
    cut.push(b'\n');
    cut.extend_from_slice(&lines[49][..lines[49].len() / 2]);
    let path = temp_file("cut.trace", &cut);
    match load(&path, LoadOptions::default()) {
        Err(LoadError::Truncated { at, .. }) => assert_eq!(at, Location::Line(50)),
        other => panic!("expected Truncated at line 50, got {other:?}"),
    }
}

#[test]
fn foreign_files_are_refused() {
    for (name, bytes) in [
        ("png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec()),
        ("empty", Vec::new()),
        ("csv", b"a,b,c\n1,2,3\n".to_vec()),
        ("comment", b"# some other format\nA 1 2 3\n".to_vec()),
    ] {
        let path = temp_file(name, &bytes);
        let err = load(&path, LoadOptions::default()).unwrap_err();
        assert!(matches!(err, LoadError::Foreign { .. }), "{name}: {err:?}");
        assert!(err.to_string().contains("not a trace"), "{name}: {err}");
    }
    // A gzip of something else is foreign too.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"hello world\n").unwrap();
    let path = temp_file("hello.gz", &gz.finish().unwrap());
    assert!(matches!(
        load(&path, LoadOptions::default()),
        Err(LoadError::Foreign { .. })
    ));
    let missing = load(Path::new("/nonexistent/trace.gz"), LoadOptions::default()).unwrap_err();
    assert!(matches!(missing, LoadError::Io { .. }));
}

#[test]
fn malformed_lines_name_the_line_and_the_expectation() {
    let cases: [(&str, u64, &str); 6] = [
        ("A 1 (nil) 1 zz 4096\n", 2, "a device address in hex"),
        ("A 1 (nil) 1 10\n", 2, "a size in bytes (line too short)"),
        ("K 1 (nil) 1 0 1,1 1,1,1 0\n", 2, "a grid size as x,y,z"),
        (
            "A 1 (nil) 1 10 4096\nK 1 (nil) 1 0 1,1,1 1,1,1 0 1-0\n",
            3,
            "an access as <id>@<offset>",
        ),
        ("Q 1 2 3\n", 2, "a record letter (N, A, F, K, D, C or S)"),
        (
            "C 1 (nil) sideways 0 0 8\n",
            2,
            "a copy kind (h2d, d2h, d2d or any)",
        ),
    ];
    for (body, line, expected_text) in cases {
        let path = temp_file("bad.trace", format!("# capture v1\n{body}").as_bytes());
        match load(&path, LoadOptions::default()) {
            Err(LoadError::Syntax { at, expected, .. }) => {
                assert_eq!(at, Location::Line(line), "{body}");
                assert_eq!(expected, expected_text, "{body}");
            }
            other => panic!("{body}: expected a syntax error, got {other:?}"),
        }
    }
}

#[test]
fn inconsistent_records_are_refused() {
    let cases = [
        ("F 1 (nil) 9\n", "allocation id 9 was never allocated"),
        (
            "A 1 (nil) 1 10 16\nA 2 (nil) 1 20 16\n",
            "allocation id 1 is allocated twice",
        ),
        (
            "A 1 (nil) 1 10 16\nF 2 (nil) 1\nF 3 (nil) 1\n",
            "allocation id 1 is freed twice",
        ),
        ("D 5 100\n", "duration for launch 5, which was never seen"),
        (
            "K 1 (nil) 1 0 1,1,1 1,1,1 0 3@0\n",
            "allocation id 3 was never allocated",
        ),
    ];
    for (body, reason_text) in cases {
        let path = temp_file(
            "inconsistent.trace",
            format!("# capture v1\n{body}").as_bytes(),
        );
        match load(&path, LoadOptions::default()) {
            Err(LoadError::Inconsistent { reason, .. }) => assert_eq!(reason, reason_text),
            other => panic!("{body}: expected Inconsistent, got {other:?}"),
        }
    }
}

mod tensile_format {
    use super::*;
    use tensile_trace::{
        Access, Alloc, AllocKind, Copy, CopyKind, End, Free, Header, KernelInfo, Launch,
        LaunchTime, Record, Sync, SyncScope as TSync, Writer, FORMAT_VERSION,
    };

    fn records() -> Vec<Record> {
        vec![
            Record::Kernel(KernelInfo {
                id: 3,
                name: "axpy".into(),
                nparams: 3,
            }),
            Record::Alloc(Alloc {
                t_ns: 10,
                stream: 0,
                id: 1,
                ptr: 0x1000,
                bytes: 256,
                kind: AllocKind::Async,
            }),
            Record::Alloc(Alloc {
                t_ns: 11,
                stream: 0,
                id: 2,
                ptr: 0x2000,
                bytes: 512,
                kind: AllocKind::Sync,
            }),
            Record::Copy(Copy {
                t_ns: 12,
                stream: 0,
                kind: CopyKind::HostToDevice,
                dst: 1,
                src: 0,
                bytes: 256,
                asynchronous: true,
            }),
            Record::Launch(Launch {
                t_ns: 13,
                stream: 7,
                seq: 0,
                kernel: 3,
                grid: [1, 1, 1],
                block: [32, 1, 1],
                smem: 0,
                accesses: vec![
                    Access {
                        alloc: 2,
                        param_offset: 8,
                    },
                    Access {
                        alloc: 1,
                        param_offset: 0,
                    },
                ],
            }),
            Record::Sync(Sync {
                t_ns: 14,
                scope: TSync::Context,
            }),
            Record::LaunchTime(LaunchTime {
                seq: 0,
                gpu_ns: 4242,
            }),
            Record::Free(Free {
                t_ns: 15,
                stream: 0,
                id: 1,
            }),
        ]
    }

    fn write(records: &[Record], end: bool) -> Vec<u8> {
        let header = Header {
            format_version: FORMAT_VERSION,
            pid: 1,
            start_unix_ns: 0,
            producer: "test".into(),
            command: "test".into(),
        };
        let mut w = Writer::new(Vec::new(), &header).unwrap();
        for r in records {
            w.write(r).unwrap();
        }
        if end {
            w.finish(End {
                t_ns: 16,
                dropped_records: 0,
            })
            .unwrap()
        } else {
            w.flush().unwrap();
            w.finish(End {
                t_ns: 16,
                dropped_records: 0,
            })
            .unwrap()
        }
    }

    #[test]
    fn own_format_maps_onto_the_model() {
        let bytes = write(&records(), true);
        for (name, content) in [
            ("own.tnsl", bytes.clone()),
            ("own.tnsl.gz", {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&bytes).unwrap();
                gz.finish().unwrap()
            }),
        ] {
            let t = load(&temp_file(name, &content), LoadOptions::default()).unwrap();
            assert_eq!(t.format, SourceFormat::Tensile);
            assert!(t.complete);
            assert_eq!(t.kernels[0].name, "axpy");
            assert_eq!(t.allocations.len(), 2);
            assert_eq!(t.ops.len(), 2);
            assert_eq!(t.ops[1].kind, OpKind::Launch { kernel: 3 });
            assert_eq!(t.ops[1].stream, 7);
            assert_eq!(t.ops[1].touches, vec![0, 1]);
            assert_eq!(t.ops[1].gpu_ns, Some(4242));
            assert_eq!(t.syncs[0].scope, SyncScope::Device);
            assert_eq!(t.allocations[0].free.map(|f| f.before_op), Some(2));
        }
    }

    #[test]
    fn own_format_cut_mid_record_is_truncated() {
        let bytes = write(&records(), true);
        let cut = temp_file("cut.tnsl", &bytes[..bytes.len() - 7]);
        let err = load(&cut, LoadOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::Truncated {
                    at: Location::Record(_),
                    ..
                }
            ),
            "{err:?}"
        );
        let partial = load(
            &cut,
            LoadOptions {
                allow_truncated: true,
            },
        )
        .unwrap();
        assert!(!partial.complete);
        assert_eq!(partial.ops.len(), 2);
    }

    #[test]
    fn own_format_gzip_cut_is_truncated_at_the_records_kept_not_at_zero() {
        let mut long = records();
        long.extend((0..3000).map(|t| {
            Record::Sync(Sync {
                t_ns: 100 + t,
                scope: TSync::Context,
            })
        }));
        let bytes = write(&long, true);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        gz.write_all(&bytes).unwrap();
        let gz = gz.finish().unwrap();
        let cut = temp_file("cut.tnsl.gz", &gz[..gz.len() * 7 / 10]);
        let err = load(&cut, LoadOptions::default()).unwrap_err();
        match &err {
            LoadError::Truncated {
                at: Location::Record(n),
                ..
            } => assert!(*n > 1000, "cut reported at record {n}"),
            other => panic!("expected Truncated at a record, got {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains("--allow-truncated"), "{message}");
        let partial = load(
            &cut,
            LoadOptions {
                allow_truncated: true,
            },
        )
        .unwrap();
        assert!(!partial.complete);
        assert_eq!(partial.ops.len(), 2);
        assert!(partial.syncs.len() > 1000 && partial.syncs.len() < 3001);
    }

    #[test]
    fn own_format_inconsistency_names_the_record() {
        let mut recs = records();
        recs.push(Record::Free(Free {
            t_ns: 20,
            stream: 0,
            id: 99,
        }));
        let path = temp_file("bad.tnsl", &write(&recs, true));
        match load(&path, LoadOptions::default()) {
            Err(LoadError::Inconsistent { at, reason, .. }) => {
                assert_eq!(at, Location::Record(9));
                assert_eq!(reason, "allocation id 99 was never allocated");
            }
            other => panic!("expected Inconsistent, got {other:?}"),
        }
    }
}
