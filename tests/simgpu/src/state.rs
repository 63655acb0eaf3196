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

static STATE: OnceLock<Result<State, CUresult>> = OnceLock::new();

/// Creates the state on the first call (`cuInit`), reading the configuration and joining the
/// shared card `TENSILE_SIM_CARD` names, if any. A card that cannot be joined is one line on
/// stderr and `CUDA_ERROR_NO_DEVICE`, from this and every later `cuInit`.
pub fn init() -> Result<&'static State, CUresult> {
    let state = STATE.get_or_init(|| {
        let capacity = crate::config::load();
        let card = match crate::config::card_name() {
            Some(name) => match crate::shared_card::join(&name, capacity) {
                Ok(card) => Some(card),
                Err(why) => {
                    eprintln!("tensile-simgpu: {why}");
                    return Err(CUDA_ERROR_NO_DEVICE);
                }
            },
            None => None,
        };
        let pools = Registry::default();
        let device = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        let default_pool = pools.insert(Arc::new(Pool::new(device, 0)));
        Ok(State {
            space: AddressSpace::new(capacity, card),
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
        })
    });
    state.as_ref().map_err(|e| *e)
}

/// The state, or `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (and after a failed one).
pub fn get() -> Result<&'static State, CUresult> {
    match STATE.get() {
        Some(Ok(state)) => Ok(state),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}
