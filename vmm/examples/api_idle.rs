//! Latency of an API request while many clients hold idle connections
//! (issue 12: 2,000 idle connections must not delay a request by more than
//! 100 ms). No KVM: the API of a fleet of 4 VMs without GPU serves
//! `GET /api/v1/vms`; the same requests are timed with 0 and with N idle
//! connections open (every tenth one half-sent, a request head cut short).
//!
//! `cargo run --release -p hqdmux --example api_idle -- [N] [REQUESTS]`

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn measure(sock: &std::path::Path, n: usize) -> Vec<Duration> {
    let mut out: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let (st, _) = vmm::http::call(sock, "GET", "/api/v1/vms", None).expect("request");
            assert_eq!(st, 200);
            t.elapsed()
        })
        .collect();
    out.sort();
    out
}

fn show(what: &str, v: &[Duration]) {
    let p = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "{what:<28} requests={:<5} p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
        v.len(),
        p(0.5),
        p(0.99),
        v.last().unwrap().as_secs_f64() * 1e3
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let idle: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(500);
    let _ = vmm::config::raise_open_files_limit();
    let toml: String = (0..4)
        .map(|i| format!("[[vm]]\nname = \"vm{i}\"\nimage = \"builtin:hello\"\n"))
        .collect();
    let cfg = vmm::config::FleetConfig::parse(&toml, std::path::Path::new("/x/f.toml")).unwrap();
    let ctl = Arc::new(vmm::api::FleetControl::new(
        Arc::new(vmm::fleet::FleetGpus::new(&cfg)),
        &cfg,
        &[None; 4],
    ));
    let dir = std::env::temp_dir().join(format!("hqdmux-api-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("api.sock");
    let server = vmm::api::serve(&sock, 0o600, ctl).unwrap();
    show("0 idle connections", &measure(&sock, n));
    let mut conns = Vec::with_capacity(idle);
    for i in 0..idle {
        let mut c = UnixStream::connect(&sock).expect("idle connection");
        if i % 10 == 0 {
            c.write_all(b"GET /api/v1/vms HTTP/1.1\r\nHost: x").unwrap();
        }
        conns.push(c);
    }
    // Let the server accept them all.
    while server.stats().open < idle {
        std::thread::sleep(Duration::from_millis(5));
    }
    let with = measure(&sock, n);
    show(&format!("{idle} idle connections"), &with);
    println!(
        "server: open={} (idle held while measuring); max delay vs 100 ms budget: {:.3} ms",
        server.stats().open,
        with.last().unwrap().as_secs_f64() * 1e3
    );
    drop(conns);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
