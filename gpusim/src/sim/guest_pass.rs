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
//! Two cuts of the tries a pass makes, neither changing what it places
//! (a try that places nothing changes nothing, and its checks are pure):
//!
//! * **The pass stops once every active queue has failed since the last
//!   placement.** It went round every queue until a whole round placed
//!   nothing; the tries of that last round after the last placement
//!   repeated a try that had failed with nothing changed since, so they
//!   failed again.
//! * **A try counts the queues that want CUs only when it needs the
//!   count.** A queue with no saved or unstarted workgroup may move a
//!   round of its running batch to another queue's CU only below an
//!   equal split; the count behind that check visits every active
//!   queue's packet window. A try that finds the count made checks the
//!   split first (most queues hold theirs); one that does not first
//!   searches its own batches for a round to move (its own window only),
//!   and a queue without one needs no count.
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

/// The knowledge a guest placement pass keeps between its tries; forgotten
/// ([`GuestPass::changed`]) once a try places a guest.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GuestPass {
    /// The count of queues of the partition that want CUs (as the
    /// rebalance counts them), once a try needed it (handed on to the
    /// rebalance while it holds).
    pub(super) want: Option<WantCount>,
}

impl GuestPass {
    /// A try changed the partition: what was learnt no longer holds.
    pub(super) fn changed(&mut self) {
        *self = GuestPass::default();
    }
}
