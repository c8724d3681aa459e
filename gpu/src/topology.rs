//! GPU topology: the hardware part of the `[gpu]` section of the fleet TOML
//! (the backend choice, `[gpu.sim]` and `[gpu.guard]` belong to the VMM's
//! `GpuConfig`, the simulator and the mediation's guard).
//!
//! Defaults describe an MI300X (gfx9.4.2/9.4.3 family): 8 XCCs, 38 CUs per XCC
//! (304 CUs), SPX (one partition over all XCCs), MEC1 with 4 pipes x 8 queues per
//! XCC. **Reservation choice:** amdgpu's default `num_kcq = 8` kernel compute
//! queues are spread over the 4 MEC1 pipes, i.e. queues 0 and 1 of every pipe
//! (`reserved_queues_per_pipe = 2`); HIQ/KIQ live on other pipes/MECs. That leaves
//! 24 user HQDs per XCC (KFD reports 24..30 depending on `num_kcq`; set
//! `reserved_queues_per_pipe = 0` for 32, or 1 for 28).

use serde::Deserialize;

/// Compute partition mode: how the XCCs are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
pub enum PartitionMode {
    /// Single partition.
    #[default]
    #[serde(rename = "SPX")]
    Spx,
    /// Two partitions.
    #[serde(rename = "DPX")]
    Dpx,
    /// Four partitions.
    #[serde(rename = "QPX")]
    Qpx,
    /// Eight partitions (one per XCC on MI300X).
    #[serde(rename = "CPX")]
    Cpx,
}

impl PartitionMode {
    /// Number of partitions.
    pub fn partitions(self) -> u32 {
        match self {
            PartitionMode::Spx => 1,
            PartitionMode::Dpx => 2,
            PartitionMode::Qpx => 4,
            PartitionMode::Cpx => 8,
        }
    }
}

/// Modelled CWSR (compute wave save/restore) cost. No public measurement exists:
/// these are **model constants**, not measurements (see docs/gpu-model.md).
///
/// save_ns = `trap_ns` + live bytes / `save_bytes_per_us` x 1000, where live bytes
/// = control stack bytes + in-flight workgroups of the busiest XCC x
/// `wg_state_bytes` (XCCs save in parallel). Restore alike.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CwsrModel {
    /// Fixed cost to trap all waves and start the save (ns).
    pub trap_ns: u64,
    /// Save bandwidth per XCC (bytes per microsecond; 200_000 = 200 GB/s).
    pub save_bytes_per_us: u64,
    /// Fixed cost to start a restore (ns).
    pub restore_ns: u64,
    /// Restore bandwidth per XCC (bytes per microsecond).
    pub restore_bytes_per_us: u64,
    /// Live state of one in-flight workgroup (bytes); default one CU's
    /// VGPR+SGPR+LDS+HWREG = 0x95000 (kfd_queue.c).
    pub wg_state_bytes: u64,
}

impl Default for CwsrModel {
    fn default() -> Self {
        CwsrModel {
            trap_ns: 5_000,
            save_bytes_per_us: 200_000,
            restore_ns: 5_000,
            restore_bytes_per_us: 200_000,
            wg_state_bytes: abi::mqd::cwsr::CU_STATE_BYTES as u64,
        }
    }
}

/// Physical GPU topology and model constants.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuTopology {
    /// XCCs (compute dies). MI300X: 8.
    pub xccs: u32,
    /// Partition mode (`"SPX"`, `"DPX"`, `"QPX"`, `"CPX"`).
    pub partition_mode: PartitionMode,
    /// MEC1 pipes per XCC: 4.
    pub pipes_per_xcc: u32,
    /// Queues per pipe: 8.
    pub queues_per_pipe: u32,
    /// Queues at the start of each pipe reserved for kernel queues (KCQ/HIQ): 2.
    pub reserved_queues_per_pipe: u32,
    /// CUs per XCC: 38 (MI300X: 304 total).
    pub cus_per_xcc: u32,
    /// Shader engines per XCC (CWSR wave-count formula): 4.
    pub ses_per_xcc: u32,
    /// CWSR cost model.
    pub cwsr: CwsrModel,
}

impl Default for GpuTopology {
    fn default() -> Self {
        GpuTopology {
            xccs: 8,
            partition_mode: PartitionMode::Spx,
            pipes_per_xcc: 4,
            queues_per_pipe: 8,
            reserved_queues_per_pipe: 2,
            cus_per_xcc: 38,
            ses_per_xcc: 4,
            cwsr: CwsrModel::default(),
        }
    }
}

/// A topology field is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// Field must be non-zero.
    #[error("gpu.{0} must be greater than 0")]
    Zero(&'static str),
    /// Field too large.
    #[error("gpu.{field} = {value} exceeds the maximum {max}")]
    TooLarge {
        /// Field name.
        field: &'static str,
        /// Value given.
        value: u64,
        /// Maximum.
        max: u64,
    },
    /// XCCs do not split evenly into the partition mode.
    #[error("gpu.partition_mode {mode:?} needs xccs divisible by {parts}, got {xccs}")]
    PartitionMismatch {
        /// Mode.
        mode: PartitionMode,
        /// Partitions of the mode.
        parts: u32,
        /// XCCs.
        xccs: u32,
    },
    /// Reservations leave no user queue.
    #[error("gpu.reserved_queues_per_pipe = {reserved} leaves no user queue of {per_pipe}")]
    NoUserSlots {
        /// Reserved.
        reserved: u32,
        /// Queues per pipe.
        per_pipe: u32,
    },
    /// A backend's largest CWSR control record (the simulator's: header +
    /// one record per active packet + one per CU of the partition) does not
    /// fit the control stack the gfx9.4.x formula gives one XCC. Returned by
    /// the backend's own check of its settings against the topology
    /// (`gpusim::SimParams::validate`), not by [`GpuTopology::validate`].
    #[error(
        "gpu.{field}: the largest CWSR control record ({need} bytes = 32 + 32 x \
         sim.max_active_packets + 24 x CUs per partition) does not fit the \
         {have}-byte control stack of one XCC"
    )]
    ControlRecordTooLarge {
        /// Field to lower (`sim.max_active_packets`, or `xccs` when the CUs of
        /// the partition alone overflow the stack).
        field: &'static str,
        /// Largest record (bytes).
        need: u64,
        /// Control stack per XCC (bytes).
        have: u64,
    },
}

/// One user HQD slot. In a multi-XCC partition it stands for the same
/// (pipe, queue) on every XCC of the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HqdSlot {
    /// Partition index.
    pub partition: u32,
    /// MEC1 pipe.
    pub pipe: u32,
    /// Queue within the pipe.
    pub queue: u32,
}

impl GpuTopology {
    /// Check every field; errors name the field.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let nz = [
            ("xccs", self.xccs),
            ("pipes_per_xcc", self.pipes_per_xcc),
            ("queues_per_pipe", self.queues_per_pipe),
            ("cus_per_xcc", self.cus_per_xcc),
            ("ses_per_xcc", self.ses_per_xcc),
        ];
        for (f, v) in nz {
            if v == 0 {
                return Err(TopologyError::Zero(f));
            }
        }
        let max = [
            ("xccs", self.xccs as u64, 64),
            ("pipes_per_xcc", self.pipes_per_xcc as u64, 8),
            ("queues_per_pipe", self.queues_per_pipe as u64, 16),
            ("cus_per_xcc", self.cus_per_xcc as u64, 1024),
            ("ses_per_xcc", self.ses_per_xcc as u64, 64),
        ];
        for (field, value, max) in max {
            if value > max {
                return Err(TopologyError::TooLarge { field, value, max });
            }
        }
        if self.cwsr.save_bytes_per_us == 0 {
            return Err(TopologyError::Zero("cwsr.save_bytes_per_us"));
        }
        if self.cwsr.restore_bytes_per_us == 0 {
            return Err(TopologyError::Zero("cwsr.restore_bytes_per_us"));
        }
        let parts = self.partition_mode.partitions();
        if !self.xccs.is_multiple_of(parts) {
            return Err(TopologyError::PartitionMismatch {
                mode: self.partition_mode,
                parts,
                xccs: self.xccs,
            });
        }
        if self.reserved_queues_per_pipe >= self.queues_per_pipe {
            return Err(TopologyError::NoUserSlots {
                reserved: self.reserved_queues_per_pipe,
                per_pipe: self.queues_per_pipe,
            });
        }
        Ok(())
    }
    /// Number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partition_mode.partitions()
    }
    /// XCCs per partition.
    pub fn xccs_per_partition(&self) -> u32 {
        self.xccs / self.partitions()
    }
    /// CUs shared by the queues of one partition.
    pub fn cus_per_partition(&self) -> u32 {
        self.cus_per_xcc * self.xccs_per_partition()
    }
    /// User HQD slots per XCC.
    pub fn user_queues_per_xcc(&self) -> u32 {
        self.pipes_per_xcc * (self.queues_per_pipe - self.reserved_queues_per_pipe)
    }
    /// All user slots, partition-major then pipe then queue. `SlotId(i)` is index i.
    pub fn user_slots(&self) -> Vec<HqdSlot> {
        let mut v = Vec::new();
        for partition in 0..self.partitions() {
            for pipe in 0..self.pipes_per_xcc {
                for queue in self.reserved_queues_per_pipe..self.queues_per_pipe {
                    v.push(HqdSlot {
                        partition,
                        pipe,
                        queue,
                    });
                }
            }
        }
        v
    }
    /// Required CWSR save area per XCC (gfx9.4.x formula, bytes); same as
    /// [`GpuTopology::cwsr_size`].
    pub fn ctx_save_bytes_per_xcc(&self) -> u32 {
        self.cwsr_size()
    }
    /// Required control stack per XCC (bytes); same as
    /// [`GpuTopology::ctl_stack_size`].
    pub fn ctl_stack_bytes_per_xcc(&self) -> u32 {
        self.ctl_stack_size()
    }
    /// KFD's `ctl_stack_size` for one XCC of this topology
    /// ([`abi::mqd::cwsr::ctl_stack_size`]): the least `cp_hqd_cntl_stack_size`
    /// admitted. Exposed to guests by the `CTL_STACK_SIZE` register.
    pub fn ctl_stack_size(&self) -> u32 {
        abi::mqd::cwsr::ctl_stack_size(self.cus_per_xcc, self.ses_per_xcc)
    }
    /// KFD's `cwsr_size` for one XCC ([`abi::mqd::cwsr::cwsr_size`]): the least
    /// `cp_hqd_ctx_save_size` admitted. Exposed by the `CWSR_SIZE` register.
    pub fn cwsr_size(&self) -> u32 {
        abi::mqd::cwsr::cwsr_size(self.cus_per_xcc, self.ses_per_xcc)
    }
    /// KFD's `debug_memory_size` for one XCC
    /// ([`abi::mqd::cwsr::debug_memory_size`]). Exposed by the
    /// `DEBUG_MEMORY_SIZE` register.
    pub fn debug_memory_size(&self) -> u32 {
        abi::mqd::cwsr::debug_memory_size(self.cus_per_xcc, self.ses_per_xcc)
    }
    /// KFD's `eop_buffer_size` ([`abi::mqd::cwsr::eop_buffer_size`]). Exposed by
    /// the `EOP_BUFFER_SIZE` register.
    pub fn eop_buffer_size(&self) -> u32 {
        abi::mqd::cwsr::eop_buffer_size()
    }
    /// XCCs one queue runs on (those of its partition): the number of save and
    /// debug areas in its CWSR area. Exposed by the `NUM_XCC` register.
    pub fn num_xcc(&self) -> u32 {
        self.xccs_per_partition()
    }
    /// Bytes a queue's CWSR area spans when its MQD declares `ctx_save_size`
    /// per XCC: save areas of all [`GpuTopology::num_xcc`] XCCs, then their
    /// debug areas, page aligned ([`abi::mqd::cwsr::total_area_size`]).
    pub fn cwsr_area_bytes(&self, ctx_save_size: u32) -> u64 {
        abi::mqd::cwsr::total_area_size(ctx_save_size, self.debug_memory_size(), self.num_xcc())
    }
    /// Bytes of the smallest admitted CWSR area of one queue
    /// (`cwsr_area_bytes(cwsr_size())`).
    pub fn min_cwsr_area_bytes(&self) -> u64 {
        self.cwsr_area_bytes(self.cwsr_size())
    }
    /// A small topology for tests: 2 XCCs x 2 CUs, SPX, 1 pipe x 4 queues, none reserved.
    pub fn tiny() -> Self {
        GpuTopology {
            xccs: 2,
            pipes_per_xcc: 1,
            queues_per_pipe: 4,
            reserved_queues_per_pipe: 0,
            cus_per_xcc: 2,
            ses_per_xcc: 1,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mi300x_defaults() {
        let t = GpuTopology::default();
        t.validate().unwrap();
        assert_eq!(t.cus_per_xcc * t.xccs, 304);
        assert_eq!(t.user_queues_per_xcc(), 24);
        assert_eq!(t.user_slots().len(), 24);
        let cpx = GpuTopology {
            partition_mode: PartitionMode::Cpx,
            ..Default::default()
        };
        assert_eq!(cpx.user_slots().len(), 192);
        assert_eq!(cpx.cus_per_partition(), 38);
        assert_eq!(
            t.user_slots()[0],
            HqdSlot {
                partition: 0,
                pipe: 0,
                queue: 2
            }
        );
        // ~22 MiB per queue per XCC
        assert!(t.ctx_save_bytes_per_xcc() > 22 << 20);
    }

    #[test]
    fn toml_section() {
        let t: GpuTopology = toml::from_str(
            "xccs = 4\npartition_mode = \"DPX\"\ncus_per_xcc = 8\n[cwsr]\ntrap_ns = 1000\n",
        )
        .unwrap();
        assert_eq!(t.xccs, 4);
        assert_eq!(t.partition_mode, PartitionMode::Dpx);
        assert_eq!(t.cwsr.trap_ns, 1000);
        assert_eq!(t.cwsr.save_bytes_per_us, 200_000);
        t.validate().unwrap();
        assert!(toml::from_str::<GpuTopology>("xcc = 4").is_err());
        // The backend, simulator knobs and guard belong to other crates.
        assert!(toml::from_str::<GpuTopology>("backend = \"sim\"").is_err());
    }

    #[test]
    fn validation_names_fields() {
        let t = GpuTopology {
            xccs: 6,
            partition_mode: PartitionMode::Qpx,
            ..Default::default()
        };
        assert!(matches!(
            t.validate(),
            Err(TopologyError::PartitionMismatch { .. })
        ));
        let t = GpuTopology {
            cus_per_xcc: 0,
            ..Default::default()
        };
        assert_eq!(t.validate(), Err(TopologyError::Zero("cus_per_xcc")));
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("gpu.cus_per_xcc"));
        let t = GpuTopology {
            reserved_queues_per_pipe: 8,
            ..Default::default()
        };
        assert!(matches!(
            t.validate(),
            Err(TopologyError::NoUserSlots { .. })
        ));
        let t = GpuTopology::default();
        assert_eq!(t.ctl_stack_bytes_per_xcc(), 12288);
        assert_eq!(t.ctl_stack_size(), 12288);
        assert_eq!(t.cwsr_size(), 12288 + 38 * 0x95000);
        assert_eq!(t.debug_memory_size(), 1520 * 32);
        assert_eq!(t.eop_buffer_size(), 4096);
        assert_eq!(t.num_xcc(), 8);
        // 8 x (cwsr + debug), page aligned.
        let total = 8 * (t.cwsr_size() as u64 + 48640);
        assert_eq!(t.min_cwsr_area_bytes(), total.div_ceil(4096) * 4096);
        let t = GpuTopology {
            pipes_per_xcc: 9,
            ..Default::default()
        };
        assert!(matches!(
            t.validate(),
            Err(TopologyError::TooLarge {
                field: "pipes_per_xcc",
                ..
            })
        ));
    }
}
