//! The client end of the vfio-user protocol, as much of it as hqdmux's own
//! VMM needs to attach a vGPU served by another process (VERSION,
//! DEVICE_GET_INFO, DEVICE_GET_REGION_INFO with the mmap-able BAR2 page,
//! DMA_MAP, SET_IRQS, REGION_READ/WRITE).
//!
//! It exists beside the `vfio_user` crate's client because the VMM must
//! watch the connection itself ([`UserClient::as_raw_fd`]: a server that
//! closes the socket means the device is gone) and must tell a refused
//! request (an error reply: the connection is fine) from a broken stream
//! ([`WireError::is_lost`]). Requests are synchronous: one message out, its
//! reply in, in order. The wire format is `vfio_server::wire`'s.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use vfio_server::wire::{self, cmd, Header};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Largest reply accepted (header included): the largest legitimate one is
/// a VERSION reply with its capabilities string.
pub const MAX_REPLY: usize = 64 * 1024;

/// How long a request waits for the server (to take the message, then to
/// answer, in all: one deadline for the whole exchange, so a server that
/// trickles its reply a byte at a time is gone too) before the server
/// counts as gone: a server that stopped (or stopped reading) must not
/// hold a vCPU forever. Far above any reply a
/// live server gives (a register access is a few microseconds).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the client offers in VERSION (as the `vfio_user` crate's client).
const CLIENT_CAPABILITIES: &str = r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"migration":{"pgsize":4096}}}"#;

/// DMA_MAP flags: readable and writable by the device.
const DMA_READ_WRITE: u32 = 0b11;

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The stream failed or ended: the server is gone.
    #[error("connection lost: {0}")]
    Lost(#[source] std::io::Error),
    /// The server answered with an error reply (the connection is fine).
    #[error("refused with errno {errno}")]
    Refused {
        /// The errno of the reply.
        errno: u32,
    },
    /// The server's reply broke the protocol (wrong id, size, shape).
    #[error("bad reply: {0}")]
    BadReply(String),
}

impl WireError {
    /// True when the connection cannot be used any more.
    pub fn is_lost(&self) -> bool {
        !matches!(self, WireError::Refused { .. })
    }
}

/// One region's `DEVICE_GET_REGION_INFO` answer.
#[derive(Debug)]
pub struct RegionInfo {
    /// `vfio_region_info.flags`.
    pub flags: u32,
    /// Region size in bytes.
    pub size: u64,
    /// Offset of the region in `fd` (for mmap).
    pub offset: u64,
    /// Mmap-able areas (offset, size) of a sparse-mmap capability.
    pub areas: Vec<(u64, u64)>,
    /// The fd that backs the mmap-able areas, when the server sent one.
    pub fd: Option<File>,
}

impl RegionInfo {
    /// True when the whole region `[0, size)` can be mmapped from `fd`.
    pub fn whole_mmap(&self) -> bool {
        self.flags & wire::REGION_FLAG_MMAP != 0
            && self.fd.is_some()
            && (self.areas.is_empty() || self.areas.contains(&(0, self.size)))
    }
}

/// A vfio-user connection to a device server.
pub struct UserClient {
    stream: UnixStream,
    next_id: u16,
    /// The whole exchange of one request ([`REPLY_TIMEOUT`] unless a test
    /// says otherwise).
    timeout: Duration,
}

impl AsRawFd for UserClient {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

fn short(what: &str) -> WireError {
    WireError::BadReply(format!("{what}: reply too short"))
}

impl UserClient {
    /// Connects to `path` and negotiates the protocol version; checks the
    /// device is a PCI device. Requests time out after [`REPLY_TIMEOUT`].
    pub fn connect(path: &Path) -> Result<Self, WireError> {
        let stream = UnixStream::connect(path).map_err(WireError::Lost)?;
        Self::over(stream, REPLY_TIMEOUT)
    }

    /// Negotiates over an already connected stream (tests, socket pairs);
    /// a request not taken or answered within `timeout` is a lost stream.
    pub fn over(stream: UnixStream, timeout: Duration) -> Result<Self, WireError> {
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(WireError::Lost)?;
        let mut c = UserClient {
            stream,
            next_id: 0,
            timeout,
        };
        let mut v = Vec::with_capacity(5 + CLIENT_CAPABILITIES.len());
        v.extend_from_slice(&0u16.to_le_bytes()); // major
        v.extend_from_slice(&1u16.to_le_bytes()); // minor
        v.extend_from_slice(CLIENT_CAPABILITIES.as_bytes());
        v.push(0);
        let (r, _) = c.request(cmd::VERSION, &v, &[])?;
        if r.len() < 4 {
            return Err(short("VERSION"));
        }
        let mut info = [0u8; 16];
        info[0..4].copy_from_slice(&16u32.to_le_bytes());
        let (r, _) = c.request(cmd::DEVICE_GET_INFO, &info, &[])?;
        if r.len() < 16 {
            return Err(short("DEVICE_GET_INFO"));
        }
        if wire::u32_at(&r, 4) & wire::DEVICE_FLAGS_PCI == 0 {
            return Err(WireError::BadReply("not a PCI device".into()));
        }
        Ok(c)
    }

    /// Sends one command and returns its reply's body (and a fd sent with it).
    fn request(
        &mut self,
        command: u16,
        body: &[u8],
        fds: &[RawFd],
    ) -> Result<(Vec<u8>, Option<File>), WireError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let deadline = Instant::now() + self.timeout;
        let size = u32::try_from(wire::HEADER + body.len())
            .map_err(|_| WireError::BadReply("message too large".into()))?;
        let h = Header {
            id,
            command,
            size,
            flags: wire::TYPE_COMMAND,
            error: 0,
        };
        let mut msg = Vec::with_capacity(size as usize);
        msg.extend_from_slice(&h.encode());
        msg.extend_from_slice(body);
        let mut sent = 0;
        if !fds.is_empty() {
            self.until(deadline)?;
            sent = self
                .stream
                .send_with_fds(&[&msg[..]], fds)
                .map_err(|e| WireError::Lost(std::io::Error::from_raw_os_error(e.errno())))?;
        }
        while sent < msg.len() {
            self.until(deadline)?;
            match self.stream.write(&msg[sent..]) {
                Ok(0) => return Err(WireError::Lost(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(WireError::Lost(e)),
            }
        }
        // The header, with any fd the server attached to it.
        let mut hb = [0u8; wire::HEADER];
        let (n, fd) = loop {
            self.until(deadline)?;
            match self.stream.recv_with_fd(&mut hb) {
                Ok(r) => break r,
                Err(e) if e.errno() == libc::EINTR => continue,
                Err(e) => {
                    return Err(WireError::Lost(std::io::Error::from_raw_os_error(
                        e.errno(),
                    )))
                }
            }
        };
        if n == 0 {
            return Err(WireError::Lost(std::io::ErrorKind::UnexpectedEof.into()));
        }
        self.read_by(&mut hb[n..], deadline)?;
        let r = Header::decode(&hb);
        let size = r.size as usize;
        if r.flags & wire::TYPE_MASK != wire::TYPE_REPLY
            || r.id != id
            || r.command != command
            || !(wire::HEADER..=MAX_REPLY).contains(&size)
        {
            // The stream cannot be resynchronised after a bad header.
            return Err(WireError::Lost(std::io::Error::other(format!(
                "reply {r:?} does not answer command {command} id {id}"
            ))));
        }
        let mut b = vec![0u8; size - wire::HEADER];
        self.read_by(&mut b, deadline)?;
        if r.flags & wire::FLAG_ERROR != 0 {
            return Err(WireError::Refused { errno: r.error });
        }
        Ok((b, fd))
    }

    /// Bounds the next socket call by what is left until `deadline`; past
    /// it, the server is gone.
    fn until(&self, deadline: Instant) -> Result<(), WireError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WireError::Lost(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no whole reply within {:?}", self.timeout),
            )));
        }
        self.stream
            .set_read_timeout(Some(left))
            .and_then(|()| self.stream.set_write_timeout(Some(left)))
            .map_err(WireError::Lost)
    }

    /// Fills `buf` from the stream by `deadline` (not a timeout per read:
    /// one byte now and then does not keep the request alive).
    fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), WireError> {
        let mut got = 0;
        while got < buf.len() {
            self.until(deadline)?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Err(WireError::Lost(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(WireError::Lost(e)),
            }
        }
        Ok(())
    }

    /// `DEVICE_GET_REGION_INFO` of region `index`, asking again with a
    /// larger `argsz` when the server has capabilities (and a fd) to send.
    pub fn region_info(&mut self, index: u32) -> Result<RegionInfo, WireError> {
        let ask = |argsz: u32| {
            let mut b = [0u8; wire::REGION_INFO as usize];
            b[0..4].copy_from_slice(&argsz.to_le_bytes());
            b[8..12].copy_from_slice(&index.to_le_bytes());
            b
        };
        let (mut r, mut fd) =
            self.request(cmd::DEVICE_GET_REGION_INFO, &ask(wire::REGION_INFO), &[])?;
        if r.len() < wire::REGION_INFO as usize {
            return Err(short("DEVICE_GET_REGION_INFO"));
        }
        let argsz = wire::u32_at(&r, 0);
        if argsz > wire::REGION_INFO {
            if argsz as usize > MAX_REPLY {
                return Err(WireError::BadReply(format!(
                    "region {index}: argsz {argsz}"
                )));
            }
            (r, fd) = self.request(cmd::DEVICE_GET_REGION_INFO, &ask(argsz), &[])?;
            if r.len() < wire::REGION_INFO as usize {
                return Err(short("DEVICE_GET_REGION_INFO"));
            }
        }
        let flags = wire::u32_at(&r, 4);
        let areas = if flags & wire::REGION_FLAG_CAPS != 0 {
            sparse_areas(&r, wire::u32_at(&r, 12) as usize).map_err(WireError::BadReply)?
        } else {
            Vec::new()
        };
        Ok(RegionInfo {
            flags,
            size: wire::u64_at(&r, 16),
            offset: wire::u64_at(&r, 24),
            areas,
            fd,
        })
    }

    /// `DMA_MAP` of `size` bytes of `fd` at file `offset` to device address `address`.
    pub fn dma_map(
        &mut self,
        offset: u64,
        address: u64,
        size: u64,
        fd: RawFd,
    ) -> Result<(), WireError> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&32u32.to_le_bytes());
        b.extend_from_slice(&DMA_READ_WRITE.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&address.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        self.request(cmd::DMA_MAP, &b, &[fd]).map(|_| ())
    }

    /// `DEVICE_SET_IRQS` of `fds.len()` vectors from `start` of IRQ `index`.
    pub fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        fds: &[RawFd],
    ) -> Result<(), WireError> {
        let mut b = Vec::with_capacity(20);
        b.extend_from_slice(&20u32.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&index.to_le_bytes());
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(&(fds.len() as u32).to_le_bytes());
        self.request(cmd::DEVICE_SET_IRQS, &b, fds).map(|_| ())
    }

    /// `REGION_READ` of `data.len()` bytes at `offset` of `region`.
    pub fn region_read(
        &mut self,
        region: u32,
        offset: u64,
        data: &mut [u8],
    ) -> Result<(), WireError> {
        let b = access(region, offset, data.len());
        let (r, _) = self.request(cmd::REGION_READ, &b, &[])?;
        let got = r
            .get(16..16 + data.len())
            .ok_or_else(|| short("REGION_READ"))?;
        data.copy_from_slice(got);
        Ok(())
    }

    /// `REGION_WRITE` of `data` at `offset` of `region`.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), WireError> {
        let mut b = access(region, offset, data.len()).to_vec();
        b.extend_from_slice(data);
        self.request(cmd::REGION_WRITE, &b, &[]).map(|_| ())
    }

    /// Closes both directions (the server sees the client leave).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The 16-byte head of REGION_READ/WRITE.
fn access(region: u32, offset: u64, len: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&offset.to_le_bytes());
    b[8..12].copy_from_slice(&region.to_le_bytes());
    b[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    b
}

/// The areas of every sparse-mmap capability in a region-info reply `r`
/// (`vfio_region_info` then its capability list; offsets count from the
/// start of `r`). Every offset and count is checked against `r`.
fn sparse_areas(r: &[u8], first: usize) -> Result<Vec<(u64, u64)>, String> {
    let mut areas = Vec::new();
    let (mut next, mut prev) = (first, 0usize);
    while next != 0 {
        if next <= prev {
            return Err(format!("capability at {next} does not advance"));
        }
        prev = next;
        let at = |off: usize, n: usize| {
            next.checked_add(off)
                .and_then(|s| r.get(s..s.checked_add(n)?))
                .ok_or_else(|| format!("capability at {next} is truncated"))
        };
        let id = u16::from_le_bytes([at(0, 2)?[0], at(0, 2)?[1]]);
        let following = wire::u32_at(at(4, 4)?, 0) as usize;
        if id == wire::REGION_CAP_SPARSE_MMAP {
            let n = wire::u32_at(at(8, 4)?, 0) as usize;
            for i in 0..n {
                let a = at(16 + 16 * i, 16)?;
                areas.push((wire::u64_at(a, 0), wire::u64_at(a, 8)));
            }
        }
        next = following;
    }
    Ok(areas)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_with_caps(caps: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; 32];
        r.extend_from_slice(caps);
        r
    }

    fn sparse(next: u32, areas: &[(u64, u64)]) -> Vec<u8> {
        let mut c = Vec::new();
        c.extend_from_slice(&wire::REGION_CAP_SPARSE_MMAP.to_le_bytes());
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&next.to_le_bytes());
        c.extend_from_slice(&(areas.len() as u32).to_le_bytes());
        c.extend_from_slice(&0u32.to_le_bytes());
        for (o, s) in areas {
            c.extend_from_slice(&o.to_le_bytes());
            c.extend_from_slice(&s.to_le_bytes());
        }
        c
    }

    #[test]
    fn a_sparse_mmap_capability_yields_its_areas() {
        let r = reply_with_caps(&sparse(0, &[(0, 4096)]));
        assert_eq!(sparse_areas(&r, 32).unwrap(), vec![(0, 4096)]);
    }

    #[test]
    fn hostile_capability_lists_are_refused_not_followed() {
        // An area count past the end of the reply.
        let mut c = sparse(0, &[(0, 4096)]);
        c[8..12].copy_from_slice(&1000u32.to_le_bytes());
        assert!(sparse_areas(&reply_with_caps(&c), 32).is_err());
        // A list that points back at itself.
        assert!(sparse_areas(&reply_with_caps(&sparse(32, &[])), 32).is_err());
        // A first offset past the end, and one that would overflow.
        assert!(sparse_areas(&reply_with_caps(&[]), 32).is_err());
        assert!(sparse_areas(&reply_with_caps(&[]), usize::MAX).is_err());
    }

    /// Reads one whole request (header and body) off the fake server's
    /// end and returns its header.
    fn take_request(b: &mut UnixStream) -> Header {
        let mut h = [0u8; 16];
        b.read_exact(&mut h).unwrap();
        let h = Header::decode(&h);
        let mut skip = vec![0u8; h.size as usize - 16];
        b.read_exact(&mut skip).unwrap();
        h
    }

    /// A bare successful reply header to `h`.
    fn reply_to(h: &Header) -> Header {
        Header {
            id: h.id,
            command: h.command,
            size: 16,
            flags: wire::TYPE_REPLY,
            error: 0,
        }
    }

    /// A fake server on a socket pair that answers VERSION and GET_INFO,
    /// then runs `rest` on its end.
    fn pair(rest: impl FnOnce(UnixStream) + Send + 'static) -> Result<UserClient, WireError> {
        let (a, mut b) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            for body in [vec![0u8; 4], {
                let mut i = vec![0u8; 16];
                i[4..8].copy_from_slice(&wire::DEVICE_FLAGS_PCI.to_le_bytes());
                i
            }] {
                let h = take_request(&mut b);
                let r = Header {
                    size: 16 + body.len() as u32,
                    ..reply_to(&h)
                };
                b.write_all(&r.encode()).unwrap();
                b.write_all(&body).unwrap();
            }
            rest(b);
        });
        UserClient::over(a, REPLY_TIMEOUT)
    }

    #[test]
    fn a_server_that_closes_the_socket_is_lost_and_an_error_reply_is_not() {
        let mut c = pair(|mut b| {
            // Refuse one request, then leave.
            let h = take_request(&mut b);
            let r = Header {
                flags: wire::TYPE_REPLY | wire::FLAG_ERROR,
                error: libc::EINVAL as u32,
                ..reply_to(&h)
            };
            b.write_all(&r.encode()).unwrap();
        })
        .unwrap();
        let e = c.region_write(0, 0x40, &[0; 4]).unwrap_err();
        assert!(!e.is_lost(), "{e}");
        let mut d = [0u8; 4];
        let e = c.region_read(0, 0, &mut d).unwrap_err();
        assert!(e.is_lost(), "{e}");
    }

    /// A server that takes a request and never answers is gone once the
    /// reply timeout passes: the request fails as a lost stream instead of
    /// blocking its caller (a vCPU) for ever.
    #[test]
    fn a_server_that_never_answers_is_lost() {
        let (a, b) = UnixStream::pair().unwrap();
        let e = UserClient::over(a, Duration::from_millis(50))
            .err()
            .expect("no VERSION reply");
        assert!(e.is_lost(), "{e}");
        drop(b);
    }

    /// A server that answers a byte at a time, each byte well within the
    /// reply timeout, is gone all the same once the whole reply is not
    /// there by then (it never is here: the body is 64 KiB at one byte per
    /// 20 ms): a per-read timeout would hold the caller for 20 minutes.
    #[test]
    fn a_server_that_trickles_its_reply_is_lost() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let h = take_request(&mut b);
            let r = Header {
                size: MAX_REPLY as u32,
                ..reply_to(&h)
            };
            let mut bytes = r.encode().to_vec();
            bytes.resize(MAX_REPLY, 0);
            // Until the client hangs up (EPIPE).
            for byte in bytes.chunks(1) {
                if b.write_all(byte).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let e = UserClient::over(a, Duration::from_millis(200))
            .err()
            .expect("no whole VERSION reply");
        assert!(e.is_lost(), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn a_reply_to_another_request_ends_the_connection() {
        let mut c = pair(|mut b| {
            let h = take_request(&mut b);
            let r = Header {
                id: h.id.wrapping_add(7),
                ..reply_to(&h)
            };
            b.write_all(&r.encode()).unwrap();
        })
        .unwrap();
        assert!(c.region_write(2, 0, &[0; 8]).unwrap_err().is_lost());
    }
}
