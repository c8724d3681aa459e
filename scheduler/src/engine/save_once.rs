//! A VM's save record lowered once per decision's saves (issue 18,
//! docs/scheduling.md "One decision's saves lower a VM's save record
//! once").
//!
//! The save record of a VM (`Spatial::saves`, read by
//! `Scheduler::rt_save_wait`) is what a higher RT's latency size budgets
//! for its set-up save: the longest recent save of the VM's queues,
//! decaying by 1/8 per shorter save. The queues one decision preempts are
//! asked at one instant and saved side by side, and the RT's reservation
//! waits for the **longest** of them. Decayed once per queue, the short
//! saves of one set-up pulled the record below that longest save (fuzz
//! seed 800120: be0's four queues saved in 8.1, 8.1, 17.2 and 25.6 us at
//! each set-up, the record flapping around 17-22 us, the RT's size budgeting
//! 19.2 us and its job 25.6 + 490.8 us against a bound of 512).
//!
//! So the saves of one VM asked at the same instant count as one: the
//! first decays the record once, the others only raise it.

/// The save record after a save of `save_ns` asked at `asked_ns`, given
/// the record `prev` and the ask time of the VM's previous recorded save
/// (`prev_asked`, `None`: no save recorded). A save asked with the
/// previous one (the same decision's preemption) cannot lower the record;
/// otherwise the record decays by 1/8 toward it, as before.
pub(crate) fn save_record_after(
    prev: u64,
    prev_asked: Option<u64>,
    save_ns: u64,
    asked_ns: u64,
) -> u64 {
    if prev_asked == Some(asked_ns) {
        save_ns.max(prev)
    } else {
        save_ns.max(prev - prev / 8)
    }
}
