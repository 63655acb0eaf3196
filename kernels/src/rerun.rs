//! `tensile_rerun_op`, the stand-in kernel of `tensile rerun`: its parameter layout, its stamps,
//! its result buffer, and its CPU twin.
//!
//! A replayed launch touches the allocations the recorded launch touched and takes the recorded
//! GPU time. In every piece of each touched allocation (one per `piece_bytes`, from offset 0)
//! it checks the 16-byte stamp the program last wrote there and writes the next one, so a piece
//! that swapping lost or left stale is caught by the first launch that touches it afterwards.
//! The program (the player) keeps the expected version of every allocation; version 0 means
//! "unstamped": nothing to check (never written) or nothing to write.
//!
//! The layout here must match `struct RerunArgs` and `struct RerunResult` in
//! `cuda/tensile_kernels.cu`.

use std::time::Duration;

use crate::memory::DeviceMemory;
use crate::params::ParamReader;
use crate::twins::{mix64, Launch, TwinError};

/// The entry's name.
pub const ENTRY: &str = "tensile_rerun_op";

/// Prefix of the copies of the entry that stand for distinct recorded kernels
/// ([`entry_for`]): a replayed step launches kernels as distinct as the recorded ones, so a
/// planner that learns the iteration from kernel identities sees the recorded pattern.
pub const ENTRY_COPY_PREFIX: &str = "tensile_rerun_op_k";

/// The name of the copy of the entry that stands for recorded kernel `kernel`.
pub fn entry_for(kernel: u32) -> String {
    format!("{ENTRY_COPY_PREFIX}{kernel}")
}

/// The project's PTX with one more copy of the entry per kernel of `kernels` (named by
/// [`entry_for`]; same body, same parameters, the same CPU twin). `None` if the PTX has no
/// such entry (it always has; the check keeps a broken build from launching garbage).
pub fn ptx_with_entries(kernels: &[u32]) -> Option<String> {
    let ptx = crate::PTX;
    let start = ptx.find(&format!(".visible .entry {ENTRY}("))?;
    let end = start + ptx[start..].find("\n}\n")? + 3;
    let entry = &ptx[start..end];
    let mut out = String::with_capacity(ptx.len() + kernels.len() * (entry.len() + 1));
    out.push_str(ptx);
    for &k in kernels {
        out.push('\n');
        // Every name in the entry (the entry's and its parameter's) starts with ENTRY.
        out.push_str(&entry.replace(ENTRY, &entry_for(k)));
    }
    Some(out)
}

/// Most allocations one launch checks (`RERUN_MAX_SLOTS`); a recorded launch touching more is
/// replayed as several launches.
pub const MAX_SLOTS: usize = 120;

/// Bytes of one slot in the parameter struct.
const SLOT_BYTES: usize = 32;

/// Bytes before the first slot: duration, op, count, piece size, result pointer.
const HEADER_BYTES: usize = 32;

/// Bytes of the whole parameter struct (the entry's only parameter).
pub const PARAM_BYTES: usize = HEADER_BYTES + MAX_SLOTS * SLOT_BYTES;

/// Bytes of the device result buffer.
pub const RESULT_BYTES: usize = 64;

/// Bytes of one stamp.
pub const STAMP_BYTES: u64 = 16;

/// One touched allocation as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Device address of the allocation.
    pub ptr: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The id the stamps carry.
    pub alloc_id: u32,
    /// Version expected in every piece (0: do not check).
    pub expected: u32,
    /// Version to write in every piece (0: do not write).
    pub written: u32,
}

/// One launch's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunArgs {
    /// GPU time the launch stands for.
    pub duration_ns: u64,
    /// The op it replays (named in a mismatch).
    pub op: u32,
    /// Distance between stamps within an allocation.
    pub piece_bytes: u64,
    /// Device address of the [`RESULT_BYTES`] result buffer.
    pub result: u64,
    /// At most [`MAX_SLOTS`].
    pub slots: Vec<Slot>,
}

impl RerunArgs {
    /// The parameter struct as the kernel reads it (always [`PARAM_BYTES`] long; unused slots
    /// are zero). Slots past [`MAX_SLOTS`] are left out: split such a launch first.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; PARAM_BYTES];
        let count = self.slots.len().min(MAX_SLOTS);
        buf[0..8].copy_from_slice(&self.duration_ns.to_ne_bytes());
        buf[8..12].copy_from_slice(&self.op.to_ne_bytes());
        buf[12..16].copy_from_slice(&(count as u32).to_ne_bytes());
        buf[16..24].copy_from_slice(&self.piece_bytes.to_ne_bytes());
        buf[24..32].copy_from_slice(&self.result.to_ne_bytes());
        for (i, s) in self.slots.iter().take(count).enumerate() {
            let at = HEADER_BYTES + i * SLOT_BYTES;
            buf[at..at + 8].copy_from_slice(&s.ptr.to_ne_bytes());
            buf[at + 8..at + 16].copy_from_slice(&s.bytes.to_ne_bytes());
            buf[at + 16..at + 20].copy_from_slice(&s.alloc_id.to_ne_bytes());
            buf[at + 20..at + 24].copy_from_slice(&s.expected.to_ne_bytes());
            buf[at + 24..at + 28].copy_from_slice(&s.written.to_ne_bytes());
        }
        buf
    }

    /// Reads the struct back from a parameter buffer.
    pub fn decode(params: &[u8]) -> Result<RerunArgs, TwinError> {
        let mut r = ParamReader::new(params);
        let all = r.bytes(PARAM_BYTES, 8)?;
        let mut r = ParamReader::new(all);
        let duration_ns = r.u64()?;
        let op = r.u32()?;
        let count = (r.u32()? as usize).min(MAX_SLOTS);
        let piece_bytes = r.u64()?;
        let result = r.u64()?;
        let mut slots = Vec::with_capacity(count);
        for _ in 0..count {
            let (ptr, bytes) = (r.u64()?, r.u64()?);
            let (alloc_id, expected, written, _pad) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            slots.push(Slot {
                ptr,
                bytes,
                alloc_id,
                expected,
                written,
            });
        }
        Ok(RerunArgs {
            duration_ns,
            op,
            piece_bytes,
            result,
            slots,
        })
    }
}

/// Number of stamps in an allocation of `bytes` (one per piece whose first 16 bytes lie
/// inside it).
pub fn stamp_count(bytes: u64, piece_bytes: u64) -> u64 {
    if piece_bytes == 0 || bytes < STAMP_BYTES {
        0
    } else {
        (bytes - STAMP_BYTES) / piece_bytes + 1
    }
}

/// The stamp of version `version` of allocation `alloc_id` in piece `piece`.
pub fn stamp(alloc_id: u32, version: u32, piece: u32) -> [u32; 4] {
    let check = mix64(
        ((u64::from(alloc_id) << 32) | u64::from(version))
            ^ (u64::from(piece) << 7)
            ^ 0x7265_7275_7374_6d70,
    ) as u32;
    [alloc_id, version, piece, check]
}

/// The stamp as the 16 bytes memory holds.
pub fn stamp_bytes(alloc_id: u32, version: u32, piece: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (chunk, w) in out.chunks_exact_mut(4).zip(stamp(alloc_id, version, piece)) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    out
}

/// The first stamp that did not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub alloc_id: u32,
    pub piece: u32,
    pub op: u32,
    pub expected: [u32; 4],
    pub found: [u32; 4],
}

/// The result buffer, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RerunResult {
    /// Stamps compared.
    pub checked: u64,
    /// Stamps that did not match.
    pub mismatches: u32,
    /// The first of them.
    pub first: Option<Mismatch>,
}

impl RerunResult {
    /// Decodes the [`RESULT_BYTES`] the device holds.
    pub fn decode(bytes: &[u8; RESULT_BYTES]) -> RerunResult {
        let word =
            |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut checked = [0u8; 8];
        checked.copy_from_slice(&bytes[0..8]);
        let mismatches = word(8);
        let words4 = |at: usize| [word(at), word(at + 4), word(at + 8), word(at + 12)];
        RerunResult {
            checked: u64::from_ne_bytes(checked),
            mismatches,
            first: (mismatches > 0).then(|| Mismatch {
                alloc_id: word(16),
                piece: word(20),
                op: word(24),
                expected: words4(32),
                found: words4(48),
            }),
        }
    }
}

/// The CPU twin: checks and writes stamps through [`DeviceMemory`], accumulating into the
/// result buffer as the kernel's atomics do.
pub fn run(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let args = RerunArgs::decode(l.params)?;
    let mut result = [0u8; RESULT_BYTES];
    mem.read(args.result, &mut result)?;
    let mut state = RerunResult::decode(&result);
    let mut checked = 0u64;
    let mut first = state.first;
    for slot in &args.slots {
        for piece in 0..stamp_count(slot.bytes, args.piece_bytes) {
            let at = slot.ptr + piece * args.piece_bytes;
            let piece = piece as u32;
            if slot.expected != 0 {
                let mut found = [0u8; 16];
                mem.read(at, &mut found)?;
                checked += 1;
                let want = stamp_bytes(slot.alloc_id, slot.expected, piece);
                if found != want {
                    if state.mismatches == 0 && first.is_none() {
                        let words = |b: &[u8; 16]| {
                            let mut w = [0u32; 4];
                            for (x, c) in w.iter_mut().zip(b.chunks_exact(4)) {
                                *x = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                            }
                            w
                        };
                        first = Some(Mismatch {
                            alloc_id: slot.alloc_id,
                            piece,
                            op: args.op,
                            expected: words(&want),
                            found: words(&found),
                        });
                    }
                    state.mismatches = state.mismatches.saturating_add(1);
                }
            }
            if slot.written != 0 {
                mem.write(at, &stamp_bytes(slot.alloc_id, slot.written, piece))?;
            }
        }
    }
    state.checked = state.checked.wrapping_add(checked);
    state.first = first;
    mem.write(args.result, &encode_result(&state))?;
    Ok(())
}

/// The result buffer's bytes for `r` (what the twin writes back).
pub fn encode_result(r: &RerunResult) -> [u8; RESULT_BYTES] {
    let mut out = [0u8; RESULT_BYTES];
    out[0..8].copy_from_slice(&r.checked.to_ne_bytes());
    out[8..12].copy_from_slice(&r.mismatches.to_ne_bytes());
    if let Some(m) = r.first {
        out[16..20].copy_from_slice(&m.alloc_id.to_ne_bytes());
        out[20..24].copy_from_slice(&m.piece.to_ne_bytes());
        out[24..28].copy_from_slice(&m.op.to_ne_bytes());
        for (i, w) in m.expected.iter().chain(&m.found).enumerate() {
            out[32 + 4 * i..36 + 4 * i].copy_from_slice(&w.to_ne_bytes());
        }
    }
    out
}

/// The GPU time a launch stands for: its `duration_ns` argument.
pub fn modelled_duration(l: &Launch<'_>) -> Option<Duration> {
    let mut r = ParamReader::new(l.params);
    r.u64().ok().map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {

    #[test]
    fn each_recorded_kernel_gets_a_copy_of_the_entry_that_runs_its_twin() {
        let ptx = ptx_with_entries(&[3, 70]).unwrap();
        let entries = |text: &str| text.matches(".visible .entry ").count();
        assert_eq!(entries(&ptx), entries(crate::PTX) + 2);
        for k in [3, 70] {
            let name = entry_for(k);
            assert!(ptx.contains(&format!(".visible .entry {name}(")), "{name}");
            assert!(
                ptx.contains(&format!("{name}_param_0")),
                "{name}'s parameter"
            );
            let twin = crate::twins::twin(&name).unwrap();
            assert_eq!(twin.name, ENTRY);
        }
        assert!(crate::twins::twin("tensile_rerun_opx").is_none());
    }

    use super::*;
    use crate::testing::FlatMemory;
    use crate::twins::{twin, Dim3};

    const BASE: u64 = 0x7100_0000_0000;
    const PIECE: u64 = 4096;

    fn launch(mem: &FlatMemory, args: &RerunArgs) -> Result<(), TwinError> {
        let params = args.encode();
        let t = twin(ENTRY).expect("the stand-in has a twin");
        (t.run)(
            &Launch {
                grid: Dim3::new(1, 1, 1),
                block: Dim3::new(128, 1, 1),
                params: &params,
            },
            mem,
        )
    }

    fn result(mem: &FlatMemory) -> RerunResult {
        let mut b = [0u8; RESULT_BYTES];
        mem.read(BASE, &mut b).unwrap();
        RerunResult::decode(&b)
    }

    fn args(op: u32, slots: Vec<Slot>) -> RerunArgs {
        RerunArgs {
            duration_ns: 1234,
            op,
            piece_bytes: PIECE,
            result: BASE,
            slots,
        }
    }

    /// Allocation 7 of 3 pieces and a little (the last piece holds a stamp: 16 bytes fit).
    fn slot(expected: u32, written: u32) -> Slot {
        Slot {
            ptr: BASE + 4096,
            bytes: 2 * PIECE + 100,
            alloc_id: 7,
            expected,
            written,
        }
    }

    #[test]
    fn stamps_written_then_checked_in_every_piece() {
        let mem = FlatMemory::new(BASE, 1 << 16);
        launch(&mem, &args(1, vec![slot(0, 1)])).unwrap();
        assert_eq!(
            result(&mem),
            RerunResult::default(),
            "unstamped: nothing checked"
        );
        for p in 0..3u32 {
            let mut b = [0u8; 16];
            mem.read(BASE + 4096 + u64::from(p) * PIECE, &mut b)
                .unwrap();
            assert_eq!(b, stamp_bytes(7, 1, p), "piece {p}");
        }
        launch(&mem, &args(2, vec![slot(1, 2)])).unwrap();
        launch(&mem, &args(3, vec![slot(2, 0)])).unwrap();
        let r = result(&mem);
        assert_eq!((r.checked, r.mismatches, r.first), (6, 0, None));
        assert_eq!(stamp_count(2 * PIECE + 16, PIECE), 3);
        assert_eq!(stamp_count(2 * PIECE + 15, PIECE), 2);
        assert_eq!(stamp_count(15, PIECE), 0);
    }

    #[test]
    fn a_stale_piece_is_reported_with_allocation_piece_and_op() {
        let mem = FlatMemory::new(BASE, 1 << 16);
        launch(&mem, &args(1, vec![slot(0, 1)])).unwrap();
        launch(&mem, &args(2, vec![slot(1, 2)])).unwrap();
        // Piece 1 goes back to version 1, as a swap-in of a stale host copy would leave it.
        mem.write(BASE + 4096 + PIECE, &stamp_bytes(7, 1, 1))
            .unwrap();
        // Piece 2 is lost altogether (zeroes).
        mem.write(BASE + 4096 + 2 * PIECE, &[0u8; 16]).unwrap();
        launch(&mem, &args(9, vec![slot(2, 3)])).unwrap();
        let r = result(&mem);
        assert_eq!((r.checked, r.mismatches), (6, 2));
        let m = r.first.expect("a mismatch");
        assert_eq!((m.alloc_id, m.piece, m.op), (7, 1, 9));
        assert_eq!(m.expected, stamp(7, 2, 1));
        assert_eq!(m.found, stamp(7, 1, 1));
        // A later mismatch does not replace the first.
        mem.write(BASE + 4096, &[0u8; 16]).unwrap();
        launch(&mem, &args(10, vec![slot(3, 4)])).unwrap();
        let r = result(&mem);
        assert_eq!(r.mismatches, 3, "only piece 0 is wrong now");
        assert_eq!(r.first.map(|m| (m.piece, m.op)), Some((1, 9)));
    }

    #[test]
    fn another_allocations_stamp_is_a_mismatch() {
        let mem = FlatMemory::new(BASE, 1 << 16);
        let other = Slot {
            alloc_id: 8,
            ..slot(0, 5)
        };
        launch(&mem, &args(1, vec![other])).unwrap();
        launch(&mem, &args(2, vec![slot(5, 6)])).unwrap();
        let m = result(&mem)
            .first
            .expect("allocation 8's stamps are not 7's");
        assert_eq!((m.alloc_id, m.found[0]), (7, 8));
    }

    #[test]
    fn params_round_trip_and_duration_is_read_from_them() {
        let a = args(
            42,
            (0..MAX_SLOTS as u32)
                .map(|i| Slot {
                    ptr: BASE + u64::from(i) * 64,
                    bytes: 64,
                    alloc_id: i,
                    expected: i,
                    written: i + 1,
                })
                .collect(),
        );
        let buf = a.encode();
        assert_eq!(buf.len(), PARAM_BYTES);
        assert_eq!(RerunArgs::decode(&buf).unwrap(), a);
        let l = Launch {
            grid: Dim3::new(1, 1, 1),
            block: Dim3::new(1, 1, 1),
            params: &buf,
        };
        assert_eq!(modelled_duration(&l), Some(Duration::from_nanos(1234)));
        let t = twin(ENTRY).unwrap();
        assert_eq!(
            t.modelled_duration.map(|f| f(&l)),
            Some(Some(Duration::from_nanos(1234)))
        );
        assert!(matches!(
            RerunArgs::decode(&buf[..100]),
            Err(TwinError::Params(_))
        ));
    }

    #[test]
    fn an_unmapped_allocation_is_a_fault() {
        let mem = FlatMemory::new(BASE, 1 << 16);
        let far = Slot {
            ptr: BASE + (1 << 20),
            ..slot(0, 1)
        };
        assert!(matches!(
            launch(&mem, &args(1, vec![far])),
            Err(TwinError::Fault(_))
        ));
    }
}
