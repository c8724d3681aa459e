//! A dispatch pass's free CUs handed to batches that have not started,
//! without the per-CU look-ups of [`SimGpu::start_one`].
//!
//! A many-queue tenant of short workgroups (a workgroup flood) keeps, per
//! queue, a batch waiting for the end of its current round: a CU given to
//! the queue then only grows that batch by one (`start_batched`'s grow:
//! `width` and `held` + 1). The round robin of a pass gives such a queue
//! one CU per turn, and each turn used to walk the queue's packet window
//! three times (`can_take_cu`, `start_one`, `start_batched`) to reach the
//! same batch: half of the simulator's instructions on a flood of 556 ns
//! workgroups, at a pass per batch end.
//!
//! A pass notes, on a queue's first turn, the batch a CU would grow
//! ([`PendingGrow`]); later turns grow it directly. The note holds for
//! the whole pass while the batch has room: within a pass `now` is
//! fixed and the round robin's starts only take free CUs and change the
//! starting queue's own packets and batches, so another queue's first
//! dispatchable packet, its batch and the batch's growth form stay as
//! noted, and a turn takes the same CU as before (the first free one in
//! the queue's mask). Growing keeps the form (`now <= start`,
//! `held == width`) until `width` reaches the batch's length, the note's
//! `room`; a queue whose note runs out takes the general path again.
//! Debug builds check every noted turn against a fresh look-up.

use super::*;

/// What a free CU given to a queue now would do, when that is growing a
/// batch that has not started: the packet, the batch, and how many more
/// CUs the batch can take before every workgroup of its first round has
/// one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PendingGrow {
    /// Index of the packet in the queue's window (`Hqd::active`).
    pub(super) packet: usize,
    /// The batch (`SimGpu::batches`).
    pub(super) batch: u32,
    /// CUs the batch can still take: its length minus its width.
    pub(super) room: u64,
    /// The packet's workgroup footprint (the CU's owner footprint).
    pub(super) fp: Footprint,
}

impl SimGpu {
    /// The batch a free CU given to `slot`'s queue now would grow, if
    /// [`Self::start_one`] would grow one that has not started: no jitter,
    /// the queue active with no saved workgroup to resume, its first
    /// dispatchable packet a dispatch with a save point, and that
    /// packet's batch joinable before its start with every CU it holds
    /// in its width. `None` otherwise (the general path decides).
    pub(super) fn pending_grow(&self, slot: u32) -> Option<PendingGrow> {
        let q = self.slots.get(slot as usize)?.as_ref()?;
        if q.state != HState::Active {
            return None;
        }
        let Some(Some(packet)) = self.dispatchable(q) else {
            return None;
        };
        self.grow_of(q, packet)
    }

    /// [`Self::pending_grow`] once the queue `q` is known active with
    /// `packet` its first dispatchable packet.
    pub(super) fn grow_of(&self, q: &Hqd, packet: usize) -> Option<PendingGrow> {
        if self.params.jitter_permille != 0 {
            return None;
        }
        #[cfg(test)]
        if self.grow_notes_off {
            return None;
        }
        let a = q.active.get(packet)?;
        let Work::Dispatch(d) = a.work else {
            return None;
        };
        if !d.desc.preemptible() {
            return None;
        }
        let batch = a.batch?;
        let b = self.batches.get(batch as usize)?;
        if !b.live || self.now > b.start || b.held != b.width {
            return None;
        }
        let room = b.len().checked_sub(b.width as u64)?;
        (room > 0).then_some(PendingGrow {
            packet,
            batch,
            room,
            fp: d.fp,
        })
    }

    /// The free CU of partition `pi` a workgroup of `slot`'s queue would
    /// take: the first in its mask, or the first free one without a mask.
    pub(super) fn free_cu_for(&self, pi: usize, slot: u32) -> Option<u32> {
        let free = &self.parts[pi].free_mask;
        match self.slots.get(slot as usize)?.as_ref()?.mask.as_ref() {
            Some(m) => m.first_in(free),
            None => free.first_in(free),
        }
    }

    /// Gives the free CU `cu` of partition `pi` to `slot`'s queue to grow
    /// the batch of `g`, as [`Self::start_batched`] grows a batch that has
    /// not started: the CU is the owner's, the batch's width and hold and
    /// the packet's and queue's in-flight counts go up by one, the batch
    /// is re-armed at the pass's end, and the CU joins its list. Returns
    /// `g` with one less room.
    pub(super) fn grow_pending(
        &mut self,
        pi: usize,
        slot: u32,
        cu: u32,
        g: PendingGrow,
    ) -> PendingGrow {
        debug_assert_eq!(
            self.pending_grow(slot),
            Some(g),
            "slot {slot}: a noted pending grow is out of date"
        );
        debug_assert_eq!(self.free_cu_for(pi, slot), Some(cu));
        #[cfg(test)]
        {
            self.grows_taken += 1;
        }
        self.take_free_cu(pi, slot, cu, g.fp);
        let b = &mut self.batches[g.batch as usize];
        b.width += 1;
        b.held += 1;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        q.active[g.packet].inflight += 1;
        q.inflight += 1;
        self.parts[pi].free_cus -= 1;
        self.touch_batch(g.batch);
        let list = &mut self.batch_cus[g.batch as usize];
        self.parts[pi].cu_batch.note(cu, g.batch, list.len());
        list.push(cu);
        PendingGrow {
            room: g.room - 1,
            ..g
        }
    }
}
