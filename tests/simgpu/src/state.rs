//! The process-global state of the simulated driver, created by `cuInit`.

use std::sync::{Arc, Mutex, OnceLock};

use tensile_driver_abi::*;

use crate::capture::Graph;
use crate::context::Context;
use crate::event::Event;
use crate::handles::Registry;
use crate::memory::{AddressSpace, Device};
use crate::module::{Function, Kernel, Library, Module};
use crate::pool::Pool;
use crate::stream::Stream;

/// The primary context of a device and its retain count.
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
    /// Per device (indexed by ordinal): its default pool, its current pool, its primary
    /// context.
    pub default_pools: Vec<usize>,
    pub current_pools: Vec<Mutex<usize>>,
    pub primaries: Vec<Mutex<Primary>>,
}

impl State {
    /// Simulated devices (`TENSILE_SIM_DEVICE_COUNT`).
    pub fn device_count(&self) -> usize {
        self.primaries.len()
    }

    /// `dev` as an index, or `CUDA_ERROR_INVALID_DEVICE` if there is no such device.
    pub fn device(&self, dev: CUdevice) -> Result<usize, CUresult> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.device_count())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// `device`'s primary context slot.
    pub fn primary(&self, device: usize) -> std::sync::MutexGuard<'_, Primary> {
        self.primaries[device]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `device`'s current pool.
    pub fn current_pool(&self, device: usize) -> std::sync::MutexGuard<'_, usize> {
        self.current_pools[device]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

static STATE: OnceLock<Result<State, CUresult>> = OnceLock::new();

/// Creates the state on the first call (`cuInit`), reading the configuration and joining the
/// shared card `TENSILE_SIM_CARD` names (one per device), if any. A card that cannot be joined
/// is one line on stderr and `CUDA_ERROR_NO_DEVICE`, from this and every later `cuInit`.
pub fn init() -> Result<&'static State, CUresult> {
    let state = STATE.get_or_init(|| {
        let capacity = crate::config::load();
        let count = crate::config::device_count();
        let devices: Vec<Device> = match crate::config::card_name() {
            Some(name) => match crate::shared_card::join(&name, count, capacity) {
                Ok(cards) => cards
                    .into_iter()
                    .map(|card| Device::new(capacity, Some(card)))
                    .collect(),
                Err(why) => {
                    eprintln!("tensile-simgpu: {why}");
                    return Err(CUDA_ERROR_NO_DEVICE);
                }
            },
            None => vec![Device::new(capacity, None); count],
        };
        let pools = Registry::default();
        let default_pools: Vec<usize> = (0..count)
            .map(|d| {
                let location = CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: d as i32,
                };
                pools.insert(Arc::new(Pool::new(location, 0)))
            })
            .collect();
        Ok(State {
            space: AddressSpace::new(devices),
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
            current_pools: default_pools.iter().map(|&p| Mutex::new(p)).collect(),
            default_pools,
            primaries: (0..count).map(|_| Mutex::new(Primary::default())).collect(),
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
