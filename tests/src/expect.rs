//! The line protocol between a workload and the tests that run it.
//!
//! A workload prints, on stdout, one line per driver call it makes that libtensile must
//! see (`E ...`: the expectation, with the pointers it used), and one line per result it
//! computed (`D <name> <hex>`: a digest, compared bit for bit between runs with and
//! without the shim). Pointers are printed in hex; they differ between runs, digests must
//! not.

use std::fmt;

/// What a workload did, as the trace must show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// `E alloc <ptr> <bytes> <kind> <stream>`
    Alloc {
        ptr: u64,
        bytes: u64,
        kind: String,
        stream: u64,
    },
    /// `E free <ptr> <stream>`
    Free { ptr: u64, stream: u64 },
    /// `E launch <kernel> <stream> <gx,gy,gz> <bx,by,bz> <smem> <base@offset,...|->`: the
    /// allocations (by base pointer) the arguments point into, and where in the parameter
    /// buffer each pointer is.
    Launch {
        kernel: String,
        stream: u64,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        accesses: Vec<(u64, u32)>,
    },
    /// `E copy <kind> <dst-base|0> <src-base|0> <bytes> <async> <stream>`
    Copy {
        kind: String,
        dst: u64,
        src: u64,
        bytes: u64,
        asynchronous: bool,
        stream: u64,
    },
    /// `E memset <dst-base> <bytes> <async> <stream>`
    Memset {
        dst: u64,
        bytes: u64,
        asynchronous: bool,
        stream: u64,
    },
    /// `E sync stream <s>` / `E sync event <e>` / `E sync ctx`
    Sync { scope: String, handle: u64 },
}

fn dims(d: &[u32; 3]) -> String {
    format!("{},{},{}", d[0], d[1], d[2])
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Alloc {
                ptr,
                bytes,
                kind,
                stream,
            } => write!(f, "E alloc {ptr:#x} {bytes} {kind} {stream}"),
            Expect::Free { ptr, stream } => write!(f, "E free {ptr:#x} {stream}"),
            Expect::Launch {
                kernel,
                stream,
                grid,
                block,
                smem,
                accesses,
            } => {
                let acc = if accesses.is_empty() {
                    "-".to_owned()
                } else {
                    accesses
                        .iter()
                        .map(|(p, o)| format!("{p:#x}@{o}"))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                write!(
                    f,
                    "E launch {kernel} {stream} {} {} {smem} {acc}",
                    dims(grid),
                    dims(block)
                )
            }
            Expect::Copy {
                kind,
                dst,
                src,
                bytes,
                asynchronous,
                stream,
            } => {
                write!(
                    f,
                    "E copy {kind} {dst:#x} {src:#x} {bytes} {} {stream}",
                    u8::from(*asynchronous)
                )
            }
            Expect::Memset {
                dst,
                bytes,
                asynchronous,
                stream,
            } => {
                write!(
                    f,
                    "E memset {dst:#x} {bytes} {} {stream}",
                    u8::from(*asynchronous)
                )
            }
            Expect::Sync { scope, handle } => write!(f, "E sync {scope} {handle:#x}"),
        }
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn dims_of(s: &str) -> Option<[u32; 3]> {
    let v: Vec<u32> = s
        .split(',')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

impl Expect {
    /// Parses one `E ...` line.
    pub fn parse(line: &str) -> Option<Expect> {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["E", "alloc", ptr, bytes, kind, stream] => Some(Expect::Alloc {
                ptr: hex(ptr)?,
                bytes: bytes.parse().ok()?,
                kind: kind.to_string(),
                stream: stream.parse().ok()?,
            }),
            ["E", "free", ptr, stream] => Some(Expect::Free {
                ptr: hex(ptr)?,
                stream: stream.parse().ok()?,
            }),
            ["E", "launch", kernel, stream, grid, block, smem, acc] => {
                let accesses = if *acc == "-" {
                    Vec::new()
                } else {
                    acc.split(',')
                        .map(|a| {
                            let (p, o) = a.split_once('@')?;
                            Some((hex(p)?, o.parse().ok()?))
                        })
                        .collect::<Option<_>>()?
                };
                Some(Expect::Launch {
                    kernel: kernel.to_string(),
                    stream: stream.parse().ok()?,
                    grid: dims_of(grid)?,
                    block: dims_of(block)?,
                    smem: smem.parse().ok()?,
                    accesses,
                })
            }
            ["E", "copy", kind, dst, src, bytes, asy, stream] => Some(Expect::Copy {
                kind: kind.to_string(),
                dst: hex(dst)?,
                src: hex(src)?,
                bytes: bytes.parse().ok()?,
                asynchronous: *asy == "1",
                stream: stream.parse().ok()?,
            }),
            ["E", "memset", dst, bytes, asy, stream] => Some(Expect::Memset {
                dst: hex(dst)?,
                bytes: bytes.parse().ok()?,
                asynchronous: *asy == "1",
                stream: stream.parse().ok()?,
            }),
            ["E", "sync", scope, handle] => Some(Expect::Sync {
                scope: scope.to_string(),
                handle: hex(handle)?,
            }),
            _ => None,
        }
    }
}

/// Every expectation line of a workload's stdout, in order.
pub fn expectations(stdout: &str) -> Vec<Expect> {
    stdout
        .lines()
        .filter(|l| l.starts_with("E "))
        .map(|l| Expect::parse(l).unwrap_or_else(|| panic!("malformed expectation line: {l}")))
        .collect()
}

/// Every digest line (`D name hex`) of a workload's stdout, in order.
pub fn digests(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("D "))
        .map(str::to_owned)
        .collect()
}

/// The digest lines of a workload's stdout by name (`D name hex` gives `name -> hex`).
pub fn named_digests(stdout: &str) -> std::collections::BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("D "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// FNV-1a over `bytes`: a digest that changes with any bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let all = [
            Expect::Alloc {
                ptr: 0x7f00,
                bytes: 64,
                kind: "async".into(),
                stream: 2,
            },
            Expect::Free {
                ptr: 0x7f00,
                stream: 0,
            },
            Expect::Launch {
                kernel: "axpy".into(),
                stream: 0x55,
                grid: [1, 2, 3],
                block: [32, 1, 1],
                smem: 0,
                accesses: vec![(0x10, 8), (0x20, 16)],
            },
            Expect::Launch {
                kernel: "k".into(),
                stream: 0,
                grid: [1; 3],
                block: [1; 3],
                smem: 4,
                accesses: vec![],
            },
            Expect::Copy {
                kind: "htod".into(),
                dst: 0x10,
                src: 0,
                bytes: 4,
                asynchronous: true,
                stream: 9,
            },
            Expect::Memset {
                dst: 0x10,
                bytes: 4,
                asynchronous: false,
                stream: 0,
            },
            Expect::Sync {
                scope: "ctx".into(),
                handle: 0,
            },
        ];
        for e in all {
            assert_eq!(Expect::parse(&e.to_string()), Some(e.clone()), "{e}");
        }
        assert_eq!(Expect::parse("E launch x"), None);
    }
}
