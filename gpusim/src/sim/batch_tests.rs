//! `Batch::all_started` (the rebalance's and the join test's one-division
//! form) against its definition, `started_by(now) >= end`, over every small
//! batch shape, guests' delay and instant.

use super::*;

fn batch(first: u64, end: u64, width: u32, start: Nanos, cost: Nanos, shifted: Nanos) -> Batch {
    Batch {
        slot: 0,
        qgen: 0,
        id: 0,
        first,
        end,
        width,
        held: width,
        start,
        cost,
        gen: 0,
        live: true,
        armed: true,
        shifted,
    }
}

#[test]
fn all_started_is_started_by_at_end() {
    let mut checked = 0u32;
    for first in [0u64, 3] {
        for len in 0..=9u64 {
            for width in 0..=4u32 {
                for cost in [0u64, 1, 3, 7] {
                    for shifted in [0u64, 1, 5, 40] {
                        let start = 10;
                        let b = batch(first, first + len, width, start, cost, shifted);
                        for now in 0..=(start + 12 * cost.max(1) + shifted + 2) {
                            assert_eq!(
                                b.all_started(now),
                                b.started_by(now) >= b.end,
                                "first {first} len {len} width {width} cost {cost} \
                                 shifted {shifted} now {now}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000);
}

#[test]
fn all_started_at_the_extremes() {
    // Products that overflow fall back to the definition.
    for (now, cost, width) in [
        (u64::MAX, 1, u32::MAX),
        (u64::MAX - 1, 2, 3),
        (1 << 40, 1, u32::MAX),
    ] {
        let b = batch(0, u64::MAX / 2, width, 0, cost, u64::MAX / 4);
        assert_eq!(b.all_started(now), b.started_by(now) >= b.end);
    }
    // A batch in its last round has started everything; one before it
    // has not.
    let b = batch(0, 10, 4, 100, 50, 0);
    assert!(!b.all_started(100 + 99));
    assert!(b.all_started(100 + 100));
}
