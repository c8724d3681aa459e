//! The virtual-time driver records a timeline: the seed scenario's
//! inference VM preempts training, spans never overlap on a slot, and the
//! SVG is well-formed and names every VM.

use eval::driver::{simulate, simulate_timeline};
use eval::scenario::Scenario;
use scheduler::Policy;
use timeline::{render_svg, RenderOptions, SpanKind};

fn seed_short() -> Scenario {
    let mut sc = Scenario::builtin("seed").unwrap();
    // Two inference bursts (17 ms and 117 ms).
    sc.duration_ms = 200;
    sc
}

#[test]
fn seed_timeline_shows_inference_preempting_training() {
    let sc = seed_short();
    let (run, t) = simulate_timeline(&sc, Policy::Hqdmux, sc.seed).unwrap();
    t.check().unwrap();
    assert_eq!((t.start_ns, t.end_ns), (0, 200_000_000));
    let id = |name: &str| t.vms.iter().find(|v| v.name == name).unwrap().id;
    let (train, infer) = (id("training"), id("inference"));
    let marks: Vec<_> = t
        .preemptions
        .iter()
        .filter(|p| p.vm == train && p.by_vm == Some(infer))
        .collect();
    assert!(!marks.is_empty(), "{:?}", t.preemptions);
    // Every preemption the scheduler counted is marked once.
    assert_eq!(t.preemptions.len() as u64, run.preemptions);
    // Training's waves were saved and restored; inference ran.
    let held = |k| t.held_ns(k);
    assert!(held(SpanKind::Save).get(&train).is_some_and(|ns| *ns > 0));
    assert!(held(SpanKind::Restore)
        .get(&train)
        .is_some_and(|ns| *ns > 0));
    assert!(held(SpanKind::Run).get(&infer).is_some_and(|ns| *ns > 0));
    // The first preemption follows the first burst's arrival (17 ms).
    assert!(marks[0].at_ns >= 17_000_000);

    let svg = render_svg(
        &t.clip(0, 60_000_000),
        &RenderOptions {
            title: Some("seed".into()),
            ..Default::default()
        },
    );
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    for v in &t.vms {
        assert!(texts.iter().any(|x| x.contains(&v.name)), "{}", v.name);
    }
    assert!(svg.contains("inference preempted") || svg.contains("training preempted by inference"));
}

#[test]
fn recording_does_not_change_the_run() {
    let sc = seed_short();
    let plain = simulate(&sc, Policy::Hqdmux, sc.seed).unwrap();
    let (rec, _) = simulate_timeline(&sc, Policy::Hqdmux, sc.seed).unwrap();
    assert_eq!(plain.hi_latency_ns, rec.hi_latency_ns);
    assert_eq!(plain.preemptions, rec.preemptions);
    assert_eq!(plain.vm_runs, rec.vm_runs);
}
