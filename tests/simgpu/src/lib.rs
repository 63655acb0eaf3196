//! A simulated GPU: a stand-in `libcuda.so.1` that implements the CUDA driver API subset
//! libtensile and its tests use, faithfully enough that ordering bugs show up as wrong data
//! or errors.
//!
//! - Memory is real host virtual memory with VMM semantics ([`memory`]): device pointers are
//!   host addresses, physical allocations are `memfd`s, and every device access (kernel,
//!   copy, memset) is checked against the mappings; a bad one is `CUDA_ERROR_ILLEGAL_ADDRESS`
//!   and breaks the context for good.
//! - Streams are asynchronous ([`stream`]): one worker thread per stream, with legacy
//!   default-stream semantics ([`context`]), events, host functions and stream-ordered frees.
//! - Kernels are PTX entries run by their CPU twins from `tensile-kernels` ([`module`]).
//! - `cuGetProcAddress` answers like the driver ([`api::proc`]).
//! - Several devices (`TENSILE_SIM_DEVICE_COUNT`), and cards shared by processes
//!   (`TENSILE_SIM_CARD`, [`shared_card`]): jobs naming one card share its capacity and engines.
//!
//! See `README.md` for the environment variables and what is NOT simulated.

pub mod api;
pub mod calls;
pub mod capture;
pub mod card;
pub mod config;
pub mod context;
pub mod engine_log;
pub mod errors;
pub mod event;
pub mod handles;
pub mod memory;
pub mod module;
pub mod ops;
pub mod os;
pub mod pool;
pub mod shared_card;
pub mod state;
pub mod stream;

pub use api::proc::{implemented_symbols, lookup};
