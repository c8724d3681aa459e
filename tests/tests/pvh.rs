//! The PVH entry of the built-in images, booted under KVM by a minimal
//! PVH loader written here (the way Cloud Hypervisor and QEMU start them:
//! docs/boot.md, "PVH boot"), so CI runs the 32-bit stub, the
//! `hvm_start_info` translation and the power-off path without a
//! third-party VMM.

use hqdmux_tests::kvm_or_skip;
use images::elf::{pvh_entry, segments, PT_LOAD};
use kvm_bindings::{kvm_segment, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuExit};

const MEM: usize = 64 << 20;
const START_INFO: u64 = 0x6000;
const MEMMAP: u64 = 0x6100;
const CMDLINE: u64 = 0x7000;

/// What the guest did on the ports a PVH guest uses.
#[derive(Debug, Default)]
struct Outcome {
    serial: String,
    /// Bytes written to QEMU's `isa-debug-exit` port (0x501).
    debug_exit: Vec<u8>,
    /// The byte written to Cloud Hypervisor's sleep control port (0x600).
    sleep: Option<u8>,
}

/// Guest RAM: anonymous memory, unmapped on drop.
struct Ram(*mut u8);

impl Ram {
    fn new() -> Ram {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Ram(p.cast())
    }

    fn write(&self, gpa: u64, bytes: &[u8]) {
        let at = usize::try_from(gpa).unwrap();
        assert!(at + bytes.len() <= MEM);
        // SAFETY: inside the mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.add(at), bytes.len()) }
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used by any vCPU.
        unsafe { libc::munmap(self.0.cast(), MEM) };
    }
}

fn flat(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xFFFF_FFFF,
        selector,
        type_: if code { 0xB } else { 0x3 },
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        ..Default::default()
    }
}

/// Boots `elf` through its PVH note with `cmdline` and an E820 map of RAM
/// below 640 KiB and from 1 MiB to 64 MiB, no ACPI tables, and runs it until
/// it writes the sleep control port (at most `max_exits` exits).
fn boot_pvh(elf: &[u8], cmdline: &str, max_exits: usize) -> Outcome {
    let kvm = Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    let ram = Ram::new();
    // SAFETY: the mapping outlives the VM (dropped after it, below).
    unsafe {
        vm.set_user_memory_region(kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: MEM as u64,
            userspace_addr: ram.0 as u64,
        })
        .unwrap();
    }
    for s in segments(elf).unwrap().iter().filter(|s| s.kind == PT_LOAD) {
        let off = s.offset as usize;
        ram.write(s.paddr, &elf[off..off + s.file_size as usize]);
    }
    // hvm_start_info (version 1): magic, version, flags, nr_modules,
    // modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr,
    // memmap_entries, reserved.
    let mut si = Vec::new();
    for v in [abi::pvh::START_MAGIC, 1, 0, 0] {
        si.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, CMDLINE, 0, MEMMAP] {
        si.extend_from_slice(&v.to_le_bytes());
    }
    si.extend_from_slice(&2u32.to_le_bytes());
    si.extend_from_slice(&0u32.to_le_bytes());
    ram.write(START_INFO, &si);
    let mut map = Vec::new();
    for (base, size) in [(0u64, 0xA0000u64), (0x10_0000, MEM as u64 - 0x10_0000)] {
        map.extend_from_slice(&base.to_le_bytes());
        map.extend_from_slice(&size.to_le_bytes());
        map.extend_from_slice(&1u32.to_le_bytes());
        map.extend_from_slice(&0u32.to_le_bytes());
    }
    ram.write(MEMMAP, &map);
    ram.write(CMDLINE, format!("{cmdline}\0").as_bytes());

    let mut vcpu = vm.create_vcpu(0).unwrap();
    vcpu.set_cpuid2(&kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap())
        .unwrap();
    // The PVH entry state: 32-bit protected mode, paging off, flat segments.
    let mut sregs = vcpu.get_sregs().unwrap();
    sregs.cs = flat(0x08, true);
    let data = flat(0x10, false);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.cr0 = 0x11; // PE, ET
    sregs.cr4 = 0;
    sregs.efer = 0;
    vcpu.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.get_regs().unwrap();
    regs.rip = pvh_entry(elf).unwrap();
    regs.rbx = START_INFO;
    regs.rflags = 0x2;
    vcpu.set_regs(&regs).unwrap();

    let mut out = Outcome::default();
    for _ in 0..max_exits {
        match vcpu.run().unwrap() {
            VcpuExit::IoOut(0x3f8, data) => out.serial.push(data[0] as char),
            VcpuExit::IoOut(0x501, data) => out.debug_exit.push(data[0]),
            VcpuExit::IoOut(0x600, data) => {
                out.sleep = Some(data[0]);
                break;
            }
            // PCI configuration mechanism #1: nothing behind it.
            VcpuExit::IoOut(0xcf8..=0xcff, _) => {}
            VcpuExit::IoOut(port, _) => panic!("write to port {port:#x}: {out:?}"),
            VcpuExit::IoIn(_, data) => data.fill(0),
            other => panic!("unexpected exit {other:?}: {out:?}"),
        }
    }
    drop(vcpu);
    drop(vm);
    out
}

#[test]
fn hello_boots_through_its_pvh_entry_reads_the_command_line_and_powers_off() {
    if !kvm_or_skip("hello_boots_through_its_pvh_entry_reads_the_command_line_and_powers_off") {
        return;
    }
    let elf = images::builtin("hello").unwrap();
    let out = boot_pvh(elf, "exit=5 name=x", 100_000);
    assert_eq!(
        out.serial,
        "hello from pvh (vm 0), args: [exit=5 name=x]\nrt: exit status 5\n"
    );
    // QEMU's isa-debug-exit gets the status; without an FADT (no RSDP) the
    // guest falls back to Cloud Hypervisor's S5 write: type 5 | SLP_EN.
    assert_eq!(out.debug_exit, [5]);
    assert_eq!(out.sleep, Some(5 << 2 | 1 << 5));
}

#[test]
fn a_gpu_guest_without_a_gpu_reports_it_and_powers_off_with_status_3() {
    if !kvm_or_skip("a_gpu_guest_without_a_gpu_reports_it_and_powers_off_with_status_3") {
        return;
    }
    // No PCI here: every config read returns 0 (IoIn), so no vGPU is found.
    let out = boot_pvh(images::builtin("gpu").unwrap(), "queues=1", 1_000_000);
    assert!(
        out.serial.contains("gpu: no vGPU") && out.serial.ends_with("rt: exit status 3\n"),
        "{out:?}"
    );
    assert_eq!(out.debug_exit, [3]);
    assert_eq!(out.sleep, Some(0x34));
}
