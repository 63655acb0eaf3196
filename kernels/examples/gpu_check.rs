//! Checks the CPU twins against the committed PTX running on a GPU, bit for bit.
//!
//! Runs every kernel through whatever `libcuda.so.1` the dynamic loader finds (via `cudarc`):
//! on a machine with an NVIDIA GPU that is the real driver, and the comparison proves the
//! twins exact; under the simulated GPU (`LD_LIBRARY_PATH` pointing at a `libcuda.so.1` link to
//! tensile-simgpu) it only proves the harness works, since the simulator runs the twins.
//!
//!     cargo run --release -p tensile-kernels --example gpu_check
//!
//! Exit status 0 and "all kernels match" on success; the first mismatch otherwise.

use std::ffi::{c_void, CString};
use std::process::ExitCode;

use cudarc::driver::{result, CudaContext, CudaStream, DevicePtr};
use tensile_kernels::testing::FlatMemory;
use tensile_kernels::twins::pattern_value;
use tensile_kernels::{args, ptx, twin, DeviceMemory, Dim3, Launch};

/// Builds a kernel's parameter buffer from the device addresses of its buffers.
type ParamsFn = Box<dyn Fn(&[u64]) -> Vec<u8>>;

/// One kernel run: its input buffers (all are also outputs) and how to build its parameters
/// from their device addresses.
struct Case {
    kernel: &'static str,
    buffers: Vec<Vec<u8>>,
    params: ParamsFn,
}

fn words(seed: u32, n: usize) -> Vec<u8> {
    (0..n as u64)
        .flat_map(|i| pattern_value(seed, i).to_ne_bytes())
        .collect()
}

/// Floats of varied magnitude, a few of them subnormal, zero or negative zero.
fn floats(seed: u32, n: usize) -> Vec<u8> {
    (0..n as u64)
        .flat_map(|i| {
            let h = pattern_value(seed, i);
            let v = match h % 97 {
                0 => 1.0e-40,
                1 => -0.0,
                2 => 0.0,
                _ => ((h >> 8) as f32 / 16_777_216.0 - 0.5) * 2f32.powi((h % 13) as i32 - 6),
            };
            f32::to_ne_bytes(v)
        })
        .collect()
}

fn cases() -> Vec<Case> {
    let n = 100_003usize;
    let nu = n as u64;
    let (m, k, c) = (33u32, 47u32, 29u32);
    vec![
        Case {
            kernel: "fill_pattern",
            buffers: vec![vec![0; n * 4]],
            params: Box::new(move |p| args::fill_pattern(p[0], nu, 0xabc)),
        },
        Case {
            kernel: "checksum",
            buffers: vec![words(1, n), vec![0; 8]],
            params: Box::new(move |p| args::checksum(p[0], nu, p[1])),
        },
        Case {
            kernel: "axpy",
            buffers: vec![floats(2, n), floats(3, n)],
            params: Box::new(move |p| args::axpy(0.37, p[0], p[1], nu)),
        },
        Case {
            kernel: "matmul_f32",
            buffers: vec![
                floats(4, (m * k) as usize),
                floats(5, (k * c) as usize),
                vec![0; (m * c) as usize * 4],
            ],
            params: Box::new(move |p| args::matmul_f32(p[0], p[1], p[2], m, c, k)),
        },
        Case {
            kernel: "scale",
            buffers: vec![floats(6, n)],
            params: Box::new(move |p| args::scale(p[0], -1.7, nu)),
        },
        Case {
            kernel: "copy_u32",
            buffers: vec![vec![0; n * 4], words(7, n)],
            params: Box::new(move |p| args::copy_u32(p[0], p[1], nu)),
        },
        Case {
            kernel: "gather4",
            buffers: vec![
                words(8, n),
                words(9, n),
                words(10, n),
                words(11, n),
                vec![0; n * 4],
            ],
            params: Box::new(move |p| args::gather4([p[0], p[1], p[2], p[3]], p[4], nu)),
        },
        Case {
            kernel: "sgd_momentum",
            buffers: vec![floats(12, n), floats(13, n), floats(14, n)],
            params: Box::new(move |p| args::sgd_momentum(p[0], p[1], p[2], 0.01, 0.9, nu)),
        },
    ]
}

/// Launch shapes (grid, block): the kernels must give the same result for any of them.
type Shape = ((u32, u32, u32), (u32, u32, u32));

const SHAPES: [Shape; 2] = [((37, 1, 1), (96, 1, 1)), ((5, 3, 2), (8, 4, 2))];

fn run_twin(case: &Case) -> Vec<Vec<u8>> {
    let base = 0x1000_0000_0000u64;
    let mut addrs = Vec::new();
    let mut at = 0u64;
    for b in &case.buffers {
        addrs.push(base + at);
        at += (b.len() as u64).next_multiple_of(256);
    }
    let mem = FlatMemory::new(base, at as usize);
    for (b, &a) in case.buffers.iter().zip(&addrs) {
        mem.write(a, b).expect("twin memory");
    }
    let params = (case.params)(&addrs);
    let t = twin(case.kernel).expect("twin");
    let ((gx, gy, gz), (bx, by, bz)) = SHAPES[0];
    let launch = Launch {
        grid: Dim3::new(gx, gy, gz),
        block: Dim3::new(bx, by, bz),
        params: &params,
    };
    (t.run)(&launch, &mem).expect("twin run");
    case.buffers
        .iter()
        .zip(&addrs)
        .map(|(b, &a)| {
            let mut out = vec![0; b.len()];
            mem.read(a, &mut out).expect("twin memory");
            out
        })
        .collect()
}

fn run_gpu(
    shape: Shape,
    stream: &std::sync::Arc<CudaStream>,
    module: cudarc::driver::sys::CUmodule,
    case: &Case,
) -> Vec<Vec<u8>> {
    let slices: Vec<_> = case
        .buffers
        .iter()
        .map(|b| stream.clone_htod(b).expect("htod"))
        .collect();
    let addrs: Vec<u64> = slices.iter().map(|s| s.device_ptr(stream).0).collect();
    let mut params = (case.params)(&addrs);
    let sig = ptx::parse_entries(tensile_kernels::PTX)
        .expect("PTX")
        .into_iter()
        .find(|e| e.name == case.kernel)
        .expect("entry");
    let mut ptrs: Vec<*mut c_void> = sig
        .params
        .iter()
        .map(|p| params[p.offset as usize..].as_mut_ptr() as *mut c_void)
        .collect();
    let name = CString::new(case.kernel).unwrap();
    // SAFETY: `module` is loaded; `ptrs` point into `params`, laid out per the signature.
    unsafe {
        let f = result::module::get_function(module, name).expect("function");
        result::launch_kernel(f, shape.0, shape.1, 0, stream.cu_stream(), &mut ptrs)
            .expect("launch");
    }
    stream.synchronize().expect("synchronize");
    slices
        .iter()
        .map(|s| stream.clone_dtoh(s).expect("dtoh"))
        .collect()
}

fn main() -> ExitCode {
    let ctx = CudaContext::new(0).expect("no CUDA device (is libcuda.so.1 on the library path?)");
    println!("device: {}", ctx.name().unwrap_or_default());
    let stream = ctx.default_stream();
    let ptx_text = CString::new(tensile_kernels::PTX).unwrap();
    // SAFETY: a NUL-terminated PTX image; the context is current.
    let module = unsafe { result::module::load_data(ptx_text.as_ptr() as *const c_void) }
        .expect("load the committed PTX");
    for case in cases() {
        let cpu = run_twin(&case);
        for shape in SHAPES {
            let gpu = run_gpu(shape, &stream, module, &case);
            for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                if let Some(at) = g.iter().zip(c).position(|(a, b)| a != b) {
                    println!("{} {shape:?}: buffer {i} differs at byte {at}", case.kernel);
                    return ExitCode::FAILURE;
                }
            }
        }
        println!("{}: identical", case.kernel);
    }
    println!("all kernels match");
    ExitCode::SUCCESS
}
