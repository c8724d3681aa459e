//! SVG Gantt rendering of a [`Timeline`].

use crate::{Span, SpanKind, Timeline};
use std::collections::BTreeSet;
use std::fmt::Write;

/// How [`render_svg`] draws a timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Picture width (px); the height follows from the rows.
    pub width: u32,
    /// Title line (none: "hqdmux timeline").
    pub title: Option<String>,
    /// Draw every HQD slot, also those idle for the whole window (default:
    /// only slots that were used; the number hidden is printed).
    pub all_slots: bool,
    /// Add one row per VM (all its slots on one row) under the slot rows.
    pub vm_rows: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            width: 1200,
            title: None,
            all_slots: false,
            vm_rows: true,
        }
    }
}

/// Colour of the `i`-th VM: ten hand-picked hues (no red: red marks
/// preemptions), then hues spaced by the golden angle.
pub fn vm_colour(i: usize) -> String {
    const PALETTE: [&str; 10] = [
        "#3b75af", "#ef8a2c", "#4aa564", "#8d6cbf", "#c9b42e", "#2bb3c0", "#a66a3f", "#e377c2",
        "#7f7f7f", "#9acd32",
    ];
    match PALETTE.get(i) {
        Some(c) => (*c).to_string(),
        None => format!("hsl({}, 55%, 50%)", (i * 137) % 360),
    }
}

/// XML-escapes text and attribute values.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

/// A tick step of 1, 2 or 5 x 10^k ns giving at most ~`n` ticks over `span`.
fn tick_step(span: u64, n: u64) -> u64 {
    let raw = (span / n.max(1)).max(1);
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            let s = p.saturating_mul(m);
            if s >= raw {
                return s;
            }
        }
        if p > u64::MAX / 10 {
            return u64::MAX;
        }
        p *= 10;
    }
}

/// Unit (divisor, name) for labels at tick step `step` ns.
fn unit(step: u64) -> (f64, &'static str) {
    if step >= 1_000_000_000 {
        (1e9, "s")
    } else if step >= 1_000_000 {
        (1e6, "ms")
    } else if step >= 1_000 {
        (1e3, "µs")
    } else {
        (1.0, "ns")
    }
}

fn fmt_num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

fn fmt_time(ns: u64) -> String {
    let (d, u) = unit(ns.max(1));
    format!("{} {u}", fmt_num(ns as f64 / d))
}

const LEFT: f64 = 170.0;
const RIGHT: f64 = 24.0;
const ROW: f64 = 18.0;
const GAP: f64 = 4.0;

/// Renders `t` as a standalone SVG document: a Gantt chart with one row per
/// HQD slot (and, with [`RenderOptions::vm_rows`], one per VM), spans
/// coloured by VM, CWSR save/restore spans hatched, preemptions marked by
/// red triangles, a legend naming every VM and a time axis with units.
pub fn render_svg(t: &Timeline, o: &RenderOptions) -> String {
    let width = f64::from(o.width.max(400));
    let plot_w = width - LEFT - RIGHT;
    let (t0, t1) = (t.start_ns, t.end_ns.max(t.start_ns + 1));
    let span_ns = t1 - t0;
    let x_of = |ns: u64| LEFT + (ns.clamp(t0, t1) - t0) as f64 / span_ns as f64 * plot_w;
    let vm_idx = |id: u32| t.vms.iter().position(|v| v.id == id).unwrap_or(t.vms.len());

    let used: BTreeSet<u32> = t
        .spans
        .iter()
        .map(|s| s.slot)
        .chain(t.preemptions.iter().map(|p| p.slot))
        .collect();
    let slot_rows: Vec<_> = t
        .slots
        .iter()
        .filter(|s| o.all_slots || used.contains(&s.id))
        .collect();
    let hidden = t.slots.len() - slot_rows.len();

    let mut b = String::new();
    // ---- legend layout (wraps) ----
    let mut legend: Vec<(String, String)> = t
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                vm_colour(i),
                format!("{} (priority {}, weight {})", v.name, v.priority, v.weight),
            )
        })
        .collect();
    let vm_items = legend.len();
    for (k, name) in [
        ("run", "running (queue mapped)"),
        ("save", "CWSR save"),
        ("restore", "CWSR restore"),
        ("drain", "dequeue without save"),
        ("preempt", "preemption"),
    ] {
        legend.push((k.to_string(), name.to_string()));
    }
    let mut lx = LEFT;
    let mut ly = 44.0;
    let mut placed = Vec::new();
    for (i, (_, text)) in legend.iter().enumerate() {
        let w = 22.0 + 6.6 * text.chars().count() as f64 + 18.0;
        if lx + w > width - RIGHT && lx > LEFT {
            lx = LEFT;
            ly += 18.0;
        }
        if i == vm_items && lx > LEFT {
            // Kinds on their own line.
            lx = LEFT;
            ly += 18.0;
        }
        placed.push((lx, ly));
        lx += w;
    }
    let mut y = ly + 22.0;
    let slots_title_y = y;
    y += 8.0;
    let slot_y0 = y;
    y += slot_rows.len() as f64 * (ROW + GAP);
    if hidden > 0 {
        y += 14.0;
    }
    let vms_title_y = y + 14.0;
    let vm_y0 = vms_title_y + 8.0;
    if o.vm_rows {
        y = vm_y0 + t.vms.len() as f64 * (ROW + GAP);
    }
    let axis_y = y + 4.0;
    let height = axis_y + 44.0;

    let _ = write!(
        b,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">
<defs>
<pattern id="hatch-save" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="5" height="5" fill="#ffffff" fill-opacity="0.15"/><line x1="0" y1="0" x2="0" y2="5" stroke="#000000" stroke-width="2.2"/></pattern>
<pattern id="hatch-restore" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)"><line x1="0" y1="0" x2="0" y2="5" stroke="#ffffff" stroke-width="2.2"/></pattern>
<pattern id="dots-drain" width="4" height="4" patternUnits="userSpaceOnUse"><circle cx="2" cy="2" r="1" fill="#000000"/></pattern>
</defs>
<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>
<text x="12" y="24" font-size="16" font-weight="bold">{title}</text>
<text x="{tx}" y="24" text-anchor="end" fill="#444444">{range}</text>
"##,
        w = width,
        h = height,
        title = esc(o.title.as_deref().unwrap_or("hqdmux timeline")),
        tx = width - RIGHT,
        range = esc(&format!(
            "{} .. {} {} ({} spans, {} preemptions)",
            fmt_num(t0 as f64 / unit(span_ns).0),
            fmt_num(t1 as f64 / unit(span_ns).0),
            unit(span_ns).1,
            t.spans.len(),
            t.preemptions.len()
        )),
    );
    // ---- legend ----
    let _ = writeln!(b, r#"<g class="legend">"#);
    for (i, ((key, text), (x, ly))) in legend.iter().zip(&placed).enumerate() {
        let sy = ly - 10.0;
        if i < vm_items {
            let _ = writeln!(
                b,
                r#"<rect x="{x}" y="{sy}" width="14" height="12" fill="{key}"/>"#
            );
        } else {
            match key.as_str() {
                "run" => {
                    let _ = writeln!(
                        b,
                        r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/>"##
                    );
                }
                "save" | "restore" => {
                    let pat = if key == "save" {
                        "hatch-save"
                    } else {
                        "hatch-restore"
                    };
                    let _ = writeln!(
                        b,
                        r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/><rect x="{x}" y="{sy}" width="14" height="12" fill="url(#{pat})"/>"##
                    );
                }
                "drain" => {
                    let _ = writeln!(
                        b,
                        r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/><rect x="{x}" y="{sy}" width="14" height="12" fill="url(#dots-drain)"/>"##
                    );
                }
                _ => {
                    let _ = writeln!(b, "{}", triangle(x + 7.0, sy, "preemption"));
                }
            }
        }
        let _ = writeln!(b, r#"<text x="{}" y="{ly}">{}</text>"#, x + 20.0, esc(text));
    }
    let _ = writeln!(b, "</g>");

    // ---- grid and axis ----
    let step = tick_step(span_ns, 10);
    let (div, uname) = unit(step);
    let _ = writeln!(b, r#"<g class="axis">"#);
    let first = t0.div_ceil(step).saturating_mul(step);
    let mut tick = first;
    while tick <= t1 {
        let x = x_of(tick);
        let _ = writeln!(
            b,
            r##"<line x1="{x:.2}" y1="{top}" x2="{x:.2}" y2="{axis_y}" stroke="#dddddd"/><line x1="{x:.2}" y1="{axis_y}" x2="{x:.2}" y2="{ty}" stroke="#333333"/><text x="{x:.2}" y="{ly}" text-anchor="middle">{v}</text>"##,
            top = slots_title_y - 10.0,
            ty = axis_y + 5.0,
            ly = axis_y + 18.0,
            v = fmt_num(tick as f64 / div),
        );
        match tick.checked_add(step) {
            Some(n) => tick = n,
            None => break,
        }
    }
    let _ = writeln!(
        b,
        r##"<line x1="{LEFT}" y1="{axis_y}" x2="{x2}" y2="{axis_y}" stroke="#333333"/><text x="{cx}" y="{uy}" text-anchor="middle">time ({uname})</text>"##,
        x2 = width - RIGHT,
        cx = LEFT + plot_w / 2.0,
        uy = axis_y + 36.0,
    );
    let _ = writeln!(b, "</g>");

    // ---- slot rows ----
    let _ = writeln!(
        b,
        r#"<text x="12" y="{slots_title_y}" font-weight="bold">HQD slots</text>"#
    );
    let _ = writeln!(b, r#"<g class="slots">"#);
    for (r, slot) in slot_rows.iter().enumerate() {
        let ry = slot_y0 + r as f64 * (ROW + GAP);
        row_background(&mut b, r, ry, plot_w, &slot.label);
        let spans = t.spans.iter().filter(|s| s.slot == slot.id);
        draw_spans(&mut b, t, spans, ry, &x_of, &vm_idx, 1.0);
        for p in t.preemptions.iter().filter(|p| p.slot == slot.id) {
            let x = x_of(p.at_ns);
            let victim = t.vm(p.vm).map_or("?", |v| v.name.as_str());
            let tip = match p.by_vm.and_then(|v| t.vm(v)) {
                Some(by) => format!("{victim} preempted by {} at {}", by.name, fmt_time(p.at_ns)),
                None => format!("{victim} preempted at {}", fmt_time(p.at_ns)),
            };
            let _ = writeln!(
                b,
                r##"<line x1="{x:.2}" y1="{ry}" x2="{x:.2}" y2="{y2}" stroke="#d62020" stroke-width="1.2"/>{}"##,
                triangle(x, ry - 3.0, &tip),
                y2 = ry + ROW,
            );
        }
    }
    if hidden > 0 {
        let _ = writeln!(
            b,
            r##"<text x="12" y="{}" fill="#666666" font-style="italic">{hidden} idle HQD slot(s) not shown</text>"##,
            slot_y0 + slot_rows.len() as f64 * (ROW + GAP) + 10.0
        );
    }
    let _ = writeln!(b, "</g>");

    // ---- VM rows ----
    if o.vm_rows {
        let _ = writeln!(
            b,
            r#"<text x="12" y="{vms_title_y}" font-weight="bold">VMs (all their slots)</text>"#
        );
        let _ = writeln!(b, r#"<g class="vms">"#);
        for (r, v) in t.vms.iter().enumerate() {
            let ry = vm_y0 + r as f64 * (ROW + GAP);
            row_background(&mut b, r, ry, plot_w, &v.name);
            let spans = t.spans.iter().filter(|s| s.vm == v.id);
            draw_spans(&mut b, t, spans, ry, &x_of, &vm_idx, 0.55);
            for p in t.preemptions.iter().filter(|p| p.vm == v.id) {
                let x = x_of(p.at_ns);
                let _ = writeln!(
                    b,
                    r##"<line x1="{x:.2}" y1="{ry}" x2="{x:.2}" y2="{y2}" stroke="#d62020" stroke-width="1.2"/>"##,
                    y2 = ry + ROW,
                );
            }
        }
        let _ = writeln!(b, "</g>");
    }
    b.push_str("</svg>\n");
    b
}

fn triangle(x: f64, top: f64, tip: &str) -> String {
    format!(
        r##"<path d="M {:.2} {:.2} L {:.2} {:.2} L {:.2} {:.2} Z" fill="#d62020"><title>{}</title></path>"##,
        x - 5.0,
        top - 6.0,
        x + 5.0,
        top - 6.0,
        x,
        top + 3.0,
        esc(tip)
    )
}

fn row_background(b: &mut String, r: usize, ry: f64, plot_w: f64, label: &str) {
    let fill = if r.is_multiple_of(2) {
        "#f4f4f4"
    } else {
        "#fbfbfb"
    };
    let _ = writeln!(
        b,
        r#"<rect x="{LEFT}" y="{ry}" width="{plot_w:.2}" height="{ROW}" fill="{fill}"/><text x="{lx}" y="{ty}" text-anchor="end">{}</text>"#,
        esc(label),
        lx = LEFT - 8.0,
        ty = ry + ROW - 5.0,
    );
}

fn draw_spans<'a>(
    b: &mut String,
    t: &Timeline,
    spans: impl Iterator<Item = &'a Span> + Clone,
    ry: f64,
    x_of: &impl Fn(u64) -> f64,
    vm_idx: &impl Fn(u32) -> usize,
    opacity: f64,
) {
    // Runs first, then dequeues and restores on top (they are short and
    // drawn at least 2 px wide so they stay visible).
    for pass in [true, false] {
        for s in spans.clone().filter(|s| (s.kind == SpanKind::Run) == pass) {
            let x = x_of(s.start_ns);
            let min_w = if pass { 0.6 } else { 2.0 };
            let w = (x_of(s.end_ns) - x).max(min_w);
            let name = t.vm(s.vm).map_or("?", |v| v.name.as_str());
            let tip = format!(
                "{name} queue {} {}: {} .. {} ({})",
                s.queue,
                s.kind.name(),
                fmt_time(s.start_ns),
                fmt_time(s.end_ns),
                fmt_time(s.end_ns - s.start_ns)
            );
            let _ = write!(
                b,
                r#"<rect x="{x:.2}" y="{ry}" width="{w:.2}" height="{ROW}" fill="{c}" fill-opacity="{opacity}"><title>{tip}</title></rect>"#,
                c = vm_colour(vm_idx(s.vm)),
                tip = esc(&tip),
            );
            let pat = match s.kind {
                SpanKind::Run => None,
                SpanKind::Save => Some("hatch-save"),
                SpanKind::Restore => Some("hatch-restore"),
                SpanKind::Drain => Some("dots-drain"),
            };
            if let Some(p) = pat {
                let _ = write!(
                    b,
                    r#"<rect x="{x:.2}" y="{ry}" width="{w:.2}" height="{ROW}" fill="url(#{p})"/>"#
                );
            }
            b.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Preemption, Recorder, RingLimits, SlotRow, VmRow};

    fn sample() -> Timeline {
        let slots = (0..3)
            .map(|i| SlotRow {
                id: i,
                label: format!("P0 pipe0 q{i}"),
                partition: 0,
            })
            .collect();
        let mut r = Recorder::new(slots, RingLimits::UNBOUNDED);
        r.set_vm(VmRow {
            id: 0,
            name: "training <lo> & co".into(),
            priority: 3,
            weight: 1,
        });
        r.set_vm(VmRow {
            id: 1,
            name: "inference".into(),
            priority: 12,
            weight: 2,
        });
        r.begin(0, 0, 0, 1, SpanKind::Run);
        r.begin(1_000_000, 1, 1, 2, SpanKind::Restore);
        r.begin(1_050_000, 1, 1, 2, SpanKind::Run);
        r.preempt(2_000_000, 0, 0, None);
        r.dequeued(2_030_000, 0, 30_000, SpanKind::Save);
        r.begin(2_030_000, 0, 1, 3, SpanKind::Run);
        r.snapshot(5_000_000, None)
    }

    #[test]
    fn svg_is_well_formed_and_names_every_vm() {
        let t = sample();
        t.check().unwrap();
        let svg = render_svg(&t, &RenderOptions::default());
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        for v in &t.vms {
            assert!(
                texts.iter().any(|x| x.contains(&v.name)),
                "legend names {}",
                v.name
            );
        }
        assert!(texts.iter().any(|x| x.starts_with("time (")));
        // One red triangle per preemption outside the legend, with a tooltip
        // naming both VMs.
        let tips: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("path"))
            .filter_map(|n| n.first_element_child().and_then(|c| c.text()))
            .filter(|x| x.contains("preempted by"))
            .collect();
        assert_eq!(tips.len(), 1);
        assert!(tips[0].contains("inference"));
        // The CWSR save is drawn hatched.
        assert!(doc
            .descendants()
            .any(|n| n.attribute("fill") == Some("url(#hatch-save)")));
        // Idle slot 2 is hidden and said so.
        assert!(texts.iter().any(|x| x.contains("1 idle HQD slot")));
    }

    #[test]
    fn empty_and_degenerate_timelines_render() {
        let t = Timeline::default();
        let svg = render_svg(&t, &RenderOptions::default());
        roxmltree::Document::parse(&svg).unwrap();
        let mut t = sample();
        t.preemptions.push(Preemption {
            at_ns: u64::MAX,
            slot: 0,
            vm: 0,
            by_vm: None,
        });
        t.end_ns = u64::MAX;
        let svg = render_svg(
            &t,
            &RenderOptions {
                width: 0,
                all_slots: true,
                vm_rows: false,
                title: Some("\u{1}x".into()),
            },
        );
        roxmltree::Document::parse(&svg).unwrap();
    }

    #[test]
    fn ticks_are_round_and_units_fit() {
        assert_eq!(tick_step(100_000_000, 10), 10_000_000);
        assert_eq!(tick_step(250_000_000, 10), 50_000_000);
        assert_eq!(unit(10_000_000), (1e6, "ms"));
        assert_eq!(unit(500), (1.0, "ns"));
        assert_eq!(fmt_time(1_500_000), "1.5 ms");
    }
}
