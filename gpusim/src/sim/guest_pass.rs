//! What one guest placement pass ([`SimGpu::place_guests`]) learns about
//! its partition once and reuses for every queue it tries, until a try
//! places a guest (the only thing in the pass that changes the partition).
//!
//! A pass tries every slot of the partition, and each try looked for a
//! host CU by visiting every guest lane (a CU with an owner and no guest)
//! and testing the owner's footprint against its own. On a tenant of many
//! queues whose workgroups cannot pair (large LDS or VGPR footprints) run
//! alone, every try visited every lane and found none, at every workgroup
//! end: most of the simulator's host time. The lanes' owners run few
//! distinct footprints (one per kernel running), so the first try that visits
//! every lane without finding a host notes them on its way, and a later
//! try whose workgroup fits beside none of them fails at once, without the
//! visit. (Collecting them up front instead cost more than it saved where
//! guests do pair: there a visit finds a host after a few lanes.) The visit itself is unchanged, so a try places the
//! same guest on the same CU as before.
//!
//! [`SimGpu::place_guests`]: super::SimGpu::place_guests

use super::occupancy::Footprint;

/// No workgroup takes less of a CU: [`Footprint::of`] gives at least one
/// wave (a whole CU otherwise). A CU whose owner leaves no room for this
/// leaves none for any guest ([`Footprint::fits_with`] is monotone).
pub(super) const SMALLEST_GUEST: Footprint = Footprint {
    waves: 1,
    vgprs: 0,
    lds: 0,
};

/// At most this many distinct footprints are kept; a partition whose lanes
/// run more is not summarised (every try visits the lanes, as before).
pub(super) const LANE_FOOTPRINTS_CAP: usize = 8;

/// The distinct footprints of the owners' workgroups on a partition's guest
/// lanes, or `None` if there are more than [`LANE_FOOTPRINTS_CAP`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LaneFootprints {
    fps: [Footprint; LANE_FOOTPRINTS_CAP],
    len: usize,
    overflow: bool,
}

impl LaneFootprints {
    /// No lanes yet.
    pub(super) fn new() -> Self {
        LaneFootprints {
            fps: [Footprint::WHOLE; LANE_FOOTPRINTS_CAP],
            len: 0,
            overflow: false,
        }
    }

    /// Adds the owner footprint of one more lane.
    pub(super) fn add(&mut self, fp: Footprint) {
        // Neighbouring lanes mostly run the same kernel.
        if self.overflow || (self.len > 0 && self.fps[self.len - 1] == fp) {
            return;
        }
        if self.fps[..self.len].contains(&fp) {
            return;
        }
        if self.len == LANE_FOOTPRINTS_CAP {
            self.overflow = true;
            return;
        }
        self.fps[self.len] = fp;
        self.len += 1;
    }

    /// Summarises the owner footprints `fps` (one per lane, any order,
    /// repeats allowed).
    #[cfg(test)]
    pub(super) fn collect(fps: impl IntoIterator<Item = Footprint>) -> Self {
        let mut s = Self::new();
        for fp in fps {
            s.add(fp);
        }
        s
    }

    /// May a workgroup of footprint `fp` fit beside the owner of some lane
    /// ([`Footprint::fits_with`])? `false` only if it fits beside none of
    /// them (then a visit of the lanes finds no host); exact unless the
    /// lanes ran more than [`LANE_FOOTPRINTS_CAP`] distinct footprints.
    pub(super) fn may_host(&self, fp: Footprint) -> bool {
        self.overflow || self.fps[..self.len].iter().any(|h| h.fits_with(fp))
    }
}

/// The knowledge a guest placement pass keeps between its tries; forgotten
/// ([`GuestPass::changed`]) once a try places a guest.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GuestPass {
    /// The count of queues of the partition that want CUs (as the
    /// rebalance counts them), once a try needed it.
    pub(super) want: Option<u32>,
    /// The footprints of the partition's roomy guest lanes, once a try
    /// visited every one of them and found no host.
    pub(super) lanes: Option<LaneFootprints>,
}

impl GuestPass {
    /// A try changed the partition: what was learnt no longer holds.
    pub(super) fn changed(&mut self) {
        *self = GuestPass::default();
    }
}
