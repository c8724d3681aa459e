//! The server against an in-process client: the `vfio_user` crate's client
//! for the VMM's side of a normal session, raw messages for hostile ones.
//! Waits have a deadline against hangs; nothing asserts on durations.

use super::*;
use abi::queue::AMD_SIGNAL_VALUE;
use abi::vgpu::{reg, NUM_VECTORS, VGPU_ID_VALUE};
use gpu::mem::DmaMemory;
use gpusim::sim::testkit::{GuestQueue, TestVm};
use mdev::probe::{hqd_reg, interrupt_kernel, mqd_addr, tiny_arbiter};
use std::os::fd::AsRawFd;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const MEM: u64 = 1 << 32;

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hqdmux-vfio-{}-{tag}.sock", std::process::id()))
}

fn spec(name: &str, priority: u8) -> VgpuSpec {
    VgpuSpec {
        name: name.into(),
        params: VmParams {
            priority,
            ..Default::default()
        },
        preempt_timeout: Duration::from_millis(500),
        guard: mdev::guard::GuardConfig::default(),
        quantum: None,
    }
}

fn memfd(len: u64) -> File {
    // SAFETY: the name is a valid C string; the fd returned is ours.
    let fd = unsafe { libc::memfd_create(c"guest".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh, owned descriptor.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A guest behind a vfio-user client: its RAM is a memfd the client maps
/// into the server, which it also reads and writes itself (as a VMM does).
struct Guest {
    client: vfio_user::Client,
    ram: File,
    tvm: TestVm,
    q: GuestQueue,
    vectors: Vec<EventFd>,
    mailbox: u64,
}

impl Guest {
    fn attach(path: &Path, topo: &gpu::topology::GpuTopology) -> Guest {
        let mut client = vfio_user::Client::new(path).unwrap();
        let ram = memfd(MEM);
        client.dma_map(0, 0, MEM, ram.as_raw_fd()).unwrap();
        let gm = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            MEM as usize,
            Some(FileOffset::new(ram.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let mem: Arc<dyn DmaMemory> = Arc::new(gm);
        let mut tvm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let q = tvm.queue(topo, 64, 0);
        mem.write(mqd_addr(&q), &q.mqd.to_bytes()).unwrap();
        let mailbox = tvm.alloc(8, 8);
        let vectors: Vec<EventFd> = (0..NUM_VECTORS)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let fds: Vec<RawFd> = vectors.iter().map(|e| e.as_raw_fd()).collect();
        client
            .set_irqs(
                wire::IRQ_MSIX,
                wire::IRQ_SET_DATA_EVENTFD | wire::IRQ_SET_ACTION_TRIGGER,
                0,
                NUM_VECTORS as u32,
                &fds,
            )
            .unwrap();
        Guest {
            client,
            ram,
            tvm,
            q,
            vectors,
            mailbox,
        }
    }

    fn rd(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client
            .region_read(wire::REGION_BAR0, off, &mut b)
            .unwrap();
        u32::from_le_bytes(b)
    }

    fn wr(&mut self, off: u64, v: u32) {
        self.client
            .region_write(wire::REGION_BAR0, off, &v.to_le_bytes())
            .unwrap();
    }

    fn load(&mut self, i: usize) {
        let a = mqd_addr(&self.q);
        self.wr(hqd_reg(i, reg::CP_MQD_BASE_ADDR), a as u32);
        self.wr(hqd_reg(i, reg::CP_MQD_BASE_ADDR_HI), (a >> 32) as u32);
        self.wr(hqd_reg(i, reg::CP_HQD_ACTIVE), 1);
    }

    fn kernel(&mut self, groups: u32, cost_ns: u64, seed: u32) -> u64 {
        let mailbox = self.mailbox;
        interrupt_kernel(&mut self.tvm, &mut self.q, groups, cost_ns, seed, mailbox).0
    }

    /// Runs a small kernel (4 workgroups, cost 10 000 ns, `seed`) on vHQD
    /// 0 by a BAR2 message, and waits (`what`) until it is done.
    fn run_small(&mut self, seed: u32, what: &str) {
        let w = self.kernel(4, 10_000, seed);
        self.ring(0, w);
        wait(what, || self.done());
    }

    fn ring(&mut self, i: usize, wptr: u64) {
        self.client
            .region_write(wire::REGION_BAR2, 8 * i as u64, &wptr.to_le_bytes())
            .unwrap();
    }

    fn done(&self) -> bool {
        let s = *self.q.signals.last().unwrap();
        (self.tvm.mem.read_u64(s + AMD_SIGNAL_VALUE as u64).unwrap() as i64) <= 0
    }
}

/// A vGPU served on its own thread that stops (its client disconnected,
/// its socket removed) when the test lets go of it, failed or not.
struct Served(Arc<VgpuServer>);

impl std::ops::Deref for Served {
    type Target = VgpuServer;
    fn deref(&self) -> &VgpuServer {
        &self.0
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.0.stop();
    }
}

fn serve(a: &Arc<GpuArbiter>, tag: &str, prio: u8, opts: ServerOptions) -> Served {
    serve_spec(a, spec(tag, prio), opts)
}

/// Serves `spec` on the socket named after it.
fn serve_spec(a: &Arc<GpuArbiter>, spec: VgpuSpec, opts: ServerOptions) -> Served {
    let s = VgpuServer::bind(&sock(&spec.name), spec, a.clone(), opts).unwrap();
    s.spawn().unwrap();
    Served(s)
}

#[test]
fn a_guest_runs_kernels_over_vfio_user_and_takes_its_interrupts() {
    let a = tiny_arbiter();
    let srv = serve(&a, "run", 8, ServerOptions::default());
    let mut g = Guest::attach(srv.path(), a.topology());
    // Config space: the in-VMM device's identity and capability.
    let mut id = [0u8; 4];
    g.client
        .region_read(wire::REGION_CONFIG, 0, &mut id)
        .unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x0FD0_1002);
    let mut cap = [0u8; 4];
    g.client
        .region_read(wire::REGION_CONFIG, 0x40, &mut cap)
        .unwrap();
    assert_eq!(u32::from_le_bytes(cap) & 0xFF, 0x11, "MSI-X");
    assert_eq!(g.client.region(wire::REGION_BAR0).unwrap().size, BAR0_SIZE);
    assert_eq!(g.client.region(wire::REGION_BAR2).unwrap().size, BAR2_SIZE);
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    g.load(0);
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ACTIVE)), 1);
    let mut w = 0;
    for k in 0..3 {
        w = g.kernel(8, 20_000, k);
    }
    g.ring(0, w);
    wait("kernels", || g.done());
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ERROR)), 0);
    // Completions raised vector 0 through the SET_IRQS eventfd.
    let mut seen = 0;
    wait("vector 0", || {
        seen += g.vectors[0].read().unwrap_or(0);
        seen >= 1
    });
    assert!(srv.stats().doorbells >= 1);
    // A queue pointed outside every DMA mapping is a queue error, as in a VM.
    g.client.dma_unmap(0, MEM).unwrap();
    g.wr(hqd_reg(1, reg::CP_MQD_BASE_ADDR), 0x1000);
    g.wr(hqd_reg(1, reg::CP_MQD_BASE_ADDR_HI), 0);
    g.wr(hqd_reg(1, reg::CP_HQD_ACTIVE), 1);
    assert_ne!(g.rd(hqd_reg(1, reg::CP_HQD_ERROR)), 0);
    srv.stop();
}

/// A request header with no error, encoded.
fn header(id: u16, command: u16, size: u32, flags: u32) -> Vec<u8> {
    Header {
        id,
        command,
        size,
        flags,
        error: 0,
    }
    .encode()
    .to_vec()
}

/// Reads one whole reply: its header and body.
fn reply(s: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut hb = [0u8; wire::HEADER];
    s.read_exact(&mut hb).unwrap();
    let r = Header::decode(&hb);
    let mut rb = vec![0u8; r.size as usize - wire::HEADER];
    s.read_exact(&mut rb).unwrap();
    (r, rb)
}

/// A DMA_MAP message of `size` bytes at `addr`, `off` into the fd sent
/// with it.
fn dma_map_msg(off: u64, addr: u64, size: u64) -> Vec<u8> {
    let mut m = header(1, cmd::DMA_MAP, 48, 0);
    m.extend_from_slice(&32u32.to_le_bytes());
    m.extend_from_slice(&3u32.to_le_bytes());
    for v in [off, addr, size] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m
}

/// A hostile vGPU (`{tag}-bad`) and another tenant's (`{tag}-good`), both
/// priority 8 on one arbiter; both stop when dropped.
fn two_tenants(tag: &str) -> (Arc<GpuArbiter>, Served, Served) {
    let a = tiny_arbiter();
    let bad = serve(&a, &format!("{tag}-bad"), 8, ServerOptions::default());
    let good = serve(&a, &format!("{tag}-good"), 8, ServerOptions::default());
    (a, bad, good)
}

/// Sends one raw message; returns the reply header and body.
fn raw(s: &mut UnixStream, command: u16, body: &[u8], size: Option<u32>) -> (Header, Vec<u8>) {
    let size = size.unwrap_or((wire::HEADER + body.len()) as u32);
    s.write_all(&header(7, command, size, 0)).unwrap();
    s.write_all(body).unwrap();
    reply(s)
}

/// The connection still answers: a config read returns the device's id.
fn still_serves(s: &mut UnixStream) {
    let (h, b) = raw(
        s,
        cmd::REGION_READ,
        &access(0, wire::REGION_CONFIG, 4),
        None,
    );
    assert_eq!(h.flags, wire::TYPE_REPLY);
    assert_eq!(&b[16..], &0x0FD0_1002u32.to_le_bytes());
}

fn is_error(h: &Header, errno: i32) -> bool {
    h.flags & wire::FLAG_ERROR != 0 && h.error == errno as u32
}

fn access(offset: u64, region: u32, count: u32) -> Vec<u8> {
    let mut b = offset.to_le_bytes().to_vec();
    b.extend_from_slice(&region.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}

#[test]
fn hostile_messages_get_errors_and_cost_the_other_vgpu_nothing() {
    let a = tiny_arbiter();
    let bad = serve(&a, "bad", 8, ServerOptions::default());
    let good = serve(&a, "good", 8, ServerOptions::default());
    let mut g = Guest::attach(good.path(), a.topology());
    let mut s = UnixStream::connect(bad.path()).unwrap();
    // Unknown and unsupported commands.
    assert!(is_error(&raw(&mut s, 99, &[], None).0, libc::ENOSYS));
    assert!(is_error(
        &raw(&mut s, cmd::DMA_READ, &[0; 24], None).0,
        libc::ENOTSUP
    ));
    // Sizes that do not fit the command.
    assert!(is_error(
        &raw(&mut s, cmd::DEVICE_GET_INFO, &[0; 3], None).0,
        libc::EINVAL
    ));
    assert!(is_error(
        &raw(&mut s, cmd::REGION_READ, &[0; 15], None).0,
        libc::EINVAL
    ));
    let mut w = access(0, wire::REGION_BAR0, 4);
    w.extend_from_slice(&[1, 2]); // says 4 bytes, carries 2
    assert!(is_error(
        &raw(&mut s, cmd::REGION_WRITE, &w, None).0,
        libc::EINVAL
    ));
    // Accesses outside a region, of a bad size, to a missing region.
    for (off, region, count) in [
        (BAR0_SIZE - 2, wire::REGION_BAR0, 4),
        (0, wire::REGION_BAR0, 0),
        (0, wire::REGION_BAR0, 16),
        (u64::MAX - 1, wire::REGION_BAR2, 4),
        (0, 4, 4),
        (0, u32::MAX, 4),
    ] {
        let (h, _) = raw(&mut s, cmd::REGION_READ, &access(off, region, count), None);
        assert!(is_error(&h, libc::EINVAL), "{off:#x} {region} {count}");
    }
    // DMA maps past the end of the fd, overlapping, without an fd.
    let ram = memfd(0x4000);
    let map = |off: u64, addr: u64, size: u64| {
        let mut b = 32u32.to_le_bytes().to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        for v in [off, addr, size] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let mut m = Header {
            id: 1,
            command: cmd::DMA_MAP,
            size: (wire::HEADER + b.len()) as u32,
            flags: 0,
            error: 0,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(&b);
        m
    };
    let send_map = |s: &mut UnixStream, m: &[u8]| -> Header {
        s.send_with_fd(m, ram.as_raw_fd()).unwrap();
        let mut hb = [0u8; wire::HEADER];
        s.read_exact(&mut hb).unwrap();
        Header::decode(&hb)
    };
    assert!(
        is_error(&send_map(&mut s, &map(0x2000, 0, 0x4000)), libc::EINVAL),
        "past the end"
    );
    assert_eq!(send_map(&mut s, &map(0, 0, 0x4000)).flags, wire::TYPE_REPLY);
    assert!(
        is_error(&send_map(&mut s, &map(0, 0x3000, 0x1000)), libc::EEXIST),
        "overlap"
    );
    // Without an fd (QEMU's ROMs): accepted, still checked for overlaps.
    assert_eq!(
        raw(&mut s, cmd::DMA_MAP, &map(0, 0x8000, 0x1000)[16..], None)
            .0
            .flags,
        wire::TYPE_REPLY
    );
    assert!(is_error(
        &raw(&mut s, cmd::DMA_MAP, &map(0, 0x3000, 0x1000)[16..], None).0,
        libc::EEXIST
    ));
    // SET_IRQS: a range past the vectors, fds that are not eventfds.
    let irqs = |start: u32, count: u32| {
        let mut b = 20u32.to_le_bytes().to_vec();
        for v in [
            wire::IRQ_SET_DATA_EVENTFD | wire::IRQ_SET_ACTION_TRIGGER,
            wire::IRQ_MSIX,
            start,
            count,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    };
    assert!(is_error(
        &raw(&mut s, cmd::DEVICE_SET_IRQS, &irqs(8, 2), None).0,
        libc::EINVAL
    ));
    assert!(is_error(
        &raw(&mut s, cmd::DEVICE_SET_IRQS, &irqs(u32::MAX, 2), None).0,
        libc::EINVAL
    ));
    {
        let mut m = Header {
            id: 2,
            command: cmd::DEVICE_SET_IRQS,
            size: 36,
            flags: 0,
            error: 0,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(&irqs(0, 1));
        s.send_with_fd(&m[..], ram.as_raw_fd()).unwrap();
        let mut hb = [0u8; wire::HEADER];
        s.read_exact(&mut hb).unwrap();
        assert!(
            is_error(&Header::decode(&hb), libc::EINVAL),
            "a memfd is not an eventfd"
        );
    }
    // The connection still works after all that.
    still_serves(&mut s);
    // A size the stream cannot be resynchronised after ends the connection.
    let h = Header {
        id: 9,
        command: cmd::VERSION,
        size: 3,
        flags: 0,
        error: 0,
    };
    s.write_all(&h.encode()).unwrap();
    let mut hb = [0u8; wire::HEADER];
    s.read_exact(&mut hb).unwrap();
    assert!(is_error(&Header::decode(&hb), libc::EINVAL));
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed");
    wait("dropped", || {
        bad.stats().dropped == 1 && bad.handle().is_none()
    });
    // The other vGPU was never disturbed.
    g.load(0);
    g.run_small(1, "kernels");
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(good.stats().error_replies, 0);
    assert!(bad.stats().error_replies >= 15);
    bad.stop();
    good.stop();
}

#[test]
fn a_client_that_stops_reading_loses_its_connection_and_nothing_else() {
    let a = tiny_arbiter();
    let opts = ServerOptions {
        send_timeout: Duration::from_millis(50),
        ..Default::default()
    };
    let stuck = serve(&a, "stuck", 8, opts);
    let good = serve(&a, "ok", 8, opts);
    let mut s = UnixStream::connect(stuck.path()).unwrap();
    s.set_nonblocking(true).unwrap();
    // Requests forever, replies never read: the socket buffers fill.
    let msg = {
        let mut m = Header {
            id: 1,
            command: cmd::REGION_READ,
            size: 32,
            flags: 0,
            error: 0,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(&access(0, wire::REGION_CONFIG, 4));
        m
    };
    let mut g = Guest::attach(good.path(), a.topology());
    loop {
        match s.write(&msg) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stuck.stats().dropped == 1 {
                    break;
                }
                // Meanwhile the other vGPU serves as usual.
                assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => break, // the server closed it
        }
    }
    wait("dropped", || stuck.stats().dropped == 1);
    // The vGPU takes the next client.
    let mut g2 = Guest::attach(stuck.path(), a.topology());
    assert_eq!(g2.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    assert_eq!(stuck.stats().connections, 2);
    stuck.stop();
    good.stop();
}

#[test]
fn a_client_killed_mid_kernel_releases_its_queues_and_the_vgpu_takes_a_new_one() {
    let a = tiny_arbiter();
    let srv = serve(&a, "reboot", 8, ServerOptions::default());
    let mut g = Guest::attach(srv.path(), a.topology());
    g.load(0);
    let w = g.kernel(64, 2_000_000, 1); // long enough to be running
    g.ring(0, w);
    wait("on the GPU", || a.stats().maps >= 1);
    let first = srv.handle().unwrap();
    drop(g); // the VMM dies
    wait("released", || srv.handle().is_none());
    let mut g = Guest::attach(srv.path(), a.topology());
    wait("registered", || srv.handle().is_some());
    assert_ne!(srv.handle(), Some(first), "a new registration");
    g.load(0);
    g.run_small(2, "kernels");
    g.tvm.verify(&g.q).unwrap();
    // Reset: queues released, registers back to reset values.
    g.client.reset().unwrap();
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ACTIVE)), 0);
    assert_eq!(srv.stats().resets, 1);
    srv.stop();
}

#[test]
fn a_taken_socket_path_is_refused_and_a_stale_one_replaced() {
    let a = tiny_arbiter();
    let p = sock("taken");
    std::fs::write(&p, b"x").unwrap();
    assert!(matches!(
        VgpuServer::bind(&p, spec("t", 1), a.clone(), ServerOptions::default()),
        Err(ServeError::PathTaken(_))
    ));
    std::fs::remove_file(&p).unwrap();
    drop(UnixListener::bind(&p).unwrap()); // a stale socket file stays
    let s = VgpuServer::bind(&p, spec("t", 1), a, ServerOptions::default()).unwrap();
    assert!(
        matches!(
            VgpuServer::bind(&p, spec("t2", 1), tiny_arbiter(), ServerOptions::default()),
            Err(ServeError::PathTaken(_))
        ),
        "a live server's socket"
    );
    drop(s);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn hostile_mqds_get_the_same_error_codes_over_vfio_user_as_in_a_vm() {
    let a = tiny_arbiter();
    let srv = serve(&a, "codes", 8, ServerOptions::default());
    let mut g = Guest::attach(srv.path(), a.topology());
    let direct = mdev::probe::add_guest(&a, "direct", 8, MEM, 64, Arc::new(Irqs::new()));
    let good = g.q.mqd.to_bytes();
    let mut wrong_ring = good.to_vec();
    // The ring base (dwords CP_HQD_PQ_BASE lo/hi) far outside guest memory.
    let base = 4 * abi::mqd::CP_HQD_PQ_BASE_LO;
    wrong_ring[base..base + 8].copy_from_slice(&(1u64 << 50 >> 8).to_le_bytes());
    let cases: [(&str, u64, Option<Vec<u8>>); 3] = [
        ("zeroed MQD", 0x3000_0000, Some(vec![0u8; good.len()])),
        ("ring outside memory", 0x3000_1000, Some(wrong_ring)),
        ("MQD across the end of memory", MEM - 16, None),
    ];
    for (i, (what, addr, bytes)) in cases.into_iter().enumerate() {
        if let Some(b) = bytes {
            g.tvm.mem.write(addr, &b).unwrap();
            direct.tvm.mem.write(addr, &b).unwrap();
        }
        let vhqd = i + 1;
        g.wr(hqd_reg(vhqd, reg::CP_MQD_BASE_ADDR), addr as u32);
        g.wr(hqd_reg(vhqd, reg::CP_MQD_BASE_ADDR_HI), (addr >> 32) as u32);
        g.wr(hqd_reg(vhqd, reg::CP_HQD_ACTIVE), 1);
        mdev::probe::load_hqd(&direct.fe, vhqd, addr);
        let over = g.rd(hqd_reg(vhqd, reg::CP_HQD_ERROR));
        let inside = direct.fe.reg_read(hqd_reg(vhqd, reg::CP_HQD_ERROR));
        assert_ne!(inside, 0, "{what}");
        assert_eq!(over, inside, "{what}");
    }
    srv.stop();
}

mod history;
mod hostile;
mod hostile_vmm;

#[test]
fn the_config_space_reads_in_bulk_as_qemu_reads_it_at_realize() {
    let a = tiny_arbiter();
    let srv = serve(&a, "bulk", 8, ServerOptions::default());
    let mut s = UnixStream::connect(srv.path()).unwrap();
    let size = abi::config_space::CONFIG_BYTES as u64;
    // The whole space in one read: the same bytes as dword by dword.
    let (h, all) = raw(
        &mut s,
        cmd::REGION_READ,
        &access(0, wire::REGION_CONFIG, size as u32),
        None,
    );
    assert_eq!(h.flags, wire::TYPE_REPLY);
    assert_eq!(all.len(), 16 + size as usize);
    for off in (0..size).step_by(4) {
        let (h, d) = raw(
            &mut s,
            cmd::REGION_READ,
            &access(off, wire::REGION_CONFIG, 4),
            None,
        );
        assert_eq!(h.flags, wire::TYPE_REPLY);
        let at = 16 + off as usize;
        assert_eq!(d[16..20], all[at..at + 4], "dword {off:#x}");
    }
    assert_eq!(all[16..20], 0x0FD0_1002u32.to_le_bytes());
    // An unaligned bulk read is the same bytes; past the end is refused.
    let (_, part) = raw(
        &mut s,
        cmd::REGION_READ,
        &access(3, wire::REGION_CONFIG, 61),
        None,
    );
    assert_eq!(part[16..], all[16 + 3..16 + 64]);
    for (off, count) in [(1, size as u32), (0, size as u32 + 4), (u64::MAX - 8, 16)] {
        let (h, _) = raw(
            &mut s,
            cmd::REGION_READ,
            &access(off, wire::REGION_CONFIG, count),
            None,
        );
        assert!(is_error(&h, libc::EINVAL), "{off:#x} {count}");
    }
    // Bulk reads stay config-only: BAR0 still takes 1, 2, 4 or 8 bytes.
    let (h, _) = raw(
        &mut s,
        cmd::REGION_READ,
        &access(0, wire::REGION_BAR0, 16),
        None,
    );
    assert!(is_error(&h, libc::EINVAL));
    srv.stop();
}

/// A storm of clients that each send one byte and disconnect: every one
/// registers (its byte is a first message) and is removed, and the
/// arbiter's tables stay bounded by the retained removed VMs (a count, not
/// a time).
#[test]
fn a_storm_of_one_byte_clients_keeps_the_arbiters_tables_bounded() {
    let a = tiny_arbiter();
    let srv = serve(&a, "storm", 3, ServerOptions::default());
    let n = mdev::telemetry::RETAINED_REMOVED_VMS as u64 + 200;
    let mut most = 0;
    for i in 0..n {
        let mut s = UnixStream::connect(srv.path()).unwrap();
        s.write_all(&[0]).unwrap();
        drop(s);
        // The server serves one connection at a time: the previous one
        // is closed (and its vGPU removed) before the next registers.
        wait("registered", || srv.stats().registrations > i);
        most = most.max(a.vm_slot_count());
    }
    wait("last one removed", || srv.handle().is_none());
    assert_eq!(srv.stats().registrations, n);
    assert!(
        most <= mdev::telemetry::RETAINED_REMOVED_VMS + 2,
        "{most} arbiter slots after {n} one-byte clients"
    );
    assert_eq!(a.vm_entry_count(), 0, "no scheduler or binding entry left");
    assert!(a.telemetry_vm_count() <= mdev::telemetry::RETAINED_REMOVED_VMS);
    srv.stop();
}

/// A vGPU whose VMM reconnects again and again is one set of series in
/// `/metrics`: no series is printed twice, and every counter of the vGPU
/// keeps counting across connections (a vGPU outlives its VMM).
#[test]
fn a_vgpu_is_one_series_across_reconnects_whose_counters_never_go_back() {
    let a = tiny_arbiter();
    let lo = serve(&a, "training", 2, ServerOptions::default());
    let hi = serve(&a, "inference", 12, ServerOptions::default());
    let mut gi = Guest::attach(hi.path(), a.topology());
    gi.load(0);
    let mut last: std::collections::BTreeMap<String, f64> = Default::default();
    for round in 0..5u32 {
        let mut g = Guest::attach(lo.path(), a.topology());
        wait("registered", || lo.handle().is_some());
        g.load(0);
        let w = g.kernel(32, 200_000, round);
        g.ring(0, w);
        // The high-priority vGPU's kernels may preempt it.
        let wi = gi.kernel(4, 10_000, round);
        gi.ring(0, wi);
        wait("inference kernels", || gi.done());
        wait("training kernels", || g.done());
        g.tvm.verify(&g.q).unwrap();
        if round % 2 == 1 {
            g.client.reset().unwrap(); // a reset is a re-registration too
        }
        drop(g); // the VMM goes; the vGPU stays
        wait("released", || lo.handle().is_none());
        let text = a.metrics_text();
        let now = mdev::probe::exposition_series(&text);
        mdev::probe::promtool_check(&text);
        for (series, v) in &last {
            let counter = ["_total{", "_count{", "_sum{", "_bucket{"]
                .iter()
                .any(|k| series.contains(k));
            if counter && series.contains("vm=\"training\"") {
                let n = now
                    .get(series)
                    .unwrap_or_else(|| panic!("{series} vanished"));
                assert!(n >= v, "{series} went back from {v} to {n}");
            }
        }
        last = now;
    }
    let busy = last
        .iter()
        .filter(|(s, _)| {
            s.starts_with("hqdmux_vm_gpu_busy_seconds_total{") && s.contains("vm=\"training\"")
        })
        .collect::<Vec<_>>();
    assert_eq!(busy.len(), 1, "one series");
    assert!(*busy[0].1 > 0.0, "five connections' GPU time kept");
    lo.stop();
    hi.stop();
}

/// A steer and a pause made while no client is connected reach the next
/// registration; made while one is, they apply at once and stay for the
/// next.
#[test]
fn steering_and_pause_outlive_a_connection() {
    let a = tiny_arbiter();
    let srv = serve(&a, "steer", 3, ServerOptions::default());
    srv.with_registration(|s| {
        assert!(s.handle.is_none());
        s.spec.params.priority = 9;
        *s.paused = true;
    });
    let mut g = Guest::attach(srv.path(), a.topology());
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    let h = srv.handle().unwrap();
    assert_eq!(a.vm_status(h).unwrap().0.priority, 9);
    assert_eq!(a.vm_controls(h).map(|c| c.0), Some(true), "paused");
    srv.with_registration(|s| {
        let h = s.handle.unwrap();
        s.arbiter.set_weight(h, 7).unwrap();
        s.spec.params.weight = 7;
        s.arbiter.resume_vm(h).unwrap();
        *s.paused = false;
    });
    assert_eq!(a.vm_status(h).unwrap().0.weight, 7);
    drop(g);
    wait("released", || srv.handle().is_none());
    let mut g = Guest::attach(srv.path(), a.topology());
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    let h2 = srv.handle().unwrap();
    assert_ne!(h, h2);
    let (p, _) = a.vm_status(h2).unwrap();
    assert_eq!((p.priority, p.weight), (9, 7));
    assert_eq!(a.vm_controls(h2).map(|c| c.0), Some(false));
    srv.stop();
}

/// The client's mapping of BAR2 (what a VMM maps into the guest).
struct MappedBar2 {
    ptr: *mut u64,
}

impl MappedBar2 {
    fn of(client: &vfio_user::Client) -> MappedBar2 {
        let r = client.region(wire::REGION_BAR2).expect("BAR2");
        assert_ne!(r.flags & wire::REGION_FLAG_MMAP, 0, "BAR2 is mmap-able");
        assert_eq!(r.sparse_areas.len(), 1);
        assert_eq!(
            (r.sparse_areas[0].offset, r.sparse_areas[0].size),
            (0, BAR2_SIZE)
        );
        let fo = r.file_offset.as_ref().expect("the page's fd");
        // SAFETY: maps the server's sealed BAR2_SIZE memfd, shared.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BAR2_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fo.file().as_raw_fd(),
                fo.start() as libc::off_t,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        MappedBar2 { ptr: p.cast() }
    }

    /// A guest store to doorbell `i` (no exit, no message).
    fn ring(&self, i: usize, wptr: u64) {
        assert!(i < abi::vgpu::NUM_VHQD);
        // SAFETY: inside the mapped page.
        unsafe { std::ptr::write_volatile(self.ptr.add(i), wptr) }
    }
}

impl Drop for MappedBar2 {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`.
        unsafe { libc::munmap(self.ptr.cast(), BAR2_SIZE as usize) };
    }
}

/// A priority-5 vGPU served with the BAR2 doorbell page polled, a guest
/// attached to it, and the guest's mapping of that page.
fn polled_guest(a: &Arc<GpuArbiter>, tag: &str) -> (Served, Guest, MappedBar2) {
    let srv = serve(
        a,
        tag,
        5,
        ServerOptions {
            doorbell_poll: Some(DEFAULT_DOORBELL_POLL),
            ..Default::default()
        },
    );
    let g = Guest::attach(srv.path(), a.topology());
    let bar2 = MappedBar2::of(&g.client);
    (srv, g, bar2)
}

/// BAR2 offered as a sparse-mmap page: doorbells stored in it run the
/// kernels exactly once with no BAR2 message; the poller scans nothing
/// while no queue is loaded; a reset forgets the old values; a client
/// without the option keeps the REGION_WRITE path.
#[test]
fn doorbells_stored_in_the_mmapped_bar2_page_run_kernels_without_a_message() {
    let a = tiny_arbiter();
    let (srv, mut g, bar2) = polled_guest(&a, "mmap");
    // Handed out, nothing loaded: register traffic wakes the poller, which
    // finds no queue and scans nothing.
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    g.wr(hqd_reg(1, reg::CP_HQD_ERROR), 0);
    assert_eq!(srv.stats().bar2_scans, 0);
    g.load(0);
    let w = g.kernel(4, 10_000, 1);
    bar2.ring(0, w);
    wait("kernel", || g.done());
    let w = g.kernel(4, 10_000, 2);
    bar2.ring(0, w);
    wait("second kernel", || g.done());
    g.tvm.verify(&g.q).unwrap();
    let s = srv.stats();
    assert_eq!(s.doorbells, 0, "no BAR2 message");
    // The second kernel can only have been noticed in the page (the queue
    // was loaded long before); the first may also have been picked up by
    // the load itself, when the load was served after the kernel's write.
    assert!(s.mmap_doorbells >= 1, "{s:?}");
    assert!(s.bar2_scans >= 1);
    // A reset zeroes the page; the old values raise nothing.
    g.client.reset().unwrap();
    let before = srv.stats().mmap_doorbells;
    g.load(0);
    g.wr(hqd_reg(1, reg::CP_HQD_ERROR), 0);
    assert_eq!(srv.stats().mmap_doorbells, before);
    drop(bar2);
    drop(g);
    srv.stop();

    // Without the option (the default): no MMAP flag, doorbells by message.
    let srv = serve(&a, "nommap", 5, ServerOptions::default());
    let mut g = Guest::attach(srv.path(), a.topology());
    let r = g.client.region(wire::REGION_BAR2).unwrap();
    assert_eq!(r.flags & wire::REGION_FLAG_MMAP, 0);
    assert!(r.file_offset.is_none() && r.sparse_areas.is_empty());
    g.load(0);
    g.run_small(3, "kernel");
    assert_eq!(srv.stats().doorbells, 1);
    assert_eq!(srv.stats().bar2_scans, 0);
    srv.stop();
}

/// Issue 19: the host does not use the value stored on the mapped page
/// (docs/vgpu-abi.md), so a guest that stores the same value twice still
/// gets its second kernel run: the poller forwards a doorbell when the
/// queue's write index moved, so the second doorbell is not dropped as
/// stale: its kernel runs.
#[test]
fn a_doorbell_of_an_unchanged_value_on_the_page_still_runs_the_kernel() {
    let a = tiny_arbiter();
    let (srv, mut g, bar2) = polled_guest(&a, "samev");
    g.load(0);
    g.kernel(4, 10_000, 1);
    bar2.ring(0, 1);
    wait("kernel", || g.done());
    g.kernel(4, 10_000, 2);
    bar2.ring(0, 1);
    wait("second kernel", || g.done());
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(srv.stats().doorbells, 0, "no BAR2 message");
    // Both kernels ran once each. (How many doorbells were stale depends on
    // when the arbiter serves the load against the kernel's write: not
    // asserted.)
    assert_eq!(a.stats().completions, 2, "{:?}", a.stats());
    drop(bar2);
    drop(g);
    srv.stop();
}

/// Issue 19: a queue reloaded on a vHQD whose first doorbell value equals
/// the old queue's last one still runs its kernel.
#[test]
fn a_reloaded_queue_whose_first_doorbell_repeats_the_old_value_runs() {
    let a = tiny_arbiter();
    let (srv, mut g, bar2) = polled_guest(&a, "reload");
    g.load(0);
    let w = g.kernel(4, 10_000, 1);
    bar2.ring(0, w);
    wait("kernel", || g.done());
    // Dequeue (drain) and reload the queue on the same vHQD.
    g.wr(hqd_reg(0, reg::CP_HQD_DEQUEUE_REQUEST), 1);
    wait("unloaded", || g.rd(hqd_reg(0, reg::CP_HQD_ACTIVE)) == 0);
    g.load(0);
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ERROR)), 0);
    g.kernel(4, 10_000, 2);
    // The same value the old queue's last doorbell stored.
    bar2.ring(0, w);
    wait("kernel after the reload", || g.done());
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(srv.stats().doorbells, 0, "no BAR2 message");
    // Both kernels ran once each; the stale count depends on timing (see
    // the test above).
    assert_eq!(a.stats().completions, 2, "{:?}", a.stats());
    drop(bar2);
    drop(g);
    srv.stop();
}
