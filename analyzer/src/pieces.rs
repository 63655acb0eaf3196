//! Pieces: the units a plan moves, byte ranges of tensors.
//!
//! The shim keeps residency per 2 MiB page, so nothing forces a plan to move a tensor whole.
//! Planning on pieces of a bounded size lets the planner evict only part of a large tensor when
//! that covers an op's excess, and keeps the memory a copy holds while in flight (a read-back
//! holds its bytes from the start, a write-out until it ends) to one piece instead of a whole
//! tensor. On the MLP trace at half its peak this takes the planned step from 82.4 to 79.2 ms
//! (docs/planner.md, "Pieces").
//!
//! A piece is accessed by exactly the ops that access its tensor, so splitting changes nothing
//! about which data an op needs, only how finely the planner may move it. This module is not the
//! planner: it only cuts a [`Cycle`] into pieces and says which tensor each piece came from.

use serde::Serialize;

use crate::cycle::{Cycle, MoveUnits, Tensor, TensorId, PAGE_BYTES};

/// Index of a piece in [`crate::plan::SwapPlan::pieces`] (and of the tensor standing for it in
/// the split cycle).
pub type PieceId = u32;

/// A byte range of a cycle tensor that a plan moves as one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Piece {
    /// The tensor it is part of.
    pub tensor: TensorId,
    /// Offset of the range in the tensor.
    pub offset: u64,
    /// Length of the range.
    pub bytes: u64,
}

/// Smallest piece: the shim's page (on the H100).
pub const MIN_PIECE_BYTES: u64 = PAGE_BYTES;
/// Largest piece, in pages. Smaller pieces gain little more on the shared traces (16 MiB:
/// 79.2 ms on the MLP at 50%, 4 MiB: 78.6 ms) and cost planning time (about twice as much at
/// 4 MiB, and the planner's time grows with the number of pieces).
pub const MAX_PIECE_PAGES: u64 = 8;
/// Largest piece on the H100.
pub const MAX_PIECE_BYTES: u64 = MAX_PIECE_PAGES * PAGE_BYTES;

/// Piece size for a budget with the H100's page ([`piece_bytes_in_pages`]).
pub fn piece_bytes(budget_bytes: u64) -> u64 {
    piece_bytes_in_pages(budget_bytes, PAGE_BYTES)
}

/// Piece size for a budget: a 128th of it, a multiple of `page`, from one page to
/// [`MAX_PIECE_PAGES`], so a small budget still holds many pieces. (With a page scaled down
/// with the sizes, as on a simulated GPU for a scaled trace, the pieces scale with them.)
pub fn piece_bytes_in_pages(budget_bytes: u64, page: u64) -> u64 {
    let page = page.max(1);
    let raw = (budget_bytes / 128).clamp(page, MAX_PIECE_PAGES * page);
    raw / page * page
}

/// One piece per tensor, each the whole tensor.
pub fn whole(cycle: &Cycle) -> Vec<Piece> {
    cycle
        .tensors
        .iter()
        .enumerate()
        .map(|(t, tensor)| Piece {
            tensor: t as TensorId,
            offset: 0,
            bytes: tensor.bytes,
        })
        .collect()
}

/// Cuts every tensor larger than `max_piece` bytes into pieces of `max_piece` (the last one
/// shorter); smaller tensors stay whole. Pieces of a tensor are consecutive.
///
/// With [`MoveUnits::ShimPages`] (`max_piece` is then a whole number of pages) the partial
/// last page of a tensor larger than a page is a piece of its own, so that every other piece is
/// a whole number of pages and movable ([`Cycle::is_movable`]); that tail stays on the device.
pub fn cut(cycle: &Cycle, max_piece: u64) -> Vec<Piece> {
    let max_piece = max_piece.max(1);
    let mut pieces = Vec::with_capacity(cycle.tensors.len());
    for (t, tensor) in cycle.tensors.iter().enumerate() {
        let whole_pages = tensor.bytes / cycle.page_bytes * cycle.page_bytes;
        let body_end = match cycle.units {
            MoveUnits::ShimPages if whole_pages > 0 => whole_pages,
            _ => tensor.bytes,
        };
        let mut offset = 0;
        loop {
            let end = if offset < body_end {
                body_end
            } else {
                tensor.bytes
            };
            let bytes = (end - offset).min(max_piece);
            pieces.push(Piece {
                tensor: t as TensorId,
                offset,
                bytes,
            });
            offset += bytes;
            if offset >= tensor.bytes {
                break;
            }
        }
    }
    pieces
}

/// Cuts every piece larger than `max_piece` bytes into consecutive pieces of `max_piece` (the
/// last one shorter), keeping the order; returns the new pieces and, for each old piece, the
/// range of new pieces it became. Pieces that tile their tensors still do. Under
/// [`MoveUnits::ShimPages`] pass a whole number of pages, so that whole-page pieces stay so.
pub fn refine(pieces: &[Piece], max_piece: u64) -> (Vec<Piece>, Vec<std::ops::Range<usize>>) {
    let max_piece = max_piece.max(1);
    let mut fine = Vec::with_capacity(pieces.len());
    let mut of = Vec::with_capacity(pieces.len());
    for p in pieces {
        let first = fine.len();
        let mut offset = 0;
        loop {
            let bytes = (p.bytes - offset).min(max_piece);
            fine.push(Piece {
                tensor: p.tensor,
                offset: p.offset + offset,
                bytes,
            });
            offset += bytes;
            if offset >= p.bytes {
                break;
            }
        }
        of.push(first..fine.len());
    }
    (fine, of)
}

/// Whether `pieces` is exactly one whole piece per tensor of `cycle`, in order.
pub fn is_whole(cycle: &Cycle, pieces: &[Piece]) -> bool {
    pieces.len() == cycle.tensors.len()
        && pieces.iter().enumerate().all(|(i, p)| {
            p.tensor as usize == i && p.offset == 0 && p.bytes == cycle.tensors[i].bytes
        })
}

/// How a plan's pieces fail to tile one of its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoverError {
    /// A piece names a tensor the cycle does not have.
    NoSuchTensor {
        /// Index of the piece.
        piece: usize,
    },
    /// A piece reaches past the end of its tensor.
    PastEnd {
        /// Index of the piece.
        piece: usize,
    },
    /// No piece covers the bytes from `offset` (up to the next piece or the tensor's end).
    Gap {
        /// First uncovered byte.
        offset: u64,
    },
    /// Two pieces both cover the byte at `offset`.
    Overlap {
        /// First byte covered twice.
        offset: u64,
    },
}

impl std::fmt::Display for CoverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoverError::NoSuchTensor { piece } => write!(f, "piece {piece} names no tensor"),
            CoverError::PastEnd { piece } => write!(f, "piece {piece} reaches past its end"),
            CoverError::Gap { offset } => write!(f, "no piece covers offset {offset}"),
            CoverError::Overlap { offset } => write!(f, "pieces overlap at offset {offset}"),
        }
    }
}

/// Checks that `pieces` tile every tensor of `cycle` exactly: each tensor's pieces lie inside
/// it, are disjoint and leave no byte uncovered. Otherwise names the first tensor that fails
/// and how. A plan whose pieces do not tile its tensors would let the simulator (and anything
/// that trusts it) keep only part of a tensor's data, so every entry that takes a plan checks.
pub fn check_cover(cycle: &Cycle, pieces: &[Piece]) -> Result<(), (TensorId, CoverError)> {
    // One whole piece per tensor tiles trivially (the local search simulates thousands of
    // plans on a cycle already cut into its pieces).
    if is_whole(cycle, pieces) {
        return Ok(());
    }
    let mut ranges: Vec<Vec<(u64, u64, usize)>> = vec![Vec::new(); cycle.tensors.len()];
    for (i, p) in pieces.iter().enumerate() {
        let Some(t) = cycle.tensors.get(p.tensor as usize) else {
            return Err((p.tensor, CoverError::NoSuchTensor { piece: i }));
        };
        if p.offset
            .checked_add(p.bytes)
            .is_none_or(|end| end > t.bytes)
        {
            return Err((p.tensor, CoverError::PastEnd { piece: i }));
        }
        if p.bytes > 0 {
            ranges[p.tensor as usize].push((p.offset, p.offset + p.bytes, i));
        }
    }
    for (t, (tensor, mut r)) in cycle.tensors.iter().zip(ranges).enumerate() {
        let t = t as TensorId;
        r.sort_unstable();
        let mut covered_to = 0;
        for (start, end, _) in r {
            if start > covered_to {
                return Err((t, CoverError::Gap { offset: covered_to }));
            }
            if start < covered_to {
                return Err((t, CoverError::Overlap { offset: start }));
            }
            covered_to = end;
        }
        if covered_to < tensor.bytes {
            return Err((t, CoverError::Gap { offset: covered_to }));
        }
    }
    Ok(())
}

/// The cycle whose tensors are `pieces`: piece `i` becomes tensor `i`, accessed by the ops that
/// access its tensor. Errors name the tensor the pieces do not tile exactly ([`check_cover`]).
pub fn split(cycle: &Cycle, pieces: &[Piece]) -> Result<Cycle, String> {
    check_cover(cycle, pieces).map_err(|(t, e)| format!("tensor {t}: {e}"))?;
    let mut tensors = Vec::with_capacity(pieces.len());
    for (i, p) in pieces.iter().enumerate() {
        let t = cycle
            .tensors
            .get(p.tensor as usize)
            .ok_or_else(|| format!("piece {i} names tensor {}, beyond the cycle", p.tensor))?;
        tensors.push(Tensor {
            bytes: p.bytes,
            ..t.clone()
        });
    }
    let mut split = Cycle::from_parts(
        &cycle.ops.iter().map(|o| o.duration_ns).collect::<Vec<_>>(),
        tensors,
    )?;
    // Keep what the ops are, where their durations came from, and where the host waited.
    for (s, o) in split.ops.iter_mut().zip(&cycle.ops) {
        s.kind = o.kind;
        s.source = o.source;
        s.host_waits = o.host_waits;
    }
    split.span = cycle.span.clone();
    split.estimated_launches = cycle.estimated_launches;
    split.units = cycle.units;
    split.page_bytes = cycle.page_bytes;
    split.immovable = cycle.immovable.clone();
    Ok(split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::Identity;
    use crate::model::AllocIdx;

    #[test]
    fn a_split_cycle_keeps_the_page_its_pieces_were_cut_in() {
        let page = 512 << 10;
        let c = Cycle::from_parts(&[10, 10], vec![tensor(3 * page, vec![0, 1])])
            .unwrap()
            .with_units(MoveUnits::ShimPages)
            .with_page_bytes(page);
        let split = split(&c, &cut(&c, page)).unwrap();
        assert_eq!(split.page_bytes, page);
        // Each one-page piece may move: in 2 MiB pages none could.
        assert!((0..3).all(|t| split.is_movable(t)));
    }

    fn tensor(bytes: u64, accesses: Vec<u32>) -> Tensor {
        Tensor {
            identity: Identity::Persistent { trace_id: 0 },
            bytes,
            accesses,
            alloc_at: None,
            free_at: None,
            source: AllocIdx::default(),
        }
    }

    #[test]
    fn cutting_covers_every_byte_once_and_keeps_the_accesses() {
        let c = Cycle::from_parts(
            &[10, 20, 30],
            vec![tensor(5 << 20, vec![0, 2]), tensor(1 << 20, vec![1])],
        )
        .unwrap();
        let pieces = cut(&c, 2 << 20);
        let sizes: Vec<(u32, u64, u64)> = pieces
            .iter()
            .map(|p| (p.tensor, p.offset, p.bytes))
            .collect();
        assert_eq!(
            sizes,
            vec![
                (0, 0, 2 << 20),
                (0, 2 << 20, 2 << 20),
                (0, 4 << 20, 1 << 20),
                (1, 0, 1 << 20)
            ]
        );
        let s = split(&c, &pieces).unwrap();
        assert_eq!(s.tensors.len(), 4);
        assert_eq!(s.ops[0].tensors, vec![0, 1, 2]);
        assert_eq!(s.ops[1].tensors, vec![3]);
        assert_eq!(s.ops[2].tensors, vec![0, 1, 2]);
        assert_eq!(s.compute_ns(), c.compute_ns());
        assert!(!is_whole(&c, &pieces));
        assert!(is_whole(&c, &whole(&c)));
    }

    #[test]
    fn pieces_that_do_not_tile_their_tensor_are_refused_with_the_tensor_named() {
        let c = Cycle::from_parts(
            &[10, 10],
            vec![tensor(4 << 20, vec![0]), tensor(6 << 20, vec![1])],
        )
        .unwrap();
        let piece = |tensor, offset, bytes| Piece {
            tensor,
            offset,
            bytes,
        };
        assert_eq!(check_cover(&c, &cut(&c, 2 << 20)), Ok(()));
        // The audit's plan: one byte per tensor.
        let one_byte = [piece(0, 0, 1), piece(1, 0, 1)];
        assert_eq!(
            check_cover(&c, &one_byte),
            Err((0, CoverError::Gap { offset: 1 }))
        );
        let hole = [
            piece(0, 0, 4 << 20),
            piece(1, 0, 2 << 20),
            piece(1, 3 << 20, 3 << 20),
        ];
        assert_eq!(
            check_cover(&c, &hole),
            Err((1, CoverError::Gap { offset: 2 << 20 }))
        );
        let overlap = [
            piece(0, 0, 4 << 20),
            piece(1, 0, 4 << 20),
            piece(1, 3 << 20, 3 << 20),
        ];
        assert_eq!(
            check_cover(&c, &overlap),
            Err((1, CoverError::Overlap { offset: 3 << 20 }))
        );
        let missing_tensor = [piece(0, 0, 4 << 20)];
        assert_eq!(
            check_cover(&c, &missing_tensor),
            Err((1, CoverError::Gap { offset: 0 }))
        );
        assert!(split(&c, &hole)
            .unwrap_err()
            .contains("tensor 1: no piece covers offset 2097152"));
    }

    #[test]
    fn a_piece_outside_its_tensor_is_refused() {
        let c = Cycle::from_parts(&[10], vec![tensor(4096, vec![0])]).unwrap();
        let bad = [Piece {
            tensor: 0,
            offset: 4000,
            bytes: 200,
        }];
        assert!(split(&c, &bad)
            .unwrap_err()
            .contains("reaches past its end"));
        let missing = [Piece {
            tensor: 3,
            offset: 0,
            bytes: 1,
        }];
        assert!(split(&c, &missing).unwrap_err().contains("names no tensor"));
    }

    #[test]
    fn in_shim_pages_the_partial_last_page_is_a_piece_of_its_own_that_never_moves() {
        const MIB: u64 = 1 << 20;
        let c = Cycle::from_parts(
            &[10, 10],
            vec![
                tensor(37 * MIB / 2, vec![0]), // 18.5 MiB
                tensor(MIB, vec![1]),
                tensor(3 * MIB / 2, vec![0]),
                tensor(4 * MIB, vec![1]),
            ],
        )
        .unwrap()
        .with_units(MoveUnits::ShimPages);
        let pieces = cut(&c, 8 * MIB);
        let sizes: Vec<(u32, u64, u64)> = pieces
            .iter()
            .map(|p| (p.tensor, p.offset, p.bytes))
            .collect();
        assert_eq!(
            sizes,
            vec![
                (0, 0, 8 * MIB),
                (0, 8 * MIB, 8 * MIB),
                (0, 16 * MIB, 2 * MIB),
                (0, 18 * MIB, MIB / 2),
                (1, 0, MIB),
                (2, 0, 3 * MIB / 2),
                (3, 0, 4 * MIB),
            ]
        );
        let s = split(&c, &pieces).unwrap();
        let movable: Vec<bool> = (0..s.tensors.len() as u32)
            .map(|t| s.is_movable(t))
            .collect();
        assert_eq!(movable, vec![true, true, true, false, false, false, true]);
        // In bytes, everything moves and a tensor is cut only by the piece size.
        let bytes = c.clone().with_units(MoveUnits::Bytes);
        assert_eq!(cut(&bytes, 8 * MIB).len(), 6);
        assert!((0..4).all(|t| bytes.is_movable(t)));
    }

    #[test]
    fn refining_cuts_each_piece_in_order_and_still_tiles_the_tensors() {
        let c = Cycle::from_parts(
            &[10, 20],
            vec![tensor(10 << 20, vec![0, 1]), tensor(1 << 20, vec![1])],
        )
        .unwrap();
        let coarse = cut(&c, 8 << 20);
        let (fine, of) = refine(&coarse, 3 << 20);
        let sizes: Vec<(u32, u64, u64)> =
            fine.iter().map(|p| (p.tensor, p.offset, p.bytes)).collect();
        assert_eq!(
            sizes,
            vec![
                (0, 0, 3 << 20),
                (0, 3 << 20, 3 << 20),
                (0, 6 << 20, 2 << 20),
                (0, 8 << 20, 2 << 20),
                (1, 0, 1 << 20)
            ]
        );
        assert_eq!(of, vec![0..3, 3..4, 4..5]);
        assert_eq!(check_cover(&c, &fine), Ok(()));
        // Nothing to cut: the same pieces.
        assert_eq!(refine(&fine, 8 << 20).0, fine);
    }

    #[test]
    fn piece_size_follows_the_budget_in_whole_pages() {
        assert_eq!(piece_bytes(0), MIN_PIECE_BYTES);
        assert_eq!(piece_bytes(100 << 30), MAX_PIECE_BYTES);
        assert_eq!(piece_bytes(1 << 30), 8 << 20);
        assert_eq!(piece_bytes(1 << 30) % MIN_PIECE_BYTES, 0);
    }
}
