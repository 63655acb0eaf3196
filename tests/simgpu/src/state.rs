//! The process-global state of the simulated driver, created by `cuInit`.

use std::sync::{Arc, Mutex, OnceLock};

use tensile_driver_abi::*;

use crate::capture::Graph;
use crate::context::Context;
use crate::event::Event;
use crate::handles::Registry;
use crate::memory::AddressSpace;
use crate::module::{Function, Kernel, Library, Module};
use crate::pool::Pool;
use crate::stream::Stream;

/// The primary context of device 0 and its retain count.
#[derive(Default)]
pub struct Primary {
    pub ctx: Option<Arc<Context>>,
    pub refs: u32,
    pub flags: u32,
}

pub struct State {
    pub space: AddressSpace,
    pub contexts: Registry<Context>,
    pub streams: Registry<Stream>,
    pub events: Registry<Event>,
    pub modules: Registry<Module>,
    pub functions: Registry<Function>,
    pub libraries: Registry<Library>,
    pub kernels: Registry<Kernel>,
    pub pools: Registry<Pool>,
    /// `CUgraph`s and `CUgraphExec`s.
    pub graphs: Registry<Graph>,
    pub graph_execs: Registry<Graph>,
    pub default_pool: usize,
    pub current_pool: Mutex<usize>,
    pub primary: Mutex<Primary>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// Creates the state on the first call (`cuInit`), reading the configuration.
pub fn init() -> &'static State {
    STATE.get_or_init(|| {
        let capacity = crate::config::load();
        let pools = Registry::default();
        let device = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        let default_pool = pools.insert(Arc::new(Pool::new(device, 0)));
        State {
            space: AddressSpace::new(capacity),
            contexts: Registry::default(),
            streams: Registry::default(),
            events: Registry::default(),
            modules: Registry::default(),
            functions: Registry::default(),
            libraries: Registry::default(),
            kernels: Registry::default(),
            pools,
            graphs: Registry::default(),
            graph_execs: Registry::default(),
            default_pool,
            current_pool: Mutex::new(default_pool),
            primary: Mutex::new(Primary::default()),
        }
    })
}

/// The state, or `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub fn get() -> Result<&'static State, CUresult> {
    STATE.get().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}
