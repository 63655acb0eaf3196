//! Pieces the shim's benches share.

use tensile_shim::executor::worker::Mover;
use tensile_shim::tracker::LaunchShape;

/// A mover that moves nothing: the executor's own work is what a bench measures.
pub struct Idle;

impl Mover for Idle {
    fn swap_out(&self, _: &[(u64, usize)]) -> Result<usize, u32> {
        Ok(0)
    }
    fn prefetch(&self, _: &[(u64, usize)]) -> Result<usize, u32> {
        Ok(0)
    }
}

/// A launch's shape on stream `0x1234`.
pub const SHAPE: LaunchShape = LaunchShape {
    grid: [4, 1, 1],
    block: [128, 1, 1],
    shared_mem_bytes: 0,
    stream: 0x1234,
};
