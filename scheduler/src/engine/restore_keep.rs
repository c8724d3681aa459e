//! A queue saved during its own restore keeps that restore (issue 18,
//! branch `fresh8`; docs/scheduling.md, "A save during a restore keeps the
//! restore").
//!
//! A queue mapped from `Saved` is not billed its restore: its VM is billed
//! from the map plus the restore's modelled length, `restore_ns`, which is
//! its last CWSR save time (the simulator's save and restore of the same
//! record take the same time). A preemption that lands while that restore
//! is still in progress (a light waker ringing just after a switch) saves
//! a queue whose waves have not run: its dequeue is short (5 us in the
//! simulator, nothing new to write), but the record it leaves is the one
//! saved before, and the next map restores all of it again. Taking the
//! short dequeue as the next restore's length billed the VM almost the
//! whole of that restore (fuzz seed 800063: sat0, 1 queue of full-CU
//! 250 us workgroups, restored in 121 us at each of its 129 slices, billed
//! 116 us of it each time, 0.887 CU-ns per billed ns against 1.000 alone).

use super::*;

/// The restore the next map of a queue saved now will take: `clean_ns`,
/// its dequeue less any wait for its own waves without a save point,
/// unless the dequeue was asked at `asked` before its previous restore
/// (`prev_ns`, ending at `restore_end`) was done, when the record saved
/// is still the previous one and its restore is at least `prev_ns`.
pub(super) fn restore_after_save(
    prev_ns: Nanos,
    restore_end: Nanos,
    asked: Nanos,
    clean_ns: Nanos,
) -> Nanos {
    if asked < restore_end {
        clean_ns.max(prev_ns)
    } else {
        clean_ns
    }
}
