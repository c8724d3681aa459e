//! The free CUs of `no_save_point` save waits, billed once the period of
//! saves in flight is over (issue 18, docs/scheduling.md "Free CUs of a
//! save wait billed when every wait is known").
//!
//! A save that waits for its queue's waves without a save point splits
//! the partition in the wait: the waiting VM is billed the partition time
//! its waves held (`wait_held_ns`), and the rest of the CUs — those its
//! finishing waves and the other queues' quick saves gave back — are
//! billed to the VMs mapped meanwhile, whose waves had them. The free time
//! of a period of saves in flight is its span less what every waiting
//! queue held. Each queue's held share is reported only when its own
//! dequeue ends, so the free time is known only when the last wait of the
//! period has been reported: before that, the span less the waits reported
//! so far over-counts it by what the queues still waiting hold. Billing it
//! as it seemed to grow (as `bill_free_wait` did up to stop 33) billed the
//! VM mapped after a VM of 6 queues, 4 of them waiting 0.65 ms with 76 CUs
//! each of a 304-CU partition, 0.48 ms of a wait in which it had 2 CUs
//! (fuzz seed 200008: the eq1 VM mapped after the eq0 VMs did 0.90 CU-ns
//! per billed ns, its equals 1.00). So the period's waits and the VMs that
//! ran in it are recorded as they come, and the free time is billed when
//! no save is in flight any more ([`Scheduler::settle_free_wait`]).

use super::*;

/// Save waits of one period of saves in flight of a partition (reset when
/// none is in flight): their span, the partition time the waiting queues'
/// waves held in it, the VMs that waited, and the VMs mapped meanwhile
/// with when they ran (billed the rest when the period ends).
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeWait {
    /// First start and last end of the reported waits.
    span: Option<(Nanos, Nanos)>,
    /// Partition time the waiting queues' waves held (their CU-ns /
    /// partition CUs, summed: different queues hold different CUs).
    held: Nanos,
    /// VMs whose queues waited (billed their own held share, not the free
    /// time).
    waiters: Vec<VmId>,
    /// Running intervals of the VMs mapped during the period's saves:
    /// `(vm, from, until)`, `from` where its billing would have started
    /// (after its restore), `until` when it stopped running (`None`: it
    /// still runs).
    runs: Vec<(VmId, Nanos, Option<Nanos>)>,
}

impl FreeWait {
    /// A wait of a queue of `waiter` from `req` for `wait`, its waves
    /// holding `held` of the partition's time in it.
    pub(crate) fn add_wait(&mut self, waiter: VmId, req: Nanos, wait: Nanos, held: Nanos) {
        if wait == 0 {
            return;
        }
        let end = req.saturating_add(wait);
        self.span = Some(
            self.span
                .map_or((req, end), |(a, b)| (a.min(req), b.max(end))),
        );
        self.held = self.held.saturating_add(held.min(wait));
        if !self.waiters.contains(&waiter) {
            self.waiters.push(waiter);
        }
    }

    /// `vm` starts running during the period's saves; its waves may take
    /// free CUs from `from` (after its restore). One interval per VM (the
    /// list stays bounded by the partition's VMs however long the period
    /// lasts): a VM that runs again in the period keeps its first start,
    /// counted as running in its gap too (a gap inside one period of saves
    /// in flight is at most one switch).
    pub(crate) fn runs_from(&mut self, vm: VmId, from: Nanos) {
        match self.runs.iter_mut().find(|r| r.0 == vm) {
            Some(r) => r.2 = None,
            None => self.runs.push((vm, from, None)),
        }
    }

    /// `vm` stops running at `now` (its open interval, if any, ends).
    pub(crate) fn stops(&mut self, vm: VmId, now: Nanos) {
        if let Some(r) = self.runs.iter_mut().find(|r| r.0 == vm && r.2.is_none()) {
            r.2 = Some(now.max(r.1));
        }
    }

    /// What each VM that ran in the period is billed of its free time:
    /// the span less the held time, spread evenly over the span (the
    /// reports give no finer shape), and at each instant split evenly
    /// among the VMs running then (not the waiters). An instant nobody ran
    /// in is billed to nobody. The parts add up to at most the free time.
    pub(crate) fn shares(&self) -> Vec<(VmId, Nanos)> {
        let Some((a, b)) = self.span else {
            return Vec::new();
        };
        let span = b.saturating_sub(a);
        let free = span.saturating_sub(self.held);
        if span == 0 || free == 0 {
            return Vec::new();
        }
        // Intervals clipped to the span, of VMs that did not wait.
        let iv: Vec<(VmId, Nanos, Nanos)> = self
            .runs
            .iter()
            .filter(|r| !self.waiters.contains(&r.0))
            .filter_map(|&(vm, from, until)| {
                let s = from.max(a);
                let e = until.unwrap_or(b).min(b);
                (s < e).then_some((vm, s, e))
            })
            .collect();
        if iv.is_empty() {
            return Vec::new();
        }
        // Sweep the endpoints: between two, each running interval gets an
        // equal part of that stretch (in ns of the span, scaled at the end).
        let mut cuts: Vec<Nanos> = iv.iter().flat_map(|x| [x.1, x.2]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut part: Vec<(VmId, u128)> = Vec::new();
        for w in cuts.windows(2) {
            let (s, e) = (w[0], w[1]);
            let on: Vec<VmId> = iv
                .iter()
                .filter(|x| x.1 <= s && x.2 >= e)
                .map(|x| x.0)
                .collect();
            if on.is_empty() {
                continue;
            }
            let each = (e - s) as u128 * free as u128 / on.len() as u128;
            for vm in on {
                match part.iter_mut().find(|p| p.0 == vm) {
                    Some(p) => p.1 = p.1.saturating_add(each),
                    None => part.push((vm, each)),
                }
            }
        }
        part.into_iter()
            .map(|(vm, x)| (vm, Nanos::try_from(x / span as u128).unwrap_or(free)))
            .filter(|x| x.1 > 0)
            .collect()
    }
}

impl Scheduler {
    /// A queue of `waiter` waited `wait` from `req` for its waves without
    /// a save point, and they held `held` of the partition's time in it:
    /// the rest of its CUs were free, and the VMs mapped meanwhile had
    /// them. Recorded; billed when the period of saves in flight ends
    /// ([`Self::settle_free_wait`]), when every wait's held share is known.
    pub(super) fn bill_free_wait(
        &mut self,
        p: usize,
        waiter: VmId,
        req: Nanos,
        wait: Nanos,
        held: Nanos,
    ) {
        self.parts[p].free_wait.add_wait(waiter, req, wait, held);
    }

    /// No save is in flight in partition `p` any more: the free time of
    /// the period's waits is billed to the VMs that ran in it
    /// ([`FreeWait::shares`]), so a VM is billed for the partition time
    /// its waves held and never for another's; then the period is reset.
    pub(super) fn settle_free_wait(&mut self, p: usize) {
        let fw = std::mem::take(&mut self.parts[p].free_wait);
        let pol = self.cfg.policy;
        for (vm, d) in fw.shares() {
            if let Some(v) = self.vms.get_mut(&vm) {
                v.stats.gpu_ns = v.stats.gpu_ns.saturating_add(d);
                v.vtime = v.vtime.saturating_add(d as u128 * SCALE / weight(v, pol));
            }
            self.sync_vt(vm);
        }
    }
}
