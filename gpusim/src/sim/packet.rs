//! Packet decode and effects: the command processor's fetch of a
//! queue's ring (`pump`), barrier packets, a doorbell, the validation of
//! a fetched packet into launched work, a packet's completion (signal,
//! header, event, read index) and the memory effects of its workgroups.

use super::*;

impl SimGpu {
    /// Packet `i` of `slot`'s queue: if it is a dispatch whose every
    /// workgroup has been handed out and has finished, complete it
    /// ([`complete_packet`]) and retire the completed packets at the front
    /// of the window ([`retire`]). The one completion path of a dispatch
    /// (single workgroups and batches alike).
    pub(super) fn complete_if_done(&mut self, slot: u32, i: usize) -> QResult<()> {
        let now = self.now;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let Some(a) = q.active.get(i) else {
            return Ok(());
        };
        let Work::Dispatch(d) = a.work else {
            return Ok(());
        };
        if a.done_wgs == d.total && a.next_wg == d.total {
            complete_packet(q, i, now, &mut self.pending, &mut self.stats, SlotId(slot))?;
            retire(q, SlotId(slot))?;
        }
        Ok(())
    }

    /// A doorbell write ([`PhysGpu::doorbell`]): checks and publishes the
    /// write index, re-reads the ring.
    pub(super) fn ring_doorbell(&mut self, now: Nanos, slot: SlotId, wptr: u64) {
        self.run_until(now);
        let s = slot.0;
        let Some(Some(q)) = self.slots.get_mut(s as usize) else {
            log::debug!("doorbell on unmapped slot {}", s);
            return;
        };
        if matches!(q.state, HState::Error(_)) {
            return;
        }
        if wptr < q.wptr {
            let old = q.wptr;
            self.fail(s, QueueErrorReason::WptrBackwards { old, new: wptr });
            return;
        }
        if wptr > wptr_limit(q.rptr, q.ring_packets) {
            let (rptr, size) = (q.rptr, q.ring_packets);
            self.fail(s, QueueErrorReason::WptrBeyondRing { wptr, rptr, size });
            return;
        }
        if wptr > q.wptr {
            q.idle_reported = false;
        }
        q.wptr = wptr;
        q.mqd.set_write_index(wptr);
        if q.state == HState::Active {
            // A doorbell re-reads a blocked queue at once, with a fresh backoff.
            q.stall_polls = 0;
            let written = self.stats.signals_decremented;
            self.pump_and_dispatch(s);
            if self.stats.signals_decremented != written {
                self.wake_barrier_waiters();
            }
        }
    }

    /// Re-reads `slot`'s ring ([`Self::pump`]), then hands free CUs of its
    /// partition out ([`Self::dispatch`]).
    pub(super) fn pump_and_dispatch(&mut self, slot: u32) {
        self.pump(slot);
        let p = self.slot_part[slot as usize];
        self.dispatch(p);
    }

    /// Fetch and launch packets of an active queue; resolve barrier packets.
    pub(super) fn pump(&mut self, slot: u32) {
        if let Err(e) = self.pump_inner(slot) {
            self.fail(slot, e);
        }
    }

    pub(super) fn pump_inner(&mut self, slot: u32) -> QResult<()> {
        let max_active = self.params.max_active_packets as usize;
        let poll_ns = self.params.barrier_poll_ns;
        let now = self.now;
        let mut need_poll = false;
        {
            let q = self.slots[slot as usize]
                .as_mut()
                .expect("pump on empty slot");
            if q.state != HState::Active {
                return Ok(());
            }
            loop {
                // Resolve barrier packets at the tail of the window.
                let mut i = 0;
                while i < q.active.len() {
                    let a = &q.active[i];
                    if !a.complete {
                        if let Work::And(b) | Work::Or(b) = a.work {
                            let is_and = matches!(a.work, Work::And(_));
                            if barrier_satisfied(&*q.mem, &b, is_and)? {
                                q.stall_polls = 0;
                                complete_packet(
                                    q,
                                    i,
                                    now,
                                    &mut self.pending,
                                    &mut self.stats,
                                    SlotId(slot),
                                )?;
                            } else {
                                need_poll = true;
                            }
                        }
                    }
                    i += 1;
                }
                retire(q, SlotId(slot))?;
                if q.active.len() >= max_active || q.fetch() == q.wptr {
                    break;
                }
                // A pending barrier packet blocks further launches.
                if q.active
                    .iter()
                    .any(|a| !a.complete && matches!(a.work, Work::And(_) | Work::Or(_)))
                {
                    break;
                }
                let idx = q.fetch();
                let addr = q.mqd.packet_addr(idx);
                let mut raw = [0u8; aql::PACKET_SIZE];
                q.mem
                    .read(addr, &mut raw)
                    .map_err(|_| QueueErrorReason::RingOutOfRange { addr })?;
                let pkt = Packet::decode(&raw);
                if pkt.body == Body::Invalid {
                    // Not published yet: the packet processor waits on the header.
                    need_poll = true;
                    q.blocked = true;
                    break;
                }
                q.blocked = false;
                q.stall_polls = 0;
                if pkt.header.barrier && q.active.iter().any(|a| !a.complete) {
                    break; // re-pumped when earlier packets complete
                }
                let act = decode_work(&*q.mem, idx, &pkt)?;
                q.active.push_back(act);
            }
        }
        {
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.barrier_blocked = q.barrier_pending();
        }
        if need_poll {
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if !q.poll_armed {
                q.poll_armed = true;
                let gen = q.gen;
                // A blocked queue (waiting only on an unpublished header or
                // an unmet barrier) re-reads with a backoff (2^n x
                // barrier_poll_ns, at most 512x): watching it costs the
                // host little however long it blocks; a doorbell, or a
                // completion of another queue that writes a signal,
                // re-reads at once.
                let mut ns = poll_ns;
                if !q.has_work() {
                    ns = poll_ns.saturating_mul(1 << q.stall_polls.min(BLOCKED_POLL_MAX_SHIFT));
                    q.stall_polls = q.stall_polls.saturating_add(1);
                    self.stats.blocked_polls += 1;
                }
                self.arm(now.saturating_add(ns), Timer::Poll { slot, gen });
            }
        }
        self.check_idle(slot);
        Ok(())
    }

    /// A completion wrote a signal: re-check at once every active queue
    /// waiting on a barrier (its dependency may be that signal) instead of
    /// at its backed-off poll. Barriers completed here write signals too:
    /// repeat while they do (each round completes at least one packet).
    pub(super) fn wake_barrier_waiters(&mut self) {
        for _ in 0..64 {
            let written = self.stats.signals_decremented;
            for slot in 0..self.slots.len() as u32 {
                let waiting = self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|q| q.state == HState::Active && q.barrier_pending());
                if waiting {
                    self.stats.barrier_wakes += 1;
                    self.pump_and_dispatch(slot);
                }
            }
            if self.stats.signals_decremented == written {
                break;
            }
        }
    }

    pub(super) fn check_idle(&mut self, slot: u32) {
        let now = self.now;
        if let Some(q) = self.slots[slot as usize].as_mut() {
            if q.state == HState::Active && q.has_work() {
                q.idle_reported = false;
            } else if q.state == HState::Active && !q.has_work() && !q.idle_reported {
                q.idle_reported = true;
                self.pending.push(GpuEvent::QueueIdle {
                    slot: SlotId(slot),
                    tag: q.tag,
                    at: now,
                });
            }
        }
    }
}

/// Highest write index a queue may publish: one ring ahead of the read index,
/// and never past a dword position that overflows `CP_HQD_PQ_WPTR`.
pub(super) fn wptr_limit(rptr: u64, ring_packets: u64) -> u64 {
    rptr.saturating_add(ring_packets).min(MAX_INDEX)
}

/// `addr + off` for a guest address, or `err` if it wraps.
pub(super) fn addr_add(addr: u64, off: u64, err: QueueErrorReason) -> QResult<u64> {
    addr.checked_add(off).ok_or(err)
}

pub(super) fn sig_check(mem: &dyn DmaMemory, addr: u64) -> QResult<()> {
    if addr != 0 && !mem.contains(addr, abi::queue::AMD_SIGNAL_SIZE as u64) {
        return Err(QueueErrorReason::SignalOutOfRange { addr });
    }
    Ok(())
}

pub(super) fn barrier_satisfied(mem: &dyn DmaMemory, b: &Barrier, is_and: bool) -> QResult<bool> {
    let mut any = false;
    let mut all = true;
    let mut deps = 0;
    for &s in b.dep_signal.iter().filter(|s| **s != 0) {
        deps += 1;
        let err = QueueErrorReason::SignalOutOfRange { addr: s };
        let v = mem
            .read_u64(addr_add(s, AMD_SIGNAL_VALUE as u64, err)?)
            .map_err(|_| err)? as i64;
        if v == 0 {
            any = true;
        } else {
            all = false;
        }
    }
    Ok(if is_and { all } else { deps == 0 || any })
}

pub(super) fn data_check(mem: &dyn DmaMemory, addr: u64, len: u64) -> QResult<()> {
    if len > 0 && !mem.contains(addr, len) {
        return Err(QueueErrorReason::DataOutOfRange { addr, len });
    }
    Ok(())
}

/// Validate a fetched packet and turn it into launched work.
pub(super) fn decode_work(mem: &dyn DmaMemory, id: u64, pkt: &Packet) -> QResult<Active> {
    let (work, signal) = match pkt.body {
        Body::KernelDispatch(d) => {
            let total = d
                .validate()
                .map_err(|why| QueueErrorReason::BadDispatch { why })?;
            let items_per_wg = d.workgroup_items(); // <= MAX_WORKGROUP_ITEMS
            let ko = d.kernel_object;
            let mut kd = [0u8; abi::kernel::KD_SIZE];
            mem.read(ko, &mut kd)
                .map_err(|_| QueueErrorReason::DescriptorOutOfRange { addr: ko })?;
            let desc = KernelDescriptor::decode(&kd)
                .map_err(|why| QueueErrorReason::BadDescriptor { addr: ko, why })?;
            let ka = d.kernarg_address;
            let mut kb = [0u8; abi::kernel::KERNARG_MAX];
            let klen = desc.kind.kernarg_size();
            mem.read(ka, &mut kb[..klen])
                .map_err(|_| QueueErrorReason::KernargOutOfRange { addr: ka })?;
            let args = Kernarg::decode(desc.kind, &kb[..klen])
                .ok_or(QueueErrorReason::KernargOutOfRange { addr: ka })?;
            match args {
                Kernarg::Fill { dst, n, .. } => data_check(mem, dst, 4 * n as u64)?,
                Kernarg::VecAdd { a, b, c, n } => {
                    for x in [a, b, c] {
                        data_check(mem, x, 4 * n as u64)?;
                    }
                }
                Kernarg::Saxpy { x, y, n, .. } => {
                    data_check(mem, x, 4 * n as u64)?;
                    data_check(mem, y, 4 * n as u64)?;
                }
                Kernarg::Checksum { src, out, n } => {
                    data_check(mem, src, 4 * n as u64)?;
                    data_check(mem, out, 8)?;
                }
                Kernarg::Mark { counters, n } => data_check(mem, counters, 4 * n as u64)?,
                Kernarg::Spin { .. } => {}
            }
            sig_check(mem, d.completion_signal)?;
            let cost = match args {
                Kernarg::Spin { ns } if ns != 0 => ns,
                _ => desc.wg_cost_ns,
            };
            if cost > MAX_WG_COST_NS || total.checked_mul(cost.max(MIN_WG_NS)).is_none() {
                return Err(QueueErrorReason::BadDispatch {
                    why: aql::DispatchError::CostOverflow {
                        workgroups: total,
                        wg_cost_ns: cost,
                    },
                });
            }
            (
                Work::Dispatch(Dispatch {
                    desc,
                    args,
                    total,
                    items_per_wg,
                    fp: Footprint::of(items_per_wg, desc.vgprs, d.group_segment_size),
                }),
                d.completion_signal,
            )
        }
        Body::BarrierAnd(b) | Body::BarrierOr(b) => {
            for s in b.dep_signal {
                sig_check(mem, s)?;
            }
            sig_check(mem, b.completion_signal)?;
            let w = if matches!(pkt.body, Body::BarrierAnd(_)) {
                Work::And(b)
            } else {
                Work::Or(b)
            };
            (w, b.completion_signal)
        }
        Body::Invalid => return Err(QueueErrorReason::UnsupportedPacket(aql::TYPE_INVALID)),
        Body::Unsupported(t) => return Err(QueueErrorReason::UnsupportedPacket(t)),
    };
    Ok(Active {
        id,
        work,
        signal,
        next_wg: 0,
        done_wgs: 0,
        inflight: 0,
        complete: false,
        batch: None,
    })
}

/// Mark packet `i` complete: decrement its signal, invalidate its header, emit.
pub(super) fn complete_packet(
    q: &mut Hqd,
    i: usize,
    now: Nanos,
    pending: &mut Vec<GpuEvent>,
    stats: &mut SimStats,
    slot: SlotId,
) -> QResult<()> {
    let a = &mut q.active[i];
    if a.complete {
        return Ok(());
    }
    a.complete = true;
    a.work = Work::Done;
    let id = a.id;
    if a.signal != 0 {
        // Atomic decrement where the memory supports it (see `DmaMemory`).
        let err = QueueErrorReason::SignalOutOfRange { addr: a.signal };
        let va = addr_add(a.signal, AMD_SIGNAL_VALUE as u64, err)?;
        q.mem.fetch_add_u64(va, u64::MAX).map_err(|_| err)?;
        stats.signals_decremented += 1;
    }
    let addr = q.mqd.packet_addr(id);
    q.mem
        .write(addr, &aql::INVALID_HEADER.to_le_bytes())
        .map_err(|_| QueueErrorReason::RingOutOfRange { addr })?;
    stats.packets_completed += 1;
    pending.push(GpuEvent::PacketCompleted {
        slot,
        tag: q.tag,
        dispatch_id: id,
        signal: a.signal,
        at: now,
    });
    Ok(())
}

/// Pop completed packets from the front; advance and report the read index.
pub(super) fn retire(q: &mut Hqd, _slot: SlotId) -> QResult<()> {
    let mut moved = false;
    while q.active.front().is_some_and(|a| a.complete) {
        q.active.pop_front();
        q.rptr += 1;
        moved = true;
    }
    if moved {
        q.mqd.set_read_index(q.rptr);
        let ra = q.mqd.rptr_report_addr();
        if ra != 0 {
            q.mem
                .write_u64(ra, q.rptr)
                .map_err(|_| QueueErrorReason::PointerAddrOutOfRange { addr: ra })?;
        }
    }
    Ok(())
}

/// Read `n` u32s at `addr` into `buf`.
pub(super) fn read_u32s(mem: &dyn DmaMemory, addr: u64, n: u64, buf: &mut Vec<u8>) -> QResult<()> {
    buf.resize((n * 4) as usize, 0);
    mem.read(addr, buf)
        .map_err(|_| QueueErrorReason::DataOutOfRange { addr, len: n * 4 })
}

/// Apply the memory effects of workgroups `from..to` of `d`, in order, as
/// [`apply_effect`] on each: the same effects and the same error at the
/// same workgroup. A `Mark` kernel's counters are added under one memory
/// lock ([`DmaMemory::add_u32_each`]); `gpas` is scratch for their
/// addresses.
pub(super) fn apply_effects(
    mem: &dyn DmaMemory,
    d: &Dispatch,
    from: u64,
    to: u64,
    gpas: &mut Vec<u64>,
    s1: &mut Vec<u8>,
    s2: &mut Vec<u8>,
) -> QResult<()> {
    let Kernarg::Mark { counters, n } = d.args else {
        for wg in from..to {
            apply_effect(mem, d, wg, s1, s2)?;
        }
        return Ok(());
    };
    let werr = |addr: u64, len: u64| QueueErrorReason::DataOutOfRange { addr, len };
    gpas.clear();
    // As `apply_effect`: workgroups past `n` mark nothing, and an address
    // that overflows fails its workgroup after the ones before it.
    let mut bad = None;
    for wg in from..to.min(n as u64) {
        match addr_add(counters, 4 * wg, werr(counters, 4 * n as u64)) {
            Ok(a) => gpas.push(a),
            Err(e) => {
                bad = Some(e);
                break;
            }
        }
    }
    mem.add_u32_each(gpas, 1)
        .map_err(|(i, _)| werr(gpas[i], 4))?;
    bad.map_or(Ok(()), Err)
}

/// Apply one workgroup's memory effect. Buffer ranges were validated when the
/// packet was fetched; every address is still computed with checked arithmetic
/// and every access bounds-checked.
pub(super) fn apply_effect(
    mem: &dyn DmaMemory,
    d: &Dispatch,
    wg: u64,
    s1: &mut Vec<u8>,
    s2: &mut Vec<u8>,
) -> QResult<()> {
    let range = |n: u32| element_range(wg, d.items_per_wg, n);
    let werr = |addr: u64, len: u64| QueueErrorReason::DataOutOfRange { addr, len };
    // Address of element `k` of the u32 array at `base` with `n` elements.
    let elem = |base: u64, k: u64, n: u32| addr_add(base, 4 * k, werr(base, 4 * n as u64));
    // A workgroup's element range holds at most `MAX_WORKGROUP_ITEMS` (1024)
    // elements (`KernelDispatch::validate` at fetch), so host buffers stay
    // bounded whatever the guest asks for.
    let range = |n: u32| {
        let (s, e) = range(n);
        debug_assert!(e - s <= MAX_WORKGROUP_ITEMS);
        (s, e - s)
    };
    match d.args {
        Kernarg::Fill { dst, n, value } => {
            let (k, m) = range(n);
            s1.clear();
            for _ in 0..m {
                s1.extend_from_slice(&value.to_le_bytes());
            }
            mem.write(elem(dst, k, n)?, s1)
                .map_err(|_| werr(dst, 4 * n as u64))?;
        }
        Kernarg::VecAdd { a, b, c, n } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(a, k, n)?, m, s1)?;
            read_u32s(mem, elem(b, k, n)?, m, s2)?;
            for i in 0..m as usize {
                let v = u32_at(s1, 4 * i).wrapping_add(u32_at(s2, 4 * i));
                put_u32(s1, 4 * i, v);
            }
            mem.write(elem(c, k, n)?, s1)
                .map_err(|_| werr(c, 4 * n as u64))?;
        }
        Kernarg::Saxpy { x, y, n, a } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(x, k, n)?, m, s1)?;
            read_u32s(mem, elem(y, k, n)?, m, s2)?;
            for i in 0..m as usize {
                let v = a
                    .wrapping_mul(u32_at(s1, 4 * i))
                    .wrapping_add(u32_at(s2, 4 * i));
                put_u32(s1, 4 * i, v);
            }
            mem.write(elem(y, k, n)?, s1)
                .map_err(|_| werr(y, 4 * n as u64))?;
        }
        Kernarg::Checksum { src, out, n } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(src, k, n)?, m, s1)?;
            let sum =
                (0..m as usize).fold(0u64, |acc, i| acc.wrapping_add(u32_at(s1, 4 * i) as u64));
            // Atomic add where the memory supports it (see `DmaMemory`).
            mem.fetch_add_u64(out, sum).map_err(|_| werr(out, 8))?;
        }
        Kernarg::Mark { counters, n } => {
            if wg < n as u64 {
                let addr = elem(counters, wg, n)?;
                mem.fetch_add_u32(addr, 1).map_err(|_| werr(addr, 4))?;
            }
        }
        Kernarg::Spin { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::mem::SparseMemory;
    use proptest::prelude::*;

    fn mark(counters: u64, n: u32, total: u64) -> Dispatch {
        Dispatch {
            desc: KernelDescriptor::new(abi::kernel::KernelKind::Mark, 1_000),
            args: Kernarg::Mark { counters, n },
            total,
            items_per_wg: 1,
            fp: Footprint::WHOLE,
        }
    }

    proptest! {
        /// A batch's effects are its workgroups' one by one: the same
        /// counters, the same error at the same workgroup (counters near
        /// the end of memory, or past it; workgroups past `n`).
        #[test]
        fn a_batch_of_mark_workgroups_marks_as_one_by_one(
            base_off in 0u64..64,
            n in 1u32..40,
            from in 0u64..50,
            len in 0u64..50,
        ) {
            let size = 1u64 << 16;
            // Counters from just below the end of memory to inside it.
            let counters = size - 4 * base_off - 4;
            let d = mark(counters, n, 60);
            let (lot, each) = (SparseMemory::new(size), SparseMemory::new(size));
            let (mut s1, mut s2, mut gpas) = (Vec::new(), Vec::new(), Vec::new());
            let got = apply_effects(&lot, &d, from, from + len, &mut gpas, &mut s1, &mut s2);
            let mut want = Ok(());
            for wg in from..from + len {
                if let Err(e) = apply_effect(&each, &d, wg, &mut s1, &mut s2) {
                    want = Err(e);
                    break;
                }
            }
            prop_assert_eq!(got, want);
            for k in 0..64u64 {
                let a = counters.saturating_add(4 * k);
                if a + 4 <= size {
                    prop_assert_eq!(lot.read_u32(a).unwrap(), each.read_u32(a).unwrap());
                }
            }
        }
    }
}
