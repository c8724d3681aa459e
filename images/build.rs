//! Builds the bare-metal guest programs in `guest-tools/` (their own cargo
//! workspace, always `--release`, panic=abort) and embeds every binary in
//! this crate, so `image = "builtin:NAME"` needs no manual build step.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let guest_dir = manifest.join("../guest-tools").canonicalize().unwrap();
    let abi_dir = manifest.join("../abi");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target_dir = out.join("guest-target");

    for p in [
        guest_dir.join("src"),
        guest_dir.join("Cargo.toml"),
        guest_dir.join("build.rs"),
        guest_dir.join("link.ld"),
        guest_dir.join(".cargo/config.toml"),
        abi_dir.join("src"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guest_dir)
        .args(["build", "--release", "--bins", "--target-dir"])
        .arg(&target_dir);
    // The outer build's flags and wrappers (clippy, coverage, ...) are for the
    // host crates, not for bare-metal guests.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("images: cannot run cargo to build guest-tools");
    assert!(
        status.success(),
        "images: building guest-tools failed ({status})"
    );

    let bin_dir = target_dir.join("release");
    let mut names: Vec<String> = std::fs::read_dir(guest_dir.join("src/bin"))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    let mut code = String::from("/// Every built-in guest image: (name, ELF bytes).\npub static BUILTIN: &[(&str, &[u8])] = &[\n");
    for name in &names {
        let path = bin_dir.join(name);
        assert!(
            Path::new(&path).exists(),
            "images: {} missing",
            path.display()
        );
        code += &format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        );
    }
    code += "];\n";
    std::fs::write(out.join("builtin.rs"), code).unwrap();
}
