//! Guest consoles: serial bytes become lines, each printed on the host's
//! stdout prefixed with the VM's name and kept for the run report.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Longest line kept; longer output is split.
const MAX_LINE: usize = 4096;

/// The console of one VM.
pub struct Console {
    name: String,
    echo: bool,
    inner: Mutex<ConsoleInner>,
}

#[derive(Default)]
struct ConsoleInner {
    partial: Vec<u8>,
    lines: Vec<String>,
    first_line_at: Option<Instant>,
}

impl Console {
    /// A console for VM `name`; `echo` prints lines on stdout as they complete.
    pub fn new(name: &str, echo: bool) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            echo,
            inner: Mutex::default(),
        })
    }

    /// Feeds bytes written by the guest.
    pub fn push(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock().unwrap();
        for &b in bytes {
            if b == b'\n' || inner.partial.len() >= MAX_LINE {
                self.finish_line(&mut inner);
                if b == b'\n' {
                    continue;
                }
            }
            if b != b'\r' {
                inner.partial.push(b);
            }
        }
    }

    /// Emits any unterminated output as a last line.
    pub fn flush(&self) {
        let mut inner = self.inner.lock().unwrap();
        if !inner.partial.is_empty() {
            self.finish_line(&mut inner);
        }
    }

    fn finish_line(&self, inner: &mut ConsoleInner) {
        let line = String::from_utf8_lossy(&inner.partial).into_owned();
        inner.partial.clear();
        inner.first_line_at.get_or_insert_with(Instant::now);
        if self.echo {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "[{}] {}", self.name, line);
        }
        inner.lines.push(line);
    }

    /// Every complete line so far.
    pub fn lines(&self) -> Vec<String> {
        self.inner.lock().unwrap().lines.clone()
    }

    /// When the first line completed.
    pub fn first_line_at(&self) -> Option<Instant> {
        self.inner.lock().unwrap().first_line_at
    }
}

/// `std::io::Write` adaptor for vm-superio's serial output.
pub struct ConsoleWriter(pub Arc<Console>);

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_strips_cr_and_flushes_partial() {
        let c = Console::new("t", false);
        c.push(b"ab\r\ncd");
        c.push(b"e\nf");
        assert_eq!(c.lines(), vec!["ab", "cde"]);
        c.flush();
        assert_eq!(c.lines(), vec!["ab", "cde", "f"]);
        assert!(c.first_line_at().is_some());
        c.push(&vec![b'x'; MAX_LINE + 1]);
        c.flush();
        assert_eq!(c.lines().len(), 5);
    }
}
