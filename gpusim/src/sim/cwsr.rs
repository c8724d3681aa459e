//! CWSR control records.
//!
//! The real CP writes a control stack (40-byte header + 8 bytes per wave, filled
//! downward from `cntl_stack_size` to `cntl_stack_offset`) and wave state (VGPRs,
//! SGPRs, LDS, HWREGs; ~22 MiB per XCC on MI300X). The simulator writes only a
//! small hqdmux-defined control record into the same control-stack region of
//! XCC 0's area and *models* the byte count of the wave state:
//!
//! ```text
//! header  (32 B): magic "HQCS" u32, version u16, flags u16, n_packets u32,
//!                 n_wgs u32, rptr u64, checksum u64
//! packet  (32 B): dispatch_id u64, next_wg u64, done_wgs u64, flags u32 (1 = complete), 0 u32
//! wg      (24 B): dispatch_id u64, wg u64, remaining_ns u64
//! ```
//!
//! The records occupy `[base + cntl_stack_offset, base + cntl_stack_size)`; the
//! MQD's `cntl_stack_offset` is lowered accordingly (KFD initialises it to the
//! size: empty stack). Restore validates everything it reads back: the area is in
//! guest memory and may have been altered.

use super::{decode_work, Active, Hqd, QResult, SavedWg, Work};
use crate::backend::QueueErrorReason;
use crate::params::{control_record_bytes, SimParams};
use crate::topology::GpuTopology;
use abi::aql::{Packet, PACKET_SIZE};
use abi::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use abi::mqd;
use std::collections::VecDeque;

/// Control record magic ("HQCS").
pub const SAVE_MAGIC: u32 = u32::from_le_bytes(*b"HQCS");
/// Control record version.
pub const SAVE_VERSION: u16 = 1;
const HDR: usize = 32;
const PKT: usize = 32;
const WG: usize = 24;
// The record layout and the size the topology checks against must agree.
const _: () = assert!(HDR == 32 && PKT == 32 && WG == 24);
/// Upper bound on a saved remaining time (2^48 ns ~ 3 days).
const MAX_REMAINING: u64 = 1 << 48;

pub(super) fn checksum(b: &[u8]) -> u64 {
    // FNV-1a, 64 bit.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Drops trailing packets without progress from the window (see
/// [`write_save`]).
fn trim(q: &mut Hqd) {
    while q
        .active
        .back()
        .is_some_and(|a| !a.complete && a.next_wg == 0 && a.done_wgs == 0 && a.inflight == 0)
    {
        q.active.pop_back();
    }
}

/// The bytes [`write_save`] will write for the queue as it is now (0 if
/// none), without writing them: a save dequeue's modelled time is known at
/// the request, its records are written when it finishes.
pub(super) fn save_bytes(q: &mut Hqd) -> u64 {
    trim(q);
    if q.active.is_empty() && q.resume.is_empty() {
        return 0;
    }
    control_record_bytes(q.active.len() as u32, q.resume.len() as u32)
}

/// Write the queue's dispatch progress; returns the record bytes (0 if none).
///
/// Trailing packets without progress (not complete, no workgroup dispatched)
/// are dropped from the window first: the CP refetches them from the ring at
/// the next map, as it would any unread packet.
pub(super) fn write_save(q: &mut Hqd, _topo: &GpuTopology) -> QResult<u64> {
    let size = q.mqd.cntl_stack_size();
    trim(q);
    if q.active.is_empty() && q.resume.is_empty() {
        q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = size;
        return Ok(0);
    }
    let total = control_record_bytes(q.active.len() as u32, q.resume.len() as u32) as usize;
    if total as u64 > size as u64 {
        return Err(QueueErrorReason::CwsrTooSmall {
            need: total as u64,
            have: size as u64,
        });
    }
    let mut b = vec![0u8; total];
    put_u32(&mut b, 0, SAVE_MAGIC);
    put_u16(&mut b, 4, SAVE_VERSION);
    put_u32(&mut b, 8, q.active.len() as u32);
    put_u32(&mut b, 12, q.resume.len() as u32);
    put_u64(&mut b, 16, q.rptr);
    let mut o = HDR;
    for a in &q.active {
        put_u64(&mut b, o, a.id);
        put_u64(&mut b, o + 8, a.next_wg);
        put_u64(&mut b, o + 16, a.done_wgs);
        put_u32(&mut b, o + 24, a.complete as u32);
        o += PKT;
    }
    for w in &q.resume {
        put_u64(&mut b, o, w.id);
        put_u64(&mut b, o + 8, w.wg);
        put_u64(&mut b, o + 16, w.remaining);
        o += WG;
    }
    let c = checksum(&b[HDR..]);
    put_u64(&mut b, 24, c);
    let off = size - total as u32;
    let addr = q.mqd.ctx_save_base().saturating_add(off as u64);
    q.mem
        .write(addr, &b)
        .map_err(|_| QueueErrorReason::CwsrOutOfRange { addr })?;
    q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = off;
    Ok(total as u64)
}

/// Read and validate saved records into `q`. Returns the modelled restore time
/// if there are saved workgroups to restore, `None` if the records hold only
/// packet progress (DrainPipe / ResetWaves, or a save with nothing in flight):
/// with no waves to relaunch the CP takes them as part of the load, at no cost.
pub(super) fn read_save(
    q: &mut Hqd,
    topo: &GpuTopology,
    params: &SimParams,
) -> QResult<Option<u64>> {
    let size = q.mqd.cntl_stack_size();
    let (active, resume, total) = parse_save(&q.mqd, &*q.mem, topo, params, q.rptr, q.wptr)?;
    let nw = resume.len();
    q.active = active;
    q.resume = resume.into();
    q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = size;
    if nw == 0 {
        return Ok(None);
    }
    let xccs = topo.xccs_per_partition() as u64;
    let busiest = (nw as u64).div_ceil(xccs);
    let c = &topo.cwsr;
    // Each workgroup restores its share of a CU's state (occupancy).
    let per_wg = q
        .resume
        .iter()
        .map(|sw| {
            q.active
                .get(sw.id.wrapping_sub(q.rptr) as usize)
                .and_then(|a| match a.work {
                    Work::Dispatch(d) => Some(d.fp.state_bytes(c.wg_state_bytes)),
                    _ => None,
                })
                .unwrap_or(c.wg_state_bytes)
        })
        .max()
        .unwrap_or(c.wg_state_bytes);
    let bytes = (total as u64).saturating_add(busiest.saturating_mul(per_wg));
    Ok(Some(c.restore_ns.saturating_add(
        bytes.saturating_mul(1000) / c.restore_bytes_per_us,
    )))
}

/// Reads and validates the control record of `m` (a queue at `rptr`,
/// written up to `wptr`) without changing anything: the packet window, the
/// saved workgroups (sorted) and the record's size. Anything wrong is
/// [`QueueErrorReason::BadSavedState`] (or a layout / range error).
pub(super) fn parse_save(
    m: &abi::mqd::V9Mqd,
    mem: &dyn crate::mem::DmaMemory,
    topo: &GpuTopology,
    params: &SimParams,
    rptr: u64,
    wptr: u64,
) -> QResult<(VecDeque<Active>, Vec<SavedWg>, usize)> {
    let bad = QueueErrorReason::BadSavedState;
    let size = m.cntl_stack_size();
    let off = m.cntl_stack_offset();
    // off <= size is checked at map; checked again (never trust, never panic).
    let total = size
        .checked_sub(off)
        .ok_or(QueueErrorReason::BadCwsrLayout {
            cntl_stack_offset: off,
            cntl_stack_size: size,
            ctx_save_size: m.ctx_save_size(),
        })? as u64;
    // Bound the host allocation by the largest record this topology writes
    // before reading anything (the offset is guest-controlled: up to 4 GiB).
    if total > params.max_control_record_bytes(topo) {
        return Err(bad("control stack larger than the largest record"));
    }
    let total = total as usize;
    if total < HDR {
        return Err(bad("control stack shorter than its header"));
    }
    let base = m.ctx_save_base();
    let mut b = vec![0u8; total];
    mem.read(base.saturating_add(off as u64), &mut b)
        .map_err(|_| QueueErrorReason::CwsrOutOfRange { addr: base })?;
    if u32_at(&b, 0) != SAVE_MAGIC {
        return Err(bad("bad magic"));
    }
    if u16_at(&b, 4) != SAVE_VERSION {
        return Err(bad("bad version"));
    }
    let np = u32_at(&b, 8) as usize;
    let nw = u32_at(&b, 12) as usize;
    if np > params.max_active_packets as usize || nw > topo.cus_per_partition() as usize {
        return Err(bad("record counts out of range"));
    }
    if control_record_bytes(np as u32, nw as u32) != total as u64 {
        return Err(bad("record counts do not match the stack size"));
    }
    if u64_at(&b, 24) != checksum(&b[HDR..]) {
        return Err(bad("checksum mismatch"));
    }
    if u64_at(&b, 16) != rptr {
        return Err(bad("saved rptr differs from the MQD"));
    }
    if rptr.saturating_add(np as u64) > wptr {
        return Err(bad("saved packets beyond the write index"));
    }
    let mut active = VecDeque::with_capacity(np);
    let mut o = HDR;
    for i in 0..np {
        let id = u64_at(&b, o);
        let next_wg = u64_at(&b, o + 8);
        let done_wgs = u64_at(&b, o + 16);
        let flags = u32_at(&b, o + 24);
        o += PKT;
        if id != rptr + i as u64 || flags > 1 || done_wgs > next_wg {
            return Err(bad("malformed packet record"));
        }
        let a = if flags == 1 {
            Active {
                id,
                work: Work::Done,
                signal: 0,
                next_wg,
                done_wgs,
                inflight: 0,
                complete: true,
                batch: None,
            }
        } else {
            let mut raw = [0u8; PACKET_SIZE];
            let addr = m.packet_addr(id);
            mem.read(addr, &mut raw)
                .map_err(|_| QueueErrorReason::RingOutOfRange { addr })?;
            let mut a = decode_work(mem, id, &Packet::decode(&raw))?;
            match a.work {
                Work::Dispatch(d) if next_wg <= d.total => {}
                Work::And(_) | Work::Or(_) if next_wg == 0 && done_wgs == 0 => {}
                _ => return Err(bad("packet record does not match the ring")),
            }
            a.next_wg = next_wg;
            a.done_wgs = done_wgs;
            a
        };
        active.push_back(a);
    }
    let mut resume = Vec::with_capacity(nw);
    let mut per_packet = vec![0u64; np];
    for _ in 0..nw {
        let w = SavedWg {
            id: u64_at(&b, o),
            wg: u64_at(&b, o + 8),
            remaining: u64_at(&b, o + 16),
        };
        o += WG;
        let k = w.id.wrapping_sub(rptr) as usize;
        let Some(a) = active.get(k) else {
            return Err(bad("workgroup of unknown packet"));
        };
        if a.complete || w.wg >= a.next_wg || w.remaining > MAX_REMAINING {
            return Err(bad("malformed workgroup record"));
        }
        per_packet[k] += 1;
        resume.push(w);
    }
    resume.sort_unstable();
    if resume
        .windows(2)
        .any(|p| p[0].id == p[1].id && p[0].wg == p[1].wg)
    {
        return Err(bad("duplicate workgroup record"));
    }
    for (a, n) in active.iter().zip(&per_packet) {
        if !a.complete && a.done_wgs + n != a.next_wg {
            return Err(bad("workgroup accounting does not add up"));
        }
    }
    Ok((active, resume, total))
}
