//! Scheduling policies as tables of behaviours (docs/scheduling.md,
//! "Baselines"): each [`Policy`] names one fixed [`PolicyOps`], and the
//! engine reads the table's entries instead of matching on the policy, as
//! amdkfd's device queue manager picks its operations once per scheduling
//! policy. Adding a policy is adding a row.

use serde::Deserialize;

use crate::DequeueMode;

/// Scheduling policy. `Hqdmux` is the product; the others are baselines
/// (docs/scheduling.md, design.md §5) run by the same engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Priority levels, CWSR preemption at once, weighted time slices among
    /// equals, aging.
    Hqdmux,
    /// HWS-like: no priorities, busy queues co-run, round robin with CWSR when
    /// there are more busy queues than slots.
    Fifo,
    /// The seed design: queues are mapped when slots are free; priority
    /// inversions are found and fixed (CWSR) by a poll every `poll_ns`.
    Poll5ms,
    /// vGPU-like: exclusive fixed equal slices, round robin over busy VMs,
    /// priorities and weights ignored.
    Timeslice,
    /// REEF-like: as `Hqdmux`, but preemption kills in-flight waves
    /// (RESET_WAVES) and the interrupted kernels are re-run.
    Reset,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 5] = [
        Policy::Hqdmux,
        Policy::Fifo,
        Policy::Poll5ms,
        Policy::Timeslice,
        Policy::Reset,
    ];

    /// Name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Hqdmux => "hqdmux",
            Policy::Fifo => "fifo",
            Policy::Poll5ms => "poll5ms",
            Policy::Timeslice => "timeslice",
            Policy::Reset => "reset",
        }
    }

    /// Parses a policy name.
    pub fn from_name(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Does the policy order queues by priority?
    pub fn uses_priority(self) -> bool {
        self.ops().by_priority
    }
}

impl Policy {
    /// The policy's behaviours (a static row; cheap to call per event).
    pub const fn ops(self) -> &'static PolicyOps {
        match self {
            Policy::Hqdmux => &HQDMUX,
            Policy::Fifo => &FIFO,
            Policy::Poll5ms => &POLL5MS,
            Policy::Timeslice => &TIMESLICE,
            Policy::Reset => &RESET,
        }
    }
}

/// How a partition's queues are given its slots at a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// By priority level, preempting lower work at once: weighted
    /// exclusive slices among equals when the configuration asks for
    /// slices, else every busy queue of the top levels shares the slots.
    Priority,
    /// Exclusive equal slices, round robin over busy VMs, whatever their
    /// priority.
    Timeslice,
    /// Queues are mapped when slots are free; priority inversions are
    /// fixed only at each poll (`SchedConfig::poll_ns`).
    PollFix,
    /// Busy queues co-run; when there are more than slots, each gets a
    /// queue slice in turn (HWS-like round robin).
    RoundRobin,
}

/// Slice length of a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantumRule {
    /// The level's own quantum (`SchedConfig::quantum_ns`).
    PerLevel,
    /// One baseline quantum for every level (`baseline_quantum_ns`).
    Baseline,
}

/// What a policy does: one row per [`Policy`], chosen once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOps {
    /// Queues are ordered by their VM's priority (then queue priority);
    /// starved levels are aged, and a drained owner may hold its
    /// partition (anticipation, cost-aware hold).
    pub by_priority: bool,
    /// How a decision gives out slots.
    pub decision: Decision,
    /// Slice length per level.
    pub quantum: QuantumRule,
    /// How preempted queues leave their slots.
    pub preempt: DequeueMode,
    /// VM weights scale virtual time (else every VM counts as weight 1).
    pub weighted: bool,
    /// CU reservations and co-residence for a higher VM beside lower work.
    pub spatial: bool,
    /// A doorbell of an unmapped queue may be planned outside a full
    /// decision (the doorbell fast path).
    pub fast_path: bool,
}

const HQDMUX: PolicyOps = PolicyOps {
    by_priority: true,
    decision: Decision::Priority,
    quantum: QuantumRule::PerLevel,
    preempt: DequeueMode::SaveWaves,
    weighted: true,
    spatial: true,
    fast_path: true,
};

const RESET: PolicyOps = PolicyOps {
    preempt: DequeueMode::ResetWaves,
    spatial: false,
    ..HQDMUX
};

const POLL5MS: PolicyOps = PolicyOps {
    decision: Decision::PollFix,
    spatial: false,
    fast_path: false,
    ..HQDMUX
};

const TIMESLICE: PolicyOps = PolicyOps {
    by_priority: false,
    decision: Decision::Timeslice,
    quantum: QuantumRule::Baseline,
    preempt: DequeueMode::SaveWaves,
    weighted: false,
    spatial: false,
    fast_path: false,
};

const FIFO: PolicyOps = PolicyOps {
    decision: Decision::RoundRobin,
    weighted: true,
    ..TIMESLICE
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows say what the policies' documentation says of them.
    #[test]
    fn each_policy_row_matches_its_description() {
        for p in Policy::ALL {
            let o = p.ops();
            let priority = matches!(p, Policy::Hqdmux | Policy::Poll5ms | Policy::Reset);
            assert_eq!(o.by_priority, priority, "{p:?}");
            // Only the product shares CUs spatially.
            assert_eq!(o.spatial, p == Policy::Hqdmux, "{p:?}");
            // Only REEF-like preemption kills waves.
            assert_eq!(
                o.preempt == DequeueMode::ResetWaves,
                p == Policy::Reset,
                "{p:?}"
            );
            // Weights are ignored only by the vGPU-like equal slices.
            assert_eq!(!o.weighted, p == Policy::Timeslice, "{p:?}");
            assert_eq!(o.quantum == QuantumRule::Baseline, !priority, "{p:?}");
        }
        assert_eq!(Policy::Poll5ms.ops().decision, Decision::PollFix);
        assert_eq!(Policy::Fifo.ops().decision, Decision::RoundRobin);
    }
}
