//! The boot-info block the VMM writes before entry: the layout is shared with
//! the host in `abi::boot` (docs/boot.md).

pub use abi::boot::{
    device_kind, parse_u64, region_kind, BootInfo, DeviceEntry, MemRegion, BOOT_MAGIC,
    BOOT_VERSION, MAX_DEVICES, MAX_MEM_REGIONS,
};
