//! What one guest placement pass ([`SimGpu::place_guests`]) learns about
//! its partition once and reuses for every queue it tries, until a try
//! places a guest (the only thing in the pass that changes the partition).
//!
//! (The pass also kept the distinct owner footprints of the lanes, noted by
//! a try that visited every lane and found no host, to turn away later
//! tries that fit beside none of them. The host search now visits only the
//! lanes that may host it ([`super::host_lanes`]), so a try no lane may
//! host visits none: the summary is gone.)
//!
//! [`SimGpu::place_guests`]: super::SimGpu::place_guests

use super::occupancy::Footprint;
use super::want::WantCount;

/// No workgroup takes less of a CU: [`Footprint::of`] gives at least one
/// wave (a whole CU otherwise). A CU whose owner leaves no room for this
/// leaves none for any guest ([`Footprint::fits_with`] is monotone).
pub(super) const SMALLEST_GUEST: Footprint = Footprint {
    waves: 1,
    vgprs: 0,
    lds: 0,
};

/// The knowledge a guest placement pass keeps between its tries.
///
/// The count of the queues that want CUs is kept through the tries that
/// place a guest: a placement changes only the placing queue's own
/// packets, batches and `inflight` (the host's batch gets a later end,
/// which no queue's "wants CUs" reads), so only that queue's entry is
/// counted again ([`GuestPass::changed`], then
/// [`SimGpu::recount_want`](super::SimGpu::recount_want)).
#[derive(Clone, Debug, Default)]
pub(super) struct GuestPass {
    /// The count of queues of the partition that want CUs (as the
    /// rebalance counts them), once a try needed it (handed on to the
    /// rebalance).
    pub(super) want: Option<WantCount>,
    /// While `want` is counted: per active slot (`SimGpu::active_slots`,
    /// same index), the CUs the queue holds if it wants CUs, else
    /// [`NOT_WANTING`].
    pub(super) held: Vec<u32>,
    /// A try changed the partition since the trying queue's entry was
    /// counted.
    pub(super) dirty: bool,
}

/// [`GuestPass::held`]'s entry of a queue that does not want CUs.
pub(super) const NOT_WANTING: u32 = u32::MAX;

impl GuestPass {
    /// A pass that reuses `held`'s allocation.
    pub(super) fn with_scratch(mut held: Vec<u32>) -> Self {
        held.clear();
        GuestPass {
            want: None,
            held,
            dirty: false,
        }
    }

    /// A try changed the partition: the trying queue's entry of the count
    /// must be counted again before the next try.
    pub(super) fn changed(&mut self) {
        self.dirty = true;
    }
}

/// The count of the entries `held` (see [`GuestPass::held`]).
pub(super) fn count_held(held: &[u32]) -> WantCount {
    let mut c = WantCount {
        want: 0,
        min_held: u32::MAX,
    };
    for &h in held {
        if h != NOT_WANTING {
            c.want += 1;
            c.min_held = c.min_held.min(h);
        }
    }
    c
}
