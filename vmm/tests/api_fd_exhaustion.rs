//! Hostile client: exhausts the server's file descriptors. A test binary of
//! its own, since it lowers `RLIMIT_NOFILE` for the whole process.

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm::http::{call, HttpServer, Request, Responder, Response, SocketOptions, TICK};

struct Ok200;
impl vmm::http::Handler for Ok200 {
    fn handle(&self, req: Request, reply: Responder) {
        reply.send(Response::json(
            200,
            &serde_json::json!({ "path": req.path }),
        ));
    }
}

/// Waits (up to a minute, against hangs) until `done` holds.
fn wait_for(what: &str, t0: Instant, done: impl Fn() -> bool) {
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whatever the host's speed: the server fails to accept at least once
/// (a connection is made to wait while the process holds every fd), and
/// retries no more often than once per [`TICK`] while nothing closes (an
/// upper bound from the time that really passed, so a slow host only
/// loosens it; a server polling the listener in a loop exceeds it by
/// thousands).
#[test]
fn fd_exhaustion_neither_spins_the_server_nor_stops_it_serving_after_a_close() {
    let dir = std::env::temp_dir().join(format!("hqdmux-fdx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("api.sock");
    // Before the server starts: it cannot have ticked more often than
    // `t0.elapsed() / TICK` times.
    let t0 = Instant::now();
    let server = HttpServer::start(&path, SocketOptions::default(), Arc::new(Ok200)).unwrap();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on valid structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let lim = libc::rlimit {
            rlim_cur: 128.min(old.rlim_cur),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    // A few fds kept aside, to be handed to a client once the rest are
    // gone.
    let mut spare: Vec<File> = (0..4).map(|_| File::open("/dev/null").unwrap()).collect();
    // Each client costs the process two fds (its end and the server's).
    let mut clients = Vec::new();
    while let Ok(s) = UnixStream::connect(&path) {
        clients.push(s);
        if clients.len() > 200 {
            break;
        }
    }
    // Every fd still free (the server may have kept up with every
    // connection so far) is taken too.
    let mut fillers = Vec::new();
    while let Ok(f) = File::open("/dev/null") {
        fillers.push(f);
    }
    // One connection waits in the backlog while the process holds every
    // fd: a spare fd goes to a new client, and the server has none to
    // accept it with. (If the server took the freed fd first, it accepted
    // an earlier waiting connection: try again with the next spare.)
    loop {
        drop(spare.pop().expect("a spare fd for the waiting client"));
        if let Ok(s) = UnixStream::connect(&path) {
            clients.push(s);
            break;
        }
    }
    wait_for("no accept error while exhausted", t0, || {
        server.stats().accept_errors >= 1
    });
    // Give a spinning server time to show.
    std::thread::sleep(TICK + TICK / 2);
    let errors = server.stats().accept_errors;
    let ticks = t0.elapsed().as_millis() / TICK.as_millis();
    // A level-triggered listener the server cannot accept from must not be
    // polled in a loop: one error, then at most one per tick.
    assert!(
        (1..=1 + ticks as u64).contains(&errors),
        "accept errors while exhausted: {errors} over {ticks} ticks"
    );
    // Free fds: the server serves again.
    drop(fillers);
    drop(spare);
    clients.truncate(clients.len().saturating_sub(20));
    // SAFETY: as above.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &old);
    }
    let (st, body) = call(&path, "GET", "/again", None).unwrap();
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&body).contains("/again"));
    drop(clients);
}
