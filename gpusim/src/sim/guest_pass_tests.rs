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

/// Five queues of short half-CU workgroups (the many-queue flood whose
/// guests cost a dispatch pass per workgroup end), one masked to CUs 4-11,
/// mapped 0-6 us apart, two kernels each; guest passes run as now or
/// (`rounds`) in whole rounds with the count first. Returns every event,
/// the co-resident workgroups, the guest tries and the counts of the
/// queues that want CUs.
fn shared_flood(rounds: bool) -> (Vec<crate::backend::GpuEvent>, u64, u64, u64) {
    use super::testkit::*;
    use super::*;
    use abi::kernel::KernelKind;
    let t = two_xcc_topo();
    let mut vm = TestVm::new(64 << 20);
    let mut qs: Vec<GuestQueue> = (0..5).map(|_| vm.queue(&t, 64, 5)).collect();
    for (i, q) in qs.iter_mut().enumerate() {
        let i32 = i as u32;
        vm.kernel_vgprs = [32, 64, 128, 32, 16][i];
        vm.kernel(
            q,
            KernelKind::Mark,
            120 + 37 * i32,
            64,
            2_100 + 350 * i as u64,
            i32,
            false,
        );
        vm.kernel(q, KernelKind::Mark, 64, 128, 3_300, 10 + i32, true);
    }
    let mut gpu = sim_no_floor(t, 1);
    gpu.guest_pass_rounds = rounds;
    let mut mask = CuMask::none(16);
    for cu in 4..12 {
        mask.insert(cu);
    }
    let mut ev = Vec::new();
    for (i, at) in [0u64, 1_500, 2_700, 4_100, 6_000].into_iter().enumerate() {
        let now = run_virtual(&mut gpu, 0, at, &mut ev).max(at);
        gpu.advance(now, &mut ev);
        let req = map_req(&vm, &qs[i], i as u32, i as u64);
        let m = (i == 2).then_some(&mask);
        gpu.map_with_cu_mask(now, req, m).unwrap();
    }
    run_virtual(&mut gpu, 6_000, u64::MAX, &mut ev);
    for q in &qs {
        vm.verify(q).unwrap();
    }
    assert_eq!(gpu.free_cus(0), 16);
    (
        ev,
        gpu.stats().coresident_wgs,
        gpu.guest_tries,
        gpu.want_counts.get(),
    )
}

/// The pass's cuts (`guest_pass`: it stops once every queue has failed
/// since the last placement; a try counts only when it needs the count)
/// place the same guests: every event and the co-resident count are
/// those of whole rounds with the count first, with fewer tries and
/// fewer counts (with the cuts disabled the two runs are the same run,
/// and the last two assertions fail).
#[test]
fn the_guest_pass_cuts_place_the_same_guests_with_fewer_tries_and_counts() {
    let (ev, shared, tries, counts) = shared_flood(false);
    let (ev_rounds, shared_rounds, tries_rounds, counts_rounds) = shared_flood(true);
    assert!(shared > 100, "{shared} co-resident workgroups");
    assert_eq!(shared, shared_rounds);
    assert_eq!(ev, ev_rounds);
    for tag in 0..5 {
        assert_eq!(
            super::testkit::completions(&ev, tag).len(),
            2,
            "queue {tag}"
        );
    }
    assert!(tries < tries_rounds, "tries {tries} vs {tries_rounds}");
    assert!(counts < counts_rounds, "counts {counts} vs {counts_rounds}");
}
