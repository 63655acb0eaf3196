#!/usr/bin/env python3
"""Regenerates kernels/ptx/tensile_kernels.ptx from kernels/cuda/tensile_kernels.cu with NVRTC.

CI never runs this: the PTX is committed. Run it after changing the CUDA source:

    pip install nvidia-cuda-nvrtc==13.0.88        # exactly this version, see below
    LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib python3 kernels/gen/gen_ptx.py

or point NVRTC_LIB_DIR at a directory holding libnvrtc.so.13 and libnvrtc-builtins.so.13.0
(libnvrtc loads the builtins library by name, so that directory must also be on
LD_LIBRARY_PATH; the script re-executes itself with it added when it is not).

Why NVRTC 13.0.88: the H100 machine's driver is CUDA 13.0 and JIT-compiles PTX ISA up to 9.0.
NVRTC 13.0.x emits `.version 9.0`; newer NVRTC emits newer ISA versions the driver refuses
with CUDA_ERROR_UNSUPPORTED_PTX_VERSION. The script checks the emitted version.
"""

import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "cuda", "tensile_kernels.cu")
OUTPUT = os.path.join(ROOT, "ptx", "tensile_kernels.ptx")
OPTIONS = [b"--gpu-architecture=compute_90", b"--std=c++17"]
MAX_PTX_VERSION = (9, 0)


def find_lib_dir():
    candidates = [os.environ.get("NVRTC_LIB_DIR")]
    try:
        import nvidia  # the PyPI wheels install the namespace package `nvidia`

        for base in nvidia.__path__:
            candidates.append(os.path.join(base, "cu13", "lib"))
    except ImportError:
        pass
    candidates.append("/tmp/nv/nvidia/cu13/lib")
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "libnvrtc.so.13")):
            return c
    sys.exit("libnvrtc.so.13 not found: pip install nvidia-cuda-nvrtc==13.0.88 or set NVRTC_LIB_DIR")


def check(nvrtc, rc, what):
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"{what} failed: {nvrtc.nvrtcGetErrorString(rc).decode()}")


def main():
    lib_dir = find_lib_dir()
    ld_path = os.environ.get("LD_LIBRARY_PATH", "")
    if lib_dir not in ld_path.split(":"):
        os.environ["LD_LIBRARY_PATH"] = lib_dir + (":" + ld_path if ld_path else "")
        os.execv(sys.executable, [sys.executable] + sys.argv)

    nvrtc = ctypes.CDLL(os.path.join(lib_dir, "libnvrtc.so.13"))
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(nvrtc, nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    print(f"NVRTC {major.value}.{minor.value} from {lib_dir}")

    with open(SOURCE, "rb") as f:
        src = f.read()
    prog = ctypes.c_void_p()
    check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(
            ctypes.byref(prog), src, b"tensile_kernels.cu", 0, None, None
        ),
        "nvrtcCreateProgram",
    )
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    rc = nvrtc.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    log_size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if log.value.strip():
        print(log.value.decode(), file=sys.stderr)
    check(nvrtc, rc, "nvrtcCompileProgram")

    size = ctypes.c_size_t()
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    ptx = buf.value.decode()

    m = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.M)
    if not m or (int(m.group(1)), int(m.group(2))) > MAX_PTX_VERSION:
        sys.exit(f"NVRTC emitted PTX {m.group(0) if m else '(no .version)'}; the H100 driver "
                 f"accepts at most {MAX_PTX_VERSION}: use nvidia-cuda-nvrtc==13.0.88")
    with open(OUTPUT, "w") as f:
        f.write(ptx)
    entries = re.findall(r"\.entry\s+(\w+)", ptx)
    print(f"wrote {OUTPUT}: {', '.join(entries)}")


if __name__ == "__main__":
    main()
