//! CPU twins of the kernels: what the simulated GPU runs when a kernel is launched.
//!
//! Each twin reads its parameters from the raw parameter buffer (laid out as the `.entry`
//! signature says), pulls every input range through [`DeviceMemory`] in one call, computes the
//! same result as the GPU bit for bit, and writes each output range back in one call. The
//! kernels use grid-stride loops, so the result does not depend on the launch shape, and the
//! twins ignore it (the simulator validates it before a launch).
//!
//! Not here: timing (the simulator models kernel duration) and any kernel outside
//! [`crate::ENTRIES`].

use std::fmt;

use crate::memory::{DeviceMemory, Fault};
use crate::params::{ParamReader, ShortParams};

/// Grid or block dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    pub fn new(x: u32, y: u32, z: u32) -> Self {
        Self { x, y, z }
    }
}

/// One launch as a twin sees it.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    pub grid: Dim3,
    pub block: Dim3,
    /// The parameter buffer, laid out per the entry signature.
    pub params: &'a [u8],
}

/// Why a twin stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwinError {
    /// An access to memory that is not mapped or not accessible.
    Fault(Fault),
    /// The parameter buffer is shorter than the signature.
    Params(ShortParams),
}

impl From<Fault> for TwinError {
    fn from(f: Fault) -> Self {
        TwinError::Fault(f)
    }
}

impl From<ShortParams> for TwinError {
    fn from(p: ShortParams) -> Self {
        TwinError::Params(p)
    }
}

impl fmt::Display for TwinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TwinError::Fault(fault) => fault.fmt(f),
            TwinError::Params(p) => {
                write!(
                    f,
                    "parameter buffer ends before {} bytes at offset {}",
                    p.size, p.offset
                )
            }
        }
    }
}

impl std::error::Error for TwinError {}

/// The signature every twin has.
pub type TwinFn = fn(&Launch<'_>, &dyn DeviceMemory) -> Result<(), TwinError>;

/// A CPU twin of one kernel entry.
#[derive(Debug, Clone, Copy)]
pub struct Twin {
    pub name: &'static str,
    /// Byte size of each parameter, as the entry declares them (checked against the PTX).
    pub param_sizes: &'static [u32],
    pub run: TwinFn,
    /// The GPU time this launch stands for, read from its parameters, for entries whose
    /// duration is an argument (the stand-in kernel of `tensile rerun`). `None` here, or a
    /// `None` result, means the simulator's default kernel duration applies.
    pub modelled_duration: Option<DurationFn>,
}

/// Reads a launch's modelled GPU time from its parameter buffer.
pub type DurationFn = fn(&Launch<'_>) -> Option<std::time::Duration>;

static TWINS: &[Twin] = &[
    Twin {
        name: "fill_pattern",
        param_sizes: &[8, 8, 4],
        run: fill_pattern,
        modelled_duration: None,
    },
    Twin {
        name: "checksum",
        param_sizes: &[8, 8, 8],
        run: checksum,
        modelled_duration: None,
    },
    Twin {
        name: "axpy",
        param_sizes: &[4, 8, 8, 8],
        run: axpy,
        modelled_duration: None,
    },
    Twin {
        name: "matmul_f32",
        param_sizes: &[8, 8, 8, 4, 4, 4],
        run: matmul_f32,
        modelled_duration: None,
    },
    Twin {
        name: "scale",
        param_sizes: &[8, 4, 8],
        run: scale,
        modelled_duration: None,
    },
    Twin {
        name: "copy_u32",
        param_sizes: &[8, 8, 8],
        run: copy_u32,
        modelled_duration: None,
    },
    Twin {
        name: "gather4",
        param_sizes: &[48],
        run: gather4,
        modelled_duration: None,
    },
    Twin {
        name: "sgd_momentum",
        param_sizes: &[8, 8, 8, 4, 4, 8],
        run: sgd_momentum,
        modelled_duration: None,
    },
    Twin {
        name: crate::rerun::ENTRY,
        param_sizes: &[crate::rerun::PARAM_BYTES as u32],
        run: crate::rerun::run,
        modelled_duration: Some(crate::rerun::modelled_duration),
    },
];

/// The twin of the entry called `name`, if this crate has one.
pub fn twin(name: &str) -> Option<Twin> {
    // The copies of the rerun entry run its twin.
    let name = if name.starts_with(crate::rerun::ENTRY_COPY_PREFIX) {
        crate::rerun::ENTRY
    } else {
        name
    };
    TWINS.iter().find(|t| t.name == name).copied()
}

/// The 64-bit mixer both the kernels and the twins use (MurmurHash3's finalizer).
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// `fill_pattern`'s value at index `i`.
pub fn pattern_value(seed: u32, i: u64) -> u32 {
    mix64(i ^ (u64::from(seed) << 32) ^ 0x9e37_79b9_7f4a_7c15) as u32
}

/// `checksum`'s term for value `v` at index `i` (the checksum is the wrapping sum of terms).
pub fn checksum_term(v: u32, i: u64) -> u64 {
    mix64((u64::from(v) << 32) ^ i)
}

fn fill_pattern(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (p, n, seed) = (r.u64()?, r.u64()?, r.u32()?);
    let values: Vec<u32> = (0..n).map(|i| pattern_value(seed, i)).collect();
    mem.write_u32s(p, &values)?;
    Ok(())
}

/// `*out` is accumulated (wrapping), as the kernel's `atomicAdd` does.
fn checksum(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (p, n, out) = (r.u64()?, r.u64()?, r.u64()?);
    let values = mem.read_u32s(p, n)?;
    let sum = values
        .iter()
        .zip(0u64..)
        .fold(0u64, |acc, (&v, i)| acc.wrapping_add(checksum_term(v, i)));
    // The kernel only adds when a thread's partial sum is non-zero; with no elements it
    // never touches `out`, so neither does the twin.
    if n > 0 {
        let old = mem.read_u64(out)?;
        mem.write_u64(out, old.wrapping_add(sum))?;
    }
    Ok(())
}

fn axpy(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (a, x, y, n) = (r.f32()?, r.u64()?, r.u64()?, r.u64()?);
    let xs = mem.read_f32s(x, n)?;
    let mut ys = mem.read_f32s(y, n)?;
    for (yv, xv) in ys.iter_mut().zip(&xs) {
        *yv = a.mul_add(*xv, *yv);
    }
    mem.write_f32s(y, &ys)?;
    Ok(())
}

fn matmul_f32(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (a, b, c) = (r.u64()?, r.u64()?, r.u64()?);
    let (m, n, k) = (
        u64::from(r.u32()?),
        u64::from(r.u32()?),
        u64::from(r.u32()?),
    );
    if m * n == 0 {
        return Ok(());
    }
    let av = mem.read_f32s(a, m * k)?;
    let bv = mem.read_f32s(b, k * n)?;
    let (nu, ku) = (n as usize, k as usize);
    let mut cv = vec![0f32; (m * n) as usize];
    for (idx, out) in cv.iter_mut().enumerate() {
        let (row, col) = (idx / nu, idx % nu);
        let mut acc = 0f32;
        for p in 0..ku {
            acc = av[row * ku + p].mul_add(bv[p * nu + col], acc);
        }
        *out = acc;
    }
    mem.write_f32s(c, &cv)?;
    Ok(())
}

fn scale(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (x, s, n) = (r.u64()?, r.f32()?, r.u64()?);
    let mut xs = mem.read_f32s(x, n)?;
    xs.iter_mut().for_each(|v| *v *= s);
    mem.write_f32s(x, &xs)?;
    Ok(())
}

fn copy_u32(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (dst, src, n) = (r.u64()?, r.u64()?, r.u64()?);
    let v = mem.read_u32s(src, n)?;
    mem.write_u32s(dst, &v)?;
    Ok(())
}

fn gather4(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let args = r.bytes(48, 8)?;
    let mut words = ParamReader::new(args);
    let src = [words.u64()?, words.u64()?, words.u64()?, words.u64()?];
    let (dst, n) = (words.u64()?, words.u64()?);
    let mut acc = mem.read_u32s(src[0], n)?;
    for &s in &src[1..] {
        let v = mem.read_u32s(s, n)?;
        acc.iter_mut().zip(&v).for_each(|(a, b)| *a ^= b);
    }
    mem.write_u32s(dst, &acc)?;
    Ok(())
}

fn sgd_momentum(l: &Launch<'_>, mem: &dyn DeviceMemory) -> Result<(), TwinError> {
    let mut r = ParamReader::new(l.params);
    let (w, g, m) = (r.u64()?, r.u64()?, r.u64()?);
    let (lr, mu, n) = (r.f32()?, r.f32()?, r.u64()?);
    let mut ws = mem.read_f32s(w, n)?;
    let gs = mem.read_f32s(g, n)?;
    let mut ms = mem.read_f32s(m, n)?;
    for i in 0..ws.len() {
        let mi = mu.mul_add(ms[i], gs[i]);
        ms[i] = mi;
        ws[i] = (-lr).mul_add(mi, ws[i]);
    }
    mem.write_f32s(m, &ms)?;
    mem.write_f32s(w, &ws)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::AccessKind;
    use crate::params::ParamBuilder;
    use crate::testing::FlatMemory;

    const BASE: u64 = 0x7000_0000_0000;

    fn run(name: &str, params: &[u8], mem: &FlatMemory) -> Result<(), TwinError> {
        let t = twin(name).unwrap();
        let launch = Launch {
            grid: Dim3::new(3, 1, 1),
            block: Dim3::new(32, 1, 1),
            params,
        };
        (t.run)(&launch, mem)
    }

    fn floats(seed: u32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (pattern_value(seed, i as u64) % 2001) as f32 / 97.0 - 10.0)
            .collect()
    }

    #[test]
    fn fill_pattern_and_checksum_match_reference() {
        let mem = FlatMemory::new(BASE, 1 << 16);
        let n = 1000u64;
        run(
            "fill_pattern",
            &ParamBuilder::new().ptr(BASE).u64(n).u32(42).build(),
            &mem,
        )
        .unwrap();
        let got = mem.read_u32s(BASE, n).unwrap();
        // Straightforward reference, written out independently of `pattern_value`.
        for (i, v) in got.iter().enumerate() {
            let mut x = (i as u64) ^ (42u64 << 32) ^ 0x9e37_79b9_7f4a_7c15;
            x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
            x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
            x ^= x >> 33;
            assert_eq!(*v, x as u32, "index {i}");
        }
        assert_ne!(got[0], got[1]);
        let out = BASE + 8192;
        mem.write_u64(out, 5).unwrap();
        run(
            "checksum",
            &ParamBuilder::new().ptr(BASE).u64(n).ptr(out).build(),
            &mem,
        )
        .unwrap();
        let mut want = 5u64;
        for (i, v) in got.iter().enumerate() {
            want = want.wrapping_add(mix64((u64::from(*v) << 32) ^ i as u64));
        }
        assert_eq!(mem.read_u64(out).unwrap(), want, "accumulates into *out");
        // Swapping two elements changes the checksum.
        let mut swapped = got.clone();
        swapped.swap(3, 4);
        mem.write_u32s(BASE, &swapped).unwrap();
        mem.write_u64(out, 0).unwrap();
        run(
            "checksum",
            &ParamBuilder::new().ptr(BASE).u64(n).ptr(out).build(),
            &mem,
        )
        .unwrap();
        assert_ne!(mem.read_u64(out).unwrap(), want.wrapping_sub(5));
    }

    #[test]
    fn float_kernels_match_reference_bit_for_bit() {
        let mem = FlatMemory::new(BASE, 1 << 20);
        let n = 777usize;
        let (x, y, z) = (BASE, BASE + 4096, BASE + 8192);
        let (xs, ys) = (floats(1, n), floats(2, n));
        mem.write_f32s(x, &xs).unwrap();
        mem.write_f32s(y, &ys).unwrap();
        let p = ParamBuilder::new()
            .f32(0.3)
            .ptr(x)
            .ptr(y)
            .u64(n as u64)
            .build();
        run("axpy", &p, &mem).unwrap();
        let got = mem.read_f32s(y, n as u64).unwrap();
        for i in 0..n {
            assert_eq!(got[i].to_bits(), 0.3f32.mul_add(xs[i], ys[i]).to_bits());
        }
        run(
            "scale",
            &ParamBuilder::new().ptr(x).f32(-2.5).u64(n as u64).build(),
            &mem,
        )
        .unwrap();
        let got = mem.read_f32s(x, n as u64).unwrap();
        for i in 0..n {
            assert_eq!(got[i].to_bits(), (xs[i] * -2.5).to_bits());
        }
        // sgd_momentum on (w = x, g = y, m = z)
        let (w0, g0, m0) = (
            got.clone(),
            mem.read_f32s(y, n as u64).unwrap(),
            floats(3, n),
        );
        mem.write_f32s(z, &m0).unwrap();
        let p = ParamBuilder::new()
            .ptr(x)
            .ptr(y)
            .ptr(z)
            .f32(0.01)
            .f32(0.9)
            .u64(n as u64);
        run("sgd_momentum", &p.build(), &mem).unwrap();
        let (w1, m1) = (
            mem.read_f32s(x, n as u64).unwrap(),
            mem.read_f32s(z, n as u64).unwrap(),
        );
        for i in 0..n {
            let m = 0.9f32.mul_add(m0[i], g0[i]);
            assert_eq!(m1[i].to_bits(), m.to_bits());
            assert_eq!(w1[i].to_bits(), (-0.01f32).mul_add(m, w0[i]).to_bits());
        }
    }

    #[test]
    fn matmul_matches_reference() {
        let mem = FlatMemory::new(BASE, 1 << 20);
        let (m, n, k) = (7usize, 5usize, 13usize);
        let (a, b, c) = (BASE, BASE + 4096, BASE + 8192);
        let (av, bv) = (floats(4, m * k), floats(5, k * n));
        mem.write_f32s(a, &av).unwrap();
        mem.write_f32s(b, &bv).unwrap();
        let p = ParamBuilder::new()
            .ptr(a)
            .ptr(b)
            .ptr(c)
            .u32(m as u32)
            .u32(n as u32);
        run("matmul_f32", &p.u32(k as u32).build(), &mem).unwrap();
        let got = mem.read_f32s(c, (m * n) as u64).unwrap();
        for r in 0..m {
            for col in 0..n {
                let mut acc = 0f32;
                for p in 0..k {
                    acc = av[r * k + p].mul_add(bv[p * n + col], acc);
                }
                assert_eq!(got[r * n + col].to_bits(), acc.to_bits(), "C[{r}][{col}]");
            }
        }
    }

    #[test]
    fn copy_and_gather4_match_reference() {
        let mem = FlatMemory::new(BASE, 1 << 20);
        let n = 300u64;
        let srcs: Vec<u64> = (0..4).map(|j| BASE + j * 4096).collect();
        for (j, &s) in srcs.iter().enumerate() {
            let v: Vec<u32> = (0..n).map(|i| pattern_value(j as u32, i)).collect();
            mem.write_u32s(s, &v).unwrap();
        }
        let dst = BASE + 5 * 4096;
        let mut args = ParamBuilder::new();
        for &s in &srcs {
            args = args.ptr(s);
        }
        let args = args.ptr(dst).u64(n).build();
        assert_eq!(args.len(), 48);
        run(
            "gather4",
            &ParamBuilder::new().bytes(&args, 8).build(),
            &mem,
        )
        .unwrap();
        let got = mem.read_u32s(dst, n).unwrap();
        for i in 0..n {
            let want = (0..4).fold(0u32, |acc, j| acc ^ pattern_value(j, i));
            assert_eq!(got[i as usize], want);
        }
        let copy = BASE + 6 * 4096;
        run(
            "copy_u32",
            &ParamBuilder::new().ptr(copy).ptr(dst).u64(n).build(),
            &mem,
        )
        .unwrap();
        assert_eq!(mem.read_u32s(copy, n).unwrap(), got);
    }

    #[test]
    fn out_of_range_access_is_a_fault_and_short_params_an_error() {
        let mem = FlatMemory::new(BASE, 4096);
        let p = ParamBuilder::new().ptr(BASE).u64(2048).u32(1).build();
        match run("fill_pattern", &p, &mem) {
            Err(TwinError::Fault(f)) => {
                assert_eq!((f.addr, f.kind), (BASE, AccessKind::Write));
            }
            other => panic!("{other:?}"),
        }
        let p = ParamBuilder::new()
            .ptr(BASE)
            .u64(u64::MAX)
            .ptr(BASE)
            .build();
        assert!(matches!(
            run("checksum", &p, &mem),
            Err(TwinError::Fault(_))
        ));
        let p = ParamBuilder::new().ptr(BASE).u64(4).build();
        assert!(matches!(
            run("fill_pattern", &p, &mem),
            Err(TwinError::Params(_))
        ));
        assert!(twin("no_such_kernel").is_none());
    }
}
