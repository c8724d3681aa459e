//! Simulator knobs (`[gpu.sim]` of the fleet TOML) and the check that the
//! simulator's CWSR control records fit a topology's control stack.

use gpu::topology::{GpuTopology, TopologyError};
use serde::Deserialize;

/// Simulator-only knobs (ignored by real backends).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimParams {
    /// How often a command processor re-checks a blocked barrier packet (ns).
    pub barrier_poll_ns: u64,
    /// Packets a CP may have launched but not retired per queue (prefetch window).
    pub max_active_packets: u32,
    /// Random extra workgroup time, 0..=cost x permille / 1000 (seeded; 0 = none).
    /// Non-zero jitter turns workgroup batching off (each workgroup is an event).
    pub jitter_permille: u32,
    /// Modelled per-workgroup dispatch floor (ns): no workgroup takes less
    /// (wave launch and retire in the SPI/CP; *modelled*, no public
    /// measurement). A flood of tiny workgroups is then a long kernel.
    pub wg_floor_ns: u64,
}

impl Default for SimParams {
    fn default() -> Self {
        SimParams {
            barrier_poll_ns: 2_000,
            max_active_packets: 8,
            jitter_permille: 0,
            wg_floor_ns: 100,
        }
    }
}

/// Bytes of the simulator's CWSR control record for `packets` packet records
/// and `wgs` workgroup records (see `sim` and docs/gpu-model.md).
pub fn control_record_bytes(packets: u32, wgs: u32) -> u64 {
    32 + 32 * packets as u64 + 24 * wgs as u64
}

impl SimParams {
    /// Largest control record on `topo`: every active packet and one saved
    /// workgroup per CU of the partition. [`SimParams::validate`] requires it
    /// to fit the control stack.
    pub fn max_control_record_bytes(&self, topo: &GpuTopology) -> u64 {
        control_record_bytes(self.max_active_packets, topo.cus_per_partition())
    }

    /// Check every knob, and that the largest control record fits one
    /// XCC's control stack of `topo` (assumed valid: call
    /// [`GpuTopology::validate`] first). Errors name the field as
    /// `sim.<field>` (or `xccs` when the CUs of a partition alone overflow
    /// the stack).
    pub fn validate(&self, topo: &GpuTopology) -> Result<(), TopologyError> {
        let max = [
            (
                "sim.max_active_packets",
                self.max_active_packets as u64,
                1024,
            ),
            ("sim.jitter_permille", self.jitter_permille as u64, 1000),
            ("sim.wg_floor_ns", self.wg_floor_ns, 1 << 32),
        ];
        for (field, value, max) in max {
            if value > max {
                return Err(TopologyError::TooLarge { field, value, max });
            }
        }
        if self.barrier_poll_ns == 0 {
            return Err(TopologyError::Zero("sim.barrier_poll_ns"));
        }
        if self.max_active_packets == 0 {
            return Err(TopologyError::Zero("sim.max_active_packets"));
        }
        let need = self.max_control_record_bytes(topo);
        let have = topo.ctl_stack_bytes_per_xcc() as u64;
        if need > have {
            let one_packet = control_record_bytes(1, topo.cus_per_partition());
            let field = if one_packet <= have {
                "sim.max_active_packets"
            } else {
                "xccs"
            };
            return Err(TopologyError::ControlRecordTooLarge { field, need, have });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_section() {
        let p: SimParams = toml::from_str("jitter_permille = 3\n").unwrap();
        assert_eq!(p.jitter_permille, 3);
        assert_eq!(p.max_active_packets, 8);
        assert!(toml::from_str::<SimParams>("jitter = 3").is_err());
    }

    #[test]
    fn validation_names_fields() {
        let t = GpuTopology::default();
        // MI300X SPX: 32 + 32*8 + 24*304 = 7584 bytes fit the 12 KiB stack.
        assert_eq!(SimParams::default().max_control_record_bytes(&t), 7584);
        SimParams::default().validate(&t).unwrap();
        // 32 + 32*155 + 24*304 = 12288 fits exactly; 156 packets do not.
        let mut p = SimParams {
            max_active_packets: 155,
            ..Default::default()
        };
        p.validate(&t).unwrap();
        p.max_active_packets = 156;
        assert_eq!(
            p.validate(&t),
            Err(TopologyError::ControlRecordTooLarge {
                field: "sim.max_active_packets",
                need: 12320,
                have: 12288
            })
        );
        assert!(p.validate(&t).unwrap_err().to_string().starts_with(
            "gpu.sim.max_active_packets: the largest CWSR control record (12320 bytes"
        ));
        // 64 XCCs in SPX: the CUs alone overflow XCC 0's stack.
        let t64 = GpuTopology {
            xccs: 64,
            ..Default::default()
        };
        assert!(matches!(
            SimParams::default().validate(&t64),
            Err(TopologyError::ControlRecordTooLarge { field: "xccs", .. })
        ));
        let p = SimParams {
            jitter_permille: 1001,
            ..Default::default()
        };
        assert_eq!(
            p.validate(&t),
            Err(TopologyError::TooLarge {
                field: "sim.jitter_permille",
                value: 1001,
                max: 1000
            })
        );
        let p = SimParams {
            barrier_poll_ns: 0,
            ..Default::default()
        };
        assert_eq!(
            p.validate(&t),
            Err(TopologyError::Zero("sim.barrier_poll_ns"))
        );
    }
}
