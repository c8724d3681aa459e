//! Occupancy: how much of a CU one workgroup takes (docs/gpu-model.md,
//! "Occupancy").
//!
//! CDNA3 (gfx942, MI300) limits per CU, as LLVM's AMDGPU backend models them
//! for the `FeatureGFX90AInsts` family (`AMDGPUBaseInfo.cpp`:
//! `getEUsPerCU` = 4 SIMDs, `getMaxWavesPerEU` = 8 waves per SIMD,
//! `getTotalNumVGPRs` = 512 unified arch + accumulation VGPRs per SIMD lane,
//! `getVGPRAllocGranule` = 8) and ROCm's GPU specifications (64 KiB of LDS
//! per CU on MI300). A workgroup of `n` work-items is `ceil(n / 64)` waves.
//! The model sums waves, VGPRs and LDS over the CU (waves spread over its
//! SIMDs), not per SIMD.

/// SIMDs per CU.
pub const SIMDS_PER_CU: u32 = 4;
/// Wave slots per SIMD.
pub const WAVES_PER_SIMD: u32 = 8;
/// VGPRs per SIMD lane (arch + accumulation, unified).
pub const VGPRS_PER_SIMD: u32 = 512;
/// VGPR allocation granule.
pub const VGPR_GRANULE: u32 = 8;
/// LDS bytes per CU.
pub const LDS_BYTES_PER_CU: u32 = 64 * 1024;
/// Work-items per wave.
pub const WAVE_SIZE: u64 = 64;

/// A workgroup's share of one CU's resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Wave slots.
    pub waves: u32,
    /// VGPRs (per lane, summed over the waves).
    pub vgprs: u32,
    /// LDS bytes.
    pub lds: u32,
}

impl Footprint {
    /// A whole CU: every wave slot, VGPR and LDS byte.
    pub const WHOLE: Footprint = Footprint {
        waves: SIMDS_PER_CU * WAVES_PER_SIMD,
        vgprs: SIMDS_PER_CU * VGPRS_PER_SIMD,
        lds: LDS_BYTES_PER_CU,
    };

    /// Footprint of a workgroup of `items` work-items whose kernel uses
    /// `vgprs` VGPRs per work-item (0: not given, a whole CU) and `lds`
    /// bytes of group segment. A workgroup that cannot fit a CU at all is
    /// a whole CU (it runs alone, as before occupancy).
    pub fn of(items: u64, vgprs: u16, lds: u32) -> Footprint {
        if vgprs == 0 {
            return Footprint::WHOLE;
        }
        let waves = items.div_ceil(WAVE_SIZE).max(1);
        let per_wave = (vgprs as u32)
            .min(VGPRS_PER_SIMD)
            .div_ceil(VGPR_GRANULE)
            .saturating_mul(VGPR_GRANULE);
        let w = Footprint::WHOLE;
        if waves > w.waves as u64 || lds > w.lds {
            return w;
        }
        let waves = waves as u32;
        let f = Footprint {
            waves,
            vgprs: per_wave.saturating_mul(waves),
            lds,
        };
        if f.vgprs > w.vgprs {
            w
        } else {
            f
        }
    }

    /// Do `self` and `other` fit one CU together?
    pub fn fits_with(self, other: Footprint) -> bool {
        let w = Footprint::WHOLE;
        self.waves.saturating_add(other.waves) <= w.waves
            && self.vgprs.saturating_add(other.vgprs) <= w.vgprs
            && self.lds.saturating_add(other.lds) <= w.lds
    }

    /// CWSR state bytes of one such workgroup when a whole CU's is `whole`
    /// (`cwsr.wg_state_bytes`): the trap handler writes the waves' allocated
    /// VGPRs and the workgroup's LDS, so a workgroup saves its share of the
    /// CU (the largest of its wave, VGPR and LDS shares; a whole CU: all).
    pub fn state_bytes(self, whole: u64) -> u64 {
        let w = Footprint::WHOLE;
        let share = |x: u32, of: u32| whole.saturating_mul(x as u64).div_ceil(of as u64);
        share(self.waves, w.waves)
            .max(share(self.vgprs, w.vgprs))
            .max(share(self.lds, w.lds))
            .min(whole)
    }

    /// At most half a CU (two such workgroups always fit one CU).
    pub fn at_most_half(self) -> bool {
        self.fits_with(self)
    }
}

/// The kernel descriptor at guest address `addr` (`None`: unreadable or
/// malformed; the GPU reports it when it fetches the packet).
pub fn read_descriptor(
    mem: &dyn crate::mem::DmaMemory,
    addr: u64,
) -> Option<abi::kernel::KernelDescriptor> {
    let mut kd = [0u8; abi::kernel::KD_SIZE];
    mem.read(addr, &mut kd).ok()?;
    abi::kernel::KernelDescriptor::decode(&kd).ok()
}

/// Two workgroups sharing a CU progress at half their solo rate each
/// (processor sharing). A guest workgroup of solo cost `cost` launched
/// beside a host with `host_left` ns of solo work left: the host is delayed
/// by `min(cost, host_left)` (the shared time's half it lost), and the
/// guest takes `cost + that delay`. Returns (host delay, guest wall time).
pub fn share(cost: u64, host_left: u64) -> (u64, u64) {
    let d = cost.min(host_left);
    (d, cost.saturating_add(d))
}

/// Solo work a workgroup has left at `now` when it ends at `end` and
/// shares its CU until `shared_until` (at half rate): the guest of a CU, or
/// its owner delayed by that guest (both run at half rate over the same
/// window).
pub fn solo_left(now: u64, end: u64, shared_until: u64) -> u64 {
    if now >= shared_until {
        end.saturating_sub(now)
    } else {
        end.saturating_sub(shared_until)
            .saturating_add((shared_until - now).div_ceil(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn gfx942_limits() {
        assert_eq!(Footprint::WHOLE.waves, 32);
        // 256 work-items at 128 VGPRs: 4 waves, 512 of 2048 VGPRs.
        let f = Footprint::of(256, 128, 0);
        assert_eq!((f.waves, f.vgprs, f.lds), (4, 512, 0));
        assert!(f.at_most_half());
        // Granule of 8: 33 VGPRs count as 40.
        assert_eq!(Footprint::of(64, 33, 0).vgprs, 40);
        // 1024 work-items at 256 VGPRs: 16 waves x 256 = the whole file.
        let big = Footprint::of(1024, 256, 0);
        assert_eq!(big, Footprint::WHOLE);
        assert!(!big.fits_with(Footprint::of(64, 8, 0)));
        // 512 work-items at 128 VGPRs: 8 waves, 1024 VGPRs, half a CU.
        assert!(Footprint::of(512, 128, 0).at_most_half());
        assert!(!Footprint::of(512, 136, 0).at_most_half());
        // Not given: a whole CU; too much LDS: a whole CU.
        assert_eq!(Footprint::of(64, 0, 0), Footprint::WHOLE);
        assert_eq!(Footprint::of(64, 32, 70_000), Footprint::WHOLE);
        // LDS limits: two 40 KiB workgroups do not share a CU.
        let l = Footprint::of(64, 32, 40 * 1024);
        assert!(!l.fits_with(l));
    }

    #[test]
    fn a_workgroup_saves_its_share_of_the_cu() {
        let whole = 0x95000u64;
        assert_eq!(Footprint::WHOLE.state_bytes(whole), whole);
        // 4 waves x 128 VGPRs: a quarter of the VGPR file.
        assert_eq!(Footprint::of(256, 128, 0).state_bytes(whole), whole / 4);
        // LDS dominates: 32 KiB of 64.
        assert_eq!(
            Footprint::of(64, 8, 32 * 1024).state_bytes(whole),
            whole / 2
        );
    }

    #[test]
    fn sharing_splits_time() {
        // A 5 us guest beside a 10 ms host: 10 us, the host loses 5 us.
        assert_eq!(share(5_000, 10_000_000), (5_000, 10_000));
        // A long guest beside a host with 2 us left: the host is 2 us late.
        assert_eq!(share(1_000_000, 2_000), (2_000, 1_002_000));
        // Work left halfway through the shared part.
        assert_eq!(solo_left(5_000, 10_000, 10_000), 2_500);
        assert_eq!(solo_left(12_000, 20_000, 10_000), 8_000);
    }

    proptest! {
        /// Processor sharing conserves work: what the guest gets in its
        /// wall time is its cost, and the host loses exactly the CU time
        /// the guest received while they shared.
        #[test]
        fn sharing_conserves_cu_time(cost in 1u64..1_000_000, left in 0u64..2_000_000) {
            let (d, wall) = share(cost, left);
            // Shared part: 2d of wall time at half rate gives each d.
            prop_assert_eq!(wall, cost + d);
            prop_assert!(d <= left && d <= cost);
            prop_assert_eq!(solo_left(0, wall, 2 * d), cost);
        }
    }
}
