//! A VM's observed re-ring gaps (idle to busy again), as a decayed
//! histogram over power-of-two buckets, and the cost-aware hold it gives:
//! how long a slice owner whose queues drained keeps the partition idle
//! rather than hand it to lower work that a CWSR save must displace again
//! at its next doorbell (docs/scheduling.md, "Cost-aware hold").

use crate::Nanos;

/// Buckets: bucket `b` holds gaps in `[2^b, 2^(b+1))` us (bucket 0 also
/// the gaps under 1 us); the last one everything from 2^23 us (8.4 s) on.
const BUCKETS: usize = 24;

/// Weight of one observation; older ones decay by 1/32 per new gap, so the
/// histogram follows about the last 32 gaps.
const ONE: u32 = 1 << 12;

/// Decayed histogram of a VM's re-ring gaps.
#[derive(Clone, Debug, Default)]
pub(super) struct GapHist {
    w: [u32; BUCKETS],
}

/// Lower edge of bucket `b`, ns.
fn lo_ns(b: usize) -> Nanos {
    if b == 0 {
        0
    } else {
        (1u64 << b) * 1_000
    }
}

/// Upper edge of bucket `b`, ns.
fn hi_ns(b: usize) -> Nanos {
    (1u64 << (b + 1)) * 1_000
}

impl GapHist {
    /// Records one gap.
    pub(super) fn note(&mut self, gap: Nanos) {
        for w in &mut self.w {
            *w -= *w >> 5;
        }
        let us = gap / 1_000;
        let b = if us == 0 {
            0
        } else {
            (63 - us.leading_zeros() as usize).min(BUCKETS - 1)
        };
        self.w[b] = self.w[b].saturating_add(ONE);
    }

    /// How long to hold the partition idle after a drain, given `c`, the
    /// idle time a switch is worth (a multiple of a CWSR save and restore).
    /// Releasing at `e` costs `c` if the gap is longer than `e` (the owner's
    /// next doorbell saves the work that took the partition) and wastes
    /// `min(gap, e)` of idle GPU; the hold is the `e` among 0 and the
    /// buckets' upper edges that minimises the expected cost
    /// `E[min(G, e)] + P(G > e) x c` over the gaps seen (each at its
    /// bucket's midpoint; ties go to the shorter hold). 0 when nothing is
    /// known or `c` is 0. Never longer than the upper edge of the longest
    /// gap's bucket (at most twice the longest gap seen).
    pub(super) fn hold_ns(&self, c: Nanos) -> Nanos {
        if c == 0 {
            return 0;
        }
        let total: u128 = self.w.iter().map(|&w| u128::from(w)).sum();
        if total == 0 {
            return 0;
        }
        // Release at 0: every gap costs a switch.
        let mut best = (total * u128::from(c), 0);
        // Mass and midpoint sum of the buckets below the candidate edge.
        let (mut below, mut below_sum) = (0u128, 0u128);
        for b in 0..BUCKETS {
            let w = u128::from(self.w[b]);
            if w == 0 {
                continue;
            }
            below += w;
            below_sum += w * u128::from((lo_ns(b) + hi_ns(b)) / 2);
            let e = hi_ns(b);
            let cost = below_sum + (total - below) * u128::from(e.saturating_add(c));
            if cost < best.0 {
                best = (cost, e);
            }
        }
        best.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(gaps: &[Nanos]) -> GapHist {
        let mut h = GapHist::default();
        for &g in gaps {
            h.note(g);
        }
        h
    }

    /// A fixed gap shorter than the switch cost is held through (until the
    /// upper edge of its bucket); one longer is not held at all.
    #[test]
    fn fixed_gaps() {
        let h = hist(&[200_000; 40]);
        assert_eq!(h.hold_ns(2_400_000), 256_000);
        let h = hist(&[1_000_000; 40]);
        assert_eq!(h.hold_ns(2_400_000), 1_024_000);
        let h = hist(&[10_000_000; 40]);
        assert_eq!(h.hold_ns(2_400_000), 0);
    }

    /// Exponential gaps (memoryless) of a mean well below the switch cost
    /// are held through the longest ones seen; a mean above it is not.
    #[test]
    fn exponential_gaps() {
        let mean = 50_000f64;
        let gaps: Vec<Nanos> = (1..200)
            .map(|i| (-(1.0 - i as f64 / 200.0).ln() * mean) as Nanos)
            .collect();
        let h = hist(&gaps);
        let hold = h.hold_ns(2_400_000);
        assert!((200_000..=1_100_000).contains(&hold), "{hold}");
        let gaps: Vec<Nanos> = gaps.iter().map(|g| g * 100).collect();
        assert_eq!(hist(&gaps).hold_ns(2_400_000), 0);
    }

    /// Bimodal: mostly short gaps with some long ones; the hold covers the
    /// short mode and ends where only long gaps are left (the partition
    /// is given away at once in none of the short gaps, and held through
    /// none of the long ones).
    #[test]
    fn bimodal_gaps() {
        let mut gaps = vec![30_000; 30];
        gaps.extend([20_000_000; 4]);
        assert_eq!(hist(&gaps).hold_ns(2_400_000), 32_000);
        // Long gaps that are cheap to hold through: held.
        let mut gaps = vec![30_000; 30];
        gaps.extend([1_500_000; 4]);
        assert_eq!(hist(&gaps).hold_ns(2_400_000), 2_048_000);
    }

    /// Nothing known, or no cost: no hold.
    #[test]
    fn nothing_known() {
        assert_eq!(GapHist::default().hold_ns(1_000_000), 0);
        assert_eq!(hist(&[5_000]).hold_ns(0), 0);
    }
}
