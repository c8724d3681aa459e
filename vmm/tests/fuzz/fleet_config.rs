//! Fuzz harness `fleet_config`: hostile TOML text through
//! [`vmm::config::FleetConfig::parse`] (parse and validate). Inputs whose
//! `[[vm]]` images are not all `builtin:` are skipped, so the fuzzer never
//! reads host files; the file path is a directory that does not exist.
//! Shared by `fuzz/fuzz_targets/fleet_config.rs` and `vmm/tests/fuzz_corpus.rs`.
#![allow(dead_code)]

use std::path::Path;
use vmm::config::FleetConfig;

/// Does every `[[vm]]` image (if any) name a built-in image?
fn builtin_images_only(text: &str) -> bool {
    let Ok(t) = text.parse::<toml::Table>() else {
        return true; // a parse error: FleetConfig::parse refuses it too
    };
    match t.get("vm") {
        Some(toml::Value::Array(vms)) => vms.iter().all(|v| match v.get("image") {
            Some(toml::Value::String(s)) => s.starts_with("builtin:"),
            _ => true, // missing or not a string: refused before any read
        }),
        _ => true,
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if !builtin_images_only(text) {
        return;
    }
    let path = Path::new("/nonexistent/hqdmux-fuzz/fleet.toml");
    match FleetConfig::parse(text, path) {
        Ok(cfg) => {
            // What validation promises the launcher.
            assert!(!cfg.vm.is_empty());
            assert!(!cfg.gpus.is_empty());
            for (i, g) in cfg.gpus.iter().enumerate() {
                assert!(g.validate().is_ok());
                assert!(cfg.gpus[..i].iter().all(|o| o.id != g.id), "unique ids");
            }
            for v in &cfg.vm {
                assert!(!v.name.is_empty());
                // Every vGPU VM is placed on a GPU of the file, and a
                // pinned partition exists on that GPU.
                let gpu = v.gpu_id.and_then(|id| cfg.gpu(id));
                assert_eq!(v.gpu, gpu.is_some(), "{v:?}");
                if let (Some(p), Some(g)) = (v.partition, gpu) {
                    assert!(p < g.topology.partitions());
                }
            }
            let _ = cfg.gpu_summary();
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        }
    }
}

/// Seed inputs: the example fleets and a few refused ones.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut v: Vec<(String, Vec<u8>)> = ["hello", "gpu", "mi300x-8gpu"]
        .iter()
        .map(|n| {
            let text = std::fs::read(root.join(format!("examples/{n}.toml"))).unwrap();
            (format!("example-{n}"), text)
        })
        .collect();
    for (n, s) in [
        ("no-vm", "[run]\ntimeout_ms = 5\n"),
        (
            "dpx-partition",
            "[gpu]\npartition_mode = \"DPX\"\n[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\npartition = 2\n",
        ),
        (
            "gpu-small-memory",
            "[[vm]]\nname = \"a\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 17\n",
        ),
        (
            "duplicate-name",
            "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n",
        ),
        (
            "gpu-entries",
            "[[gpu]]\nid = 0\n[[gpu]]\nid = 3\npartition_mode = \"CPX\"\n[[vm]]\nname = \"a\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 256\npartition = 5\n[[vm]]\nname = \"b\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 256\ngpu_id = 0\n",
        ),
        (
            "gpu-entries-duplicate-id",
            "[[gpu]]\nid = 1\n[[gpu]]\nid = 1\n[[vm]]\nname = \"a\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 256\ngpu_id = 9\n",
        ),
        (
            "bad-gpu",
            "[gpu]\nxccs = 3\npartition_mode = \"QPX\"\ncus_per_xcc = 0\n[[vm]]\nname = \"a\"\nimage = \"builtin:nope\"\n",
        ),
    ] {
        v.push((n.to_owned(), s.as_bytes().to_vec()));
    }
    v
}
