//! The boot-info block the VMM writes before entry (layout in docs/boot.md).

/// `"HQDB"` little-endian.
pub const BOOT_MAGIC: u32 = 0x4244_5148;
/// Layout version this runtime understands.
pub const BOOT_VERSION: u32 = 1;
/// Maximum devices described in the block.
pub const MAX_DEVICES: usize = 16;

/// Kinds of entries in [`BootInfo::devices`].
pub mod device_kind {
    /// 16550 UART; `base` is the I/O port.
    pub const SERIAL: u32 = 1;
    /// Exit port; `base` is the I/O port (32-bit write = exit status).
    pub const EXIT: u32 = 2;
    /// Checkpoint port; `base` is the I/O port (32-bit write = host timestamp).
    pub const CHECKPOINT: u32 = 3;
    /// Virtual GPU register window (MMIO, 4 KiB; docs/vgpu-abi.md).
    pub const VGPU_REGS: u32 = 4;
    /// Virtual GPU doorbell window (MMIO, 4 KiB; docs/vgpu-abi.md).
    pub const VGPU_DOORBELLS: u32 = 5;
}

/// One device entry.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceEntry {
    /// A `device_kind` value.
    pub kind: u32,
    /// Interrupt vector (0 = none).
    pub vector: u32,
    /// MMIO guest physical address or I/O port.
    pub base: u64,
    /// Size in bytes of the register window.
    pub size: u64,
    /// Reserved, zero.
    pub reserved: u64,
}

/// The boot-info block (1648 bytes, at the GPA passed in `rsi`).
#[repr(C)]
pub struct BootInfo {
    /// [`BOOT_MAGIC`].
    pub magic: u32,
    /// [`BOOT_VERSION`].
    pub version: u32,
    /// Index of the VM in the fleet (0-based).
    pub vm_id: u32,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest RAM size in bytes, RAM spans `[0, mem_bytes)`.
    pub mem_bytes: u64,
    /// First free, page-aligned address after the loaded image.
    pub image_end: u64,
    /// Bytes used in `name`.
    pub name_len: u32,
    /// Bytes used in `args`.
    pub args_len: u32,
    /// Entries used in `devices`.
    pub dev_count: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// VM name, UTF-8.
    pub name: [u8; 64],
    /// Argument string, UTF-8.
    pub args: [u8; 1024],
    /// Devices.
    pub devices: [DeviceEntry; MAX_DEVICES],
}

impl BootInfo {
    /// True when magic and version match and the lengths are in range.
    pub fn is_valid(&self) -> bool {
        self.magic == BOOT_MAGIC
            && self.version == BOOT_VERSION
            && self.name_len as usize <= self.name.len()
            && self.args_len as usize <= self.args.len()
            && self.dev_count as usize <= MAX_DEVICES
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        core::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("?")
    }

    /// The argument string.
    pub fn args(&self) -> &str {
        core::str::from_utf8(&self.args[..self.args_len as usize]).unwrap_or("")
    }

    /// Value of `key=value` among whitespace-separated args.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args().split_ascii_whitespace().find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then_some(v)
        })
    }

    /// Integer value of `key=value` (decimal or 0x hex).
    pub fn arg_u64(&self, key: &str) -> Option<u64> {
        parse_u64(self.arg(key)?)
    }

    /// The first device of `kind`.
    pub fn device(&self, kind: u32) -> Option<&DeviceEntry> {
        self.devices[..self.dev_count as usize]
            .iter()
            .find(|d| d.kind == kind)
    }
}

/// Parses decimal or `0x` hexadecimal.
pub fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}
