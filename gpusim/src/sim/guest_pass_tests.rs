//! The roomy-lane index's premise: a lane whose owner leaves no room for
//! [`SMALLEST_GUEST`] hosts no guest.

use super::guest_pass::SMALLEST_GUEST;
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
