//! A small HTTP/1.1 server over a Unix socket for the operator API
//! (docs/operators.md, docs/api/openapi.json).
//!
//! One thread runs an epoll loop over the listening socket and every
//! connection, all non-blocking: a slow, idle or half-sent client holds only
//! its own bounded buffers and never delays another. Requests are parsed
//! defensively ([`parse_request`]): the head is capped at [`MAX_HEAD`] bytes,
//! the body at [`MAX_BODY`] (`Content-Length` only; chunked bodies are
//! refused with `400`), and bad framing gets `400` and the connection closed.
//! Keep-alive is the HTTP/1.1 default. At most [`MAX_CONNECTIONS`] are open;
//! one more is answered `503` and closed. Connections idle for
//! [`IDLE_TIMEOUT`] are closed.
//!
//! A [`Handler`] answers each request through a [`Responder`], at once or
//! later from another thread (e.g. after the fleet stopped a VM): the
//! connection reads nothing more until its answer is written.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Largest request head (request line and headers), bytes.
pub const MAX_HEAD: usize = 8 * 1024;
/// Largest request body, bytes.
pub const MAX_BODY: usize = 64 * 1024;
/// Most connections open at once.
pub const MAX_CONNECTIONS: usize = 8192;
/// A connection with no request in flight is closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often [`Handler::tick`] runs.
pub const TICK: Duration = Duration::from_secs(1);

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method, as sent (`GET`, `PATCH`, ...).
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query string (after `?`), if any.
    pub query: Option<String>,
    /// Headers (names lower-cased), in order.
    pub headers: Vec<(String, String)>,
    /// Body (`Content-Length` bytes).
    pub body: Vec<u8>,
    /// The connection stays open after the answer.
    pub keep_alive: bool,
}

impl Request {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why bytes are not (yet) a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// More bytes are needed.
    #[error("incomplete request")]
    Incomplete,
    /// Malformed: answer 400 and close.
    #[error("{0}")]
    Bad(String),
    /// The head is larger than [`MAX_HEAD`]: 431 and close.
    #[error("request head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// The body is larger than [`MAX_BODY`]: 413 and close.
    #[error("request body of {0} bytes is larger than {MAX_BODY} bytes")]
    BodyTooLarge(u64),
    /// A framing this server does not implement (chunked bodies): 400 and close.
    #[error("{0}")]
    Unsupported(String),
}

impl ParseError {
    /// The status code answering it.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::Incomplete | ParseError::Bad(_) | ParseError::Unsupported(_) => 400,
            ParseError::HeadTooLarge => 431,
            ParseError::BodyTooLarge(_) => 413,
        }
    }
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses one request from the start of `buf`; returns it and the number
/// of bytes it used. Pure: reads nothing but `buf`.
pub fn parse_request(buf: &[u8]) -> Result<(Request, usize), ParseError> {
    let limit = buf.len().min(MAX_HEAD);
    let Some(end) = buf[..limit].windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() >= MAX_HEAD {
            return Err(ParseError::HeadTooLarge);
        }
        // A bare-LF head is not HTTP/1.1 framing this server accepts.
        if buf[..limit].windows(2).any(|w| w == b"\n\n") {
            return Err(ParseError::Bad("lines must end with CRLF".into()));
        }
        return Err(ParseError::Incomplete);
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| ParseError::Bad("request head is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::Bad(format!(
            "malformed request line '{}'",
            line.escape_debug()
        )));
    };
    if method.is_empty() || !method.bytes().all(is_token_char) {
        return Err(ParseError::Bad("malformed method".into()));
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        v => {
            return Err(ParseError::Bad(format!(
                "unsupported version '{}'",
                v.escape_debug()
            )))
        }
    };
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(ParseError::Bad(
            "the target must be an absolute path".into(),
        ));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target.to_owned(), None),
    };
    let mut headers = Vec::new();
    let mut length: Option<u64> = None;
    let mut keep_alive = http11;
    for l in lines {
        let Some((name, value)) = l.split_once(':') else {
            return Err(ParseError::Bad(format!(
                "malformed header line '{}'",
                l.escape_debug()
            )));
        };
        if name.is_empty() || !name.bytes().all(is_token_char) {
            return Err(ParseError::Bad(format!(
                "malformed header name '{}'",
                name.escape_debug()
            )));
        }
        let value = value.trim_matches(|c| c == ' ' || c == '\t');
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(ParseError::Bad(format!("control byte in header '{name}'")));
        }
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                let n: u64 = value
                    .parse()
                    .ok()
                    .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| ParseError::Bad(format!("bad Content-Length '{value}'")))?;
                if length.is_some_and(|l| l != n) {
                    return Err(ParseError::Bad("conflicting Content-Length headers".into()));
                }
                length = Some(n);
            }
            "transfer-encoding" => {
                return Err(ParseError::Unsupported(
                    "Transfer-Encoding is not supported: send Content-Length".into(),
                ))
            }
            "connection" => {
                for t in value.split(',').map(|t| t.trim().to_ascii_lowercase()) {
                    match t.as_str() {
                        "close" => keep_alive = false,
                        "keep-alive" => keep_alive = true,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        headers.push((name, value.to_owned()));
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY as u64 {
        return Err(ParseError::BodyTooLarge(length));
    }
    let start = end + 4;
    let total = start + length as usize;
    if buf.len() < total {
        return Err(ParseError::Incomplete);
    }
    Ok((
        Request {
            method: method.to_owned(),
            path,
            query,
            headers,
            body: buf[start..total].to_vec(),
            keep_alive,
        },
        total,
    ))
}

/// One answer: a status and a JSON (or text) body.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
    /// Extra headers (e.g. `Allow`, `Location`).
    pub headers: Vec<(&'static str, String)>,
    /// Close the connection after this answer.
    pub close: bool,
}

impl Response {
    /// A JSON answer.
    pub fn json<T: serde::Serialize + ?Sized>(status: u16, v: &T) -> Self {
        let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
        body.push(b'\n');
        Response {
            status,
            content_type: "application/json",
            body,
            headers: Vec::new(),
            close: false,
        }
    }

    /// A JSON error `{"error": reason}`.
    pub fn error(status: u16, reason: impl Into<String>) -> Self {
        Self::json(status, &serde_json::json!({ "error": reason.into() }))
    }

    /// A plain-text answer (e.g. Prometheus exposition).
    pub fn text(status: u16, content_type: &'static str, body: String) -> Self {
        Response {
            status,
            content_type,
            body: body.into_bytes(),
            headers: Vec::new(),
            close: false,
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    fn encode(&self, keep_alive: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            reason_phrase(self.status),
            self.content_type,
            self.body.len()
        );
        for (n, v) in &self.headers {
            out += &format!("{n}: {v}\r\n");
        }
        out += if keep_alive && !self.close {
            "\r\n"
        } else {
            "Connection: close\r\n\r\n"
        };
        let mut out = out.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Answers one request: call [`Responder::send`] now or later, from any thread.
pub trait Handler: Send + Sync + 'static {
    /// Handles `req`.
    fn handle(&self, req: Request, reply: Responder);
    /// Called every [`TICK`] on the server thread (e.g. to sample shares).
    fn tick(&self) {}
}

/// Where a request's answer goes. Dropping it unsent answers 500.
pub struct Responder {
    conn: u64,
    tx: Option<Sender<(u64, Response)>>,
    wake: Arc<EventFd>,
}

impl Responder {
    /// Sends the answer (ignored if the client has gone).
    pub fn send(mut self, r: Response) {
        if let Some(tx) = self.tx.take() {
            if tx.send((self.conn, r)).is_ok() {
                let _ = self.wake.write(1);
            }
        }
    }

    /// A responder whose answer lands in the returned receiver (tests).
    pub fn detached() -> (Self, Receiver<(u64, Response)>) {
        let (tx, rx) = channel();
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK).expect("eventfd"));
        (
            Responder {
                conn: 0,
                tx: Some(tx),
                wake,
            },
            rx,
        )
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((
                self.conn,
                Response::error(500, "internal error: the request was dropped"),
            ));
            let _ = self.wake.write(1);
        }
    }
}

/// Socket file options.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Permission bits of the socket file (default 0o600).
    pub mode: u32,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions { mode: 0o600 }
    }
}

/// Why the socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Something that is not a socket is at the path.
    #[error("{0}: exists and is not a socket; refusing to replace it")]
    NotASocket(String),
    /// A live server answers on the path.
    #[error("{0}: another server (a running fleet?) is listening there")]
    InUse(String),
    /// I/O error.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// Checks that [`bind`] could take `path` now (nothing there, or a stale
/// socket) without touching it: a fleet calls this before building VMs.
pub fn check_socket_path(path: &Path) -> Result<(), BindError> {
    let p = || path.display().to_string();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => Err(BindError::InUse(p())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(BindError::Io(p(), e)),
        },
        Ok(_) => Err(BindError::NotASocket(p())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BindError::Io(p(), e)),
    }
}

/// Binds a listening socket at `path`: an existing file there is replaced
/// only if it is a socket nobody listens on (a dead fleet's); the socket
/// file gets `opts.mode`.
pub fn bind(path: &Path, opts: SocketOptions) -> Result<UnixListener, BindError> {
    let p = || path.display().to_string();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(BindError::InUse(p())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                log::info!("api: replacing the stale socket {}", p());
                std::fs::remove_file(path).map_err(|e| BindError::Io(p(), e))?;
            }
            Err(e) => return Err(BindError::Io(p(), e)),
        },
        Ok(_) => return Err(BindError::NotASocket(p())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(BindError::Io(p(), e)),
    }
    // Create it with no access for anyone, then open it up to `mode`: no
    // window in which the umask's wider mode applies.
    // SAFETY: umask(2) only swaps the process's mask; restored just below.
    let old = unsafe { libc::umask(0o777) };
    let r = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = r.map_err(|e| BindError::Io(p(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(opts.mode & 0o777))
        .map_err(|e| BindError::Io(p(), e))?;
    l.set_nonblocking(true).map_err(|e| BindError::Io(p(), e))?;
    Ok(l)
}

const TOKEN_LISTEN: u64 = u64::MAX;
const TOKEN_WAKE: u64 = u64::MAX - 1;

struct Conn {
    stream: UnixStream,
    gen: u32,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// A request is with the handler.
    pending: bool,
    /// Close once `out` is written.
    closing: bool,
    keep_alive: bool,
    last: Instant,
    /// Waiting for the socket to take more of `out`.
    writing: bool,
    /// The epoll mask registered now.
    mask: EventSet,
    /// The peer shut its writing side: answer what is buffered, then close.
    eof: bool,
}

/// A running HTTP server; stops and removes its socket file on drop.
pub struct HttpServer {
    path: PathBuf,
    wake: Arc<EventFd>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<ServerStats>>,
}

/// Server counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub open: usize,
    /// Requests answered.
    pub requests: u64,
    /// Requests refused for framing (400/413/431).
    pub bad: u64,
    /// `accept(2)` failures (EMFILE and friends): each one also pauses
    /// accepting until a connection closes or the next [`TICK`].
    pub accept_errors: u64,
}

impl HttpServer {
    /// Binds `path` (see [`bind`]) and serves `handler` on a new thread.
    pub fn start(
        path: &Path,
        opts: SocketOptions,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, BindError> {
        let listener = bind(path, opts)?;
        let io = |e| BindError::Io(path.display().to_string(), e);
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(io)?);
        let epoll = Epoll::new().map_err(io)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_LISTEN),
            )
            .map_err(io)?;
        epoll
            .ctl(
                ControlOperation::Add,
                wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_WAKE),
            )
            .map_err(io)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(ServerStats::default()));
        let (tx, rx) = channel();
        let mut loop_ = Loop {
            epoll,
            listener,
            wake: wake.clone(),
            conns: HashMap::new(),
            next_gen: 0,
            next_slot: 0,
            free: Vec::new(),
            tx,
            rx,
            handler,
            stop: stop.clone(),
            stats: stats.clone(),
            accept_paused: false,
        };
        let thread = std::thread::Builder::new()
            .name("hqdmux-api".into())
            .spawn(move || loop_.run())
            .map_err(io)?;
        Ok(HttpServer {
            path: path.to_owned(),
            wake,
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Loop {
    epoll: Epoll,
    listener: UnixListener,
    wake: Arc<EventFd>,
    conns: HashMap<u32, Conn>,
    next_gen: u32,
    next_slot: u32,
    free: Vec<u32>,
    tx: Sender<(u64, Response)>,
    rx: Receiver<(u64, Response)>,
    handler: Arc<dyn Handler>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    stats: Arc<Mutex<ServerStats>>,
    /// The listener is disarmed after an `accept` error (see `set_accepting`).
    accept_paused: bool,
}

fn conn_token(slot: u32, gen: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(slot)
}

impl Loop {
    fn run(&mut self) {
        let mut events = vec![EpollEvent::default(); 256];
        let mut next_tick = Instant::now() + TICK;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let n = match self.epoll.wait(wait.as_millis() as i32 + 1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    log::error!("api: epoll_wait: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            if self.stop.load(std::sync::atomic::Ordering::SeqCst) {
                // Answers already given (e.g. the stop of the fleet's last
                // VM) still go out, as far as one non-blocking write takes
                // them.
                while let Ok((conn, resp)) = self.rx.try_recv() {
                    self.answer(conn, resp);
                }
                return;
            }
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_LISTEN => self.accept(),
                    TOKEN_WAKE => {
                        let _ = self.wake.read();
                    }
                    t => self.ready(t, ev.event_set()),
                }
            }
            while let Ok((conn, resp)) = self.rx.try_recv() {
                self.answer(conn, resp);
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + TICK;
                self.handler.tick();
                self.reap_idle();
                self.set_accepting(true);
            }
            let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            s.open = self.conns.len();
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if self.conns.len() >= MAX_CONNECTIONS {
                        let mut s = stream;
                        let _ = s
                            .write_all(&Response::error(503, "too many connections").encode(false));
                        continue;
                    }
                    let slot = self.free.pop().unwrap_or_else(|| {
                        self.next_slot += 1;
                        self.next_slot - 1
                    });
                    self.next_gen = self.next_gen.wrapping_add(1);
                    let gen = self.next_gen;
                    if self
                        .epoll
                        .ctl(
                            ControlOperation::Add,
                            stream.as_raw_fd(),
                            EpollEvent::new(EventSet::IN, conn_token(slot, gen)),
                        )
                        .is_err()
                    {
                        continue;
                    }
                    self.conns.insert(
                        slot,
                        Conn {
                            stream,
                            gen,
                            inbuf: Vec::new(),
                            out: Vec::new(),
                            pending: false,
                            closing: false,
                            keep_alive: true,
                            last: Instant::now(),
                            writing: false,
                            mask: EventSet::IN,
                            eof: false,
                        },
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE and friends: log and try again on the next event.
                    // The listener stays readable (level-triggered): stop
                    // polling it until a connection closes or the next tick,
                    // else the loop spins and floods the log.
                    self.stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .accept_errors += 1;
                    log::warn!("api: accept: {e}; not accepting until a connection closes");
                    self.set_accepting(false);
                    return;
                }
            }
        }
    }

    fn close(&mut self, slot: u32) {
        if let Some(c) = self.conns.remove(&slot) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                c.stream.as_raw_fd(),
                EpollEvent::default(),
            );
            self.free.push(slot);
            drop(c);
            self.set_accepting(true);
        }
    }

    /// Arms or disarms the listener (disarmed after an `accept` error).
    fn set_accepting(&mut self, on: bool) {
        if on != self.accept_paused {
            return;
        }
        let set = if on { EventSet::IN } else { EventSet::empty() };
        if self
            .epoll
            .ctl(
                ControlOperation::Modify,
                self.listener.as_raw_fd(),
                EpollEvent::new(set, TOKEN_LISTEN),
            )
            .is_ok()
        {
            self.accept_paused = !on;
        }
    }

    fn ready(&mut self, token: u64, set: EventSet) {
        let (slot, gen) = (token as u32, (token >> 32) as u32);
        let Some(c) = self.conns.get_mut(&slot).filter(|c| c.gen == gen) else {
            return;
        };
        c.last = Instant::now();
        if set.intersects(EventSet::HANG_UP | EventSet::ERROR) && (c.pending || c.writing) {
            // The client is gone: its answer has nowhere to go.
            self.close(slot);
            return;
        }
        if set.contains(EventSet::OUT) || c.writing {
            self.flush(slot);
            if !self.conns.contains_key(&slot) {
                return;
            }
        }
        if set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR) {
            self.read(slot);
        }
    }

    fn read(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(&slot) else {
            return;
        };
        let mut buf = [0u8; 4096];
        loop {
            // Bounded: never hold more than one maximal request.
            if c.inbuf.len() >= MAX_HEAD + MAX_BODY {
                break;
            }
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    // Peer closed its side: answer what it sent first.
                    if c.pending || !c.out.is_empty() || !c.inbuf.is_empty() {
                        c.eof = true;
                        break;
                    }
                    self.close(slot);
                    return;
                }
                Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(slot);
                    return;
                }
            }
        }
        self.dispatch(slot);
    }

    /// Hands the next complete request of `slot` to the handler.
    fn dispatch(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(&slot) else {
            return;
        };
        if c.pending || !c.out.is_empty() || c.closing {
            return;
        }
        if c.inbuf.is_empty() {
            if c.eof {
                self.close(slot);
            }
            return;
        }
        match parse_request(&c.inbuf) {
            Ok((req, used)) => {
                c.inbuf.drain(..used);
                c.pending = true;
                c.keep_alive = req.keep_alive;
                let token = conn_token(slot, c.gen);
                let reply = Responder {
                    conn: token,
                    tx: Some(self.tx.clone()),
                    wake: self.wake.clone(),
                };
                let h = self.handler.clone();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.handle(req, reply)))
                    .is_err()
                {
                    log::error!("api: host bug: a request handler panicked");
                }
                self.interest(slot);
            }
            Err(ParseError::Incomplete) => {
                if c.eof {
                    // A truncated request: nothing more will come.
                    self.close(slot);
                }
            }
            Err(e) => {
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).bad += 1;
                let mut r = Response::error(e.status(), e.to_string());
                r.close = true;
                c.keep_alive = false;
                c.closing = true;
                c.inbuf.clear();
                c.out = r.encode(false);
                self.flush(slot);
            }
        }
    }

    fn answer(&mut self, token: u64, resp: Response) {
        let (slot, gen) = (token as u32, (token >> 32) as u32);
        let Some(c) = self.conns.get_mut(&slot).filter(|c| c.gen == gen) else {
            return;
        };
        c.pending = false;
        let keep = c.keep_alive && !resp.close && !c.closing && (!c.eof || !c.inbuf.is_empty());
        c.out = resp.encode(keep);
        if !keep {
            c.closing = true;
        }
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests += 1;
        self.flush(slot);
    }

    fn flush(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(&slot) else {
            return;
        };
        while !c.out.is_empty() {
            match c.stream.write(&c.out) {
                Ok(0) => {
                    self.close(slot);
                    return;
                }
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    c.writing = true;
                    self.interest(slot);
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(slot);
                    return;
                }
            }
        }
        c.writing = false;
        if c.closing {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            self.close(slot);
            return;
        }
        // Pipelined requests already buffered.
        self.dispatch(slot);
        self.interest(slot);
    }

    /// Registers what `slot` waits for: nothing to read while its answer is
    /// pending or being written (the kernel buffers what the client sends
    /// meanwhile; level-triggered readiness would otherwise spin), or
    /// while its buffer holds a maximal request.
    fn interest(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(&slot) else {
            return;
        };
        let mut want = EventSet::empty();
        if !c.pending && !c.writing && !c.eof && c.inbuf.len() < MAX_HEAD + MAX_BODY {
            want |= EventSet::IN;
        }
        if c.writing {
            want |= EventSet::OUT;
        }
        if want != c.mask {
            c.mask = want;
            let _ = self.epoll.ctl(
                ControlOperation::Modify,
                c.stream.as_raw_fd(),
                EpollEvent::new(want, conn_token(slot, c.gen)),
            );
        }
    }

    fn reap_idle(&mut self) {
        let now = Instant::now();
        let idle: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.pending && now.duration_since(c.last) > IDLE_TIMEOUT)
            .map(|(s, _)| *s)
            .collect();
        for s in idle {
            self.close(s);
        }
    }
}

/// Client side: sends one request over the Unix socket at `path` and
/// returns the status and body. `body` is sent as JSON when given.
pub fn call(
    path: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, &[u8])>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n");
    if let Some((ct, b)) = body {
        req += &format!("Content-Type: {ct}\r\nContent-Length: {}\r\n", b.len());
    }
    req += "\r\n";
    let mut bytes = req.into_bytes();
    if let Some((_, b)) = body {
        bytes.extend_from_slice(b);
    }
    s.write_all(&bytes)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    parse_response(&resp).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP answer")
    })
}

/// Splits a whole HTTP answer into status and body.
pub fn parse_response(resp: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = resp.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&resp[..end]).ok()?;
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, resp[end + 4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Request {
        parse_request(s.as_bytes()).unwrap().0
    }

    #[test]
    fn parses_requests_and_keep_alive() {
        let r = ok("GET /api/v1/vms?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/api/v1/vms");
        assert_eq!(r.query.as_deref(), Some("x=1"));
        assert!(r.keep_alive);
        assert_eq!(r.header("host"), Some("a"));
        let r = ok("PATCH /a HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
        assert_eq!(r.body, b"{}");
        assert!(!r.keep_alive);
        assert!(!ok("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(ok("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        // Two pipelined requests: the first uses only its own bytes.
        let two = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        let (r, used) = parse_request(two).unwrap();
        assert_eq!((r.path.as_str(), used), ("/a", 19));
        assert_eq!(parse_request(&two[used..]).unwrap().0.path, "/b");
    }

    #[test]
    fn refuses_bad_framing_with_the_right_status() {
        let st = |s: &[u8]| parse_request(s).map(|_| 0).unwrap_or_else(|e| e.status());
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n"),
            Err(ParseError::Incomplete)
        );
        assert_eq!(
            parse_request(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"),
            Err(ParseError::Incomplete)
        );
        assert_eq!(st(b"GET / HTTP/2.0\r\n\r\n"), 400);
        assert_eq!(st(b"GET  / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(st(b"GET x HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(st(b"G\x01T / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(st(b"GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
        assert_eq!(st(b"GET / HTTP/1.1\r\n Folded: x\r\n\r\n"), 400);
        assert_eq!(st(b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        assert_eq!(st(b"GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n"), 400);
        assert_eq!(
            st(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(
            st(b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            400
        );
        assert_eq!(st(b"GET / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n"), 413);
        assert_eq!(
            st(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(st(b"GET / HTTP/1.1\n\n"), 400);
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 10, b'a');
        assert_eq!(st(&big), 431);
    }

    struct Echo;
    impl Handler for Echo {
        fn handle(&self, req: Request, reply: Responder) {
            if req.path == "/later" {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    reply.send(Response::json(200, &serde_json::json!({"later": true})));
                });
                return;
            }
            if req.path == "/drop" {
                return;
            }
            reply.send(Response::json(
                200,
                &serde_json::json!({"path": req.path, "len": req.body.len()}),
            ))
        }
    }

    fn temp_sock(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hqdmux-http-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("api.sock")
    }

    #[test]
    fn serves_keep_alive_deferred_and_bad_requests_and_cleans_up() {
        let path = temp_sock("serve");
        let server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Echo)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Two requests on one keep-alive connection, the first deferred.
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(b"GET /later HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.windows(8).filter(|w| w == b"HTTP/1.1").count() < 2 || !got.ends_with(b"}\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&got).contains("\"len\"") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&got);
        let first = text.find("later").unwrap();
        let second = text.find("\"len\": 3").unwrap();
        assert!(first < second, "answers in request order: {text}");
        // Framing errors: 400 JSON, then the connection closes.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"BROKEN\r\n\r\n").unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let (st, body) = parse_response(&out).unwrap();
        assert_eq!(st, 400);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("request line"));
        // A dropped responder answers 500 rather than hanging the client.
        let (st, _) = call(&path, "GET", "/drop", None).unwrap();
        assert_eq!(st, 500);
        assert!(server.stats().bad >= 1);
        drop(server);
        assert!(!path.exists(), "socket removed");
    }

    #[test]
    fn an_idle_or_half_sent_client_does_not_block_another() {
        let path = temp_sock("idle");
        let _server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Echo)).unwrap();
        let mut idle: Vec<UnixStream> = (0..200)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        idle[0].write_all(b"GET /x HTTP/1.1\r\nHost:").unwrap();
        let (st, body) = call(&path, "GET", "/y", None).unwrap();
        assert_eq!(st, 200);
        assert!(String::from_utf8_lossy(&body).contains("/y"));
    }

    #[test]
    fn the_socket_refuses_to_replace_files_and_live_servers_but_takes_stale_sockets() {
        let path = temp_sock("bind");
        std::fs::write(&path, b"precious").unwrap();
        assert!(matches!(
            bind(&path, SocketOptions::default()),
            Err(BindError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        std::fs::remove_file(&path).unwrap();
        let live = bind(&path, SocketOptions { mode: 0o640 }).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert!(matches!(
            bind(&path, SocketOptions::default()),
            Err(BindError::InUse(_))
        ));
        drop(live); // the file stays: a stale socket
        assert!(path.exists());
        let again = bind(&path, SocketOptions::default());
        assert!(again.is_ok(), "{:?}", again.err());
    }

    /// Everything the server sends on `s` until it closes.
    fn exchange(path: &Path, bytes: &[u8]) -> String {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn hostile_framing_over_the_socket_gets_answers_then_a_close() {
        let path = temp_sock("hostile");
        let server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Echo)).unwrap();
        // A good request pipelined with a bad one: the good one is answered,
        // then a 400, then the connection closes; nothing after it is read.
        let t = exchange(
            &path,
            b"GET /a HTTP/1.1\r\n\r\nBAD\r\n\r\nGET /c HTTP/1.1\r\n\r\n",
        );
        assert!(t.starts_with("HTTP/1.1 200"), "{t}");
        assert!(t.contains("\"/a\""), "{t}");
        assert!(t.contains("HTTP/1.1 400"), "{t}");
        assert!(!t.contains("\"/c\""), "{t}");
        // HTTP/1.0 without keep-alive: one answer, then a close.
        let t = exchange(&path, b"GET /old HTTP/1.0\r\n\r\n");
        assert!(t.starts_with("HTTP/1.1 200") && t.contains("/old"), "{t}");
        assert!(t.to_ascii_lowercase().contains("connection: close"), "{t}");
        // Non-UTF-8 in the target; a path longer than the head cap.
        let t = exchange(&path, b"GET /\xff\xfe HTTP/1.1\r\n\r\n");
        assert!(t.starts_with("HTTP/1.1 400"), "{t}");
        let mut long = b"GET /".to_vec();
        long.resize(MAX_HEAD * 2, b'a');
        long.extend_from_slice(b" HTTP/1.1\r\n\r\n");
        let t = exchange(&path, &long);
        assert!(t.starts_with("HTTP/1.1 431"), "{t}");
        // Duplicate equal Content-Length is one length; a body over the cap
        // is refused before it is read.
        let t = exchange(
            &path,
            b"POST /d HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\nConnection: close\r\n\r\nab",
        );
        assert!(t.contains("\"len\": 2"), "{t}");
        let t = exchange(
            &path,
            b"POST /e HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n",
        );
        assert!(t.starts_with("HTTP/1.1 400"), "{t}");
        let t = exchange(
            &path,
            b"POST /e HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
        );
        assert!(t.starts_with("HTTP/1.1 413"), "{t}");
        assert!(server.stats().bad >= 5);
    }

    #[test]
    fn a_client_sending_one_byte_at_a_time_does_not_block_another() {
        let path = temp_sock("slow");
        let _server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Echo)).unwrap();
        let mut slow = UnixStream::connect(&path).unwrap();
        let req = b"GET /slow HTTP/1.1\r\nConnection: close\r\n\r\n";
        for (k, b) in req.iter().enumerate() {
            slow.write_all(&[*b]).unwrap();
            if k % 8 == 0 {
                let (st, body) = call(&path, "GET", "/fast", None).unwrap();
                assert_eq!(st, 200);
                assert!(String::from_utf8_lossy(&body).contains("/fast"));
            }
        }
        slow.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut out = Vec::new();
        slow.read_to_end(&mut out).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("/slow"));
    }

    #[test]
    fn the_socket_refuses_a_directory_and_a_symlink_even_to_a_stale_socket() {
        let path = temp_sock("bind2");
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(
            bind(&path, SocketOptions::default()),
            Err(BindError::NotASocket(_))
        ));
        assert!(check_socket_path(&path).is_err());
        assert!(path.is_dir(), "the directory is left alone");
        std::fs::remove_dir(&path).unwrap();
        // A stale socket elsewhere, reached through a symlink: refused, and
        // neither the link nor its target is removed.
        let stale = path.with_file_name("stale.sock");
        drop(bind(&stale, SocketOptions::default()).unwrap());
        std::os::unix::fs::symlink(&stale, &path).unwrap();
        assert!(matches!(
            bind(&path, SocketOptions::default()),
            Err(BindError::NotASocket(_))
        ));
        assert!(check_socket_path(&path).is_err());
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(stale.exists());
    }

    #[test]
    fn a_client_that_half_closes_after_its_requests_still_gets_the_answers() {
        let path = temp_sock("halfclose");
        let _server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Echo)).unwrap();
        for _ in 0..20 {
            let mut s = UnixStream::connect(&path).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(b"GET /h1 HTTP/1.1\r\n\r\nGET /later HTTP/1.1\r\n\r\n")
                .unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            let t = String::from_utf8_lossy(&out);
            assert!(t.contains("/h1"), "{t}");
            assert!(t.contains("later"), "{t}");
        }
    }
}
