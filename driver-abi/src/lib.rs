//! The CUDA driver ABI, as far as libtensile and the simulated GPU need it.
//!
//! This crate is the single place where the driver's C types, result codes and the
//! `cuGetProcAddress` symbol table are written down, so that the interposer (`tensile-shim`)
//! and the stand-in driver (`tensile-simgpu`) can never disagree about them.
//!
//! It is *not* a binding to a driver: it declares no `extern` functions and links nothing.
//! Result codes are plain integers (`CUresult = u32`) rather than a Rust `enum`, because a
//! real driver may return codes newer than this crate, and turning an unknown discriminant
//! into a Rust enum is undefined behaviour.

mod proc;
#[rustfmt::skip] // generated: one row per line, as the generator writes it
mod proc_table;
pub mod types;

pub use proc::{proc_table, resolve_proc, ProcEntry, ProcLookup};
pub use types::*;
