//! The player: a driver program that executes a [`Script`], the hidden `tensile rerun-player`
//! subcommand that `tensile rerun` starts (under `LD_PRELOAD=libtensile.so` for a managed run).
//!
//! It keeps, for every slot, the version its stamps must hold (the program's view of the data,
//! in program order), launches `tensile_rerun_op` with those versions, and reads the device's
//! result buffer at every iteration boundary. Work on different streams that touches the same
//! allocation is ordered with an event, as the recorded program must have ordered it (the
//! capture format does not record events). The result is one JSON line on stdout.
//!
//! A second script (`--then`) is played after the first in the same process, as a program
//! that changes what it does (another model, another batch size): the first script's every
//! stamp is checked, its allocations freed, then the second plays from its prologue on. The
//! JSON then holds each script's result under `phases`.
//!
//! The fault switch (`TENSILE_RERUN_FAULT=stale:<iteration>`, for tests): in that iteration of
//! the last script played, right after the largest allocation touched by a launch gets new
//! stamps, a launch puts the previous stamps back, as a swap-in from a stale host copy would;
//! the program's next use of the allocation must report it.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void, CString};
use std::time::Instant;

use serde_json::json;
use tensile_driver_abi::{CUdeviceptr, CUevent, CUfunction, CUstream};
use tensile_kernels::rerun::{
    entry_for, stamp_bytes, stamp_count, RerunArgs, RerunResult, Slot, RESULT_BYTES,
};

use super::driver::{check, Driver};
use super::script::{Script, SlotIdx, Step, StreamIdx, FINAL_CHECK_KERNEL};

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory every context may use.
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`.
const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// Threads of one stand-in launch (one block).
const BLOCK_THREADS: c_uint = 256;

/// The test-only fault switch (see the module doc).
pub const FAULT_ENV: &str = "TENSILE_RERUN_FAULT";

/// The op number the check after the last iteration reports.
const FINAL_CHECK_OP: u32 = u32::MAX;

/// Exit status of a run whose stamps did not match.
pub const EXIT_STAMP_FAILED: i32 = 3;

/// A pinned host buffer, never freed (the process ends with the run).
struct HostBuffer {
    ptr: *mut c_void,
    bytes: usize,
}

/// One slot's allocation and the version its stamps hold.
#[derive(Default, Clone)]
struct SlotState {
    ptr: Option<CUdeviceptr>,
    bytes: u64,
    /// Version every piece holds now (0: unstamped).
    version: u32,
    /// Last version handed out (versions are never reused, so stale data never matches).
    last_version: u32,
    /// Stream that last used the allocation since the last device-wide wait.
    last_stream: Option<StreamIdx>,
}

struct Player<'a> {
    d: Driver,
    script: &'a Script,
    /// Kernel launches made so far by the process (the library numbers launches the same way:
    /// a plan's `applies_from` is one of these numbers).
    launches: u64,
    /// The stand-in entry of each recorded kernel.
    funcs: HashMap<u32, CUfunction>,
    streams: Vec<CUstream>,
    events: Vec<CUevent>,
    slots: Vec<SlotState>,
    result: CUdeviceptr,
    /// One pinned buffer per copy step of the iteration (by step index), and one for the
    /// prologue (whose copies are waited for one at a time).
    iteration_buffers: Vec<Option<HostBuffer>>,
    prologue_buffer: Option<HostBuffer>,
    allocated_on_demand: u64,
    fault_iteration: Option<u32>,
    fault_done: bool,
}

/// What was played when a result is checked.
#[derive(Debug, Clone, Copy)]
enum Played {
    Prologue,
    Warmup(u32),
    Measured(u32),
}

/// How one script's play ended.
enum Outcome {
    /// Every stamp matched: the script's result.
    Verified(serde_json::Value),
    /// A stamp did not: the result that says where.
    StampFailed(serde_json::Value),
}

fn read_script(path: &std::path::Path, iterations: Option<u32>) -> Result<Script, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the script {}: {e}", path.display()))?;
    let mut script: Script = serde_json::from_str(&text)
        .map_err(|e| format!("the script {} is not valid: {e}", path.display()))?;
    if let Some(n) = iterations {
        script.iterations = n;
    }
    Ok(script)
}

/// Runs the player on the script at `path` (then on the one at `then`, if given), printing
/// its JSON result; the process's exit status says whether every stamp matched.
pub fn run(
    path: &std::path::Path,
    then: Option<&std::path::Path>,
    iterations: Option<u32>,
) -> Result<i32, String> {
    let script = read_script(path, iterations)?;
    let then = then.map(|p| read_script(p, iterations)).transpose()?;
    let fault_iteration = match std::env::var(FAULT_ENV) {
        Ok(v) => Some(
            v.strip_prefix("stale:")
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(|| format!("TENSILE_RERUN_FAULT={v:?}: expected stale:<iteration>"))?,
        ),
        Err(_) => None,
    };
    // The fault switch applies to the last script played.
    let mut player = Player::new(&script, fault_iteration.filter(|_| then.is_none()), 0)?;
    let first = match player.play()? {
        Outcome::Verified(json) => json,
        Outcome::StampFailed(json) => {
            println!("{json}");
            return Ok(EXIT_STAMP_FAILED);
        }
    };
    let Some(then) = &then else {
        println!("{first}");
        return Ok(0);
    };
    // The program moves on: what it held is freed (its stamps were all checked), and the
    // next script starts from nothing, its launches numbered on from the first's.
    player.free_everything()?;
    let launches = player.launches;
    drop(player);
    eprintln!("rerun-player: the first script done; the second starts");
    let mut player = Player::new(then, fault_iteration, launches)?;
    let second = match player.play()? {
        Outcome::Verified(json) => json,
        Outcome::StampFailed(mut json) => {
            json["phase"] = json!(2);
            println!("{json}");
            return Ok(EXIT_STAMP_FAILED);
        }
    };
    let checked = first["stamps_checked"].as_u64().unwrap_or(0)
        + second["stamps_checked"].as_u64().unwrap_or(0);
    println!(
        "{}",
        json!({
            "verified": true,
            "stamps_checked": checked,
            "phases": [first, second],
        })
    );
    Ok(0)
}

impl<'a> Player<'a> {
    /// A player for `script` in a process that has made `launches` kernel launches.
    fn new(
        script: &'a Script,
        fault_iteration: Option<u32>,
        launches: u64,
    ) -> Result<Player<'a>, String> {
        let d = Driver::load()?;
        // SAFETY: (this covers every driver call in this file, which say "see `new`") the
        // arguments are live handles this player created, out-pointers to locals, and host
        // buffers it allocated with the sizes given.
        unsafe {
            check((d.cuInit)(0), "cuInit")?;
            let mut dev = 0;
            check((d.cuDeviceGet)(&mut dev, 0), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            check(
                (d.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            check((d.cuCtxSetCurrent)(ctx), "cuCtxSetCurrent")?;
            // One copy of the stand-in entry per recorded kernel, so the replayed launches are
            // as distinct as the recorded ones (a planner learns the iteration from them).
            let mut kernels = script.kernels();
            kernels.push(FINAL_CHECK_KERNEL);
            let ptx = tensile_kernels::rerun::ptx_with_entries(&kernels)
                .ok_or("the kernels' PTX has no tensile_rerun_op entry")?;
            let ptx = CString::new(ptx).map_err(|e| e.to_string())?;
            let mut module = std::ptr::null_mut();
            check(
                (d.cuModuleLoadData)(&mut module, ptx.as_ptr().cast()),
                "cuModuleLoadData",
            )?;
            let mut funcs = HashMap::with_capacity(kernels.len());
            for &k in &kernels {
                let name = CString::new(entry_for(k)).map_err(|e| e.to_string())?;
                let mut func = std::ptr::null_mut();
                check(
                    (d.cuModuleGetFunction)(&mut func, module, name.as_ptr()),
                    "cuModuleGetFunction(tensile_rerun_op_k*)",
                )?;
                funcs.insert(k, func);
            }
            let mut streams = vec![std::ptr::null_mut()];
            let mut events = Vec::new();
            for _ in 0..=script.streams {
                let mut ev = std::ptr::null_mut();
                check((d.cuEventCreate)(&mut ev, 0), "cuEventCreate")?;
                events.push(ev);
            }
            for _ in 0..script.streams {
                let mut s = std::ptr::null_mut();
                check(
                    (d.cuStreamCreate)(&mut s, CU_STREAM_NON_BLOCKING),
                    "cuStreamCreate",
                )?;
                streams.push(s);
            }
            let mut result = 0;
            check(
                (d.cuMemAlloc)(&mut result, RESULT_BYTES),
                "cuMemAlloc(result)",
            )?;
            let zero = [0u8; RESULT_BYTES];
            check(
                (d.cuMemcpyHtoD)(result, zero.as_ptr().cast(), RESULT_BYTES),
                "cuMemcpyHtoD(result)",
            )?;
            Ok(Player {
                d,
                script,
                launches,
                funcs,
                streams,
                events,
                slots: vec![SlotState::default(); script.slot_names.len()],
                result,
                iteration_buffers: (0..script.iteration.len()).map(|_| None).collect(),
                prologue_buffer: None,
                allocated_on_demand: 0,
                fault_iteration,
                fault_done: false,
            })
        }
    }

    fn play(&mut self) -> Result<Outcome, String> {
        let script = self.script;
        let prologue_start = Instant::now();
        for step in &script.prologue {
            self.step(step, None, None)?;
        }
        self.sync_device()?;
        let prologue_ns = prologue_start.elapsed().as_nanos() as u64;
        if let Some(failed) = self.check_result(Played::Prologue)? {
            return Ok(Outcome::StampFailed(failed));
        }
        // Warm-up iterations first (the script's stand-ins for recorded steps), unmeasured;
        // each reads the result back like a measured one, so that every played iteration is
        // the same program.
        let mut steps_ns = Vec::new();
        // Every played iteration, warm-up included: its time and the launches made before it
        // (and, last, after it).
        let mut iteration_ns = Vec::new();
        let mut iteration_launches = Vec::new();
        let mut last = Instant::now();
        for n in 0..script.warmup + script.iterations {
            let measured = n.checked_sub(script.warmup);
            iteration_launches.push(self.launches);
            for (i, step) in script.iteration.iter().enumerate() {
                self.step(step, Some(i), measured)?;
            }
            self.sync_device()?;
            let now = Instant::now();
            iteration_ns.push((now - last).as_nanos() as u64);
            let played = match measured {
                Some(it) => {
                    steps_ns.push((now - last).as_nanos() as u64);
                    Played::Measured(it)
                }
                None => Played::Warmup(n),
            };
            last = now;
            if let Some(failed) = self.check_result(played)? {
                return Ok(Outcome::StampFailed(failed));
            }
            if let Some(it) = measured.filter(|_| script.iterations >= 4) {
                eprintln!(
                    "rerun-player: iteration {}/{} done",
                    it + 1,
                    script.iterations
                );
            }
        }
        iteration_launches.push(self.launches);
        // Data that was lost after its last use would go unnoticed: check every live stamp.
        if script.iterations > 0 {
            self.check_everything_live()?;
            self.sync_device()?;
            if let Some(failed) = self.check_result(Played::Measured(script.iterations))? {
                return Ok(Outcome::StampFailed(failed));
            }
        }
        let r = self.read_result()?;
        Ok(Outcome::Verified(json!({
            "verified": true,
            "steps_ns": steps_ns,
            "iteration_ns": iteration_ns,
            "iteration_launches": iteration_launches,
            "launches": self.launches,
            "prologue_ns": prologue_ns,
            "stamps_checked": r.checked,
            "allocated_on_demand": self.allocated_on_demand,
        })))
    }

    /// Frees every allocation the script still holds, and waits for the device.
    fn free_everything(&mut self) -> Result<(), String> {
        for slot in 0..self.slots.len() as SlotIdx {
            let stream = self.slots[slot as usize].last_stream.unwrap_or(0);
            self.free(slot, stream)?;
        }
        self.sync_device()
    }

    /// Launches a check-only stand-in for every live, stamped allocation (one each: together
    /// they may not fit the device budget).
    fn check_everything_live(&mut self) -> Result<(), String> {
        let live: Vec<Slot> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let ptr = s.ptr?;
                (s.version != 0).then_some(Slot {
                    ptr,
                    bytes: s.bytes,
                    alloc_id: i as u32 + 1,
                    expected: s.version,
                    written: 0,
                })
            })
            .collect();
        for chunk in live.chunks(1) {
            let args = RerunArgs {
                duration_ns: 0,
                op: FINAL_CHECK_OP,
                piece_bytes: self.script.piece_bytes,
                result: self.result,
                slots: chunk.to_vec(),
            };
            self.launch(FINAL_CHECK_KERNEL, &args, 0)?;
        }
        Ok(())
    }

    fn read_result(&self) -> Result<RerunResult, String> {
        let mut bytes = [0u8; RESULT_BYTES];
        // SAFETY: see `new`.
        unsafe {
            check(
                (self.d.cuMemcpyDtoH)(bytes.as_mut_ptr().cast(), self.result, RESULT_BYTES),
                "cuMemcpyDtoH(result)",
            )?;
        }
        Ok(RerunResult::decode(&bytes))
    }

    /// Reports a mismatch (one line on stderr); `Some(the result that says where)` if one was
    /// found.
    fn check_result(&self, played: Played) -> Result<Option<serde_json::Value>, String> {
        let r = self.read_result()?;
        let Some(m) = r.first else {
            return Ok(None);
        };
        let slot = m.alloc_id.wrapping_sub(1) as usize;
        let name = self.script.slot_names.get(slot).copied().unwrap_or(0);
        let place = match (m.op, played) {
            (FINAL_CHECK_OP, _) => "in the check after the last iteration".to_string(),
            (op, Played::Measured(i)) => format!("at op {op} in steady-state iteration {i}"),
            (op, Played::Warmup(i)) => {
                format!("at op {op} in warm-up iteration {i} (before the measured ones)")
            }
            (op, Played::Prologue) => format!("at op {op} in the prologue"),
        };
        let message = format!(
            "stamp mismatch: allocation {name} (recorded id), piece {}, {place}: expected \
             version {}, found {:08x?} ({} mismatched stamps of {} checked)",
            m.piece, m.expected[1], m.found, r.mismatches, r.checked
        );
        eprintln!("rerun-player: {message}");
        let out = json!({
            "verified": false,
            "stamps_checked": r.checked,
            "mismatches": r.mismatches,
            "allocation": name,
            "op": m.op,
            "piece": m.piece,
            "message": message,
        });
        Ok(Some(out))
    }

    fn sync_device(&mut self) -> Result<(), String> {
        // SAFETY: see `new`.
        unsafe { check((self.d.cuCtxSynchronize)(), "cuCtxSynchronize")? };
        for s in &mut self.slots {
            s.last_stream = None;
        }
        Ok(())
    }

    /// Makes `stream` wait for the work of another stream that last used `slot`.
    fn order_after_last_use(&mut self, slot: SlotIdx, stream: StreamIdx) -> Result<(), String> {
        let state = &mut self.slots[slot as usize];
        if let Some(other) = state.last_stream.filter(|&o| o != stream) {
            let ev = self.events[other as usize];
            // SAFETY: see `new`.
            unsafe {
                check(
                    (self.d.cuEventRecord)(ev, self.streams[other as usize]),
                    "cuEventRecord",
                )?;
                check(
                    (self.d.cuStreamWaitEvent)(self.streams[stream as usize], ev, 0),
                    "cuStreamWaitEvent",
                )?;
            }
        }
        self.slots[slot as usize].last_stream = Some(stream);
        Ok(())
    }

    fn alloc(&mut self, slot: SlotIdx, bytes: u64, stream: StreamIdx) -> Result<(), String> {
        if self.slots[slot as usize].ptr.is_some() {
            self.free(slot, stream)?;
        }
        let mut ptr = 0;
        // SAFETY: see `new`.
        unsafe {
            if self.script.stream_ordered {
                check(
                    (self.d.cuMemAllocAsync)(
                        &mut ptr,
                        bytes as usize,
                        self.streams[stream as usize],
                    ),
                    &format!("cuMemAllocAsync({bytes} bytes)"),
                )?;
            } else {
                check(
                    (self.d.cuMemAlloc)(&mut ptr, bytes as usize),
                    &format!("cuMemAlloc({bytes} bytes)"),
                )?;
            }
        }
        let state = &mut self.slots[slot as usize];
        state.ptr = Some(ptr);
        state.bytes = bytes;
        state.version = 0;
        state.last_stream = self.script.stream_ordered.then_some(stream);
        Ok(())
    }

    fn free(&mut self, slot: SlotIdx, stream: StreamIdx) -> Result<(), String> {
        let Some(ptr) = self.slots[slot as usize].ptr else {
            return Ok(());
        };
        if self.script.stream_ordered {
            self.order_after_last_use(slot, stream)?;
            // SAFETY: see `new`.
            unsafe {
                check(
                    (self.d.cuMemFreeAsync)(ptr, self.streams[stream as usize]),
                    "cuMemFreeAsync",
                )?;
            }
        } else {
            // SAFETY: see `new`.
            unsafe { check((self.d.cuMemFree)(ptr), "cuMemFree")? };
        }
        let state = &mut self.slots[slot as usize];
        state.ptr = None;
        state.version = 0;
        state.last_stream = None;
        Ok(())
    }

    /// The slot's allocation, made now (unstamped) if the script never made it.
    fn ensure(&mut self, slot: SlotIdx) -> Result<CUdeviceptr, String> {
        if let Some(p) = self.slots[slot as usize].ptr {
            return Ok(p);
        }
        self.allocated_on_demand += 1;
        let mut ptr = 0;
        let bytes = self.slot_bytes(slot);
        // SAFETY: see `new`.
        unsafe {
            check(
                (self.d.cuMemAlloc)(&mut ptr, bytes as usize),
                "cuMemAlloc (on demand)",
            )?;
        }
        let state = &mut self.slots[slot as usize];
        state.ptr = Some(ptr);
        state.bytes = bytes;
        state.version = 0;
        Ok(ptr)
    }

    /// A slot the script only names in launches: the size it was given when first made.
    fn slot_bytes(&self, slot: SlotIdx) -> u64 {
        let from_steps = self
            .script
            .prologue
            .iter()
            .chain(&self.script.iteration)
            .find_map(|s| match s {
                Step::Alloc { slot: s, bytes, .. } if *s == slot => Some(*bytes),
                _ => None,
            });
        from_steps.unwrap_or(self.script.piece_bytes)
    }

    fn launch(&mut self, kernel: u32, args: &RerunArgs, stream: StreamIdx) -> Result<(), String> {
        let func = *self
            .funcs
            .get(&kernel)
            .ok_or_else(|| format!("no stand-in entry for kernel {kernel}"))?;
        let mut params = args.encode();
        let mut kernel_params = [params.as_mut_ptr().cast::<c_void>()];
        self.launches += 1;
        // SAFETY: see `new`; `params` outlives the call (the driver copies it at launch).
        unsafe {
            check(
                (self.d.cuLaunchKernel)(
                    func,
                    1,
                    1,
                    1,
                    BLOCK_THREADS,
                    1,
                    1,
                    0,
                    self.streams[stream as usize],
                    kernel_params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                "cuLaunchKernel(tensile_rerun_op)",
            )
        }
    }

    fn next_version(&mut self, slot: SlotIdx) -> u32 {
        let s = &mut self.slots[slot as usize];
        s.last_version = s.last_version.wrapping_add(1).max(1);
        s.last_version
    }

    fn kernel(
        &mut self,
        op: u32,
        kernel: u32,
        stream: StreamIdx,
        duration_ns: u64,
        slots: &[SlotIdx],
        iteration: Option<u32>,
    ) -> Result<(), String> {
        let mut args = RerunArgs {
            duration_ns,
            op,
            piece_bytes: self.script.piece_bytes,
            result: self.result,
            slots: Vec::with_capacity(slots.len()),
        };
        for &slot in slots {
            let ptr = self.ensure(slot)?;
            self.order_after_last_use(slot, stream)?;
            let written = self.next_version(slot);
            let state = &mut self.slots[slot as usize];
            args.slots.push(Slot {
                ptr,
                bytes: state.bytes,
                alloc_id: slot + 1,
                expected: state.version,
                written,
            });
            state.version = written;
        }
        self.launch(kernel, &args, stream)?;
        if iteration.is_some() && iteration == self.fault_iteration && !self.fault_done {
            self.inject_stale_stamps(kernel, &args, stream)?;
        }
        Ok(())
    }

    /// The fault switch: puts back the previous stamps of the largest allocation this launch
    /// stamped, behind the program's back (its expected version stays the new one).
    fn inject_stale_stamps(
        &mut self,
        kernel: u32,
        args: &RerunArgs,
        stream: StreamIdx,
    ) -> Result<(), String> {
        let Some(target) = args
            .slots
            .iter()
            .filter(|s| s.expected != 0 && stamp_count(s.bytes, args.piece_bytes) > 0)
            .max_by_key(|s| s.bytes)
            .copied()
        else {
            return Ok(());
        };
        self.fault_done = true;
        let stale = RerunArgs {
            duration_ns: 0,
            op: args.op,
            slots: vec![Slot {
                expected: 0,
                written: target.expected,
                ..target
            }],
            ..args.clone()
        };
        let name = self.script.slot_names[(target.alloc_id - 1) as usize];
        eprintln!(
            "rerun-player: fault switch: allocation {name} gets its stamps from before op {} back",
            args.op
        );
        self.launch(kernel, &stale, stream)
    }

    fn host_buffer(&mut self, index: Option<usize>, bytes: usize) -> Result<*mut c_void, String> {
        let slot = match index {
            Some(i) => &mut self.iteration_buffers[i],
            None => &mut self.prologue_buffer,
        };
        if slot.as_ref().is_none_or(|b| b.bytes < bytes) {
            let mut p = std::ptr::null_mut();
            // SAFETY: see `new`.
            unsafe {
                check(
                    (self.d.cuMemHostAlloc)(&mut p, bytes.max(1), CU_MEMHOSTALLOC_PORTABLE),
                    &format!("cuMemHostAlloc({bytes} bytes)"),
                )?;
            }
            *slot = Some(HostBuffer { ptr: p, bytes });
        }
        Ok(slot.as_ref().map(|b| b.ptr).unwrap_or(std::ptr::null_mut()))
    }

    /// Prologue copies (`index` None) share one host buffer: each waits for its copy before the
    /// next one reuses the buffer.
    fn wait_if_prologue_buffer(
        &self,
        index: Option<usize>,
        stream: StreamIdx,
    ) -> Result<(), String> {
        if index.is_none() {
            // SAFETY: see `new`.
            unsafe {
                check(
                    (self.d.cuStreamSynchronize)(self.streams[stream as usize]),
                    "cuStreamSynchronize",
                )?;
            }
        }
        Ok(())
    }

    fn copy_in(
        &mut self,
        index: Option<usize>,
        slot: SlotIdx,
        bytes: u64,
        stream: StreamIdx,
    ) -> Result<(), String> {
        let ptr = self.ensure(slot)?;
        self.order_after_last_use(slot, stream)?;
        let host = self.host_buffer(index, bytes as usize)?;
        let version = self.next_version(slot);
        let piece = self.script.piece_bytes;
        let stamps = stamp_count(self.slots[slot as usize].bytes, piece);
        let mut covered = 0;
        for p in 0..stamps {
            let at = p * piece;
            if at + 16 > bytes {
                break;
            }
            let stamp = stamp_bytes(slot + 1, version, p as u32);
            // SAFETY: `host` holds at least `bytes` bytes and `at + 16 <= bytes`; the previous
            // copy from this buffer finished at the last iteration boundary (or, in the
            // prologue, at the wait after it).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    stamp.as_ptr(),
                    host.cast::<u8>().add(at as usize),
                    16,
                )
            };
            covered += 1;
        }
        // SAFETY: see `new`.
        unsafe {
            check(
                (self.d.cuMemcpyHtoDAsync)(
                    ptr,
                    host,
                    bytes as usize,
                    self.streams[stream as usize],
                ),
                "cuMemcpyHtoDAsync",
            )?;
        }
        self.wait_if_prologue_buffer(index, stream)?;
        // A copy that covers every stamp leaves them all at the new version; one that covers
        // only some leaves the allocation unstamped until a launch writes it whole.
        self.slots[slot as usize].version = if covered == stamps { version } else { 0 };
        Ok(())
    }

    fn copy_out(
        &mut self,
        index: Option<usize>,
        slot: SlotIdx,
        bytes: u64,
        stream: StreamIdx,
    ) -> Result<(), String> {
        let ptr = self.ensure(slot)?;
        self.order_after_last_use(slot, stream)?;
        let host = self.host_buffer(index, bytes as usize)?;
        // SAFETY: see `new`.
        unsafe {
            check(
                (self.d.cuMemcpyDtoHAsync)(
                    host,
                    ptr,
                    bytes as usize,
                    self.streams[stream as usize],
                ),
                "cuMemcpyDtoHAsync",
            )?;
        }
        self.wait_if_prologue_buffer(index, stream)?;
        Ok(())
    }

    fn step(
        &mut self,
        step: &Step,
        index: Option<usize>,
        iteration: Option<u32>,
    ) -> Result<(), String> {
        match step {
            Step::Alloc {
                slot,
                bytes,
                stream,
            } => self.alloc(*slot, *bytes, *stream),
            Step::Free { slot, stream } => self.free(*slot, *stream),
            Step::Kernel {
                op,
                kernel,
                stream,
                duration_ns,
                slots,
            } => self.kernel(*op, *kernel, *stream, *duration_ns, slots, iteration),
            Step::CopyIn {
                slot,
                bytes,
                stream,
                ..
            } => self.copy_in(index, *slot, *bytes, *stream),
            Step::CopyOut {
                slot,
                bytes,
                stream,
                ..
            } => self.copy_out(index, *slot, *bytes, *stream),
            Step::SyncStream(s) => {
                // SAFETY: see `new`.
                unsafe {
                    check(
                        (self.d.cuStreamSynchronize)(self.streams[*s as usize]),
                        "cuStreamSynchronize",
                    )?;
                }
                for st in &mut self.slots {
                    if st.last_stream == Some(*s) {
                        st.last_stream = None;
                    }
                }
                Ok(())
            }
            Step::SyncDevice => self.sync_device(),
        }
    }
}

/// Succeeds if the driver `libcuda.so.1` resolves to has a device.
pub fn probe() -> Result<(), String> {
    let d = Driver::load()?;
    // SAFETY: out-pointers to locals.
    unsafe {
        check((d.cuInit)(0), "cuInit")?;
        let mut dev = 0;
        check((d.cuDeviceGet)(&mut dev, 0), "cuDeviceGet")
    }
}
