//! Units: which device or host unit (one physical allocation, mapped whole) a page belongs
//! to, growing page sets to whole units, cutting pages brought in together into new units,
//! and re-cutting the units an access shares with pages outside it, so that an access does
//! not bring in its neighbours' pages (invariant 6 in the module docs).

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE};

use crate::memory::frames::HostFrame;
use crate::memory::journal::SwapCause;
use crate::memory::page::{PageEntry, ResidencyState};

use super::{coalesce, AccessTicket, Inner, SwapOrder};

impl Inner {
    /// The unit page `p`'s device frame belongs to, as `(first page, pages)`.
    pub(super) fn unit_span(&self, p: usize) -> Option<(usize, usize)> {
        let d = self.pages.get(p)?.state.device_frame()?;
        let (_, n) = self.dev.unit(d);
        Some((p - d.offset as usize, n))
    }

    /// The host unit page `p`'s host frame belongs to (`Host`, `ToHost` or `ToDevice`), as
    /// `(first page, pages)`.
    pub(super) fn host_unit_span(&self, p: usize) -> Option<(usize, usize)> {
        let h = match self.pages.get(p)?.state {
            ResidencyState::Host(h)
            | ResidencyState::ToHost { host: h, .. }
            | ResidencyState::ToDevice { host: h, .. } => h,
            _ => return None,
        };
        let (first, n) = self.host.unit_of(h);
        Some((p - (h.0 - first.0) as usize, n))
    }

    /// `Host` pages grown to whole host units (sorted, deduplicated), as
    /// [`Self::whole_units`] does for device units.
    pub(super) fn whole_host_units(
        &self,
        pages: Vec<usize>,
        ok: impl Fn(&PageEntry) -> bool,
    ) -> Vec<usize> {
        self.grown_to_spans(pages, |p| self.host_unit_span(p), ok)
    }

    /// `pages` grown to whole units (sorted, deduplicated): the pages of a unit are taken
    /// together if every one of them passes `ok`, and left out together otherwise; a page
    /// without a device frame is taken if it passes `ok`.
    pub(super) fn whole_units(
        &self,
        pages: Vec<usize>,
        ok: impl Fn(&PageEntry) -> bool,
    ) -> Vec<usize> {
        self.grown_to_spans(pages, |p| self.unit_span(p), ok)
    }

    /// `pages` grown to the spans `span` gives (a page alone where it gives none), each taken
    /// whole if every page of it passes `ok` and left out otherwise. Sorted, deduplicated.
    pub(super) fn grown_to_spans(
        &self,
        mut pages: Vec<usize>,
        span: impl Fn(usize) -> Option<(usize, usize)>,
        ok: impl Fn(&PageEntry) -> bool,
    ) -> Vec<usize> {
        pages.sort_unstable();
        pages.dedup();
        let mut out = Vec::with_capacity(pages.len());
        let mut covered_to = 0;
        for p in pages {
            if p < covered_to {
                continue;
            }
            let (a, n) = span(p).unwrap_or((p, 1));
            covered_to = a + n;
            if self.span_all((a, n), &ok) {
                out.extend(a..a + n);
            }
        }
        out
    }

    /// Whether every page of the span `(first, pages)` passes `ok`.
    pub(super) fn span_all(&self, (a, n): (usize, usize), ok: impl Fn(&PageEntry) -> bool) -> bool {
        (a..a + n).all(|q| self.pages.get(q).is_some_and(&ok))
    }

    /// The units of sorted whole-unit `pages` (pages with device frames), as `(first, pages)`.
    pub(super) fn spans(&self, pages: &[usize]) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for &p in pages {
            if out.last().is_some_and(|&(a, n)| p < a + n) {
                continue;
            }
            if let Some(span) = self.unit_span(p) {
                out.push(span);
            }
        }
        out
    }

    /// Sorted `pages` cut into the units they get when brought in together: runs of
    /// consecutive pages that one live allocation covers whole (a unit moves whole, and two
    /// tensors seldom move together again), cut after `max_unit_pages` (at most
    /// [`super::MAX_UNIT_PAGES`]). A tensor's last
    /// page, which it covers only in part, is a unit of its own: the arena packs small
    /// tensors into the rest of it, and an access to one of them must not bring in (or pin)
    /// the whole tensor. Sizes in page order.
    /// The pages of a host unit (all in `pages`, as [`Self::whole_host_units`] makes them)
    /// get one device unit of their own: the same pages then leave again as one.
    pub(super) fn unit_sizes(&self, pages: &[usize]) -> Vec<usize> {
        let mut sizes: Vec<usize> = Vec::new();
        let mut prev: Option<(usize, Option<CUdeviceptr>)> = None;
        let mut i = 0;
        while i < pages.len() {
            let p = pages[i];
            if let Some((a, n)) = self.host_unit_span(p).filter(|&(_, n)| n > 1) {
                if a == p
                    && pages
                        .get(i..i + n)
                        .is_some_and(|w| w.iter().copied().eq(a..a + n))
                {
                    sizes.push(n);
                    prev = None;
                    i += n;
                    continue;
                }
            }
            let own = self.whole_owner(p);
            // Only pages one allocation covers whole share a unit: where tensors share a page,
            // a unit over it would pull all of them in and out whenever one is touched.
            let joins = prev.is_some_and(|(q, o)| q + 1 == p && own.is_some() && o == own);
            match sizes.last_mut() {
                Some(n) if joins && *n < self.max_unit_pages => *n += 1,
                _ => sizes.push(1),
            }
            prev = Some((p, own));
            i += 1;
        }
        sizes
    }

    /// The live allocation that covers page `p` whole, if one does (its address).
    pub(super) fn whole_owner(&self, p: usize) -> Option<CUdeviceptr> {
        let start = self.va(p);
        self.sub
            .find(start)
            .filter(|a| a.ptr + a.span >= start + self.page as u64)
            .map(|a| a.ptr)
    }

    /// Sends the units that hold pages of `t` and pages outside it to the host, and waits
    /// until they are there: brought back for `t`, its pages then get units of their own. For
    /// an access that fits the budget only without those units' other pages. Units pinned by
    /// other calls in flight stay.
    pub(super) fn split_units_around(&mut self, t: &AccessTicket) -> Result<(), CUresult> {
        let inside = |p: usize| t.runs.iter().any(|&(a, b)| (a..=b).contains(&p));
        let touched: Vec<usize> = t.runs.iter().flat_map(|&(a, b)| a..=b).collect();
        let straddling: Vec<(usize, usize)> = self
            .spans(&self.whole_units(touched.clone(), |e| e.state.device_frame().is_some()))
            .into_iter()
            .filter(|&(a, n)| !(a..a + n).all(inside))
            .collect();
        // This access's own pins would hold them: drop them meanwhile (the lock is held).
        self.unpin(t);
        let r = (|| {
            if straddling.is_empty() {
                return Ok(());
            }
            self.wait_incoming()?;
            let pages: Vec<usize> = straddling.iter().flat_map(|&(a, n)| a..a + n).collect();
            let victims = self.whole_units(pages, |e| {
                e.pins == 0 && matches!(e.state, ResidencyState::Device(_))
            });
            if !victims.is_empty() {
                self.order_swap_out_after_uses(&victims)?;
                let need = victims.len();
                self.swap_out_pages(victims, need, SwapOrder::AfterUses, SwapCause::Access)?;
            }
            self.wait_outgoing()
        })();
        let _ = self.pin_pages(t);
        r?;
        // Then host units reaching past the access (those just made too) become single
        // frames (a copy on the host).
        let mut host_units: Vec<(usize, usize)> = Vec::new();
        for &p in &touched {
            if let Some((a, n)) = self.host_unit_span(p).filter(|&(_, n)| n > 1) {
                let host = matches!(
                    self.pages.get(p).map(|e| e.state),
                    Some(ResidencyState::Host(_))
                );
                if host && !(a..a + n).all(inside) && !host_units.contains(&(a, n)) {
                    host_units.push((a, n));
                }
            }
        }
        for (a, n) in host_units {
            self.host_unit_to_singles(a, n)?;
        }
        Ok(())
    }

    /// Moves the pages of the host unit at `a` (`n` pages, all `Host`) to single host frames:
    /// a copy between the two in the host window, then the unit's mapping goes and the single
    /// frames are mapped page by page. The unit is free afterwards.
    pub(super) fn host_unit_to_singles(&mut self, a: usize, n: usize) -> Result<(), CUresult> {
        let mut singles: Vec<HostFrame> = Vec::with_capacity(n);
        let give_back = |s: &mut Self, singles: Vec<HostFrame>| {
            for h in singles {
                s.host.give(h);
            }
        };
        for _ in 0..n {
            match self.take_host(false) {
                Ok(h) => singles.push(h),
                Err(e) => {
                    give_back(self, singles);
                    return Err(e);
                }
            }
        }
        self.host.regroup(&mut singles);
        let mut copies: Vec<(CUdeviceptr, CUdeviceptr)> = Vec::with_capacity(n);
        for (q, &h) in (a..a + n).zip(&singles) {
            let Some(ResidencyState::Host(old)) = self.pages.get(q).map(|e| e.state) else {
                give_back(self, singles);
                return Err(CUDA_ERROR_INVALID_VALUE);
            };
            copies.push((self.host.window_address(h), self.host.window_address(old)));
        }
        let copied = coalesce(&copies, self.page)
            .into_iter()
            .try_for_each(|(dst, src, len)| {
                self.driver
                    .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            });
        // Whatever was queued must have run before the frames are reused or given back.
        let synced = self.driver.stream_synchronize(self.swap_out_stream);
        if let Err(e) = copied.and(synced) {
            give_back(self, singles);
            return Err(e);
        }
        if let Err(e) = self.unmap_host_pages(&[a]) {
            give_back(self, singles);
            return Err(e);
        }
        for (q, h) in (a..a + n).zip(singles) {
            match self.pages.rehost(q, h) {
                Ok(old) => self.host.give(old),
                Err(e) => debug_assert!(false, "rehost refused: {e:?}"),
            }
        }
        self.remap_host();
        Ok(())
    }
}
