//! Which batch holds a CU: a per-CU index into the batches' CU lists
//! (`SimGpu::batch_cus`), for the guest search.
//!
//! A guest search ([`SimGpu::try_guest`]) that found a roomy lane looked
//! for the owner's batch on it by visiting every batch index and scanning
//! each live batch's CU list: at every workgroup end of a many-queue
//! tenant whose workgroups pair (a pass per end, a search per queue),
//! most of the simulator's host time. A batch's CU list only grows at its
//! end (a CU given to it) and shrinks from its end (CUs given back), and a
//! reused batch index starts an empty list; so a CU's entry, written when
//! the CU is pushed, names the list and position where it sits for as
//! long as it sits there. A reader checks that the entry still holds the
//! CU ([`CuBatchIndex::holder`]); an entry left behind by a pop or a
//! reuse fails that check.
//!
//! A CU sits in at most one live batch's list (it is taken free, pushed
//! once, and freed only by the pop that removes it, or with every batch
//! of its queue when the queue fails or is saved), so the live batch the
//! index names is the one the scan of every batch index found first.
//! Debug builds check every look-up against that scan.
//!
//! [`SimGpu::try_guest`]: super::SimGpu::try_guest

/// Per CU of a partition: the batch index + 1 whose CU list it was last
/// pushed to (0: never) and its position in that list.
#[derive(Clone, Debug, Default)]
pub(super) struct CuBatchIndex {
    entries: Vec<(u32, u32)>,
}

impl CuBatchIndex {
    /// An index over `cus` CUs, none in a batch.
    pub(super) fn new(cus: u32) -> Self {
        CuBatchIndex {
            entries: vec![(0, 0); cus as usize],
        }
    }

    /// `cu` was pushed to batch `batch`'s CU list at position `pos`.
    /// A CU outside the partition or an index past `u32::MAX - 1` is not
    /// noted (the look-up then finds nothing; neither occurs).
    pub(super) fn note(&mut self, cu: u32, batch: u32, pos: usize) {
        let (Some(b1), Ok(pos)) = (batch.checked_add(1), u32::try_from(pos)) else {
            return;
        };
        if let Some(e) = self.entries.get_mut(cu as usize) {
            *e = (b1, pos);
        }
    }

    /// The batch whose CU list holds `cu` now, given the lists
    /// (`lists[b]`: batch `b`'s CUs), if the entry last noted for `cu`
    /// still names it; `None` otherwise. The caller checks the batch is
    /// live and whose it is.
    pub(super) fn holder(&self, cu: u32, lists: &[Vec<u32>]) -> Option<usize> {
        let &(b1, pos) = self.entries.get(cu as usize)?;
        let b = b1.checked_sub(1)? as usize;
        (lists.get(b)?.get(pos as usize) == Some(&cu)).then_some(b)
    }
}
