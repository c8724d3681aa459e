//! `hqdmux sim` as an operator runs it (virtual time, no KVM).

mod common;

use common::{assert_ok, hqdmux, refused, scratch_file, sim};

const SCENARIO: &str = include_str!("scenarios/mine.toml");

#[test]
fn scenario_file_json_has_one_object_per_policy_with_the_contract_fields() {
    let f = scratch_file("sim-json", "mine.toml", SCENARIO);
    let out = sim(&["--policy", "all", "--json", "--seed", "3"], &f);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["hqdmux", "fifo", "poll5ms", "timeslice", "reset"]);
    for r in rows {
        assert_eq!(r["scenario"], "mine");
        assert_eq!(r["seed"], 3);
        for f in [
            "hi_p50_us",
            "hi_p99_us",
            "hi_p999_us",
            "hi_isolated_p99_us",
            "hi_sla_miss_rate",
            "lo_throughput_retained",
            "preemptions",
            "save_restore_us_total",
            "hqd_utilisation",
            "lost_effects",
            "duplicate_effects",
        ] {
            assert!(r[f].is_number(), "{f} in {r}");
        }
        // One lo VM: no fairness to measure (null, not a perfect 1.0).
        assert!(r["jain_index"].is_null(), "{r}");
    }
    // hqdmux preempts the batch VM; fifo never does.
    assert!(rows[0]["preemptions"].as_u64().unwrap() > 0);
    assert_eq!(rows[1]["preemptions"].as_u64().unwrap(), 0);
    assert!(rows[0]["hi_p99_us"].as_f64().unwrap() < rows[1]["hi_p99_us"].as_f64().unwrap());
}

#[test]
fn table_form_and_list() {
    let out = hqdmux().args(["sim", "--list"]).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    for n in ["seed", "disb-a", "disb-e", "flood", "oversub", "storm"] {
        assert!(s.contains(n), "{s}");
    }
    let f = scratch_file("sim-table", "mine.toml", SCENARIO);
    let out = sim(&["--policy", "hqdmux"], &f);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        s.contains("scenario mine") && s.contains("hi_p99") && s.contains("\nhqdmux "),
        "{s}"
    );
}

#[test]
fn bad_scenarios_and_policies_exit_2_naming_file_field_and_reason() {
    let f = scratch_file(
        "sim-bad",
        "bad.toml",
        SCENARIO.replace("priority = 12", "priority = 40"),
    );
    let e = refused(&sim(&[], &f));
    assert!(
        e.contains("bad.toml: tenant 'svc': field `priority`: 40 is out of range 0..=15"),
        "{e}"
    );
    for (args, want) in [
        (
            ["sim", "--scenario", "nosuch"],
            "no built-in scenario 'nosuch'",
        ),
        (["sim", "--policy", "lottery"], "unknown policy 'lottery'"),
    ] {
        let out = hqdmux().args(args).output().unwrap();
        assert!(refused(&out).contains(want), "{args:?}");
    }
}

#[test]
fn a_sweep_in_a_scenario_file_runs_each_point() {
    let text = SCENARIO.replace(
        "duration_ms = 300\n",
        "duration_ms = 100\nsweep = { tenant = \"batch\", counts = [1, 3] }\n",
    );
    let f = scratch_file("sim-sweep", "sweep.toml", text);
    let out = sim(&["--policy", "hqdmux", "--json"], &f);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine/batch=1", "mine/batch=3"]);
}

#[test]
fn per_vm_section_lists_every_vm_with_units_and_json_carries_it() {
    let f = scratch_file(
        "sim-pervm",
        "mine.toml",
        SCENARIO.replace("name = \"batch\"", "name = \"batch\"\ncount = 2"),
    );
    let out = sim(&["--policy", "hqdmux", "--per-vm"], &f);
    assert_ok(&out);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("per VM: scenario mine policy hqdmux"), "{s}");
    assert!(
        s.contains("gpu_time_ms") && s.contains("max_wait_us"),
        "{s}"
    );
    for vm in ["svc ", "batch-0 ", "batch-1 "] {
        assert!(s.lines().any(|l| l.starts_with(vm)), "{vm}: {s}");
    }
    assert!(s.contains("jain by level"), "{s}");
    // Without --per-vm: no such section.
    let out = sim(&["--policy", "hqdmux"], &f);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("per VM"));
    let out = sim(&["--policy", "hqdmux", "--json"], &f);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v[0];
    let vms = r["vms"].as_array().unwrap();
    let names: Vec<&str> = vms.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["svc", "batch-0", "batch-1"]);
    let share: f64 = vms.iter().map(|v| v["share"].as_f64().unwrap()).sum();
    assert!((share - 1.0).abs() < 1e-9, "{r}");
    assert!(r["jain_by_level"]["12"].is_null(), "{r}");
    assert!(r["jain_by_level"]["2"].is_number(), "{r}");
}
