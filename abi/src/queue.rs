//! ROCr `amd_queue_t` and `amd_signal_t` layouts (ROCR-Runtime `amd_hsa_queue.h`,
//! `amd_hsa_signal.h`).
//!
//! ROCr passes `&amd_queue.write_dispatch_id` to KFD as the queue's write pointer
//! (-> MQD `cp_hqd_pq_wptr_poll_addr`) and `&amd_queue.read_dispatch_id` as its read
//! pointer (-> MQD `cp_hqd_pq_rptr_report_addr`). The simulated CP therefore reads
//! the write index (in packets) at the wptr poll address and reports the read
//! index (in packets, a u64) at the rptr report address.

/// Size of `amd_queue_t` in bytes (it is 64-byte aligned, 256 bytes long).
pub const AMD_QUEUE_SIZE: usize = 256;
/// `hsa_queue_t.base_address` (u64): ring buffer address.
pub const AMD_QUEUE_BASE_ADDRESS: usize = 8;
/// `hsa_queue_t.size` (u32): ring size in packets (power of two).
pub const AMD_QUEUE_SIZE_PACKETS: usize = 24;
/// `amd_queue_t.write_dispatch_id` (u64): producer's write index, in packets.
pub const AMD_QUEUE_WRITE_DISPATCH_ID: usize = 0x38;
/// `amd_queue_t.read_dispatch_id` (u64): consumer's read index, in packets.
pub const AMD_QUEUE_READ_DISPATCH_ID: usize = 0x80;

/// Size of `amd_signal_t` in bytes.
pub const AMD_SIGNAL_SIZE: usize = 64;
/// Alignment ROCr gives every `amd_signal_t` (`AMD_SIGNAL_ALIGN_BYTES`).
pub const AMD_SIGNAL_ALIGN: u64 = 64;
/// `amd_signal_t.kind` (i64): `AMD_SIGNAL_KIND_USER` = 1 for a memory signal.
pub const AMD_SIGNAL_KIND: usize = 0;
/// `AMD_SIGNAL_KIND_USER`.
pub const AMD_SIGNAL_KIND_USER: i64 = 1;
/// `amd_signal_t.value` (i64). Packet completion decrements it by one.
pub const AMD_SIGNAL_VALUE: usize = 8;
/// `amd_signal_t.event_mailbox_ptr` (u64): where an interrupt signal's
/// completion writes `event_id` (0 = none).
pub const AMD_SIGNAL_EVENT_MAILBOX_PTR: usize = 0x10;
/// `amd_signal_t.event_id` (u32): the value written to the mailbox.
pub const AMD_SIGNAL_EVENT_ID: usize = 0x18;
/// `amd_signal_t.start_ts` (u64).
pub const AMD_SIGNAL_START_TS: usize = 0x20;
/// `amd_signal_t.end_ts` (u64).
pub const AMD_SIGNAL_END_TS: usize = 0x28;

/// Build a minimal 256-byte `amd_queue_t` image (base address, size, zero indices).
pub fn amd_queue_image(ring_base: u64, size_packets: u32) -> [u8; AMD_QUEUE_SIZE] {
    let mut b = [0u8; AMD_QUEUE_SIZE];
    crate::le::put_u64(&mut b, AMD_QUEUE_BASE_ADDRESS, ring_base);
    crate::le::put_u32(&mut b, AMD_QUEUE_SIZE_PACKETS, size_packets);
    b
}

/// Build a 64-byte `amd_signal_t` image with the given initial value (kind
/// left 0, no mailbox).
pub fn amd_signal_image(value: i64) -> [u8; AMD_SIGNAL_SIZE] {
    let mut b = [0u8; AMD_SIGNAL_SIZE];
    crate::le::put_u64(&mut b, AMD_SIGNAL_VALUE, value as u64);
    b
}

/// Build a 64-byte `amd_signal_t` image of an interrupt signal: kind USER,
/// `value`, and the mailbox that receives `event_id` at completion.
pub fn amd_interrupt_signal_image(
    value: i64,
    mailbox: u64,
    event_id: u32,
) -> [u8; AMD_SIGNAL_SIZE] {
    let mut b = amd_signal_image(value);
    crate::le::put_u64(&mut b, AMD_SIGNAL_KIND, AMD_SIGNAL_KIND_USER as u64);
    crate::le::put_u64(&mut b, AMD_SIGNAL_EVENT_MAILBOX_PTR, mailbox);
    crate::le::put_u32(&mut b, AMD_SIGNAL_EVENT_ID, event_id);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn images() {
        let q = amd_queue_image(0x1000, 64);
        assert_eq!(crate::le::u64_at(&q, 8), 0x1000);
        assert_eq!(crate::le::u32_at(&q, 24), 64);
        let s = amd_signal_image(-3);
        assert_eq!(crate::le::u64_at(&s, 8) as i64, -3);
        let s = amd_interrupt_signal_image(1, 0xABC0, 7);
        assert_eq!(crate::le::u64_at(&s, 0), 1);
        assert_eq!(crate::le::u64_at(&s, 8), 1);
        assert_eq!(crate::le::u64_at(&s, 16), 0xABC0);
        assert_eq!(crate::le::u32_at(&s, 24), 7);
        assert_eq!(crate::le::u32_at(&s, 28), 0);
    }
}
