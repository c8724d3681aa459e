//! Tests of the host lanes (`sim/host_lanes.rs`): the CUs a guest search
//! visits are those a visit of every roomy lane did not skip (another
//! owner's, whose footprint leaves room, in the queue's mask), in the same
//! round-robin order.

use super::host_lanes::HostLanes;
use super::occupancy::Footprint;
use crate::backend::CuMask;

const SMALL: Footprint = Footprint {
    waves: 4,
    vgprs: 128,
    lds: 0,
};
const BIG_LDS: Footprint = Footprint {
    waves: 4,
    vgprs: 1024,
    lds: 50_732,
};

/// The CUs a search visits, in order.
fn visit(h: &HostLanes, owner: u32, fp: Footprint, mask: Option<&CuMask>, start: u32) -> Vec<u32> {
    let mut words = Vec::new();
    if !h.hosts_for(owner, fp, mask.map(|m| m.words()), &mut words) {
        return Vec::new();
    }
    h.iter_from(&words, start).collect()
}

/// The slow path: every roomy lane (`lanes`: CU -> (owner, footprint)) in
/// round-robin order from `start`, the skipped ones left out.
fn visit_all(
    lanes: &[Option<(u32, Footprint)>],
    owner: u32,
    fp: Footprint,
    mask: Option<&CuMask>,
    start: u32,
) -> Vec<u32> {
    let len = lanes.len() as u32;
    let s = if start < len { start } else { 0 };
    (s..len)
        .chain(0..s)
        .filter(|&c| {
            lanes[c as usize].is_some_and(|(o, f)| {
                o != owner && f.fits_with(fp) && mask.is_none_or(|m| m.contains(c))
            })
        })
        .collect()
}

#[test]
fn no_lanes_host_nothing() {
    let h = HostLanes::new(304);
    assert!(visit(&h, 1, SMALL, None, 0).is_empty());
    // Outside the partition: nothing, no panic.
    let mut h = HostLanes::new(8);
    h.insert(8, 1, SMALL);
    h.insert(u32::MAX, 1, SMALL);
    h.remove(8);
    h.remove(u32::MAX);
    assert_eq!(h.pair_of(8), None);
    assert!(visit(&h, 2, SMALL, None, 0).is_empty());
}

#[test]
fn a_queue_is_never_its_own_host() {
    let mut h = HostLanes::new(130);
    for cu in 0..130 {
        h.insert(cu, 1 + cu % 2, SMALL);
    }
    let got = visit(&h, 1, SMALL, None, 0);
    assert_eq!(got, (0..130).filter(|c| c % 2 == 1).collect::<Vec<_>>());
}

#[test]
fn lanes_that_cannot_pair_turn_a_guest_away() {
    // 600089's sat0: workgroups of 39 KB of LDS pair with none of their
    // own kind.
    let mut h = HostLanes::new(304);
    for cu in 0..304 {
        h.insert(cu, 1 + cu % 15, BIG_LDS);
    }
    assert!(visit(&h, 1, BIG_LDS, None, 0).is_empty());
    assert_eq!(visit(&h, 1, SMALL, None, 300).len(), 304 - 21);
}

#[test]
fn the_mask_keeps_the_search_inside_it() {
    let mut h = HostLanes::new(304);
    for cu in 0..304 {
        h.insert(cu, 2, SMALL);
    }
    let mut m = CuMask::none(304);
    for cu in (100..200).step_by(3) {
        m.insert(cu);
    }
    let got = visit(&h, 1, SMALL, Some(&m), 150);
    let want: Vec<u32> = (150..200)
        .chain(100..150)
        .filter(|c| m.contains(*c))
        .collect();
    assert_eq!(got, want);
    // A mask shorter than the partition: the CUs past it are outside.
    let short = CuMask::all(64);
    assert_eq!(
        visit(&h, 1, SMALL, Some(&short), 0),
        (0..64).collect::<Vec<_>>()
    );
}

#[test]
fn a_lane_that_left_is_not_visited_and_a_moved_lane_follows_its_pair() {
    let mut h = HostLanes::new(70);
    h.insert(3, 2, SMALL);
    h.insert(65, 2, SMALL);
    h.insert(66, 3, BIG_LDS);
    assert_eq!(h.pair_of(66), Some((3, BIG_LDS)));
    h.remove(65);
    h.remove(65); // twice: nothing
    assert_eq!(visit(&h, 1, SMALL, None, 0), vec![3, 66]);
    // The same CU noted again under another pair leaves its old one.
    h.insert(3, 3, BIG_LDS);
    assert_eq!(h.pair_of(3), Some((3, BIG_LDS)));
    assert_eq!(visit(&h, 3, SMALL, None, 0), Vec::<u32>::new());
    assert_eq!(visit(&h, 2, SMALL, None, 10), vec![66, 3]);
}

#[test]
fn the_search_agrees_with_a_visit_of_every_lane() {
    // Random notes and removals (pairs come and go, groups are reused)
    // against the slow path, for many queries, at partition sizes around
    // the word boundaries.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let fps = [
        SMALL,
        BIG_LDS,
        Footprint {
            waves: 16,
            vgprs: 4096,
            lds: 63_044,
        },
        Footprint {
            waves: 2,
            vgprs: 64,
            lds: 16_384,
        },
        Footprint {
            waves: 1,
            vgprs: 8,
            lds: 0,
        },
    ];
    for len in [1u32, 63, 64, 65, 130, 304] {
        let mut h = HostLanes::new(len);
        let mut lanes: Vec<Option<(u32, Footprint)>> = vec![None; len as usize];
        for step in 0..3000 {
            let cu = rnd(len as u64) as u32;
            if rnd(3) == 0 {
                h.remove(cu);
                lanes[cu as usize] = None;
            } else {
                let pair = (1 + rnd(6) as u32, fps[rnd(fps.len() as u64) as usize]);
                h.insert(cu, pair.0, pair.1);
                lanes[cu as usize] = Some(pair);
            }
            for cu in 0..len {
                assert_eq!(
                    h.pair_of(cu),
                    lanes[cu as usize],
                    "len {len} step {step} cu {cu}"
                );
            }
            let owner = 1 + rnd(6) as u32;
            let fp = fps[rnd(fps.len() as u64) as usize];
            let mask = (rnd(2) == 0).then(|| {
                let mut m = CuMask::none(len);
                for c in 0..len {
                    if rnd(3) != 0 {
                        m.insert(c);
                    }
                }
                m
            });
            let start = rnd(len as u64 + 2) as u32;
            assert_eq!(
                visit(&h, owner, fp, mask.as_ref(), start),
                visit_all(&lanes, owner, fp, mask.as_ref(), start),
                "len {len} step {step} owner {owner} start {start}"
            );
        }
    }
}
