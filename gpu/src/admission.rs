//! MQD admission: the static checks run on a guest's MQD before it may be
//! loaded on an HQD (header, AQL, ring size and range, pointer addresses, CWSR
//! area). The front end runs them when a guest loads an MQD, for an early error
//! in `CP_HQD_ERROR`; the simulator's `map` runs them again, since a backend
//! must never trust its caller with guest input.
//!
//! The rules follow linux KFD where KFD checks the same thing
//! (`kfd_queue_acquire_buffers` in `kfd_queue.c`, `set_queue_properties_from_user`
//! in `kfd_chardev.c`) and say where hqdmux differs; docs/vgpu-abi.md ("The MQD a
//! driver must build") lists them for driver writers.
//!
//! Fields the host reads but does not check: `cp_hqd_persistent_state` and
//! `cp_hqd_quantum` are accepted with any value (the modelled CP neither
//! preloads nor time-slices queues of a pipe; a real CP runs a queue without a
//! preload request too). Drivers should write KFD's values
//! ([`abi::mqd::KFD_PERSISTENT_STATE`], [`abi::mqd::KFD_QUANTUM`]), as
//! [`abi::mqd::AqlMqdBuilder`] does.

use crate::backend::QueueErrorReason;
use crate::mem::DmaMemory;
use crate::topology::GpuTopology;
use abi::mqd::{self, V9Mqd};

/// Check an MQD against a topology and the VM's memory. Every guest value is
/// treated as hostile: sizes and addresses use checked or saturating
/// arithmetic, and the first failed rule is returned:
///
/// 1. header is [`mqd::MQD_HEADER_VALUE`] ([`QueueErrorReason::BadMqdHeader`]);
/// 2. `cp_hqd_aql_control` bit 0 set ([`QueueErrorReason::NotAql`]);
/// 3. `QUEUE_SIZE` in [`mqd::MIN_QUEUE_SIZE`]..=[`mqd::MAX_QUEUE_SIZE`], i.e. a
///    ring of 1 KiB (`KFD_MIN_QUEUE_RING_SIZE`) to 2 GiB
///    ([`QueueErrorReason::RingSize`]);
/// 4. the ring lies in VM memory ([`QueueErrorReason::RingOutOfRange`]);
/// 5. the wptr poll and rptr report addresses, when non-zero, hold 8 bytes of
///    VM memory ([`QueueErrorReason::PointerAddrOutOfRange`]);
/// 6. `cp_hqd_ctx_save_size` >= [`abi::mqd::cwsr::cwsr_size`] and `cp_hqd_cntl_stack_size`
///    >= [`abi::mqd::cwsr::ctl_stack_size`] of the topology ([`QueueErrorReason::CwsrTooSmall`]);
/// 7. `cntl_stack_offset <= cntl_stack_size <= ctx_save_size`
///    ([`QueueErrorReason::BadCwsrLayout`]);
/// 8. the whole CWSR area, [`abi::mqd::cwsr::total_area_size`] bytes from
///    `cp_hqd_ctx_save_base_addr` (the save areas of every XCC of the partition,
///    then their debug areas), lies in VM memory ([`QueueErrorReason::CwsrOutOfRange`]);
/// 9. the saved rptr is packet aligned and at most one ring behind the wptr
///    ([`QueueErrorReason::BadPointers`]).
pub fn check_mqd(
    topo: &GpuTopology,
    m: &V9Mqd,
    mem: &dyn DmaMemory,
) -> Result<(), QueueErrorReason> {
    if m.dw[mqd::HEADER] != mqd::MQD_HEADER_VALUE {
        return Err(QueueErrorReason::BadMqdHeader(m.dw[mqd::HEADER]));
    }
    if !m.is_aql() {
        return Err(QueueErrorReason::NotAql);
    }
    check_ring_size(m)?;
    let base = m.ring_base();
    if !mem.contains(base, m.ring_bytes()) {
        return Err(QueueErrorReason::RingOutOfRange { addr: base });
    }
    for addr in [m.wptr_poll_addr(), m.rptr_report_addr()] {
        if addr != 0 && !mem.contains(addr, 8) {
            return Err(QueueErrorReason::PointerAddrOutOfRange { addr });
        }
    }
    check_cwsr(topo, m, mem)?;
    let cus = crate::backend::CuMask::from_mqd(
        m,
        topo.cus_per_xcc,
        topo.ses_per_xcc,
        topo.xccs_per_partition(),
    );
    if cus.count() == 0 {
        return Err(QueueErrorReason::EmptyCuMask);
    }
    if m.read_index().is_none() {
        return Err(QueueErrorReason::BadPointers);
    }
    Ok(())
}

/// Rule 3: the ring size `QUEUE_SIZE` encodes.
fn check_ring_size(m: &V9Mqd) -> Result<(), QueueErrorReason> {
    let queue_size = m.queue_size_field();
    if !(mqd::MIN_QUEUE_SIZE..=mqd::MAX_QUEUE_SIZE).contains(&queue_size) {
        return Err(QueueErrorReason::RingSize { queue_size });
    }
    Ok(())
}

/// Rules 6 to 8: CWSR sizes, layout and range.
fn check_cwsr(topo: &GpuTopology, m: &V9Mqd, mem: &dyn DmaMemory) -> Result<(), QueueErrorReason> {
    let need_ctx = topo.cwsr_size() as u64;
    let need_ctl = topo.ctl_stack_size() as u64;
    let have = m.ctx_save_size() as u64;
    if have < need_ctx {
        return Err(QueueErrorReason::CwsrTooSmall {
            need: need_ctx,
            have,
        });
    }
    let ctl = m.cntl_stack_size() as u64;
    if ctl < need_ctl {
        return Err(QueueErrorReason::CwsrTooSmall {
            need: need_ctl,
            have: ctl,
        });
    }
    if ctl > have || m.cntl_stack_offset() > m.cntl_stack_size() {
        return Err(QueueErrorReason::BadCwsrLayout {
            cntl_stack_offset: m.cntl_stack_offset(),
            cntl_stack_size: m.cntl_stack_size(),
            ctx_save_size: m.ctx_save_size(),
        });
    }
    let cb = m.ctx_save_base();
    if !mem.contains(cb, topo.cwsr_area_bytes(m.ctx_save_size())) {
        return Err(QueueErrorReason::CwsrOutOfRange { addr: cb });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;
    use abi::mqd::AqlMqdBuilder;
    use QueueErrorReason as R;

    const MEM: u64 = 64 << 20;
    const RING: u64 = 0x10_0000;
    const AMDQ: u64 = 0x8000;
    const CTX: u64 = 0x20_0000;

    fn setup() -> (GpuTopology, VecMemory, V9Mqd) {
        let topo = GpuTopology::tiny();
        let mem = VecMemory::new(MEM as usize);
        let m = AqlMqdBuilder {
            mqd_addr: 0x1000,
            ring_base: RING,
            ring_packets: 64,
            amd_queue: AMDQ,
            eop_base: 0x4000,
            ..Default::default()
        }
        .cwsr_for(CTX, topo.cus_per_xcc, topo.ses_per_xcc)
        .build();
        (topo, mem, m)
    }

    fn check(topo: &GpuTopology, mem: &VecMemory, m: &V9Mqd) -> Result<(), R> {
        check_mqd(topo, m, mem)
    }

    #[test]
    fn builder_mqd_is_admitted() {
        let (topo, mem, m) = setup();
        assert_eq!(check(&topo, &mem, &m), Ok(()));
    }

    #[test]
    fn header_and_aql() {
        let (topo, mem, mut m) = setup();
        m.dw[mqd::HEADER] = 0x1234;
        assert_eq!(check(&topo, &mem, &m), Err(R::BadMqdHeader(0x1234)));
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_AQL_CONTROL] = 0;
        assert_eq!(check(&topo, &mem, &m), Err(R::NotAql));
    }

    #[test]
    fn ring_size_limits_are_kfds() {
        let (topo, mem, mut m) = setup();
        // Below KFD_MIN_QUEUE_RING_SIZE (1024 bytes = QUEUE_SIZE 7).
        for qs in [0u32, 1, 4, 6] {
            m.dw[mqd::CP_HQD_PQ_CONTROL] = qs;
            assert_eq!(
                check(&topo, &mem, &m),
                Err(R::RingSize { queue_size: qs }),
                "QUEUE_SIZE {qs}"
            );
        }
        // Above 2 GiB (QUEUE_SIZE 28), up to the 6-bit maximum.
        for qs in [29u32, 40, 63] {
            m.dw[mqd::CP_HQD_PQ_CONTROL] = qs;
            assert_eq!(check(&topo, &mem, &m), Err(R::RingSize { queue_size: qs }));
        }
        // The smallest ring (16 packets) is accepted; other bits of
        // cp_hqd_pq_control are ignored.
        m.dw[mqd::CP_HQD_PQ_CONTROL] = 7 | 5 << 8;
        assert_eq!(check(&topo, &mem, &m), Ok(()));
        // The largest ring is accepted by the size rule; this VM's 64 MiB
        // cannot hold it.
        m.dw[mqd::CP_HQD_PQ_CONTROL] = 28;
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::RingOutOfRange { addr: RING })
        );
    }

    #[test]
    fn ring_size_error_text_gives_the_decoded_size_and_the_limits() {
        let text = R::RingSize { queue_size: 4 }.to_string();
        assert_eq!(
            text,
            "ring size 128 bytes (QUEUE_SIZE 4) is outside the accepted 1024..=2147483648 bytes"
        );
        let text = R::RingSize { queue_size: 63 }.to_string();
        assert!(text.starts_with("ring size 73786976294838206464 bytes (QUEUE_SIZE 63)"));
    }

    /// RAM split around a hole (a VM with RAM above 4 GiB, scaled down):
    /// a queue wholly above the hole is admitted, one touching the hole is not.
    #[test]
    fn a_queue_above_the_hole_is_admitted_and_one_in_the_hole_is_not() {
        use vm_memory::{GuestAddress, GuestMemoryMmap};
        let topo = GpuTopology::tiny();
        let (low, hole_end) = (MEM, 2 * MEM);
        let mem = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), low as usize),
            (GuestAddress(hole_end), MEM as usize),
        ])
        .unwrap();
        let mqd = |base: u64| {
            AqlMqdBuilder {
                mqd_addr: base + 0x1000,
                ring_base: base + RING,
                ring_packets: 64,
                amd_queue: base + AMDQ,
                eop_base: base + 0x4000,
                ..Default::default()
            }
            .cwsr_for(base + CTX, topo.cus_per_xcc, topo.ses_per_xcc)
            .build()
        };
        assert_eq!(
            check_mqd(&topo, &mqd(hole_end), &mem),
            Ok(()),
            "above the hole"
        );
        assert_eq!(check_mqd(&topo, &mqd(0), &mem), Ok(()), "below the hole");
        let mut m = mqd(hole_end);
        m.set64(mqd::CP_HQD_PQ_BASE_LO, mqd::CP_HQD_PQ_BASE_HI, low >> 8);
        assert_eq!(
            check_mqd(&topo, &m, &mem),
            Err(R::RingOutOfRange { addr: low }),
            "a ring in the hole"
        );
        // A CWSR area that starts in RAM below the hole and runs into it.
        let mut m = mqd(hole_end);
        let cb = low - 0x1000;
        m.set64(
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            cb,
        );
        assert_eq!(
            check_mqd(&topo, &m, &mem),
            Err(R::CwsrOutOfRange { addr: cb }),
            "a CWSR area across the hole"
        );
    }

    #[test]
    fn ring_and_pointers_in_memory() {
        let (topo, mem, mut m) = setup();
        m.set64(
            mqd::CP_HQD_PQ_BASE_LO,
            mqd::CP_HQD_PQ_BASE_HI,
            (MEM - 2048) >> 8,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::RingOutOfRange { addr: MEM - 2048 })
        );
        // A base whose ring wraps the address space.
        m.set64(
            mqd::CP_HQD_PQ_BASE_LO,
            mqd::CP_HQD_PQ_BASE_HI,
            u64::MAX >> 8,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::RingOutOfRange {
                addr: u64::MAX << 8
            })
        );
        let (_, _, mut m) = setup();
        m.set64(
            mqd::CP_HQD_PQ_WPTR_POLL_ADDR_LO,
            mqd::CP_HQD_PQ_WPTR_POLL_ADDR_HI,
            u64::MAX - 3,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::PointerAddrOutOfRange { addr: u64::MAX - 3 })
        );
        let (_, _, mut m) = setup();
        m.set64(
            mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
            mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_HI,
            MEM - 4,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::PointerAddrOutOfRange { addr: MEM - 4 })
        );
        // Zero addresses mean "none" and are accepted.
        let (_, _, mut m) = setup();
        m.set64(
            mqd::CP_HQD_PQ_WPTR_POLL_ADDR_LO,
            mqd::CP_HQD_PQ_WPTR_POLL_ADDR_HI,
            0,
        );
        m.set64(
            mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
            mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_HI,
            0,
        );
        assert_eq!(check(&topo, &mem, &m), Ok(()));
    }

    #[test]
    fn cwsr_sizes_and_layout() {
        let (topo, mem, mut m) = setup();
        let ctx = topo.cwsr_size();
        let ctl = topo.ctl_stack_size();
        m.dw[mqd::CP_HQD_CTX_SAVE_SIZE] = ctx - 4096;
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::CwsrTooSmall {
                need: ctx as u64,
                have: (ctx - 4096) as u64
            })
        );
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_CNTL_STACK_SIZE] = ctl - 8;
        m.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = ctl - 8;
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::CwsrTooSmall {
                need: ctl as u64,
                have: (ctl - 8) as u64
            })
        );
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = ctl + 8;
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::BadCwsrLayout {
                cntl_stack_offset: ctl + 8,
                cntl_stack_size: ctl,
                ctx_save_size: ctx
            })
        );
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_CNTL_STACK_SIZE] = ctx + 4096;
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::BadCwsrLayout {
                cntl_stack_offset: ctl,
                cntl_stack_size: ctx + 4096,
                ctx_save_size: ctx
            })
        );
    }

    #[test]
    fn cwsr_area_includes_the_debug_areas() {
        let (topo, mem, mut m) = setup();
        let ctx = topo.cwsr_size() as u64;
        let xccs = topo.num_xcc() as u64;
        let dbg = topo.debug_memory_size() as u64;
        assert!(dbg > 0);
        let total = (xccs * (ctx + dbg)).div_ceil(4096) * 4096;
        assert_eq!(topo.cwsr_area_bytes(ctx as u32), total);
        // Exactly at the end of memory: accepted.
        m.set64(
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            MEM - total,
        );
        assert_eq!(check(&topo, &mem, &m), Ok(()));
        // The save areas fit but the debug areas after them do not.
        let base = MEM - xccs * ctx;
        m.set64(
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            base,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::CwsrOutOfRange { addr: base })
        );
        // A larger declared ctx_save_size moves the debug areas further.
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_CTX_SAVE_SIZE] = (ctx + 4096) as u32;
        m.set64(
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            MEM - total,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::CwsrOutOfRange { addr: MEM - total })
        );
        // A base near the top of the address space does not wrap.
        m.set64(
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            u64::MAX - 4095,
        );
        assert_eq!(
            check(&topo, &mem, &m),
            Err(R::CwsrOutOfRange {
                addr: u64::MAX - 4095
            })
        );
        // Hostile sizes saturate (u32::MAX per XCC is still "too large", not a wrap).
        let (_, _, mut m) = setup();
        m.dw[mqd::CP_HQD_CTX_SAVE_SIZE] = u32::MAX;
        assert_eq!(check(&topo, &mem, &m), Err(R::CwsrOutOfRange { addr: CTX }));
    }

    #[test]
    fn saved_pointers() {
        let (topo, mem, mut m) = setup();
        m.dw[mqd::CP_HQD_PQ_RPTR] = 3;
        assert_eq!(check(&topo, &mem, &m), Err(R::BadPointers));
        let (_, _, mut m) = setup();
        m.set_write_index(200);
        m.set_read_index(100); // further apart than the 64-packet ring
        assert_eq!(check(&topo, &mem, &m), Err(R::BadPointers));
        m.set_read_index(136);
        assert_eq!(check(&topo, &mem, &m), Ok(()));
    }

    #[test]
    fn a_cu_mask_that_selects_no_cu_is_refused_and_one_cu_is_enough() {
        let (topo, mem, mut m) = setup();
        for dw in abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE {
            m.dw[dw] = 0;
        }
        assert_eq!(check(&topo, &mem, &m), Err(R::EmptyCuMask));
        m.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[0]] = 1;
        assert_eq!(check(&topo, &mem, &m), Ok(()));
    }

    #[test]
    fn persistent_state_and_quantum_are_accepted_as_written() {
        let (topo, mem, mut m) = setup();
        assert_eq!(
            m.dw[mqd::CP_HQD_PERSISTENT_STATE],
            mqd::KFD_PERSISTENT_STATE
        );
        assert_eq!(m.dw[mqd::CP_HQD_QUANTUM], mqd::KFD_QUANTUM);
        for (ps, q) in [(0x0BE0_5501, 0x111), (0, 0), (u32::MAX, u32::MAX)] {
            m.dw[mqd::CP_HQD_PERSISTENT_STATE] = ps;
            m.dw[mqd::CP_HQD_QUANTUM] = q;
            assert_eq!(check(&topo, &mem, &m), Ok(()), "{ps:#x} {q:#x}");
        }
    }

    /// MQD dwords the rules read, with values biased to the interesting edges.
    fn hostile_dword() -> impl proptest::strategy::Strategy<Value = u32> {
        use proptest::prelude::*;
        prop_oneof![
            any::<u32>(),
            0u32..64,
            Just(u32::MAX),
            ((MEM - 0x10_0000) as u32)..(MEM as u32),
            Just(0x10_0000 >> 8),
        ]
    }

    proptest::proptest! {
        /// Whatever a guest writes into the fields admission reads, the check
        /// never panics, and an admitted MQD satisfies every documented rule
        /// (checked here independently, with u128 arithmetic).
        #[test]
        fn admitted_mqds_satisfy_every_rule(
            // Each field keeps the builder's (valid) value with probability
            // 0.8, so admitted MQDs with a few hostile fields are common.
            fields in proptest::collection::vec(proptest::option::weighted(0.2, hostile_dword()), 14),
        ) {
            let (topo, mem, mut m) = setup();
            let dws = [
                mqd::CP_HQD_PQ_BASE_LO,
                mqd::CP_HQD_PQ_BASE_HI,
                mqd::CP_HQD_PQ_RPTR,
                mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
                mqd::CP_HQD_PQ_WPTR_POLL_ADDR_LO,
                mqd::CP_HQD_PQ_CONTROL,
                mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
                mqd::CP_HQD_CTX_SAVE_BASE_ADDR_HI,
                mqd::CP_HQD_CNTL_STACK_OFFSET,
                mqd::CP_HQD_CNTL_STACK_SIZE,
                mqd::CP_HQD_CTX_SAVE_SIZE,
                mqd::CP_HQD_PQ_WPTR_LO,
                mqd::CP_HQD_PQ_WPTR_HI,
                mqd::CP_HQD_PERSISTENT_STATE,
            ];
            for (d, v) in dws.iter().zip(fields) {
                if let Some(v) = v {
                    m.dw[*d] = v;
                }
            }
            if check(&topo, &mem, &m).is_ok() {
                let in_mem = |a: u64, len: u128| a as u128 + len <= MEM as u128;
                let qs = m.queue_size_field();
                proptest::prop_assert!((7..=28).contains(&qs));
                proptest::prop_assert!(in_mem(m.ring_base(), 1u128 << (qs + 3)));
                for a in [m.wptr_poll_addr(), m.rptr_report_addr()] {
                    proptest::prop_assert!(a == 0 || in_mem(a, 8));
                }
                let ctx = m.ctx_save_size() as u128;
                let dbg = topo.debug_memory_size() as u128;
                let xccs = topo.num_xcc() as u128;
                proptest::prop_assert!(ctx >= topo.cwsr_size() as u128);
                proptest::prop_assert!(m.cntl_stack_size() >= topo.ctl_stack_size());
                proptest::prop_assert!(m.cntl_stack_offset() <= m.cntl_stack_size());
                proptest::prop_assert!(m.cntl_stack_size() as u128 <= ctx);
                proptest::prop_assert!(in_mem(m.ctx_save_base(), (ctx + dbg) * xccs));
                proptest::prop_assert!(m.read_index().is_some());
            }
        }
    }

    #[test]
    fn rules_apply_in_documented_order() {
        // A bad header wins over every later rule; a bad ring size over a
        // ring out of range; CWSR sizes over the CWSR range.
        let (topo, mem, mut m) = setup();
        m.dw[mqd::CP_HQD_PQ_CONTROL] = 2;
        m.dw[mqd::CP_HQD_CTX_SAVE_SIZE] = 0;
        m.dw[mqd::HEADER] = 0;
        assert_eq!(check(&topo, &mem, &m), Err(R::BadMqdHeader(0)));
        m.dw[mqd::HEADER] = mqd::MQD_HEADER_VALUE;
        assert_eq!(check(&topo, &mem, &m), Err(R::RingSize { queue_size: 2 }));
        m.dw[mqd::CP_HQD_PQ_CONTROL] = 9;
        assert!(matches!(
            check(&topo, &mem, &m),
            Err(R::CwsrTooSmall { .. })
        ));
    }
}
