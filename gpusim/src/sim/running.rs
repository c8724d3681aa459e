//! CU time of the workgroups running now: the part of it not yet credited
//! ([`PhysGpu::take_cu_time`] credits a workgroup when it completes or a
//! save cuts it). A measure taken at the end of a run reads it so that the
//! work of the queue holding the partition then is not left out.

use super::*;

impl SimGpu {
    /// Per tag, the CU time the workgroups running at `now` have done since
    /// they started (or were restored) and not yet credited by
    /// [`PhysGpu::take_cu_time`]: a solo workgroup's work less what it has
    /// left, a batch's finished rounds (credited only when the batch ends
    /// or is saved) and its current round's part. Reads the model only;
    /// the same CU time is credited again when those workgroups complete,
    /// so a caller adds it once, at the end of what it measures. Pairs are
    /// appended to `out`; several may name one tag.
    pub fn running_cu_time(&self, out: &mut Vec<(u64, u64)>) {
        let now = self.now;
        let tag_of = |slot: u32, qgen: u64| {
            self.slots
                .get(slot as usize)
                .and_then(|q| q.as_ref())
                .filter(|q| q.gen == qgen)
                .map(|q| q.tag)
        };
        for w in self.wgs.iter().filter(|w| w.live) {
            if let Some(tag) = tag_of(w.slot, w.qgen) {
                let left = occupancy::solo_left(now, w.end, w.shared_until).min(w.work);
                out.push((tag, w.work - left));
            }
        }
        for b in self.batches.iter().filter(|b| b.live) {
            if let Some(tag) = tag_of(b.slot, b.qgen) {
                let (done, started, into) = b.progress(now);
                let running = started
                    .saturating_sub(b.first)
                    .saturating_sub(done)
                    .min(b.held as u64);
                let ns = done
                    .saturating_mul(b.cost)
                    .saturating_add(running.saturating_mul(into));
                out.push((tag, ns));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::topology::GpuTopology;
    use abi::kernel::KernelKind;

    fn sum(v: &[(u64, u64)]) -> u64 {
        v.iter().map(|e| e.1).sum()
    }

    /// One kernel of a whole partition of 1 ms workgroups: half-way through
    /// nothing is credited and the running half is read (twice alike); at
    /// the end the credit is the kernel's whole CU time and nothing runs.
    #[test]
    fn running_work_is_read_without_being_credited() {
        let topo = GpuTopology::tiny();
        let cus = topo.cus_per_partition() as u64;
        let mut gpu = SimGpu::new(topo.clone(), 0).unwrap();
        let mut vm = TestVm::new(32 << 20);
        let mut q = vm.queue(&topo, 64, 5);
        vm.kernel(&mut q, KernelKind::Mark, cus as u32, 4, 1_000_000, 1, false);
        gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
        let mut ev = Vec::new();
        run_virtual(&mut gpu, 0, 500_000, &mut ev);
        gpu.advance(500_000, &mut ev);
        let (mut credit, mut running) = (Vec::new(), Vec::new());
        gpu.take_cu_time(&mut credit);
        gpu.running_cu_time(&mut running);
        assert_eq!(sum(&credit), 0);
        assert!(!running.is_empty() && running.iter().all(|e| e.0 == 7));
        let half = cus * 500_000;
        assert!(
            sum(&running) <= half && sum(&running) * 10 >= half * 9,
            "{running:?}"
        );
        let mut again = Vec::new();
        gpu.running_cu_time(&mut again);
        assert_eq!(sum(&again), sum(&running));
        run_virtual(&mut gpu, 500_000, u64::MAX, &mut ev);
        gpu.take_cu_time(&mut credit);
        running.clear();
        gpu.running_cu_time(&mut running);
        assert_eq!(sum(&credit), cus * 1_000_000);
        assert_eq!(sum(&running), 0);
    }
}
