//! Emulated platform devices: serial console, exit and checkpoint ports,
//! and the vGPU windows ([`vgpu`]).

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

/// The serial port raises no interrupt yet (the guests only write).
pub struct NoIrq;

impl Trigger for NoIrq {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        Ok(())
    }
}

/// 16550 UART (vm-superio) whose output feeds a [`Console`].
pub struct SerialDevice(Serial<NoIrq, NoEvents, ConsoleWriter>);

impl SerialDevice {
    /// A UART writing to `console`.
    pub fn new(console: Arc<Console>) -> Self {
        Self(Serial::new(NoIrq, ConsoleWriter(console)))
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let Some(b) = data.first_mut() {
            *b = self.0.read(offset as u8);
        }
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> BusAction {
        if let Some(&b) = data.first() {
            if let Err(e) = self.0.write(offset as u8, b) {
                log::warn!("serial write failed: {e:?}");
            }
        }
        BusAction::Continue
    }
}

/// Exit status port.
pub struct ExitDevice;

impl BusDevice for ExitDevice {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, _offset: u64, data: &[u8]) -> BusAction {
        let mut v = [0u8; 4];
        let n = data.len().min(4);
        v[..n].copy_from_slice(&data[..n]);
        BusAction::Exit(u32::from_le_bytes(v))
    }
}

/// Timestamped guest checkpoints (e.g. code 1 = runtime entered).
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
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, _offset: u64, data: &[u8]) -> BusAction {
        let mut v = [0u8; 4];
        let n = data.len().min(4);
        v[..n].copy_from_slice(&data[..n]);
        self.marks
            .lock()
            .unwrap()
            .push((u32::from_le_bytes(v), Instant::now()));
        BusAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_output_reaches_console_and_exit_reports_status() {
        let console = Console::new("s", false);
        let mut s = SerialDevice::new(console.clone());
        for &b in b"hi\n" {
            assert_eq!(s.write(0, &[b]), BusAction::Continue);
        }
        assert_eq!(console.lines(), vec!["hi"]);
        assert_eq!(ExitDevice.write(0, &7u32.to_le_bytes()), BusAction::Exit(7));
        assert_eq!(ExitDevice.write(0, &[3]), BusAction::Exit(3));
        let marks = Arc::default();
        let mut c = CheckpointDevice::new(Arc::clone(&marks));
        c.write(0, &1u32.to_le_bytes());
        assert_eq!(marks.lock().unwrap()[0].0, 1);
    }
}
