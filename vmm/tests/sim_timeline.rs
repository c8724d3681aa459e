//! `hqdmux sim --timeline` as an operator runs it: one SVG (or JSON) per run.

mod common;

use common::{assert_ok, refused, scratch, sim, write_file};

/// The seed scenario's shape, shortened to one inference burst.
const SCENARIO: &str = include_str!("scenarios/seedlet.toml");

#[test]
fn one_svg_per_policy_naming_every_vm_and_json_on_request() {
    let d = scratch("simtl-svg");
    let sc = write_file(&d, "seedlet.toml", SCENARIO);
    let base = d.join("t.svg");
    // Not a policy name: refused before anything is written.
    refused(&sim(&["--policy", "hqdmux,fifo"], &sc));
    assert_ok(&sim(
        &["--policy", "all", "--timeline", base.to_str().unwrap()],
        &sc,
    ));
    for p in ["hqdmux", "fifo", "poll5ms", "timeslice", "reset"] {
        let f = d.join(format!("t-{p}.svg"));
        let svg = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        let texts: String = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            texts.contains("training") && texts.contains("inference"),
            "{p}"
        );
        assert!(texts.contains(&format!("--policy {p}")), "{p}: title");
    }
    assert!(!base.exists(), "several policies: no file at PATH itself");
    // Under hqdmux, inference preempts training: the JSON says so.
    let json = d.join("t.json");
    // `hqdmux sim --policy hqdmux --timeline-from-ms FROM --timeline t.json`.
    let window_from = |from_ms: &str| {
        let timeline = json.to_str().unwrap();
        let args = [
            "--policy",
            "hqdmux",
            "--timeline-from-ms",
            from_ms,
            "--timeline",
            timeline,
        ];
        sim(&args, &sc)
    };
    assert_ok(&window_from("10"));
    let t = timeline::Timeline::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!((t.start_ns, t.end_ns), (10_000_000, 60_000_000));
    let id = |n: &str| t.vms.iter().find(|v| v.name == n).unwrap().id;
    assert!(t
        .preemptions
        .iter()
        .any(|p| p.vm == id("training") && p.by_vm == Some(id("inference"))));
    // An empty window is refused.
    assert!(refused(&window_from("70")).contains("empty window"));
    let _ = std::fs::remove_dir_all(&d);
}
