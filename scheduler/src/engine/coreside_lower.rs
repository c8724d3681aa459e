//! Co-residence admission counts the lower VMs that may hold CUs beside
//! the owner (issue 18, docs/scheduling.md "Co-residence counts the lower
//! VMs that may run beside the owner").
//!
//! `Spatial::can_coreside` admits an owner beside lower work only when
//! every lower VM's workgroups are known to fit half a CU. It was asked
//! about every busy VM below the owner, but only one lower level runs
//! beside an owner (`spatial_beside_level`: the running lower level, or
//! the parked owner's), and a busy VM of another level holds no CU of the
//! partition until a later decision maps it, which decides co-residence
//! again with it resident. A starved lower VM that rang once and never
//! completed has no recorded occupancy (the binding records it only from
//! a doorbell whose scan covers every packet since the previous one), and
//! it refused co-residence for the whole run although it never ran beside
//! the owner (fuzz seed 600002: an RT of 26 workgroups of 16 us, a best
//! effort be0 beside it, be1 below be0 starved all run; the RT held a
//! reservation of 16 CUs and be0's 304-workgroup kernel ran two rounds on
//! the other 288 CUs, 0.745 of its CU time alone).
//!
//! The admission now leaves out a lower VM whose occupancy was never
//! recorded when it may not hold CUs beside the owner: none of its queues
//! running, being saved or mapped idle on the partition, not the parked
//! (displaced) owner nor the partition's slice owner, and not of the level
//! that runs beside the owner. When none of the busy lower VMs may hold
//! CUs beside it (nothing lower is on the partition yet), every busy lower
//! VM counts, as before. A VM whose occupancy is known still counts
//! wherever it is: leaving out starved VMs known to hold whole CUs too let
//! a lower RT co-reside under a higher RT that then set its reservation up
//! with a save of the best effort at each of its jobs (fuzz seed 97092:
//! CWSR 15.1% of the run, the best effort 0.637 of alone against 0.72;
//! passing on main).

use super::{Scheduler, SliceOwner};
use crate::VmId;

impl Scheduler {
    /// May lower VM `vm` (busy at `level` on partition `p`) hold CUs of
    /// `p` beside `owner` without a new decision of `owner`'s: a queue of
    /// it running, being saved or mapped idle there, it the parked or the
    /// slice owner, or `level` the lower level that runs beside `owner`
    /// (`beside`, see [`Self::coreside_beside_level`]).
    fn coreside_may_hold(
        &self,
        p: usize,
        owner: SliceOwner,
        beside: Option<u16>,
        vm: VmId,
        level: u16,
    ) -> bool {
        if vm == owner.vm || level >= owner.level {
            return false;
        }
        let part = &self.parts[p];
        let of_vm = |q: &super::QueueId| self.queues.get(q).is_some_and(|qq| qq.vm == vm);
        beside == Some(level)
            || part.parked.is_some_and(|k| k.vm == vm)
            || part.owner.is_some_and(|o| o.vm == vm)
            || part.running.iter().any(|e| of_vm(&e.2))
            || part.freeing.iter().any(of_vm)
            || part.idle_mapped.iter().any(|e| of_vm(&e.1))
    }

    /// The lower level that would run beside `owner` on `p` under a
    /// co-residence: the highest level of a running lower queue of another
    /// VM, else the parked owner's level when it is below `owner` (as
    /// `spatial_beside_level` takes it for a co-residence).
    fn coreside_beside_level(&self, p: usize, owner: SliceOwner) -> Option<u16> {
        let part = &self.parts[p];
        part.running
            .iter()
            .filter(|e| e.0 < owner.level)
            .filter(|e| self.queues.get(&e.2).is_some_and(|q| q.vm != owner.vm))
            .map(|e| e.0)
            .max()
            .or_else(|| {
                part.parked
                    .filter(|k| k.level < owner.level && k.vm != owner.vm)
                    .map(|k| k.level)
            })
    }

    /// The busy lower VMs of `p` whose occupancy decides `owner`'s
    /// co-residence (see the module doc): every one whose occupancy is
    /// recorded or that may hold CUs beside it, or every busy lower VM
    /// when none may.
    pub(super) fn coreside_lower_vms(
        &self,
        p: usize,
        owner: SliceOwner,
    ) -> impl Iterator<Item = VmId> + '_ {
        let beside = self.coreside_beside_level(p, owner);
        // Each busy lower VM once, with whether it may hold CUs beside the
        // owner (asked once per VM).
        let lower: Vec<(VmId, bool)> = self.parts[p]
            .busy
            .range(..owner.level)
            .flat_map(|(&l, m)| m.keys().map(move |&v| (v, l)))
            .map(|(v, l)| (v, self.coreside_may_hold(p, owner, beside, v, l)))
            .collect();
        let any = lower.iter().any(|&(_, may)| may);
        let noted = |v: &VmId| self.spatial.occ.get(v).is_some_and(|o| o.noted);
        lower
            .into_iter()
            .filter(move |(v, may)| !any || *may || noted(v))
            .map(|(v, _)| v)
    }
}
