//! Helpers shared by the tests that run the `hqdmux` binary as an operator
//! does: the command, scratch directories, config and scenario files.

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The `hqdmux` binary under test.
pub fn hqdmux() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hqdmux"))
}

/// A fresh, empty directory for one test: `hqdmux-{tag}-{pid}` under the
/// system temp directory (whatever an earlier run left there is removed).
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hqdmux-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `file` in `dir` and returns its path.
pub fn write_file(dir: &Path, file: &str, text: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

/// Writes `text` to `file` in a fresh [`scratch`] directory `tag` and
/// returns its path.
pub fn scratch_file(tag: &str, file: &str, text: impl AsRef<[u8]>) -> PathBuf {
    write_file(&scratch(tag), file, text)
}

/// Runs `hqdmux ARGS FILE` to completion.
pub fn run_on(args: &[&str], file: &Path) -> Output {
    hqdmux().args(args).arg(file).output().unwrap()
}

/// Starts `hqdmux ARGS FILE` with stdout and stderr piped.
pub fn spawn_on(args: &[&str], file: &Path) -> Child {
    hqdmux()
        .args(args)
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `hqdmux sim ARGS --scenario-file SCENARIO` to completion.
pub fn sim(args: &[&str], scenario: &Path) -> Output {
    hqdmux()
        .arg("sim")
        .args(args)
        .arg("--scenario-file")
        .arg(scenario)
        .output()
        .unwrap()
}

/// Asserts that the command succeeded, showing its stderr if not.
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that the command exited with status 2 (refused its input) and
/// returns its stderr.
pub fn refused(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}
