//! One KVM virtual machine: memfd-backed RAM, loaded image, buses, vCPU threads.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_userspace_memory_region, CpuId};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::boot::{self, BootParams, DeviceEntry};
use crate::bus::{Bus, BusAction};
use crate::console::Console;
use crate::devices::pci::PciRoot;
use crate::devices::{self, CheckpointDevice, ExitDevice, SerialDevice};

/// Everything needed to build one VM.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Fleet index, told to the guest.
    pub id: u32,
    /// Unique name.
    pub name: String,
    /// Static x86_64 ELF image.
    pub elf: Arc<[u8]>,
    /// Guest RAM bytes.
    pub mem_bytes: u64,
    /// vCPU count.
    pub vcpus: u8,
    /// Argument string.
    pub args: String,
    /// Print console lines on stdout.
    pub echo: bool,
    /// More boot-info device entries, after the built-in ones. Their bus
    /// devices are inserted after `create`. (The vGPU is found by PCI.)
    pub extra_devices: Vec<DeviceEntry>,
}

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmOutcome {
    /// The guest wrote this status to the exit port.
    Exited(u32),
    /// A vCPU triple-faulted (KVM_EXIT_SHUTDOWN).
    TripleFault {
        /// Which vCPU.
        vcpu: u8,
    },
    /// KVM could not emulate or run the guest.
    InternalError {
        /// Which vCPU.
        vcpu: u8,
        /// KVM's reason.
        detail: String,
    },
    /// vCPU 0 halted with no way to wake it.
    Halted,
    /// Stopped by the host (run timeout or shutdown).
    Stopped(String),
    /// KVM_RUN itself failed.
    HostError(String),
    /// A device's backend went away while the VM ran (a vGPU whose
    /// vfio-user server closed the connection: daemon killed or vGPU
    /// removed); the VM is stopped rather than left waiting on a device that
    /// can no longer answer.
    DeviceLost(String),
}

impl VmOutcome {
    /// True for a clean exit with status 0.
    pub fn is_success(&self) -> bool {
        *self == VmOutcome::Exited(0)
    }
}

impl std::fmt::Display for VmOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmOutcome::Exited(s) => write!(f, "exited with status {s}"),
            VmOutcome::TripleFault { vcpu } => write!(f, "triple fault on vCPU {vcpu}"),
            VmOutcome::InternalError { vcpu, detail } => {
                write!(f, "KVM internal error on vCPU {vcpu}: {detail}")
            }
            VmOutcome::Halted => write!(f, "halted with interrupts off"),
            VmOutcome::Stopped(why) => write!(f, "stopped: {why}"),
            VmOutcome::HostError(e) => write!(f, "host error: {e}"),
            VmOutcome::DeviceLost(why) => write!(f, "device lost: {why}"),
        }
    }
}

/// Failures building a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// A KVM ioctl failed.
    #[error("KVM {what}: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be created.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The image or boot structures could not be placed.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// A vCPU thread could not be started.
    #[error("vCPU thread: {0}")]
    Thread(std::io::Error),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// A built VM, not yet running.
pub struct Vm {
    spec: VmSpec,
    // Kept alive while vCPUs run; dropped only after they are joined.
    vm_fd: Arc<VmFd>,
    mem: Arc<GuestMemoryMmap>,
    vcpus: Vec<VcpuFd>,
    pio: Bus,
    mmio: Bus,
    pci: Arc<PciRoot>,
    console: Arc<Console>,
    marks: Arc<Mutex<Vec<(u32, Instant)>>>,
    entry: u64,
}

/// The CPUID table given to every vCPU: what KVM supports on this host.
pub fn supported_cpuid(kvm: &Kvm) -> Result<CpuId, VmError> {
    kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("get_supported_cpuid"))
}

/// Creates memfd-backed guest RAM of `bytes`, split around the MMIO hole
/// ([`boot::RamLayout`]): the first 3 GiB at guest address 0, the rest at
/// 4 GiB (file offset 3 GiB). Pages are allocated on first touch. The
/// memfd is sealed against shrinking and growing, so a vfio-user server
/// given it (DMA_MAP) can map it safely (docs/vgpu-abi.md).
pub fn create_guest_memory(name: &str, bytes: u64) -> Result<GuestMemoryMmap, VmError> {
    let cname = std::ffi::CString::new(format!("hqdmux-{name}")).unwrap_or_default();
    // SAFETY: memfd_create with a valid C string; the fd is owned by `File` below.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(VmError::Memory(format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd is a fresh, owned descriptor.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(bytes)
        .map_err(|e| VmError::Memory(format!("ftruncate: {e}")))?;
    // SAFETY: fcntl on the fd `file` owns; no pointers.
    if unsafe {
        libc::fcntl(
            fd,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    } != 0
    {
        return Err(VmError::Memory(format!(
            "F_ADD_SEALS: {}",
            std::io::Error::last_os_error()
        )));
    }
    // One descriptor shared by both regions (docs/operators.md counts one
    // memfd per VM).
    let file = Arc::new(file);
    let mut ranges = Vec::new();
    let mut offset = 0u64;
    for (gpa, size) in boot::RamLayout::new(bytes).regions() {
        let size = usize::try_from(size)
            .map_err(|_| VmError::Memory(format!("{size} bytes do not fit the host")))?;
        ranges.push((
            GuestAddress(gpa),
            size,
            Some(FileOffset::from_arc(file.clone(), offset)),
        ));
        offset += size as u64;
    }
    GuestMemoryMmap::from_ranges_with_files(ranges).map_err(|e| VmError::Memory(e.to_string()))
}

/// The guest physical-address width of `cpuid` (leaf 0x80000008, EAX bits
/// 7:0), if the leaf is there.
pub fn guest_phys_bits(cpuid: &CpuId) -> Option<u32> {
    cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == 0x8000_0008)
        .map(|e| e.eax & 0xff)
        .filter(|b| *b > 0)
}

impl Vm {
    /// Builds the VM: RAM, image, boot structures, devices and vCPUs.
    pub fn create(kvm: &Kvm, cpuid: &CpuId, spec: VmSpec) -> Result<Self, VmError> {
        let t0 = Instant::now();
        let vm_fd = kvm.create_vm().map_err(kvm_err("create_vm"))?;
        // In-kernel LAPIC/IOAPIC/PIC before any vCPU: MSI-X interrupts arrive
        // through irqfds and `hlt` waits in the kernel.
        vm_fd
            .create_irq_chip()
            .map_err(kvm_err("create_irq_chip"))?;
        let layout = boot::RamLayout::new(spec.mem_bytes);
        if let Some(bits) = guest_phys_bits(cpuid) {
            if bits < 64 && layout.top() > 1u64 << bits {
                return Err(VmError::Memory(format!(
                    "{} MiB of RAM ends at {:#x}, beyond the {bits}-bit guest physical addresses of this host",
                    spec.mem_bytes >> 20,
                    layout.top()
                )));
            }
        }
        let mem = create_guest_memory(&spec.name, spec.mem_bytes)?;
        for (slot, (gpa, size)) in layout.regions().enumerate() {
            let host = mem
                .get_host_address(GuestAddress(gpa))
                .map_err(|e| VmError::Memory(e.to_string()))?;
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: gpa,
                memory_size: size,
                userspace_addr: host as u64,
                flags: 0,
            };
            // SAFETY: the region maps part of `mem` (one of its mmaps, whole),
            // which outlives the VM fd's use (kept in `Vm` and in every vCPU
            // thread until they are joined).
            unsafe { vm_fd.set_user_memory_region(region) }
                .map_err(kvm_err("set_user_memory_region"))?;
        }

        let (entry, image_end) = boot::load_image(&mem, &spec.elf, spec.mem_bytes)?;
        let mut devices = vec![
            DeviceEntry {
                kind: boot::device_kind::SERIAL,
                vector: 0,
                base: devices::SERIAL_PORT,
                size: 8,
                reserved: 0,
            },
            DeviceEntry {
                kind: boot::device_kind::EXIT,
                vector: 0,
                base: devices::EXIT_PORT,
                size: 4,
                reserved: 0,
            },
            DeviceEntry {
                kind: boot::device_kind::CHECKPOINT,
                vector: 0,
                base: devices::CHECKPOINT_PORT,
                size: 4,
                reserved: 0,
            },
        ];
        devices.extend(spec.extra_devices.iter().copied());
        let params = BootParams {
            vm_id: spec.id,
            vcpus: u32::from(spec.vcpus),
            name: &spec.name,
            args: &spec.args,
            devices: &devices,
        };
        boot::write_boot_structures(&mem, &params, spec.mem_bytes, image_end)?;

        let console = Console::new(&spec.name, spec.echo);
        let marks = Arc::new(Mutex::new(Vec::new()));
        let pio = Bus::new();
        let bus_err = |e| VmError::Memory(format!("bus: {e}"));
        pio.insert(
            devices::SERIAL_PORT,
            8,
            Arc::new(SerialDevice::new(console.clone())),
        )
        .map_err(bus_err)?;
        pio.insert(devices::EXIT_PORT, 4, Arc::new(ExitDevice))
            .map_err(bus_err)?;
        pio.insert(
            devices::CHECKPOINT_PORT,
            4,
            Arc::new(CheckpointDevice::new(marks.clone())),
        )
        .map_err(bus_err)?;
        let pci = Arc::new(PciRoot::new());
        pio.insert(u64::from(abi::pci::CONFIG_ADDRESS_PORT), 8, pci.clone())
            .map_err(bus_err)?;

        let mut vcpus = Vec::new();
        for i in 0..spec.vcpus {
            let vcpu = vm_fd
                .create_vcpu(u64::from(i))
                .map_err(kvm_err("create_vcpu"))?;
            vcpu.set_cpuid2(cpuid).map_err(kvm_err("set_cpuid2"))?;
            let mut sregs = vcpu.get_sregs().map_err(kvm_err("get_sregs"))?;
            boot::setup_sregs(&mut sregs);
            vcpu.set_sregs(&sregs).map_err(kvm_err("set_sregs"))?;
            vcpu.set_regs(&boot::entry_regs(entry, u64::from(i)))
                .map_err(kvm_err("set_regs"))?;
            if i > 0 {
                // With the in-kernel LAPIC an application processor waits for
                // INIT/SIPI; ours start at the entry point like vCPU 0.
                vcpu.set_mp_state(kvm_bindings::kvm_mp_state {
                    mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
                })
                .map_err(kvm_err("set_mp_state"))?;
            }
            vcpus.push(vcpu);
        }
        log::debug!("{}: built in {:?}", spec.name, t0.elapsed());
        Ok(Self {
            spec,
            vm_fd: Arc::new(vm_fd),
            mem: Arc::new(mem),
            vcpus,
            pio,
            mmio: Bus::new(),
            pci,
            console,
            marks,
            entry,
        })
    }

    /// The VM's name.
    pub fn spec_name(&self) -> &str {
        &self.spec.name
    }

    /// Guest RAM (shared with device models).
    pub fn guest_memory(&self) -> Arc<GuestMemoryMmap> {
        self.mem.clone()
    }

    /// The MMIO bus (shared: devices may be added or moved while running).
    pub fn mmio_bus(&self) -> Bus {
        self.mmio.clone()
    }

    /// PCI bus 0 (configuration mechanism #1).
    pub fn pci(&self) -> &Arc<PciRoot> {
        &self.pci
    }

    /// The KVM VM (ioeventfds, irqfds, GSI routes).
    pub fn vm_fd(&self) -> &Arc<VmFd> {
        &self.vm_fd
    }

    /// Guest RAM.
    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// ELF entry point.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// Starts one thread per vCPU; `done` is signalled when the VM ends.
    pub fn start(self, done: EventFd) -> Result<RunningVm, VmError> {
        install_kick_handler();
        let shared = Arc::new(VmShared {
            stop: AtomicBool::new(false),
            outcome: Mutex::new(None),
            done,
            exits: std::sync::atomic::AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
        });
        let started = Instant::now();
        let mut threads = Vec::new();
        for (i, vcpu) in self.vcpus.into_iter().enumerate() {
            let ctx = VcpuContext {
                index: i as u8,
                vcpu,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                shared: shared.clone(),
                _mem: self.mem.clone(),
            };
            let t = std::thread::Builder::new()
                .name(format!("{}-vcpu{i}", self.spec.name))
                .spawn(move || ctx.run())
                .map_err(VmError::Thread)?;
            threads.push(t);
        }
        *lock_threads(&shared) = threads;
        Ok(RunningVm {
            name: self.spec.name,
            shared,
            console: self.console,
            marks: self.marks,
            started,
            _vm_fd: self.vm_fd,
            mem: self.mem,
        })
    }
}

struct VmShared {
    stop: AtomicBool,
    outcome: Mutex<Option<(VmOutcome, Instant)>>,
    done: EventFd,
    exits: std::sync::atomic::AtomicU64,
    /// The vCPU threads, until [`RunningVm::stop`] joins them: kept here
    /// (never detached) so that a [`VmEnder`] can kick them soundly.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock_threads(s: &VmShared) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
    s.threads.lock().unwrap_or_else(|e| e.into_inner())
}

impl VmShared {
    /// Records the first outcome and tells everyone to stop.
    fn finish(&self, outcome: VmOutcome) {
        let mut slot = self.outcome.lock().unwrap();
        if slot.is_none() {
            *slot = Some((outcome, Instant::now()));
            self.stop.store(true, Ordering::SeqCst);
            let _ = self.done.write(1);
        }
    }
}

struct VcpuContext {
    index: u8,
    vcpu: VcpuFd,
    pio: Bus,
    mmio: Bus,
    shared: Arc<VmShared>,
    _mem: Arc<GuestMemoryMmap>,
}

impl VcpuContext {
    fn run(mut self) {
        while !self.shared.stop.load(Ordering::SeqCst) {
            let exit = self.vcpu.run();
            self.shared.exits.fetch_add(1, Ordering::Relaxed);
            let outcome = match exit {
                Ok(VcpuExit::IoOut(port, data)) => match self.pio.write(u64::from(port), data) {
                    Some(BusAction::Exit(status)) => Some(VmOutcome::Exited(status)),
                    Some(BusAction::Continue) => None,
                    None => {
                        log::debug!("vCPU {}: write to unclaimed port {port:#x}", self.index);
                        None
                    }
                },
                Ok(VcpuExit::IoIn(port, data)) => {
                    self.pio.read(u64::from(port), data);
                    None
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => match self.mmio.write(addr, data) {
                    Some(BusAction::Exit(status)) => Some(VmOutcome::Exited(status)),
                    Some(BusAction::Continue) => None,
                    None => {
                        log::debug!("vCPU {}: write to unclaimed MMIO {addr:#x}", self.index);
                        None
                    }
                },
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    self.mmio.read(addr, data);
                    None
                }
                Ok(VcpuExit::Hlt) => {
                    if self.index == 0 {
                        Some(VmOutcome::Halted)
                    } else {
                        return; // an application processor parked itself
                    }
                }
                Ok(VcpuExit::Shutdown) => Some(VmOutcome::TripleFault { vcpu: self.index }),
                Ok(VcpuExit::InternalError) => {
                    // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member is the valid one.
                    let suberror =
                        unsafe { self.vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
                    let rip = self.vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                    log::warn!(
                        "vCPU {}: KVM internal error {suberror} at rip {rip:#x}",
                        self.index
                    );
                    Some(VmOutcome::InternalError {
                        vcpu: self.index,
                        detail: format!("suberror {suberror}"),
                    })
                }
                Ok(VcpuExit::FailEntry(reason, _)) => Some(VmOutcome::InternalError {
                    vcpu: self.index,
                    detail: format!("entry failed, hardware reason {reason:#x}"),
                }),
                Ok(other) => Some(VmOutcome::InternalError {
                    vcpu: self.index,
                    detail: format!("unexpected exit {other:?}"),
                }),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
                Err(e) => Some(VmOutcome::HostError(format!("KVM_RUN: {e}"))),
            };
            if let Some(outcome) = outcome {
                self.shared.finish(outcome);
                return;
            }
        }
    }
}

static KICK_HANDLER: Once = Once::new();

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_kick_handler() {
    KICK_HANDLER.call_once(|| {
        if let Err(e) = register_signal_handler(SIGRTMIN(), kick_handler) {
            log::error!("cannot install the vCPU kick signal handler: {e}");
        }
    });
}

/// Ends a running VM from a thread of the host (a device whose backend
/// went away): records the outcome and kicks every vCPU out of `KVM_RUN`.
#[derive(Clone)]
pub struct VmEnder {
    shared: Arc<VmShared>,
}

impl VmEnder {
    /// Records `outcome` unless the VM already ended, and then kicks its
    /// vCPUs (those not joined yet); returns whether this call ended it.
    pub fn end(&self, outcome: VmOutcome) -> bool {
        let mut slot = self
            .shared
            .outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some((outcome, Instant::now()));
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.done.write(1);
        drop(slot);
        for t in lock_threads(&self.shared).iter() {
            if !t.is_finished() {
                let _ = t.kill(SIGRTMIN());
            }
        }
        true
    }
}

/// A running VM.
pub struct RunningVm {
    name: String,
    shared: Arc<VmShared>,
    console: Arc<Console>,
    marks: Arc<Mutex<Vec<(u32, Instant)>>>,
    started: Instant,
    _vm_fd: Arc<VmFd>,
    mem: Arc<GuestMemoryMmap>,
}

/// The end of one VM's run.
#[derive(Debug, Clone)]
pub struct VmReport {
    /// VM name.
    pub name: String,
    /// How it ended.
    pub outcome: VmOutcome,
    /// vCPU threads started.
    pub started: Instant,
    /// Guest runtime entered (checkpoint 1), if seen.
    pub entered: Option<Instant>,
    /// First complete console line, if any.
    pub first_line: Option<Instant>,
    /// Time from start to end.
    pub run_time: Duration,
    /// Console lines.
    pub console: Vec<String>,
    /// VM exits handled by vCPU threads.
    pub exits: u64,
    /// Every checkpoint the guest wrote (value, host time), in order.
    pub checkpoints: Vec<(u32, Instant)>,
}

impl VmReport {
    /// Host-measured spans from each checkpoint `from` to the next `to`
    /// (e.g. 2 = GPU work submitted, 3 = completed).
    pub fn spans(&self, from: u32, to: u32) -> Vec<Duration> {
        let mut out = Vec::new();
        let mut start = None;
        for &(c, t) in &self.checkpoints {
            if c == from {
                start = Some(t);
            } else if c == to {
                if let Some(s) = start.take() {
                    out.push(t - s);
                }
            }
        }
        out
    }
}

impl RunningVm {
    /// VM name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True once an outcome is recorded.
    pub fn has_ended(&self) -> bool {
        self.shared.outcome.lock().unwrap().is_some()
    }

    /// A handle that ends this VM from another thread ([`VmEnder::end`]).
    pub fn ender(&self) -> VmEnder {
        VmEnder {
            shared: self.shared.clone(),
        }
    }

    /// Guest RAM.
    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// Records outcome `Stopped(why)` (unless the VM already ended) and asks
    /// its vCPUs to stop (one kick each), without waiting for them: a later
    /// event (such as a vGPU detach waking a guest's wait) cannot then change
    /// the outcome, and halting every VM before stopping them one by one
    /// lets their vCPUs leave `KVM_RUN` together.
    pub fn halt(&self, why: &str) {
        self.shared.finish(VmOutcome::Stopped(why.to_owned()));
        for t in lock_threads(&self.shared).iter() {
            if !t.is_finished() {
                let _ = t.kill(SIGRTMIN());
            }
        }
    }

    /// Stops the VM (if still running) with outcome `Stopped(why)`, joins its
    /// vCPU threads and returns its report. Guest memory is dropped only after.
    pub fn stop(self, why: &str) -> VmReport {
        self.shared.finish(VmOutcome::Stopped(why.to_owned()));
        let deadline = Instant::now() + Duration::from_secs(5);
        let threads = std::mem::take(&mut *lock_threads(&self.shared));
        for t in threads {
            while !t.is_finished() && Instant::now() < deadline {
                let _ = t.kill(SIGRTMIN());
                std::thread::sleep(Duration::from_millis(2));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                log::error!("{}: vCPU thread did not stop; leaking it", self.name);
                std::mem::forget(self.mem.clone());
            }
        }
        self.console.flush();
        let (outcome, ended) = self
            .shared
            .outcome
            .lock()
            .unwrap()
            .clone()
            .expect("outcome set by finish");
        let checkpoints = self.marks.lock().unwrap().clone();
        let entered = checkpoints.iter().find(|(c, _)| *c == 1).map(|(_, t)| *t);
        VmReport {
            name: self.name.clone(),
            outcome,
            started: self.started,
            entered,
            first_line: self.console.first_line_at(),
            run_time: ended - self.started,
            console: self.console.lines(),
            exits: self.shared.exits.load(Ordering::Relaxed),
            checkpoints,
        }
    }
}
