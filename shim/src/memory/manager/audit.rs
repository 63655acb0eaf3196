//! The bookkeeping audit tests run after every step: every frame owned exactly once (a unit
//! handed over by the pages read back into it, `handover.rs`), the
//! in-flight sets matching the page states, no pin left behind. Only tests call it (it is
//! compiled in every build, being public); the manager's own paths never do.

use std::collections::HashMap;

use crate::memory::frames::{DevFrame, HostFrame};
use crate::memory::page::{Frame, ResidencyState};

use super::MemoryManager;

impl MemoryManager {
    /// Checks the bookkeeping: every device and host frame is free or owned by exactly one
    /// page (or, for host frames, waiting on a cancelled copy), the in-flight sets match the
    /// page states, and nothing pins a page. For tests; `Err` says what is wrong.
    pub fn audit(&self) -> Result<(), String> {
        use std::collections::HashSet;
        let s = self.lock();
        let mut dev: HashSet<DevFrame> = HashSet::new();
        let mut host: HashSet<HostFrame> = HashSet::new();
        let mut own_dev = |d: DevFrame, who: &str| {
            if dev.insert(d) {
                Ok(())
            } else {
                Err(format!("device frame {d:?} twice ({who})"))
            }
        };
        for d in s.dev.free_list() {
            own_dev(d, "free list")?;
        }
        for &d in &s.arriving_frames {
            own_dev(d, "arriving")?;
        }
        for &f in &s.backing_frames {
            if let Frame::Device(d) = f {
                own_dev(d, "a new allocation's backing")?;
            }
        }
        let mut host_own = |h: HostFrame, who: &str| {
            if host.insert(h) {
                Ok(())
            } else {
                Err(format!("host frame {h:?} twice ({who})"))
            }
        };
        let (host_free, host_created) = s.host.free_list();
        for h in host_free {
            host_own(h, "free list")?;
        }
        for &(h, _) in &s.deferred_host {
            host_own(h, "deferred")?;
        }
        for &f in &s.backing_frames {
            if let Frame::Host(h) = f {
                host_own(h, "a new allocation's backing")?;
            }
        }
        // Pins held for captured graphs are expected; any other pin is a lost ticket.
        let mut capture_pins: HashMap<usize, u32> = HashMap::new();
        for &(a, b) in s.capture_pinned.values() {
            for p in a..=b {
                *capture_pins.entry(p).or_default() += 1;
            }
        }
        for (p, e) in s.pages.iter() {
            let expected = capture_pins.get(&p).copied().unwrap_or(0);
            if e.pins != expected {
                return Err(format!(
                    "page {p} pinned {} times, {expected} of them for captured graphs",
                    e.pins
                ));
            }
            if s.completing.contains(&p) && !matches!(e.state, ResidencyState::ToHost { .. }) {
                return Err(format!("page {p} is completing but not ToHost"));
            }
            if s.mapping.contains(&p) && e.state != ResidencyState::Unbacked {
                return Err(format!("page {p} is being mapped but not Unbacked"));
            }
            if s.arriving.contains(&p) && !matches!(e.state, ResidencyState::Host(_)) {
                return Err(format!("page {p} is arriving but not Host"));
            }
            match e.state {
                ResidencyState::Unbacked => {}
                ResidencyState::Device(d) => own_dev(d, "page")?,
                ResidencyState::Host(h) => host_own(h, "page")?,
                ResidencyState::ToHost { dev, host, .. } => {
                    // A unit handed over: the pages read back into it own its frames.
                    if !s.is_handed(p) {
                        own_dev(dev, "page")?;
                    }
                    host_own(host, "page")?;
                    if !s.outgoing.contains(&p) {
                        return Err(format!("page {p} is ToHost but not outgoing"));
                    }
                }
                ResidencyState::ToDevice { dev, host, .. } => {
                    own_dev(dev, "page")?;
                    host_own(host, "page")?;
                    if !s.incoming.contains(&p) {
                        return Err(format!("page {p} is ToDevice but not incoming"));
                    }
                }
            }
        }
        for (&unit, u) in &s.handed {
            for i in 0..u.pages {
                let frame = DevFrame {
                    unit,
                    offset: i as u32,
                };
                let victim = s.pages.get(u.first + i).map(|e| e.state);
                if !matches!(victim, Some(ResidencyState::ToHost { dev, event, .. })
                    if dev == frame && event == u.event)
                {
                    return Err(format!(
                        "unit {unit} handed over, but page {} is {victim:?}",
                        u.first + i
                    ));
                }
                // Owned by the pages read back into it, or given back by them and parked.
                if !dev.contains(&frame) {
                    if !s.dev.is_parked(frame) {
                        return Err(format!(
                            "unit {unit} handed over, but nothing read back into {frame:?}"
                        ));
                    }
                    dev.insert(frame);
                }
            }
        }
        if dev.len() != s.dev.created_frames() {
            return Err(format!(
                "{} device frames accounted for, {} created",
                dev.len(),
                s.dev.created_frames()
            ));
        }
        if host.len() != host_created {
            return Err(format!(
                "{} host frames accounted for, {host_created} created",
                host.len()
            ));
        }
        // Units whole: every page of a unit holds its frame of it, in order, in one state.
        let kind = |st: ResidencyState| match st {
            ResidencyState::ToHost { event, .. } => (1, Some(event)),
            ResidencyState::ToDevice { event, .. } => (2, Some(event)),
            ResidencyState::Host(_) => (3, None),
            ResidencyState::Device(_) => (4, None),
            ResidencyState::Unbacked => (0, None),
        };
        for (p, e) in s.pages.iter() {
            let Some(d) = e.state.device_frame() else {
                continue;
            };
            let (_, n) = s.dev.unit(d);
            let first = p
                .checked_sub(d.offset as usize)
                .ok_or_else(|| format!("page {p} holds {d:?} below the arena"))?;
            for (i, q) in (first..first + n).enumerate() {
                let other = s.pages.get(q).map(|o| o.state);
                let frame = other.and_then(|st| st.device_frame());
                if frame
                    != Some(DevFrame {
                        unit: d.unit,
                        offset: i as u32,
                    })
                {
                    return Err(format!(
                        "unit {} of page {p} is not whole: page {q} holds {frame:?}",
                        d.unit
                    ));
                }
                if other.map(kind) != Some(kind(e.state)) {
                    return Err(format!(
                        "unit {} is split: page {p} is {:?}, page {q} {other:?}",
                        d.unit, e.state
                    ));
                }
            }
        }
        // Host units whole likewise.
        for (p, e) in s.pages.iter() {
            let Some((a, n)) = s.host_unit_span(p).filter(|&(_, n)| n > 1) else {
                continue;
            };
            for q in a..a + n {
                let other = s.pages.get(q).map(|o| o.state);
                if other.map(kind) != Some(kind(e.state))
                    || s.host_unit_span(q) != Some((a, n))
                    || s.unmapped_host.contains(&q) != s.unmapped_host.contains(&p)
                {
                    return Err(format!(
                        "host unit at page {a} ({n} pages) is split: page {p} is {:?}, page {q} \
                         {other:?}",
                        e.state
                    ));
                }
            }
        }
        for &p in &s.unmapped_host {
            if !matches!(
                s.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            ) {
                return Err(format!("page {p} noted unmapped but not Host"));
            }
        }
        // The freed pages noted as holding device frames do.
        for &p in &s.dead_device {
            if !matches!(
                s.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Device(_) | ResidencyState::ToHost { .. })
            ) {
                return Err(format!("page {p} noted dead on the device but not there"));
            }
        }
        Ok(())
    }
}
