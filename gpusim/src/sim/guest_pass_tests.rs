//! [`LaneFootprints`] (the guest pass's summary of its lanes' owner
//! footprints) against a visit of every lane: a try it turns away finds no
//! host in the visit, and below its cap it turns away exactly those.

use super::guest_pass::{LaneFootprints, LANE_FOOTPRINTS_CAP, SMALLEST_GUEST};
use super::occupancy::Footprint;
use proptest::prelude::*;

/// Footprints from a small palette (repeats, pairs that fit and do not) or
/// anywhere up to a whole CU.
fn footprint() -> impl Strategy<Value = Footprint> {
    let w = Footprint::WHOLE;
    prop_oneof![
        (0usize..6).prop_map(|i| [
            Footprint {
                waves: 4,
                vgprs: 128,
                lds: 0
            },
            Footprint {
                waves: 4,
                vgprs: 1024,
                lds: 50_732
            },
            Footprint {
                waves: 16,
                vgprs: 4096,
                lds: 63_044
            },
            Footprint {
                waves: 2,
                vgprs: 64,
                lds: 16_384
            },
            Footprint::WHOLE,
            Footprint {
                waves: 1,
                vgprs: 8,
                lds: 0
            },
        ][i]),
        (0..=w.waves, 0..=w.vgprs, 0..=w.lds).prop_map(|(waves, vgprs, lds)| Footprint {
            waves,
            vgprs,
            lds
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn may_host_agrees_with_a_visit_of_the_lanes(
        lanes in prop::collection::vec(footprint(), 0..40),
        guest in footprint(),
    ) {
        let s = LaneFootprints::collect(lanes.iter().copied());
        let visit = lanes.iter().any(|h| h.fits_with(guest));
        // Never turns away a try the visit would host.
        if visit {
            prop_assert!(s.may_host(guest));
        }
        // Exact while the lanes run at most the cap's distinct footprints.
        let mut distinct = lanes.clone();
        distinct.sort_by_key(|f| (f.waves, f.vgprs, f.lds));
        distinct.dedup();
        if distinct.len() <= LANE_FOOTPRINTS_CAP {
            prop_assert_eq!(s.may_host(guest), visit);
        }
    }
}

#[test]
fn no_lanes_host_nothing() {
    let s = LaneFootprints::collect(std::iter::empty());
    assert!(!s.may_host(Footprint {
        waves: 1,
        vgprs: 8,
        lds: 0
    }));
}

#[test]
fn many_distinct_footprints_are_not_summarised() {
    // More distinct footprints than the cap, none of which leaves room for
    // the guest: the summary no longer answers (every try visits).
    let big = Footprint::WHOLE;
    let lanes = (0..=LANE_FOOTPRINTS_CAP as u32).map(|i| Footprint {
        waves: big.waves - i,
        ..big
    });
    let s = LaneFootprints::collect(lanes);
    assert!(s.may_host(big));
}

#[test]
fn lanes_that_cannot_pair_turn_a_guest_away() {
    // 300169's eq11: workgroups of 50,732 LDS bytes pair with none of their
    // own kind.
    let fp = Footprint {
        waves: 1,
        vgprs: 32,
        lds: 50_732,
    };
    let s = LaneFootprints::collect([fp; 30]);
    assert!(!s.may_host(fp));
    assert!(s.may_host(Footprint {
        waves: 1,
        vgprs: 32,
        lds: 1024
    }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The roomy-lane index keeps only lanes whose owner leaves room for
    /// [`SMALLEST_GUEST`]: sound only if every workgroup takes at least
    /// that, so a lane left out could host no guest.
    #[test]
    fn a_lane_without_room_for_the_smallest_guest_hosts_none(
        items in 0u64..4096,
        vgprs in 0u16..600,
        lds in 0u32..(80 * 1024),
        owner in footprint(),
    ) {
        let guest = Footprint::of(items, vgprs, lds);
        // (Its VGPRs and LDS are 0: no footprint has less.)
        prop_assert!(guest.waves >= SMALLEST_GUEST.waves);
        if !owner.fits_with(SMALLEST_GUEST) {
            prop_assert!(!owner.fits_with(guest));
        }
    }
}

#[test]
fn whole_cu_lanes_are_not_roomy() {
    assert!(!Footprint::WHOLE.fits_with(SMALLEST_GUEST));
    assert!(Footprint::of(64, 32, 0).fits_with(SMALLEST_GUEST));
}
