//! Guest consoles: serial bytes become lines, each printed on the host's
//! stdout prefixed with the VM's name and kept for the run report.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Longest line kept; longer output is split.
const MAX_LINE: usize = 4096;
/// Bytes of complete lines kept per VM for the run report (a line costs its
/// length plus [`LINE_OVERHEAD`]); past it the oldest lines are dropped, so
/// a guest printing forever cannot grow host memory without bound.
const MAX_KEPT_BYTES: usize = 1 << 20;
/// What one kept line costs beyond its bytes (the `String` and its slot).
const LINE_OVERHEAD: usize = 48;

/// The console of one VM.
pub struct Console {
    name: String,
    echo: bool,
    inner: Mutex<ConsoleInner>,
}

#[derive(Default)]
struct ConsoleInner {
    partial: Vec<u8>,
    lines: VecDeque<String>,
    /// Cost of `lines` (bytes + [`LINE_OVERHEAD`] each).
    kept_bytes: usize,
    /// Oldest lines dropped to stay under [`MAX_KEPT_BYTES`].
    dropped: u64,
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

    fn lock(&self) -> MutexGuard<'_, ConsoleInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Feeds bytes written by the guest.
    pub fn push(&self, bytes: &[u8]) {
        let mut inner = self.lock();
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
        let mut inner = self.lock();
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
        inner.kept_bytes += line.len() + LINE_OVERHEAD;
        inner.lines.push_back(line);
        while inner.kept_bytes > MAX_KEPT_BYTES && inner.lines.len() > 1 {
            if let Some(old) = inner.lines.pop_front() {
                inner.kept_bytes -= old.len() + LINE_OVERHEAD;
                inner.dropped += 1;
            }
        }
    }

    /// Every complete line kept: the most recent ones up to about 1 MiB,
    /// after a first line saying how many earlier ones were dropped (if any).
    pub fn lines(&self) -> Vec<String> {
        let inner = self.lock();
        let mut out = Vec::with_capacity(inner.lines.len() + 1);
        if inner.dropped > 0 {
            out.push(format!(
                "[hqdmux: {} earlier console lines dropped (at most {MAX_KEPT_BYTES} bytes are kept per VM)]",
                inner.dropped
            ));
        }
        out.extend(inner.lines.iter().cloned());
        out
    }

    /// When the first line completed.
    pub fn first_line_at(&self) -> Option<Instant> {
        self.lock().first_line_at
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

    #[test]
    fn a_guest_flooding_its_console_keeps_bounded_host_memory() {
        let c = Console::new("t", false);
        c.push(b"first\n");
        // Empty lines cost the host a String each: they count too.
        for _ in 0..(MAX_KEPT_BYTES / 64 + 10) {
            c.push(b"\n");
        }
        for i in 0..(2 * MAX_KEPT_BYTES / MAX_LINE) {
            c.push(&vec![b'a' + (i % 26) as u8; MAX_LINE]);
        }
        c.push(b"\nlast\n");
        let lines = c.lines();
        let kept: usize = lines.iter().map(|l| l.len() + LINE_OVERHEAD).sum();
        assert!(kept <= MAX_KEPT_BYTES + 200, "{kept} bytes kept");
        assert_eq!(lines.last().map(String::as_str), Some("last"));
        assert!(
            lines[0].starts_with("[hqdmux: ") && lines[0].contains("earlier console lines dropped"),
            "{}",
            lines[0]
        );
        assert!(!lines.iter().any(|l| l == "first"));
    }
}
