//! Puts the git commit of the source tree into `hqdmux --version`
//! (`HQDMUX_GIT_COMMIT`): `unknown` when git or the repository is missing
//! (a source tarball, `cargo install` from a copy).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    println!(
        "cargo:rustc-env=HQDMUX_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it
    // names (a commit) and packed refs.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    for w in watch {
        if let Some(p) = git(&["rev-parse", "--git-path", &w]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
