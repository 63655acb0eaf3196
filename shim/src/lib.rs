//! The in-process runtime of libtensile.
//!
//! `libtensile.so` (crate `tensile-preload`) is only the C surface: every exported function
//! calls into this crate. Here live the real driver table ([`real`]), the managed entry
//! points ([`syms`], [`entry`], [`hooks`], [`proc_address`], [`interpose`]), access
//! tracking ([`alloc_index`], [`params`], [`kernels`], [`tracker`]), the trace recorder
//! ([`recorder`], [`timing`]), configuration and logging ([`config`], [`log`]) and the process-wide
//! [`runtime`] tying them together. The plan executor ([`executor`]) decides, per launch,
//! what the manager moves ahead of need. The memory manager ([`memory`]) is started per context
//! by [`managed`] over the real driver ([`real_memory`]) and called from the hooks.
//!
//! Data path of a launch: the wrapper ([`entry`]) finds the real function for the exact
//! versioned symbol, the hook ([`hooks::launch`]) resolves the allocations the arguments
//! point into ([`tracker::Tracker::resolve_launch`]), forwards, and records.

pub use tensile_driver_abi as abi;

pub mod alloc_index;
pub mod callers;
pub mod config;
pub mod coordination;
pub mod executor;
pub mod hooks;
pub mod interpose;
pub mod ipc;
pub mod kernels;
pub mod log;
pub mod managed;
pub mod memory;
pub mod other_devices;
pub mod params;
pub mod plan_room;
pub mod planning;
pub mod proc_address;
pub mod pytorch;
pub mod real;
pub mod real_memory;
pub mod recorder;
pub mod runtime;
pub mod syms;
pub mod timing;
pub mod tracker;
pub mod turns;

pub use syms::{entry, pfn, Sym};
