//! Memory shared with other processes through CUDA IPC (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`), for arena memory the driver's own IPC
//! cannot share: the driver exports only `cuMemAlloc` memory through those calls, and the
//! arena is VMM mappings.
//!
//! The exporter ([`exporter`]) pins the allocation on the device and exports the device
//! units behind it as file descriptors (`cuMemExportToShareableHandle`); the handle it
//! returns ([`handle`]) names the export. An importer under libtensile ([`importer`]) asks
//! the exporter for the descriptors over a Unix domain socket ([`wire`]) and maps the units
//! itself. Handles that are not libtensile's are the driver's business, both ways.
//!
//! Not here: the hooks (`crate::hooks::ipc`), pinning and naming the units
//! (`crate::memory::manager`'s `export.rs`).

pub mod exporter;
pub mod handle;
pub mod importer;
pub mod wire;
