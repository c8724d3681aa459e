//! Emulated platform devices: serial console, exit and checkpoint ports,
//! the PCI host bridge and bus ([`pci`]), the vGPU PCI function ([`vgpu`])
//! with its MSI-X model ([`msix`]).

pub mod msix;
pub mod pci;
pub mod vfio_client;
pub mod vfio_wire;
pub mod vgpu;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use vm_superio::{serial::NoEvents, Serial, Trigger};

use crate::bus::{BusAction, BusDevice};
use crate::console::{Console, ConsoleWriter};

/// COM1 port base.
pub const SERIAL_PORT: u64 = 0x3f8;
/// Exit port: a 32-bit write ends the VM with that status.
pub const EXIT_PORT: u64 = 0xf4;
/// Checkpoint port: a 32-bit write records a host timestamp.
pub const CHECKPOINT_PORT: u64 = 0xf8;

/// Lines per second a [`RateLimitedLog`] lets through.
pub const LOG_LINES_PER_SECOND: u32 = 5;

/// A warning log for guest-triggered events: at most
/// [`LOG_LINES_PER_SECOND`] lines per second; the first line after a
/// suppressed burst says how many were suppressed.
pub struct RateLimitedLog {
    prefix: String,
    st: Mutex<LimitState>,
}

struct LimitState {
    window: Option<Instant>,
    lines: u32,
    suppressed: u64,
    total: u64,
    unlogged: u64,
}

impl RateLimitedLog {
    /// A limiter whose lines start with `prefix`.
    pub fn new(prefix: String) -> Self {
        RateLimitedLog {
            prefix,
            st: Mutex::new(LimitState {
                window: None,
                lines: 0,
                suppressed: 0,
                total: 0,
                unlogged: 0,
            }),
        }
    }

    /// Logs `msg` at warn level unless the limit is reached.
    pub fn warn(&self, msg: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        let mut st = self
            .st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.total += 1;
        if st
            .window
            .is_none_or(|w| now.duration_since(w) >= std::time::Duration::from_secs(1))
        {
            st.window = Some(now);
            st.lines = 0;
        }
        if st.lines >= LOG_LINES_PER_SECOND {
            st.suppressed += 1;
            st.unlogged += 1;
            return;
        }
        st.lines += 1;
        let suppressed = std::mem::take(&mut st.suppressed);
        drop(st);
        if suppressed > 0 {
            log::warn!(
                "{}: {msg} ({suppressed} similar lines suppressed)",
                self.prefix
            );
        } else {
            log::warn!("{}: {msg}", self.prefix);
        }
    }

    /// Logs the count of lines suppressed since the last logged one (if
    /// any); returns how many were never logged in all.
    pub fn flush(&self) -> u64 {
        let mut st = self
            .st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let suppressed = std::mem::take(&mut st.suppressed);
        let unlogged = st.unlogged;
        drop(st);
        if suppressed > 0 {
            log::warn!("{}: {suppressed} similar lines suppressed", self.prefix);
        }
        unlogged
    }

    /// Events reported (logged or suppressed).
    pub fn total(&self) -> u64 {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .total
    }

    /// Events suppressed since the last logged line.
    pub fn suppressed(&self) -> u64 {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .suppressed
    }
}

/// The serial port raises no interrupt yet (the guests only write).
pub struct NoIrq;

impl Trigger for NoIrq {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        Ok(())
    }
}

/// 16550 UART (vm-superio) whose output feeds a [`Console`].
pub struct SerialDevice(Mutex<Serial<NoIrq, NoEvents, ConsoleWriter>>);

impl SerialDevice {
    /// A UART writing to `console`.
    pub fn new(console: Arc<Console>) -> Self {
        Self(Mutex::new(Serial::new(NoIrq, ConsoleWriter(console))))
    }

    fn uart(&self) -> std::sync::MutexGuard<'_, Serial<NoIrq, NoEvents, ConsoleWriter>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl BusDevice for SerialDevice {
    fn read(&self, offset: u64, data: &mut [u8]) {
        if let Some(b) = data.first_mut() {
            *b = self.uart().read(offset as u8);
        }
    }
    fn write(&self, offset: u64, data: &[u8]) -> BusAction {
        if let Some(&b) = data.first() {
            if let Err(e) = self.uart().write(offset as u8, b) {
                log::warn!("serial write failed: {e:?}");
            }
        }
        BusAction::Continue
    }
}

/// The little-endian value of a port write of up to 4 bytes (a longer
/// write is cut to its first 4, a shorter one zero-extended).
fn le_u32_prefix(data: &[u8]) -> u32 {
    let mut v = [0u8; 4];
    let n = data.len().min(4);
    v[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(v)
}

/// Exit status port.
pub struct ExitDevice;

impl BusDevice for ExitDevice {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> BusAction {
        BusAction::Exit(le_u32_prefix(data))
    }
}

/// Most checkpoints recorded per VM (24 bytes each): later ones are
/// dropped, so a guest writing the port forever cannot grow host memory
/// without bound. `builtin:gpu` writes two per submit/wait cycle.
pub const MAX_CHECKPOINTS: usize = 1 << 16;

/// Timestamped guest checkpoints (e.g. code 1 = runtime entered); the first
/// [`MAX_CHECKPOINTS`] of a VM are kept.
#[derive(Default)]
pub struct CheckpointDevice {
    marks: Arc<Mutex<Vec<(u32, Instant)>>>,
}

impl CheckpointDevice {
    /// A device recording into `marks`.
    pub fn new(marks: Arc<Mutex<Vec<(u32, Instant)>>>) -> Self {
        Self { marks }
    }
}

impl BusDevice for CheckpointDevice {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> BusAction {
        let mut marks = self
            .marks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if marks.len() < MAX_CHECKPOINTS {
            marks.push((le_u32_prefix(data), Instant::now()));
        }
        BusAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_output_reaches_console_and_exit_reports_status() {
        let console = Console::new("s", false);
        let s = SerialDevice::new(console.clone());
        for &b in b"hi\n" {
            assert_eq!(s.write(0, &[b]), BusAction::Continue);
        }
        assert_eq!(console.lines(), vec!["hi"]);
        assert_eq!(ExitDevice.write(0, &7u32.to_le_bytes()), BusAction::Exit(7));
        assert_eq!(ExitDevice.write(0, &[3]), BusAction::Exit(3));
        let marks = Arc::default();
        let c = CheckpointDevice::new(Arc::clone(&marks));
        c.write(0, &1u32.to_le_bytes());
        assert_eq!(marks.lock().unwrap()[0].0, 1);
    }

    #[test]
    fn port_writes_of_any_width_read_as_one_le_u32() {
        assert_eq!(le_u32_prefix(&[]), 0);
        assert_eq!(le_u32_prefix(&[0x34, 0x12]), 0x1234, "zero-extended");
        assert_eq!(
            le_u32_prefix(&[1, 2, 3, 4, 5, 6, 7, 8]),
            0x0403_0201,
            "cut to 4 bytes"
        );
        assert_eq!(ExitDevice.write(0, &[9, 0, 0, 0, 1]), BusAction::Exit(9));
    }

    #[test]
    fn a_guest_writing_checkpoints_forever_keeps_bounded_host_memory() {
        let marks = Arc::new(Mutex::new(Vec::new()));
        let d = CheckpointDevice::new(marks.clone());
        for i in 0..MAX_CHECKPOINTS as u32 + 1000 {
            assert_eq!(d.write(0, &i.to_le_bytes()), BusAction::Continue);
        }
        let m = marks.lock().unwrap();
        assert_eq!(m.len(), MAX_CHECKPOINTS);
        assert_eq!(m[0].0, 0, "the first ones are kept");
        assert_eq!(m[MAX_CHECKPOINTS - 1].0, MAX_CHECKPOINTS as u32 - 1);
    }

    #[test]
    fn rate_limited_log_counts_what_it_suppresses() {
        let l = RateLimitedLog::new("t".into());
        for _ in 0..100 {
            l.warn(format_args!("x"));
        }
        assert_eq!(l.total(), 100);
        assert_eq!(l.suppressed(), 100 - u64::from(LOG_LINES_PER_SECOND));
        assert_eq!(l.flush(), 100 - u64::from(LOG_LINES_PER_SECOND));
        assert_eq!(l.suppressed(), 0, "flushed");
    }
}
