//! Hostile clients, each beside a well-behaved vGPU on the same arbiter
//! that must keep running its kernels exactly once (`TestVm::verify`).

use super::*;

/// The good vGPU runs `n` more kernels, each verified (marks exactly once).
fn good_runs(g: &mut Guest, seed: u32) {
    g.run_small(seed, "good kernels");
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ERROR)), 0);
}

/// A guest attached to `srv` with vHQD 0 loaded that ran kernels (`seed`).
fn running_guest(srv: &VgpuServer, a: &GpuArbiter, seed: u32) -> Guest {
    let mut g = Guest::attach(srv.path(), a.topology());
    g.load(0);
    good_runs(&mut g, seed);
    g
}

/// A hostile vGPU (`bad`) beside a good one whose guest already ran
/// kernels, on one arbiter; both stop when dropped.
fn pair(tag: &str) -> (Arc<GpuArbiter>, Served, Served, Guest) {
    let (a, bad, good) = two_tenants(tag);
    let g = running_guest(&good, &a, 1);
    (a, bad, good, g)
}

/// A message with `fds` attached; returns the reply.
fn with_fds(s: &mut UnixStream, m: &[u8], fds: &[RawFd]) -> (Header, Vec<u8>) {
    s.send_with_fds(&[m], fds).unwrap();
    reply(s)
}

fn set_irqs_msg(flags: u32, index: u32, start: u32, count: u32) -> Vec<u8> {
    let mut m = header(2, cmd::DEVICE_SET_IRQS, 36, 0);
    for v in [20, flags, index, start, count] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m
}

fn closed(s: &mut UnixStream) -> bool {
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).is_ok()
}

#[test]
fn bad_framing_ends_only_that_connection() {
    let (_a, bad, good, mut g) = pair("frame");
    // Sizes the stream cannot be resynchronised after: an error, then EOF.
    for (i, size) in [0u32, 15, 4097, u32::MAX].into_iter().enumerate() {
        let mut s = UnixStream::connect(bad.path()).unwrap();
        s.write_all(&header(3, cmd::VERSION, size, 0)).unwrap();
        let (h, _) = reply(&mut s);
        assert!(is_error(&h, libc::EINVAL), "size {size}");
        assert_eq!(h.id, 3);
        assert!(closed(&mut s));
        wait("dropped", || bad.stats().dropped == i as u64 + 1);
        good_runs(&mut g, 10 + i as u32);
    }
    // A truncated header, then the client goes: the connection just ends.
    let mut s = UnixStream::connect(bad.path()).unwrap();
    s.write_all(&header(3, cmd::VERSION, 20, 0)[..7]).unwrap();
    drop(s);
    wait("released", || {
        bad.stats().connections == 5 && bad.handle().is_none()
    });
    // A length larger than the body sent, then a half-close: EOF mid-body.
    let mut s = UnixStream::connect(bad.path()).unwrap();
    s.write_all(&header(3, cmd::DEVICE_GET_INFO, 32, 0))
        .unwrap();
    s.write_all(&[0; 5]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));
    wait("released", || {
        bad.stats().connections == 6 && bad.handle().is_none()
    });
    good_runs(&mut g, 20);
    // Replies sent as commands, unknown types, ids echoed, NO_REPLY kept.
    let mut s = UnixStream::connect(bad.path()).unwrap();
    for flags in [
        wire::TYPE_REPLY,
        2,
        0xF,
        wire::TYPE_REPLY | wire::FLAG_ERROR,
    ] {
        s.write_all(&header(0xFFFF, cmd::DEVICE_RESET, 16, flags))
            .unwrap();
        let (h, _) = reply(&mut s);
        assert!(is_error(&h, libc::EINVAL), "flags {flags:#x}");
        assert_eq!(h.id, 0xFFFF);
    }
    assert_eq!(bad.stats().resets, 0, "a reply is never acted on");
    let mut m = header(5, cmd::DEVICE_GET_INFO, 32, wire::FLAG_NO_REPLY);
    m.extend_from_slice(&[0; 16]);
    s.write_all(&m).unwrap();
    let mut m = header(6, cmd::DEVICE_GET_INFO, 32, 0);
    m.extend_from_slice(&[0; 16]);
    s.write_all(&m).unwrap();
    let (h, _) = reply(&mut s);
    assert_eq!((h.id, h.flags), (6, wire::TYPE_REPLY), "no reply to id 5");
    // Zero-length bodies where one is needed, bodies where none is.
    for c in [
        cmd::VERSION,
        cmd::DMA_MAP,
        cmd::DMA_UNMAP,
        cmd::DEVICE_GET_INFO,
        cmd::DEVICE_GET_REGION_INFO,
        cmd::DEVICE_GET_IRQ_INFO,
        cmd::DEVICE_SET_IRQS,
        cmd::REGION_READ,
        cmd::REGION_WRITE,
    ] {
        let (h, _) = raw(&mut s, c, &[], None);
        assert!(h.flags & wire::FLAG_ERROR != 0, "command {c}");
    }
    let (h, _) = raw(&mut s, cmd::DEVICE_RESET, &[0; 4], None);
    assert!(is_error(&h, libc::EINVAL));
    for c in [0u16, 15, 0xFFFF] {
        assert!(is_error(&raw(&mut s, c, &[0; 8], None).0, libc::ENOSYS));
    }
    // Huge counts.
    for (off, region, count) in [
        (0, wire::REGION_BAR0, u32::MAX),
        (u64::MAX, wire::REGION_CONFIG, 1),
        (0, wire::REGION_CONFIG, 3),
    ] {
        let (h, _) = raw(&mut s, cmd::REGION_READ, &access(off, region, count), None);
        assert!(is_error(&h, libc::EINVAL), "{off:#x} {region} {count}");
    }
    good_runs(&mut g, 21);
    assert_eq!(good.stats().error_replies, 0);
}

#[test]
fn fd_abuse_and_hostile_dma_maps_get_errors() {
    let (_a, bad, _good, mut g) = pair("fds");
    let mut s = UnixStream::connect(bad.path()).unwrap();
    let ram = memfd(0x4000);
    // Fds with a command that takes none; more than MAX_FDS at once.
    let many: Vec<RawFd> = (0..wire::MAX_FDS + 4).map(|_| ram.as_raw_fd()).collect();
    let mut m = header(1, cmd::DEVICE_GET_INFO, 32, 0);
    m.extend_from_slice(&[0; 16]);
    for n in [1, wire::MAX_FDS, wire::MAX_FDS + 4] {
        let r = with_fds(&mut s, &m, &many[..n]);
        assert!(
            r.0.flags & wire::FLAG_ERROR != 0 || n > wire::MAX_FDS,
            "{n} fds"
        );
    }
    // Two fds with one map.
    let (h, _) = with_fds(&mut s, &dma_map_msg(0, 0, 0x1000), &many[..2]);
    assert!(is_error(&h, libc::EINVAL));
    // Not shmem: a pipe, a directory; shmem with no size.
    let (pr, _pw) = std::io::pipe().unwrap();
    let dir = File::open("/").unwrap();
    let empty = memfd(0);
    for fd in [pr.as_raw_fd(), dir.as_raw_fd(), empty.as_raw_fd()] {
        let (h, _) = with_fds(&mut s, &dma_map_msg(0, 0, 0x1000), &[fd]);
        assert!(is_error(&h, libc::EINVAL), "fd {fd}");
    }
    // Past the end, wrapping, unaligned, zero size.
    for (off, addr, size) in [
        (0x1000, 0, 0x4000),
        (!0xFFFu64, 0, 0x1000),
        (0, !0xFFFu64, 0x2000),
        (0x800, 0, 0x1000),
        (0, 0x800, 0x1000),
        (0, 0, 0x800),
        (0, 0, 0),
    ] {
        let (h, _) = with_fds(&mut s, &dma_map_msg(off, addr, size), &[ram.as_raw_fd()]);
        assert!(is_error(&h, libc::EINVAL), "{off:#x} {addr:#x} {size:#x}");
    }
    // 256 maps, then the 257th is refused; overlaps too.
    for i in 0..dma::MAX_MAPPINGS as u64 {
        let (h, _) = with_fds(&mut s, &dma_map_msg(0, i << 20, 0x1000), &[ram.as_raw_fd()]);
        assert_eq!(h.flags, wire::TYPE_REPLY, "map {i}");
    }
    let (h, _) = with_fds(&mut s, &dma_map_msg(0, 1 << 40, 0x1000), &[ram.as_raw_fd()]);
    assert!(is_error(&h, libc::ENOSPC));
    let mut un = 24u32.to_le_bytes().to_vec();
    un.extend_from_slice(&0u32.to_le_bytes());
    un.extend_from_slice(&(3u64 << 20).to_le_bytes());
    un.extend_from_slice(&0x1000u64.to_le_bytes());
    assert_eq!(
        raw(&mut s, cmd::DMA_UNMAP, &un, None).0.flags,
        wire::TYPE_REPLY
    );
    let (h, _) = with_fds(
        &mut s,
        &dma_map_msg(0, (4 << 20) - 0x1000, 0x2000),
        &[ram.as_raw_fd()],
    );
    assert!(is_error(&h, libc::EEXIST), "overlap");
    good_runs(&mut g, 2);
    // The connection still serves.
    still_serves(&mut s);
    assert_eq!(bad.stats().dropped, 0);
}

#[test]
fn hostile_set_irqs_and_region_edges_get_errors() {
    let (_a, bad, _good, mut g) = pair("irqs");
    let mut s = UnixStream::connect(bad.path()).unwrap();
    let efd = EventFd::new(EFD_NONBLOCK).unwrap();
    let (pr, _pw) = std::io::pipe().unwrap();
    let trig = wire::IRQ_SET_DATA_EVENTFD | wire::IRQ_SET_ACTION_TRIGGER;
    let n = NUM_VECTORS as u32;
    for (flags, index, start, count, fds) in [
        (trig, wire::NUM_IRQS, 0, 1, vec![efd.as_raw_fd()]),
        (trig, u32::MAX, 0, 1, vec![efd.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, n, 1, vec![efd.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, u32::MAX, 1, vec![efd.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, 0, u32::MAX, vec![efd.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, 0, 2, vec![efd.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, 0, 1, vec![pr.as_raw_fd()]),
        (trig, wire::IRQ_MSIX, 0, 2, vec![efd.as_raw_fd()]),
        (
            wire::IRQ_SET_DATA_NONE | wire::IRQ_SET_ACTION_TRIGGER,
            wire::IRQ_MSIX,
            0,
            1,
            vec![efd.as_raw_fd()],
        ),
        (trig | 1 << 6, wire::IRQ_MSIX, 0, 1, vec![efd.as_raw_fd()]),
        (
            trig | wire::IRQ_SET_ACTION_MASK,
            wire::IRQ_MSIX,
            0,
            1,
            vec![efd.as_raw_fd()],
        ),
        (
            wire::IRQ_SET_DATA_NONE | wire::IRQ_SET_ACTION_MASK,
            wire::IRQ_MSIX,
            0,
            n + 1,
            vec![],
        ),
        (trig, 0, 0, 1, vec![efd.as_raw_fd()]),
    ] {
        let (h, _) = with_fds(&mut s, &set_irqs_msg(flags, index, start, count), &fds);
        assert!(
            is_error(&h, libc::EINVAL),
            "{flags:#x} {index} {start} {count}"
        );
    }
    // Eventfd data with no fds is a run of `-1` fds (QEMU's client enables
    // MSI-X this way): those vectors lose their eventfds, no error.
    let (h, _) = with_fds(&mut s, &set_irqs_msg(trig, wire::IRQ_MSIX, 0, 1), &[]);
    assert_eq!(h.flags, wire::TYPE_REPLY);
    let (h, _) = raw(
        &mut s,
        cmd::DEVICE_SET_IRQS,
        &set_irqs_msg(
            wire::IRQ_SET_DATA_BOOL | wire::IRQ_SET_ACTION_TRIGGER,
            2,
            0,
            1,
        )[16..],
        None,
    );
    assert!(is_error(&h, libc::ENOTSUP));
    // Masking every vector at once is legal.
    let m = set_irqs_msg(
        wire::IRQ_SET_DATA_NONE | wire::IRQ_SET_ACTION_MASK,
        wire::IRQ_MSIX,
        0,
        n,
    );
    assert_eq!(
        raw(&mut s, cmd::DEVICE_SET_IRQS, &m[16..], None).0.flags,
        wire::TYPE_REPLY
    );
    // Region edges: the last bytes of each region are served, one past is refused.
    for (region, size) in [
        (wire::REGION_BAR0, BAR0_SIZE),
        (wire::REGION_BAR2, BAR2_SIZE),
        (wire::REGION_CONFIG, abi::config_space::CONFIG_BYTES as u64),
    ] {
        for count in [1u32, 2, 4, 8] {
            let ok = raw(
                &mut s,
                cmd::REGION_READ,
                &access(size - u64::from(count), region, count),
                None,
            );
            assert_eq!(ok.0.flags, wire::TYPE_REPLY, "{region} {count}");
            assert_eq!(ok.1.len(), 16 + count as usize);
            let over = raw(
                &mut s,
                cmd::REGION_READ,
                &access(size - u64::from(count) + 1, region, count),
                None,
            );
            assert!(is_error(&over.0, libc::EINVAL), "{region} {count}");
            let mut w = access(size - u64::from(count), region, count);
            w.extend(std::iter::repeat_n(0xFFu8, count as usize));
            let ok = raw(&mut s, cmd::REGION_WRITE, &w, None);
            assert_eq!(ok.0.flags, wire::TYPE_REPLY, "write {region} {count}");
        }
    }
    // Misaligned register and config accesses inside the regions.
    for (off, region, count) in [
        (1, wire::REGION_BAR0, 4),
        (3, wire::REGION_CONFIG, 4),
        (2, wire::REGION_BAR0, 8),
    ] {
        let r = raw(&mut s, cmd::REGION_READ, &access(off, region, count), None);
        assert_eq!(r.0.flags, wire::TYPE_REPLY);
    }
    good_runs(&mut g, 3);
}

#[test]
fn silent_half_closed_and_storming_clients_cost_nothing() {
    let (a, bad, _good, mut g) = pair("storm");
    // Connects and never speaks: its own vGPU waits, the other runs.
    let silent = UnixStream::connect(bad.path()).unwrap();
    wait("accepted", || bad.stats().connections == 1);
    good_runs(&mut g, 2);
    assert_eq!(bad.handle(), None, "registered only at its first byte");
    assert_eq!(bad.stats().registrations, 0);
    // Half-closes: the server sees the end and takes the next client.
    silent.shutdown(std::net::Shutdown::Write).unwrap();
    drop(silent);
    // Speaks, then half-closes: registered, then released.
    let mut s = UnixStream::connect(bad.path()).unwrap();
    still_serves(&mut s);
    assert!(bad.handle().is_some());
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));
    wait("released", || bad.handle().is_none());
    // A reconnect storm: every connection registers and leaves again.
    let before = bad.stats().registrations;
    for _ in 0..200 {
        drop(UnixStream::connect(bad.path()).unwrap());
    }
    wait("storm served", || {
        bad.stats().connections == 202 && bad.handle().is_none()
    });
    assert_eq!(
        bad.stats().registrations,
        before,
        "no byte, no registration"
    );
    good_runs(&mut g, 3);
    // Then a real guest attaches to the stormed vGPU and runs.
    let _b = running_guest(&bad, &a, 4);
    good_runs(&mut g, 5);
}

#[test]
fn unmapping_a_loaded_queues_memory_is_its_queue_error_only() {
    let (_a, bad, _good, mut g) = pair("unmap");
    let mut b = running_guest(&bad, &_a, 1);
    // The client takes the memory away under the loaded queue, then rings.
    b.client.dma_unmap(0, MEM).unwrap();
    let w = b.kernel(4, 10_000, 2);
    b.ring(0, w);
    wait("queue error", || b.rd(hqd_reg(0, reg::CP_HQD_ERROR)) != 0);
    good_runs(&mut g, 2);
}

#[test]
fn a_shrunk_memfd_is_a_queue_error_not_a_sigbus() {
    let (_a, bad, _good, mut g) = pair("shrink");
    let mut b = running_guest(&bad, &_a, 1);
    // The client shrinks its (unsealed) RAM memfd under the mapping: the
    // queue's ring and MQD are past the new end.
    let f = b.ram.try_clone().unwrap();
    let w = b.kernel(4, 10_000, 2);
    f.set_len(0x1000).unwrap();
    b.ring(0, w);
    wait("queue error", || b.rd(hqd_reg(0, reg::CP_HQD_ERROR)) != 0);
    // The daemon (this process) lives; the other vGPU runs on.
    good_runs(&mut g, 2);
}

#[test]
fn a_client_that_blocks_its_eventfd_stalls_nobody_else() {
    let (_a, bad, _good, mut g) = pair("efd");
    let mut b = Guest::attach(bad.path(), _a.topology());
    b.load(0);
    // The client makes its vector-0 eventfd blocking again (O_NONBLOCK is
    // on the description it shares with the server) and fills its counter.
    let fd = b.vectors[0].as_raw_fd();
    // SAFETY: fcntl on an fd the test owns; no pointers.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK), 0);
    }
    b.vectors[0].write(u64::MAX - 1).unwrap();
    b.run_small(1, "bad kernels");
    // The completion interrupt cannot be sent; the other vGPU still runs.
    good_runs(&mut g, 2);
    good_runs(&mut g, 3);
}

/// A REGION_WRITE of `v` (32 bits) to BAR0 at `off`, with header `flags`.
fn bar0_write(id: u16, off: u64, v: u32, flags: u32) -> Vec<u8> {
    let mut m = header(id, cmd::REGION_WRITE, 36, flags);
    m.extend_from_slice(&access(off, wire::REGION_BAR0, 4));
    m.extend_from_slice(&v.to_le_bytes());
    m
}

/// The 32-bit BAR0 register at `off`, read over a raw connection.
fn bar0_read(s: &mut UnixStream, off: u64) -> u32 {
    let (h, b) = raw(
        s,
        cmd::REGION_READ,
        &access(off, wire::REGION_BAR0, 4),
        None,
    );
    assert_eq!(h.flags, wire::TYPE_REPLY);
    wire::u32_at(&b, 16)
}

/// Points vHQD `i` at an MQD at `addr` and activates it; returns its
/// `CP_HQD_ERROR`.
fn load_at(s: &mut UnixStream, i: usize, addr: u64) -> u32 {
    for (r, v) in [
        (reg::CP_MQD_BASE_ADDR, addr as u32),
        (reg::CP_MQD_BASE_ADDR_HI, (addr >> 32) as u32),
        (reg::CP_HQD_ACTIVE, 1),
    ] {
        s.write_all(&bar0_write(3, hqd_reg(i, r), v, 0)).unwrap();
        assert_eq!(reply(s).0.flags, wire::TYPE_REPLY);
    }
    bar0_read(s, hqd_reg(i, reg::CP_HQD_ERROR))
}

#[test]
fn an_fd_less_map_is_unreachable_memory_and_unmaps_cleanly() {
    let (_a, bad, _good, mut g) = pair("nofd");
    let mut s = UnixStream::connect(bad.path()).unwrap();
    // QEMU's ROM maps: no fd. Accepted.
    for addr in [0x10_0000u64, 0xFFFC_0000] {
        let m = dma_map_msg(0, addr, 0x4_0000);
        s.write_all(&m).unwrap();
        let (h, _) = reply(&mut s);
        assert_eq!(h.flags, wire::TYPE_REPLY, "{addr:#x}");
    }
    // Overlaps and bad ranges are still refused, with or without a fd.
    let ram = memfd(0x4000);
    let (h, _) = with_fds(
        &mut s,
        &dma_map_msg(0, 0x13_F000, 0x2000),
        &[ram.as_raw_fd()],
    );
    assert!(is_error(&h, libc::EEXIST));
    for (addr, size, errno) in [
        (0x12_0000, 0x1000, libc::EEXIST),
        (0x80_0800, 0x1000, libc::EINVAL),
        (0x80_0000, 0, libc::EINVAL),
        (!0xFFFu64, 0x2000, libc::EINVAL),
    ] {
        s.write_all(&dma_map_msg(0, addr, size)).unwrap();
        assert!(is_error(&reply(&mut s).0, errno), "{addr:#x} {size:#x}");
    }
    // A queue inside it is the same queue error as one outside every map.
    let inside = load_at(&mut s, 0, 0x10_0000);
    let outside = load_at(&mut s, 1, 0x40_0000);
    assert_ne!(inside, 0, "a queue in unreachable memory is refused");
    assert_eq!(inside, outside);
    // Its unmap succeeds; a second one finds nothing.
    let unmap = |addr: u64, size: u64| {
        let mut m = header(4, cmd::DMA_UNMAP, 40, 0);
        m.extend_from_slice(&24u32.to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m.extend_from_slice(&addr.to_le_bytes());
        m.extend_from_slice(&size.to_le_bytes());
        m
    };
    for addr in [0x10_0000u64, 0xFFFC_0000] {
        s.write_all(&unmap(addr, 0x4_0000)).unwrap();
        assert_eq!(reply(&mut s).0.flags, wire::TYPE_REPLY, "{addr:#x}");
    }
    s.write_all(&unmap(0x10_0000, 0x4_0000)).unwrap();
    assert!(is_error(&reply(&mut s).0, libc::ENOENT));
    good_runs(&mut g, 2);
    assert_eq!(bad.stats().dropped, 0);
}

#[test]
fn a_failed_command_that_asked_for_no_reply_gets_none() {
    let (_a, bad, _good, mut g) = pair("noreply");
    let mut s = UnixStream::connect(bad.path()).unwrap();
    let before = bad.stats();
    // Posted writes (no reply asked) that fail: outside BAR0, a missing
    // region, a bad size, an unknown command. None is answered.
    s.write_all(&bar0_write(10, BAR0_SIZE - 2, 1, wire::FLAG_NO_REPLY))
        .unwrap();
    let mut m = header(11, cmd::REGION_WRITE, 36, wire::FLAG_NO_REPLY);
    m.extend_from_slice(&access(0, 4, 4));
    m.extend_from_slice(&[0; 4]);
    s.write_all(&m).unwrap();
    let mut m = header(12, cmd::REGION_WRITE, 34, wire::FLAG_NO_REPLY);
    m.extend_from_slice(&access(0, wire::REGION_BAR0, 4));
    m.extend_from_slice(&[0; 2]); // says 4 bytes, carries 2
    s.write_all(&m).unwrap();
    s.write_all(&header(13, 99, 16, wire::FLAG_NO_REPLY))
        .unwrap();
    // A posted write that succeeds is not answered either.
    s.write_all(&bar0_write(
        14,
        hqd_reg(0, reg::CP_MQD_BASE_ADDR),
        0x1000,
        wire::FLAG_NO_REPLY,
    ))
    .unwrap();
    // The next reply is the answer to the next request that wants one.
    let mut m = header(15, cmd::REGION_READ, 32, 0);
    m.extend_from_slice(&access(
        hqd_reg(0, reg::CP_MQD_BASE_ADDR),
        wire::REGION_BAR0,
        4,
    ));
    s.write_all(&m).unwrap();
    let (h, b) = reply(&mut s);
    assert_eq!((h.id, h.flags), (15, wire::TYPE_REPLY));
    assert_eq!(wire::u32_at(&b, 16), 0x1000, "the posted write took");
    // A request that wants a reply still gets its error.
    let (h, _) = raw(&mut s, 99, &[], None);
    assert!(is_error(&h, libc::ENOSYS));
    let after = bad.stats();
    assert_eq!(after.unreplied_errors - before.unreplied_errors, 4);
    assert_eq!(after.error_replies - before.error_replies, 1);
    // A no-reply message whose size cannot be framed ends the connection
    // without an error reply.
    s.write_all(&header(16, cmd::REGION_WRITE, 8, wire::FLAG_NO_REPLY))
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply: {rest:?}");
    assert_eq!(bad.stats().unreplied_errors - before.unreplied_errors, 5);
    good_runs(&mut g, 2);
}

/// A client that connects and never speaks holds the vGPU's one
/// connection only until the first-message timeout: it is dropped
/// (counted `silent`), the next client is served, and the vGPU never
/// registered for it. Both clients connect, and the next one writes its
/// first message, before the server starts accepting: the next one's
/// message is waiting in its socket when the server takes it, so it is
/// never silent itself, however slow the host.
#[test]
fn a_silent_client_is_dropped_and_the_next_one_served() {
    let a = tiny_arbiter();
    let opts = ServerOptions {
        first_message_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let srv = VgpuServer::bind(&sock("silent"), spec("silent", 8), a.clone(), opts).unwrap();
    let mut quiet = UnixStream::connect(srv.path()).unwrap();
    let mut next = UnixStream::connect(srv.path()).unwrap();
    let mut m = header(6, cmd::DEVICE_GET_INFO, 32, 0);
    m.extend_from_slice(&[0; 16]);
    next.write_all(&m).unwrap();
    let t = srv.spawn().unwrap();
    // The server ends the silent one: EOF on its side.
    assert!(closed(&mut quiet));
    let (h, _) = reply(&mut next);
    assert_eq!((h.id, h.flags), (6, wire::TYPE_REPLY), "{h:?}");
    still_serves(&mut next);
    let s = srv.stats();
    assert_eq!((s.connections, s.dropped, s.silent), (2, 1, 1), "{s:?}");
    assert_eq!(
        s.registrations, 1,
        "the silent client cost the arbiter nothing"
    );
    drop(next);
    srv.stop();
    t.join().unwrap();
}

/// How a connection with a message half-read ends decides how it counts:
/// the client leaving mid-message is a drop; the server stopping (SIGTERM,
/// the vGPU removed) is a clean close.
#[test]
fn a_stop_mid_message_is_a_clean_close_and_a_client_leaving_mid_message_a_drop() {
    let a = tiny_arbiter();
    // The client leaves with a header sent and its body half sent.
    let srv = serve(&a, "half-client", 8, ServerOptions::default());
    let mut s = UnixStream::connect(srv.path()).unwrap();
    s.write_all(&header(3, cmd::DEVICE_GET_INFO, 32, 0))
        .unwrap();
    s.write_all(&[0; 5]).unwrap();
    wait("registered", || srv.handle().is_some());
    drop(s);
    wait("released", || srv.handle().is_none());
    wait("counted", || srv.stats().dropped == 1);
    srv.stop();

    // The server stops with a header half read, then with a body half read.
    for (tag, part) in [("half-head", 7), ("half-body", wire::HEADER + 5)] {
        let srv = VgpuServer::bind(
            &sock(tag),
            spec(tag, 8),
            a.clone(),
            ServerOptions::default(),
        )
        .unwrap();
        let t = srv.spawn().unwrap();
        let mut s = UnixStream::connect(srv.path()).unwrap();
        let mut m = header(3, cmd::DEVICE_GET_INFO, 32, 0);
        m.extend_from_slice(&[0; 16]);
        s.write_all(&m[..part]).unwrap();
        wait("registered", || srv.handle().is_some());
        srv.stop();
        t.join().unwrap();
        let st = srv.stats();
        assert_eq!((st.connections, st.dropped), (1, 0), "{tag}: {st:?}");
        assert!(srv.handle().is_none());
        assert!(closed(&mut s));
    }
}
