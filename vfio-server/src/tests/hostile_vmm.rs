//! A hostile VMM through the socket: a flood of huge DMA maps, and unmaps
//! and resets while a kernel runs, each beside another tenant's vGPU.

use super::*;

/// A memfd of `len` bytes sealed against shrinking (as QEMU's).
fn sealed(len: u64) -> File {
    // SAFETY: valid C string; the fd returned is ours.
    let fd = unsafe { libc::memfd_create(c"big".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: fresh owned fd.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    // SAFETY: fcntl on our fd.
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
        0
    );
    f
}

fn vm_size_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmSize:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One hostile client DMA-maps a sparse sealed memfd again and again, 64
/// TiB at a time (before the budget of mapped bytes, 47 maps of it, 64 TiB
/// then halving sizes, filled the daemon's 128 TiB address space: another tenant's DMA_MAP was then
/// refused and no thread could start). Now the maps past the budget are
/// reached through the fd, and the other tenant maps and runs.
#[test]
fn a_flood_of_huge_sealed_maps_leaves_the_daemon_its_address_space() {
    let (_a, bad, good) = two_tenants("vas");
    let mut s = UnixStream::connect(bad.path()).unwrap();
    let big = sealed(1 << 46);
    let before = vm_size_kib();
    let mut addr = 0u64;
    let mut size = 1u64 << 46;
    let mut maps = 0;
    while size >= 1 << 21 && maps < 64 {
        s.send_with_fds(&[&dma_map_msg(0, addr, size)[..]], &[big.as_raw_fd()])
            .unwrap();
        let (h, _) = reply(&mut s);
        if h.flags == wire::TYPE_REPLY {
            maps += 1;
            addr += size;
        } else {
            size /= 2;
        }
    }
    assert_eq!(maps, 64, "every map is accepted");
    let grown = vm_size_kib().saturating_sub(before) << 10;
    assert!(
        grown <= dma::MAX_MAPPED_BYTES,
        "the daemon grew by {grown:#x} bytes"
    );
    assert!(dma::mapped_bytes() <= dma::MAX_MAPPED_BYTES);
    // Another tenant's VMM attaches now: its guest RAM (a sealed 4 GiB
    // memfd, as QEMU's) is DMA-mapped, as a raw client (this test process
    // is also the daemon, so the client must not map anything itself).
    let ram = sealed(4 << 30);
    let mut t = UnixStream::connect(good.path()).unwrap();
    t.send_with_fds(&[&dma_map_msg(0, 0, 4 << 30)[..]], &[ram.as_raw_fd()])
        .unwrap();
    let (h, _) = reply(&mut t);
    assert_eq!(h.flags, wire::TYPE_REPLY, "errno {}", h.error);
    let th = std::thread::Builder::new().spawn(|| 1).unwrap();
    assert_eq!(th.join().unwrap(), 1);
    drop(t);
    // Then that tenant's VMM attaches for real and runs its kernels.
    let mut g = Guest::attach(good.path(), _a.topology());
    g.load(0);
    g.run_small(1, "good kernel");
    g.tvm.verify(&g.q).unwrap();
    drop(g);
    drop(s);
    wait("released", || bad.handle().is_none());
    bad.stop();
    good.stop();
}

/// DMA_UNMAP of a queue's memory (ring, MQD, signals) while its kernel
/// runs, and DEVICE_RESET mid-kernel again and again: the queue errors, the
/// other tenant's kernels run exactly once, nothing leaks into the arbiter.
#[test]
fn unmaps_and_resets_mid_kernel_cost_the_other_tenant_nothing() {
    let (a, bad, good) = two_tenants("mid");
    let mut g = Guest::attach(good.path(), a.topology());
    g.load(0);
    let mut b = Guest::attach(bad.path(), a.topology());
    b.load(0);
    for round in 0..20u32 {
        // Counted before the kernel is written: the load of the previous
        // round may be served (and map the queue) after it is.
        let maps = a.stats().maps;
        let w = b.kernel(64, 2_000_000, 100 + round);
        b.ring(0, w);
        wait("on the GPU", || a.stats().maps > maps);
        if round % 2 == 0 {
            b.client.dma_unmap(0, MEM).unwrap();
            wait("queue error", || b.rd(hqd_reg(0, reg::CP_HQD_ERROR)) != 0);
            b.client.dma_map(0, 0, MEM, b.ram.as_raw_fd()).unwrap();
        }
        b.client.reset().unwrap();
        g.run_small(round, "good");
        g.tvm.verify(&g.q).unwrap();
        // The bad one re-loads its queue fresh (a new ring).
        b.q = b.tvm.queue(a.topology(), 64, 0);
        b.tvm
            .mem
            .write(mqd_addr(&b.q), &b.q.mqd.to_bytes())
            .unwrap();
        b.load(0);
    }
    let st = bad.stats();
    assert_eq!((st.connections, st.resets, st.dropped), (1, 20, 0));
    assert_eq!(st.registrations, 21, "one per connection and per reset");
    assert_eq!(good.stats().error_replies, 0);
    assert_eq!(
        a.stats().completions,
        20,
        "only the other tenant's kernels completed"
    );
    assert!(a.vm_slot_count() <= mdev::telemetry::RETAINED_REMOVED_VMS + 2);
    bad.stop();
    good.stop();
}
