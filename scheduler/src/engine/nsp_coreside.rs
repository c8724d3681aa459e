//! No co-residence beside waves a save would wait for longer than the
//! allowance (issue 18, fuzz seed 600053).
//!
//! Co-residence (`Scheduler::spatial_coreside`) shares every CU of the
//! partition with the lower work: the owner's job at most doubles, and
//! when it runs past twice the allowance (`coreside_deadline`) a
//! reservation is set up with a save of the lower queues on its CUs. A
//! lower VM whose kernels set `no_save_point` breaks both halves of that
//! bound once its waves are longer than the allowance: its waves hold
//! their places on every CU the owner shares (the owner's workgroups get
//! a place only as those waves end), and the save the deadline asks for
//! waits for them to end. Fuzz seed 600053: rt0 (a job of 54 us alone
//! every 396 us) co-resided with be1, whose flagged workgroups take
//! 1.01 ms; every time be1 ran that kernel, rt0's job waited for them
//! (1054 us against its bound of 301, every ~44 ms).
//!
//! So an owner does not co-reside while a VM busy below it has a
//! recorded whole save (its waits for its own flagged waves included,
//! `engine/nsp_save.rs`) longer than the allowance: it takes the
//! reservation its RT bound sizes instead, whose one set-up save is the
//! one wait the promise lets a lower guest's flag cost a higher VM, and
//! which, held across the owner's gaps, keeps the flagged waves off its
//! CUs from then on. The record comes from a save that waited: the
//! first wait happens (the promise's one wait), and a guest can only
//! lose co-residence by flagging, never gain GPU time.

use super::*;

impl Scheduler {
    /// Would co-residence of an owner at `level` of `p` share its CUs
    /// with waves a save waits for longer than `allowance`? True when a
    /// VM busy below `level` has a recorded whole save
    /// ([`WaitedSaves`]) above it.
    pub(super) fn coreside_beside_long_waits(
        &self,
        p: usize,
        level: u16,
        allowance: Nanos,
    ) -> bool {
        self.rt_waited_save(p, level) > allowance
    }
}
