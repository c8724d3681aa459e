//! An RT's reservation budgets the lower saves' waits for waves without a
//! save point (issue 18, fuzz seed 300129).
//!
//! A reservation sized by latency (`Spatial::size_for_latency`) gets the
//! promise's allowance (one save and restore, `spatial_wait_allowance`)
//! less what the RT waits before it runs: the longest recent clean save
//! of the VMs below it (`Scheduler::rt_save_wait`). A save of a queue
//! running a `no_save_point` kernel waits first for its in-flight
//! workgroups to end, and that wait is left out of the clean save (so no
//! guest raises the partition's typical save by flagging its kernels).
//! The RT waits for it all the same: fuzz seed 300129's RT (28 us alone,
//! every 3.2 ms) waited 169 us for a save (84 us of flagged waves, 85 us
//! clean) and then ran 138 us on a reservation sized for an 85 us save:
//! 307 us against its bound of 273.
//!
//! Here each VM whose saves waited keeps its longest recent **whole**
//! save (the wait included), decaying by 1/8 per shorter one (as
//! `Spatial::saves`); the RT's switch budget is the allowance less the
//! longest such save among the VMs busy below it, when that leaves a
//! budget. A wait the allowance cannot absorb (waves longer than the
//! allowance: fuzz seed 97057's 9.4 ms ones) is the one wait the promise
//! lets a lower guest's flag cost a higher VM, and sizing cannot meet the
//! bound behind it: the budget is then the clean one, as before.
//!
//! A hostile guest cannot widen an RT's reservation this way beyond its
//! size without latency sizing: the latency size only ever lowers the
//! size the RT's width asks for (`Scheduler::spatial_plan`).

use super::*;

/// Per VM whose saves waited for its own waves without a save point:
/// its longest recent whole save (wait included), decaying by 1/8 per
/// shorter save of the VM, with an index longest first.
#[derive(Debug, Default)]
pub(crate) struct WaitedSaves {
    by_vm: BTreeMap<VmId, Nanos>,
    by_len: BTreeSet<(Reverse<Nanos>, VmId)>,
}

impl WaitedSaves {
    /// Records a save of a queue of `vm` that took `whole_ns`, of which
    /// `clean_ns` was the save itself. A VM is tracked from its first save
    /// with a wait on; its entry is dropped once it decays to its clean
    /// saves (its flagged kernels no longer cost a wait).
    pub fn note(&mut self, vm: VmId, whole_ns: Nanos, clean_ns: Nanos) {
        let old = self.by_vm.get(&vm).copied();
        if old.is_none() && whole_ns <= clean_ns {
            return;
        }
        let old = old.unwrap_or(0);
        self.by_len.remove(&(Reverse(old), vm));
        let s = whole_ns.max(old - old / 8);
        if s <= clean_ns {
            self.by_vm.remove(&vm);
            return;
        }
        self.by_vm.insert(vm, s);
        self.by_len.insert((Reverse(s), vm));
    }

    /// Forgets `vm` (removed).
    pub fn forget(&mut self, vm: VmId) {
        if let Some(s) = self.by_vm.remove(&vm) {
            self.by_len.remove(&(Reverse(s), vm));
        }
    }

    /// `vm`'s recorded whole save, if its saves waited.
    pub fn get(&self, vm: VmId) -> Option<Nanos> {
        self.by_vm.get(&vm).copied()
    }
}

impl Scheduler {
    /// The longest recent whole save (waits for waves without a save point
    /// included, [`WaitedSaves`]) of the VMs busy below `level` in `p`; 0
    /// when none of them waited. The walk of the longest saves is cut at
    /// as many steps as there are busy VMs below `level` (as
    /// `rt_save_wait`), then a lookup per busy VM.
    pub(super) fn rt_waited_save(&self, p: usize, level: u16) -> Nanos {
        let busy = &self.parts[p].busy;
        let waited = &self.spatial.waited;
        if waited.by_vm.is_empty() {
            return 0;
        }
        let busy_below = |vm: &VmId| busy.range(..level).any(|(_, vms)| vms.contains_key(vm));
        let n_busy: usize = busy.range(..level).map(|(_, vms)| vms.len()).sum();
        for &(Reverse(s), vm) in waited.by_len.iter().take(n_busy) {
            if busy_below(&vm) {
                return s;
            }
        }
        if waited.by_len.len() <= n_busy {
            return 0;
        }
        busy.range(..level)
            .flat_map(|(_, vms)| vms.keys())
            .filter_map(|&vm| waited.get(vm))
            .fold(0, Nanos::max)
    }

    /// The switch budget of an owner at `level` of `p` whose reservation
    /// saves the lower work on its CUs: the allowance less the longest
    /// whole save it may wait for (its waits for waves without a save
    /// point included) when that leaves a budget, else less the clean
    /// save (`rt_save_wait`) as before; 0 when no save is measured.
    pub(super) fn rt_switch_budget(&self, p: usize, level: u16) -> Nanos {
        let clean = self.rt_save_wait(p, level);
        if clean == 0 {
            return 0;
        }
        let allowance = self.spatial_wait_allowance(p);
        let whole = self.rt_waited_save(p, level).max(clean);
        match allowance.checked_sub(whole) {
            Some(b) if b > 0 => b,
            _ => allowance.saturating_sub(clean),
        }
    }
}
