//! Hostile client: exhausts the server's file descriptors. A test binary of
//! its own, since it lowers `RLIMIT_NOFILE` for the whole process.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use vmm::http::{call, HttpServer, Request, Responder, Response, SocketOptions};

struct Ok200;
impl vmm::http::Handler for Ok200 {
    fn handle(&self, req: Request, reply: Responder) {
        reply.send(Response::json(
            200,
            &serde_json::json!({ "path": req.path }),
        ));
    }
}

#[test]
fn fd_exhaustion_neither_spins_the_server_nor_stops_it_serving_after_a_close() {
    let dir = std::env::temp_dir().join(format!("hqdmux-fdx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("api.sock");
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
    // Each client costs the process two fds (its end and the server's).
    let mut clients = Vec::new();
    while let Ok(s) = UnixStream::connect(&path) {
        clients.push(s);
        if clients.len() > 200 {
            break;
        }
    }
    // The last connects wait in the backlog: the server has no fd to
    // accept them with.
    std::thread::sleep(Duration::from_millis(500));
    let errors = server.stats().accept_errors;
    // A level-triggered listener the server cannot accept from must not be
    // polled in a loop: a few errors per second, not thousands.
    assert!(
        (1..=4).contains(&errors),
        "accept errors while exhausted: {errors}"
    );
    // Free fds: the server serves again.
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
