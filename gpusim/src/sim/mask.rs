//! CU masks: the guest MQD's and the host's, their intersection, and
//! batches cut when a mask narrows.

use super::*;

impl SimGpu {
    /// Sets the host CU mask of a mapped slot ([`PhysGpu::set_cu_mask`]).
    pub(super) fn set_host_mask(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mask: &CuMask,
    ) -> Result<(), GpuError> {
        self.run_until(now);
        let cus = self.topo.cus_per_partition();
        let q = self
            .slots
            .get_mut(slot.0 as usize)
            .ok_or(GpuError::NoSuchSlot(slot))?
            .as_mut()
            .ok_or(GpuError::NotMapped(slot))?;
        let host = (mask.count() < cus || mask.len() < cus).then(|| mask.and(&CuMask::all(cus)));
        if q.host_mask == host {
            return Ok(());
        }
        q.host_mask = host;
        q.mask = effective_mask(q.guest_mask.as_ref(), q.host_mask.as_ref());
        self.stats.cu_mask_changes += 1;
        self.cut_batches_outside_mask(slot.0);
        let p = self.slot_part[slot.0 as usize];
        self.dispatch(p);
        Ok(())
    }

    /// The CUs a mapped slot's workgroups may launch on (`None`: not mapped).
    pub fn cu_mask(&self, slot: SlotId) -> Option<CuMask> {
        let q = self.slots.get(slot.0 as usize)?.as_ref()?;
        let all = CuMask::all(self.topo.cus_per_partition());
        Some(q.mask.clone().unwrap_or(all))
    }

    /// CUs (partition numbering) running a live workgroup of `slot`'s queue.
    pub fn running_cus(&self, slot: SlotId) -> Vec<u32> {
        let Some(Some(q)) = self.slots.get(slot.0 as usize) else {
            return Vec::new();
        };
        self.wgs
            .iter()
            .filter(|w| w.live && w.slot == slot.0 && w.qgen == q.gen)
            .map(|w| w.cu)
            .chain(
                self.slot_batches(slot.0, q.gen)
                    .into_iter()
                    .flat_map(|bi| self.batch_cus[bi as usize].iter().copied()),
            )
            .collect()
    }

    /// The queue in `slot` has a new mask: its batches holding a CU outside
    /// it stop at the end of their current round (as in `rebalance`); the
    /// round robin then hands their workgroups out again inside the mask.
    /// A batch that starts later (the rest of a cut batch, waiting for its
    /// predecessor's round end) gives all its workgroups and CUs back at
    /// once: kept, its first round would start after workgroups handed out
    /// now, and a save in between would find an unstarted workgroup below
    /// a running one (a saved wave past `next_wg`, refused on restore).
    pub(super) fn cut_batches_outside_mask(&mut self, slot: u32) {
        let now = self.now;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return;
        };
        let (qgen, mask) = (q.gen, q.mask.clone());
        let Some(mask) = mask else { return };
        let p = self.slot_part[slot as usize] as usize;
        for bi in self.slot_batches(slot, qgen) {
            if self.batch_cus[bi as usize]
                .iter()
                .all(|&cu| mask.contains(cu))
            {
                continue;
            }
            let b = self.batches[bi as usize];
            if now < b.start {
                let q = self.slots[slot as usize].as_mut().expect("slot");
                q.inflight -= b.held;
                if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                    a.next_wg = a.next_wg.min(b.first);
                    a.inflight -= b.held;
                    if a.batch == Some(bi) {
                        a.batch = None;
                    }
                }
                let freed = self.release_batch_cus(bi, b.held);
                self.parts[p].free_cus += freed;
                self.batches[bi as usize].live = false;
                self.free_batches.push(bi);
                continue;
            }
            let started = b.started_by(now);
            if started >= b.end {
                continue;
            }
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.next_wg = a.next_wg.min(started);
            }
            self.batches[bi as usize].cut_at(started);
            self.touch_batch(bi);
        }
        self.flush_batches();
    }
}

/// CUs a queue may launch on: guest mask ∩ host mask (`None`: all).
pub(super) fn effective_mask(guest: Option<&CuMask>, host: Option<&CuMask>) -> Option<CuMask> {
    match (guest, host) {
        (None, None) => None,
        (Some(m), None) | (None, Some(m)) => Some(m.clone()),
        (Some(a), Some(b)) => Some(a.and(b)),
    }
}
