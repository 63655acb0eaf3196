//! The coordinator slots of a process's devices beyond the first.
//!
//! A process that uses several GPUs has a memory manager per device ([`crate::managed`]).
//! Plans (`TENSILE_POLICY=plan`) serve the first device only: its slot streams the records
//! and takes the plans ([`crate::planning`]). Under `TENSILE_COORDINATOR=auto` every other
//! device gets a slot of its own on its card's coordinator (`gpu-` and the card's UUID), joined
//! by the planning thread once the device's manager runs: it streams no records, and serves
//! for the grants the device's manager meets and for the reports of that manager's memory.
//! Those devices swap on demand (LRU) within their grants.
//!
//! The process takes turns on its first device's coordinator only: its other slots join
//! saying that it takes its turns elsewhere ([`tensile_protocol::JobOptions::turns_elsewhere`]),
//! so their coordinators never pause it (it runs as a high-priority job would) while its own
//! priority still ranks its memory there. Turns decided by each
//! card's coordinator on its own could stop a process on one card while it has the turn on
//! another, and two such processes would wait for each other for good: seen with two jobs on
//! the same two simulated cards, each paused by one coordinator while it had the turn on the
//! other, until the turns changed, and changed again crosswise. The cost: on its other cards,
//! such a process does not give way to other jobs' turns, only shares the memory.
//!
//! The planner sees the first device's records only ([`FirstDeviceRecords`]): the other
//! devices' allocations, their frees, the accesses of launches to them, and copies and
//! memsets touching them are left out, so that a plan for the first device's budget counts
//! the first device's memory alone.
//!
//! A named coordinator (`TENSILE_COORDINATOR=NAME`) divides one card: it coordinates the first
//! device only, and every other device runs on its own budget (`TENSILE_DEVICE_MEMORY`),
//! which is said once per device.

use std::collections::HashSet;

use tensile_driver_abi::CUdevice;
use tensile_trace::Record;

use crate::config::Coordinator;
use crate::coordination::CoordinatorSource;
use crate::managed::Managed;
use crate::planning::{card_name, Grants, PlanPricing, PlanSource};
use crate::runtime::Runtime;

/// The slots of the devices beyond the first, polled by the planning thread.
#[derive(Default)]
pub struct OtherDevices {
    /// One per manager beyond the first, in the order they started.
    devices: Vec<OtherDevice>,
}

/// One device's slot (if it has one) and the grants its manager meets.
struct OtherDevice {
    device: CUdevice,
    source: Option<CoordinatorSource>,
    grants: Grants,
}

impl OtherDevices {
    /// Joins the coordinators of managers started since the last call, then polls every
    /// slot: grants are met by their device's manager, pauses and reports go through.
    pub fn poll(&mut self, rt: &'static Runtime) {
        let seen = 1 + self.devices.len();
        for m in rt.memory.running().skip(seen).collect::<Vec<_>>() {
            self.devices.push(OtherDevice {
                device: m.driver.device(),
                source: join(rt, m),
                grants: Grants::default(),
            });
        }
        for d in &mut self.devices {
            d.poll(rt);
        }
    }
}

impl OtherDevice {
    fn poll(&mut self, rt: &Runtime) {
        let Some(source) = self.source.as_mut() else {
            return;
        };
        let m = rt.memory.on_device(self.device);
        if source.poll().is_some() {
            // Nothing is streamed, so no plan should come; none is run for this device.
            tracing::debug!(
                "tensile: a plan for device {} from its coordinator is ignored",
                self.device
            );
        }
        self.grants.step(m, source.take_grant());
        source.report(rt);
    }
}

/// The record stream as the planner of the first device sees it (see the module docs).
#[derive(Default)]
pub struct FirstDeviceRecords {
    /// Allocations of other devices whose records were left out and which live on.
    left_out: HashSet<u64>,
}

impl FirstDeviceRecords {
    /// Gives `source` what of `record` concerns the first device (with one manager running,
    /// all of it).
    pub fn push(&mut self, rt: &Runtime, source: &mut dyn PlanSource, record: &Record) {
        if rt.memory.count() <= 1 {
            source.push(record);
            return;
        }
        let elsewhere = |ptr: u64| on_another_device(rt, ptr);
        match record {
            Record::Alloc(a) if elsewhere(a.ptr) => {
                self.left_out.insert(a.id);
            }
            Record::Free(f) if self.left_out.remove(&f.id) => {}
            Record::Launch(l) if l.accesses.iter().any(|a| self.left_out.contains(&a.alloc)) => {
                let mut l = l.clone();
                l.accesses.retain(|a| !self.left_out.contains(&a.alloc));
                source.push(&Record::Launch(l));
            }
            Record::Copy(c) if elsewhere(c.dst) || elsewhere(c.src) => {}
            Record::Memset(m) if elsewhere(m.dst) => {}
            _ => source.push(record),
        }
    }
}

/// Whether `ptr` is memory of a device plans do not serve (in another manager's arena than
/// the first's).
pub fn on_another_device(rt: &Runtime, ptr: u64) -> bool {
    rt.memory.count() > 1
        && rt.memory().is_some_and(|first| !first.mm.owns(ptr))
        && rt.memory.owning(ptr).is_some()
}

/// The slot of `m`'s device on its card's coordinator, as the configuration says (see the
/// module docs); `None`, said once, where it has none.
fn join(rt: &'static Runtime, m: &Managed) -> Option<CoordinatorSource> {
    let config = &rt.config;
    let device = m.driver.device();
    let name = match &config.coordinator {
        Coordinator::Off => return None,
        Coordinator::Named(name) => {
            tracing::info!(
                "tensile: TENSILE_COORDINATOR={name} coordinates the first device this process \
                 uses only; device {device} runs on its own budget, without a coordinator"
            );
            return None;
        }
        Coordinator::Auto => match card_name(m.driver.device_uuid()) {
            Some(name) => name,
            None => {
                tracing::warn!(
                    "tensile: the driver gives no UUID for device {device}, so its coordinator \
                     cannot be told from the first device's: device {device} runs on its own \
                     budget, without a coordinator"
                );
                return None;
            }
        },
    };
    let source = CoordinatorSource::connect_for_device(
        device,
        &name,
        PlanPricing::of(config),
        config.priority,
        m.mm.page_bytes() as u64,
        config.plan_room,
    );
    match source {
        Ok(mut source) => {
            source.set_grant_wait(config.grant_wait);
            tracing::info!(
                "tensile: device {device}'s memory is granted by coordinator {name:?}; it \
                 swaps on demand (lru) within its grant"
            );
            Some(source)
        }
        Err(why) => {
            tracing::warn!(
                "tensile: no coordinator for device {device} ({why}); it runs on its own budget"
            );
            None
        }
    }
}
