//! hqdmux VMM: KVM virtual machines with bare-metal guests, launched as a
//! fleet from one TOML config. See docs/architecture.md.

pub mod api;
pub mod boot;
pub mod bus;
pub mod config;
pub mod console;
pub mod devices;
pub mod fleet;
pub mod simcmd;
pub mod vm;

/// True when `/dev/kvm` can be opened read-write.
pub fn kvm_available() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}
