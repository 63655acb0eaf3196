//! Packed parameter buffers for each kernel, in the layout its `.entry` declares: what a test
//! or workload passes with `CU_LAUNCH_PARAM_BUFFER_POINTER` (or splits per parameter).
//! Pointers are device addresses (`u64`).

use crate::params::ParamBuilder;

pub fn fill_pattern(p: u64, n: u64, seed: u32) -> Vec<u8> {
    ParamBuilder::new().ptr(p).u64(n).u32(seed).build()
}

/// `out` is accumulated (wrapping): zero it first for a fresh checksum.
pub fn checksum(p: u64, n: u64, out: u64) -> Vec<u8> {
    ParamBuilder::new().ptr(p).u64(n).ptr(out).build()
}

pub fn axpy(a: f32, x: u64, y: u64, n: u64) -> Vec<u8> {
    ParamBuilder::new().f32(a).ptr(x).ptr(y).u64(n).build()
}

/// C (m x n) = A (m x k) * B (k x n), row-major.
pub fn matmul_f32(a: u64, b: u64, c: u64, m: u32, n: u32, k: u32) -> Vec<u8> {
    ParamBuilder::new()
        .ptr(a)
        .ptr(b)
        .ptr(c)
        .u32(m)
        .u32(n)
        .u32(k)
        .build()
}

pub fn scale(x: u64, s: f32, n: u64) -> Vec<u8> {
    ParamBuilder::new().ptr(x).f32(s).u64(n).build()
}

pub fn copy_u32(dst: u64, src: u64, n: u64) -> Vec<u8> {
    ParamBuilder::new().ptr(dst).ptr(src).u64(n).build()
}

/// The 48-byte struct `{ const u32* src[4]; u32* dst; u64 n; }`, passed by value.
pub fn gather4(src: [u64; 4], dst: u64, n: u64) -> Vec<u8> {
    let b = src.iter().fold(ParamBuilder::new(), |b, &s| b.ptr(s));
    b.ptr(dst).u64(n).build()
}

pub fn sgd_momentum(w: u64, g: u64, m: u64, lr: f32, mu: f32, n: u64) -> Vec<u8> {
    ParamBuilder::new()
        .ptr(w)
        .ptr(g)
        .ptr(m)
        .f32(lr)
        .f32(mu)
        .u64(n)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::parse_entries;

    /// Each builder produces exactly the entry's parameter-buffer size.
    #[test]
    fn buffers_match_the_committed_signatures() {
        let sizes: Vec<(&str, usize)> = vec![
            ("fill_pattern", fill_pattern(1, 2, 3).len()),
            ("checksum", checksum(1, 2, 3).len()),
            ("axpy", axpy(1.0, 2, 3, 4).len()),
            ("matmul_f32", matmul_f32(1, 2, 3, 4, 5, 6).len()),
            ("scale", scale(1, 2.0, 3).len()),
            ("copy_u32", copy_u32(1, 2, 3).len()),
            ("gather4", gather4([1, 2, 3, 4], 5, 6).len()),
            ("sgd_momentum", sgd_momentum(1, 2, 3, 4.0, 5.0, 6).len()),
        ];
        let entries = parse_entries(crate::PTX).unwrap();
        for (name, len) in sizes {
            let e = entries.iter().find(|e| e.name == name).unwrap();
            assert_eq!(len, e.param_bytes() as usize, "{name}");
        }
    }
}
