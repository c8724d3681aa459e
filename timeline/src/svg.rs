//! SVG rendering of a [`Timeline`]: a Gantt chart (one rectangle per span)
//! when spans are wide enough to see, and an aggregated picture (per-VM
//! lanes shaded by GPU time per bin, waiting strips, preemption counts per
//! bin) when they would be narrower than a pixel. Either way the size is
//! bounded: it depends on the rows and the width, not on the number of
//! spans.

use crate::{Span, SpanKind, Timeline};
use std::collections::{BTreeMap, BTreeSet};
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
    /// The aggregated picture always has them (they are its main rows).
    pub vm_rows: bool,
    /// `Some(true)`: always aggregate into bins; `Some(false)`: always draw
    /// every span (the size then grows with the spans); `None` (default):
    /// aggregate when spans would be narrower than a pixel or too many to
    /// draw one by one (see [`DETAIL_MAX_ITEMS`]).
    pub aggregate: Option<bool>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            width: 1200,
            title: None,
            all_slots: false,
            vm_rows: true,
            aggregate: None,
        }
    }
}

/// Most spans, preemptions and waits drawn one by one; a window with more
/// is aggregated (keeps a drawn-in-detail picture well under 1 MB).
pub const DETAIL_MAX_ITEMS: usize = 1200;

/// Width of one aggregation bin (px).
pub const BIN_PX: f64 = 3.0;

/// Most HQD slot rows drawn in the aggregated picture; with more slots in
/// use only the VM lanes are drawn (and the count of slots is printed).
pub const AGG_MAX_SLOT_ROWS: usize = 24;

/// Shading levels of aggregated bins (GPU time share rounded up to 1/8).
const LEVELS: u64 = 8;

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

/// Time of a timeline summed into `n` equal bins over `[start_ns, end_ns)`,
/// per lane (a VM or a slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bins {
    /// Window start (ns).
    pub start_ns: u64,
    /// Window end (ns), `> start_ns`.
    pub end_ns: u64,
    /// Number of bins.
    pub n: usize,
    lanes: BTreeMap<u32, Vec<u64>>,
}

impl Bins {
    /// Empty bins (`n >= 1`; an empty window is taken as 1 ns long).
    pub fn new(start_ns: u64, end_ns: u64, n: usize) -> Self {
        Bins {
            start_ns,
            end_ns: end_ns.max(start_ns.saturating_add(1)),
            n: n.max(1),
            lanes: BTreeMap::new(),
        }
    }

    fn len(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// `[start, end)` of bin `i` (ns).
    pub fn bounds(&self, i: usize) -> (u64, u64) {
        let at = |k: usize| {
            let off = (k as u128 * u128::from(self.len())) / self.n as u128;
            self.start_ns + off as u64
        };
        (at(i), at(i + 1))
    }

    /// The bin holding time `ns` (clamped to the window).
    pub fn index(&self, ns: u64) -> usize {
        let ns = ns.clamp(self.start_ns, self.end_ns - 1);
        let off = ns - self.start_ns;
        let mut i = ((u128::from(off) * self.n as u128) / u128::from(self.len())) as usize;
        // Bounds round down: `ns` may already be past bin `i` (or past
        // empty bins when there are more bins than nanoseconds).
        while i + 1 < self.n && self.bounds(i + 1).0 <= ns {
            i += 1;
        }
        i
    }

    /// Adds the part of `[start_ns, end_ns)` inside the window to `lane`.
    pub fn add(&mut self, lane: u32, start_ns: u64, end_ns: u64) {
        let s = start_ns.max(self.start_ns);
        let e = end_ns.min(self.end_ns);
        if s >= e {
            return;
        }
        let (n, first) = (self.n, self.index(s));
        let (start, len) = (self.start_ns, u128::from(self.len()));
        let at = move |k: usize| start + ((k as u128 * len) / n as u128) as u64;
        let v = self.lanes.entry(lane).or_insert_with(|| vec![0; n]);
        for (i, slot) in v.iter_mut().enumerate().skip(first) {
            let (bs, be) = (at(i), at(i + 1));
            *slot += e.min(be).saturating_sub(s.max(bs));
            if be >= e {
                break;
            }
        }
    }

    /// The time per bin of `lane` (empty if nothing was added to it).
    pub fn lane(&self, lane: u32) -> &[u64] {
        self.lanes.get(&lane).map_or(&[], |v| v.as_slice())
    }
}

/// A timeline summed into `n` bins: per VM, GPU time (slot time of all its
/// spans, any kind) and waiting time; per slot and VM, slot time.
#[derive(Clone, Debug)]
pub struct Aggregate {
    /// Per VM: slot time of its spans.
    pub busy: Bins,
    /// Per VM: time waiting ready for a slot.
    pub waiting: Bins,
    /// Per VM: preemptions suffered per bin.
    pub preempted: BTreeMap<u32, Vec<u32>>,
    /// Per `(slot, vm)`: slot time (lane key `slot << 16 | vm` is avoided:
    /// kept as a map of maps).
    pub slot_vm: BTreeMap<u32, Bins>,
}

/// Sums `t` into `n` bins (see [`Aggregate`]). Busy time is conserved: the
/// bins of a VM add up to the time of its spans inside the window.
pub fn aggregate(t: &Timeline, n: usize) -> Aggregate {
    let mut busy = Bins::new(t.start_ns, t.end_ns, n);
    let mut waiting = busy.clone();
    let mut slot_vm: BTreeMap<u32, Bins> = BTreeMap::new();
    for s in &t.spans {
        busy.add(s.vm, s.start_ns, s.end_ns);
        slot_vm
            .entry(s.slot)
            .or_insert_with(|| Bins::new(t.start_ns, t.end_ns, n))
            .add(s.vm, s.start_ns, s.end_ns);
    }
    for w in &t.waits {
        waiting.add(w.vm, w.start_ns, w.end_ns);
    }
    let mut preempted: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in &t.preemptions {
        if p.at_ns < busy.start_ns || p.at_ns > busy.end_ns {
            continue;
        }
        let i = busy.index(p.at_ns);
        let v = preempted.entry(p.vm).or_insert_with(|| vec![0; busy.n]);
        v[i] = v[i].saturating_add(1);
    }
    Aggregate {
        busy,
        waiting,
        preempted,
        slot_vm,
    }
}

/// Shading level (0..=LEVELS) of `part` ns out of `whole` ns: 0 only for
/// nothing, so any activity stays visible.
fn level(part: u64, whole: u64) -> u64 {
    if part == 0 || whole == 0 {
        return 0;
    }
    let l = (u128::from(part) * u128::from(LEVELS)).div_ceil(u128::from(whole));
    (l as u64).clamp(1, LEVELS)
}

/// Per-row path builder: one `<path>` per (fill, level), consecutive bins
/// of one level merged.
#[derive(Default)]
struct Shades {
    paths: BTreeMap<(String, u64), String>,
}

impl Shades {
    fn rect(&mut self, fill: &str, lvl: u64, x: f64, y: f64, w: f64, h: f64) {
        let p = self.paths.entry((fill.to_string(), lvl)).or_default();
        let _ = write!(p, "M{x:.1} {y:.1}h{w:.1}v{h:.1}h{:.1}z", -w);
    }

    fn write(self, b: &mut String) {
        for ((fill, lvl), d) in self.paths {
            // A floor keeps light activity visible; level 8 is opaque.
            let op = 0.12 + 0.88 * lvl as f64 / LEVELS as f64;
            let _ = writeln!(b, r#"<path d="{d}" fill="{fill}" fill-opacity="{op:.3}"/>"#);
        }
    }
}

/// Runs of equal non-zero level in `vals` (each over its bin's width):
/// `(first bin, bins, level)`.
fn runs(levels: &[u64]) -> Vec<(usize, usize, u64)> {
    let mut out: Vec<(usize, usize, u64)> = Vec::new();
    for (i, &l) in levels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        match out.last_mut() {
            Some((s, n, pl)) if *pl == l && *s + *n == i => *n += 1,
            _ => out.push((i, 1, l)),
        }
    }
    out
}

const LEFT: f64 = 170.0;
/// Width of the per-VM summary column right of the plot.
const SUMMARY_W: f64 = 340.0;
const ROW: f64 = 18.0;
const GAP: f64 = 4.0;
/// Aggregated VM lane: preemption strip, GPU-time band, waiting strip.
const LANE_P: f64 = 5.0;
const LANE_RUN: f64 = 14.0;
const LANE_W: f64 = 5.0;
const LANE: f64 = LANE_P + LANE_RUN + LANE_W;
const WAIT_FILL: &str = "#e0a030";
const MARK_FILL: &str = "#7b2fbe";
const PREEMPT_FILL: &str = "#d62020";

/// Per-VM figures over the window (the summary column).
struct VmSummary {
    held_ns: u64,
    wait_ns: u64,
    preempted: u64,
    by: BTreeMap<u32, u64>,
}

fn summaries(t: &Timeline) -> BTreeMap<u32, VmSummary> {
    let mut m: BTreeMap<u32, VmSummary> = t
        .vms
        .iter()
        .map(|v| {
            (
                v.id,
                VmSummary {
                    held_ns: 0,
                    wait_ns: 0,
                    preempted: 0,
                    by: BTreeMap::new(),
                },
            )
        })
        .collect();
    for s in &t.spans {
        if let Some(v) = m.get_mut(&s.vm) {
            v.held_ns = v.held_ns.saturating_add(s.end_ns - s.start_ns);
        }
    }
    for w in &t.waits {
        if let Some(v) = m.get_mut(&w.vm) {
            v.wait_ns = v.wait_ns.saturating_add(w.end_ns - w.start_ns);
        }
    }
    for p in &t.preemptions {
        if let Some(v) = m.get_mut(&p.vm) {
            v.preempted += 1;
            if let Some(by) = p.by_vm {
                *v.by.entry(by).or_insert(0) += 1;
            }
        }
    }
    m
}

/// Shortens `s` to at most `n` characters (with an ellipsis).
fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut o: String = s.chars().take(n.saturating_sub(1)).collect();
        o.push('…');
        o
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// The summary line of one VM: GPU time and waiting as shares of the
/// window, preemptions suffered and the (at most two) VMs that made most.
fn summary_text(t: &Timeline, s: &VmSummary, window: u64) -> (String, String) {
    let head = format!(
        "GPU {} · waiting {} · preempted {}",
        pct(s.held_ns, window),
        pct(s.wait_ns, window),
        s.preempted
    );
    let mut txt = String::new();
    if !s.by.is_empty() {
        let mut by: Vec<(u32, u64)> = s.by.iter().map(|(k, v)| (*k, *v)).collect();
        by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let names: Vec<String> = by
            .iter()
            .take(2)
            .map(|(v, n)| {
                let name = t
                    .vm(*v)
                    .map_or_else(|| format!("vm{v}"), |r| r.name.clone());
                format!("{} {n}", short(&name, 10))
            })
            .collect();
        let _ = write!(txt, "by {}", names.join(", "));
        if by.len() > 2 {
            let _ = write!(txt, " +{} VMs", by.len() - 2);
        }
    }
    (head, txt)
}

/// Change labels: marks at the same pixel with the same text are one
/// label naming their VMs (`train-1, train-2 +3: priority 6 -> 10`).
fn mark_groups(t: &Timeline, x_of: &impl Fn(u64) -> f64) -> Vec<(f64, String)> {
    let mut groups: Vec<(f64, String, Vec<String>)> = Vec::new();
    for m in &t.marks {
        let x = x_of(m.at_ns);
        let who =
            m.vm.map(|v| t.vm(v).map_or_else(|| format!("vm{v}"), |r| r.name.clone()));
        match groups
            .iter_mut()
            .find(|(gx, text, _)| (gx - x).abs() < 1.0 && *text == m.text)
        {
            Some(g) => g.2.extend(who),
            None => groups.push((x, m.text.clone(), who.into_iter().collect())),
        }
    }
    groups
        .into_iter()
        .map(|(x, text, who)| {
            let label = match who.len() {
                0 => text,
                1 | 2 => format!("{}: {text}", who.join(", ")),
                n => format!("{}, {} +{}: {text}", who[0], who[1], n - 2),
            };
            (x, label)
        })
        .collect()
}

/// Renders `t` as a standalone SVG document.
///
/// Detailed (few, wide spans): one row per HQD slot and one per VM, spans
/// coloured by VM, CWSR save/restore hatched, preemptions marked by red
/// triangles labelled with the preemptor's name, waiting (ready, no slot)
/// as an amber strip under the VM's row.
///
/// Aggregated (spans narrower than a pixel or too many, see
/// [`RenderOptions::aggregate`]): bins of [`BIN_PX`] px; per VM a lane
/// shaded by its GPU time in each bin (idle = blank), an amber strip shaded
/// by its waiting time, a red strip shaded by the preemptions it suffered;
/// slot rows (up to [`AGG_MAX_SLOT_ROWS`]) shaded by occupancy in the
/// colour of the VM that held the slot longest; a row of preemption counts
/// per bin.
///
/// Both: a title, the GPU id and window, a legend naming every VM with its
/// priority and weight, policy/priority/weight changes as purple lines
/// labelled on the picture, a time axis with units, and per VM a summary
/// (GPU time, waiting, preemptions suffered and by whom).
pub fn render_svg(t: &Timeline, o: &RenderOptions) -> String {
    let width = f64::from(o.width.max(700));
    let plot_r = width - SUMMARY_W;
    let plot_w = plot_r - LEFT;
    let (t0, t1) = (t.start_ns, t.end_ns.max(t.start_ns.saturating_add(1)));
    let span_ns = t1 - t0;
    let x_of = |ns: u64| LEFT + (ns.clamp(t0, t1) - t0) as f64 / span_ns as f64 * plot_w;
    let vm_idx = |id: u32| t.vms.iter().position(|v| v.id == id).unwrap_or(t.vms.len());

    let px_ns = span_ns as f64 / plot_w;
    let runs_n = t.spans.iter().filter(|s| s.kind == SpanKind::Run).count();
    let thin = t
        .spans
        .iter()
        .filter(|s| s.kind == SpanKind::Run && ((s.end_ns - s.start_ns) as f64) < px_ns)
        .count();
    let items = t.spans.len() + t.preemptions.len() + t.waits.len();
    let agg = o
        .aggregate
        .unwrap_or(items > DETAIL_MAX_ITEMS || (runs_n > 100 && thin * 4 > runs_n));
    let nbins = ((plot_w / BIN_PX).floor() as usize).max(1);
    let ag = agg.then(|| aggregate(t, nbins));

    let used: BTreeSet<u32> = t
        .spans
        .iter()
        .map(|s| s.slot)
        .chain(t.preemptions.iter().map(|p| p.slot))
        .collect();
    let mut slot_rows: Vec<_> = t
        .slots
        .iter()
        .filter(|s| o.all_slots || used.contains(&s.id))
        .collect();
    let mut hidden_note = None;
    if agg && slot_rows.len() > AGG_MAX_SLOT_ROWS {
        hidden_note = Some(format!(
            "{} HQD slots in use: too many rows to draw; see the VM lanes",
            slot_rows.len()
        ));
        slot_rows.clear();
    } else if t.slots.len() > slot_rows.len() {
        hidden_note = Some(format!(
            "{} idle HQD slot(s) not shown",
            t.slots.len() - slot_rows.len()
        ));
    }
    let vm_rows = agg || o.vm_rows;
    let vm_row_h = if agg { LANE } else { ROW };

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
    let keys: &[(&str, &str)] = if agg {
        &[
            ("shade", "GPU time per bin (blank: idle)"),
            ("wait", "waiting: ready, no slot"),
            ("preempt-strip", "preemptions suffered"),
            ("mark", "policy / priority / weight change"),
        ]
    } else {
        &[
            ("run", "running"),
            ("save", "CWSR save"),
            ("restore", "CWSR restore"),
            ("drain", "dequeue without save"),
            ("wait", "waiting: ready, no slot"),
            ("preempt", "preemption (by whom)"),
            ("mark", "change"),
        ]
    };
    for (k, name) in keys {
        legend.push((k.to_string(), name.to_string()));
    }
    let mut lx = LEFT;
    let mut ly = 66.0;
    let mut placed = Vec::new();
    for (i, (_, text)) in legend.iter().enumerate() {
        let w = 22.0 + 6.6 * text.chars().count() as f64 + 18.0;
        if lx > LEFT && (lx + w > width - 12.0 || i == vm_items) {
            lx = LEFT;
            ly += 18.0;
        }
        placed.push((lx, ly));
        lx += w;
    }
    let mut y = ly + 14.0;
    // ---- change marks band ----
    let mut mark_labels: Vec<(f64, f64, String)> = Vec::new();
    let mut unlabelled = 0usize;
    if !t.marks.is_empty() {
        let mut line_end = [f64::MIN; 3];
        for (x, text) in mark_groups(t, &x_of) {
            let text = short(&text, 44);
            let w = 6.2 * text.chars().count() as f64 + 8.0;
            match line_end.iter().position(|e| *e < x) {
                Some(l) => {
                    line_end[l] = x + w;
                    mark_labels.push((x, y + 12.0 + 13.0 * l as f64, text));
                }
                None => unlabelled += 1,
            }
        }
        y += 13.0 * 3.0 + 6.0;
    }
    let grid_top = y;
    let slots_title_y = y + 10.0;
    let slot_y0 = slots_title_y + 8.0;
    y = slot_y0 + slot_rows.len() as f64 * (ROW + GAP);
    if hidden_note.is_some() {
        y += 14.0;
    }
    let vms_title_y = y + 14.0;
    let vm_y0 = vms_title_y + 8.0;
    if vm_rows {
        y = vm_y0 + t.vms.len() as f64 * (vm_row_h + GAP);
    }
    let hist_y0 = y + 4.0;
    if agg {
        y = hist_y0 + 34.0;
    }
    let axis_y = y + 4.0;
    let height = axis_y + 44.0;

    let mode = if agg {
        format!(
            "aggregated: 1 bin = {} ({} px)",
            fmt_time(span_ns / nbins as u64),
            BIN_PX
        )
    } else {
        "every span drawn".to_string()
    };
    let gpu = t.gpu_id.map_or_else(String::new, |g| format!("GPU {g} · "));
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
<text x="12" y="44" fill="#333333">{sub}</text>
"##,
        w = width,
        h = height,
        title = esc(o.title.as_deref().unwrap_or("hqdmux timeline")),
        sub = esc(&format!(
            "{gpu}{} .. {} {} ({}) · {} VMs · {} spans · {} preemptions · {} changes · {mode}",
            fmt_num(t0 as f64 / unit(span_ns).0),
            fmt_num(t1 as f64 / unit(span_ns).0),
            unit(span_ns).1,
            fmt_time(span_ns),
            t.vms.len(),
            t.spans.len(),
            t.preemptions.len(),
            t.marks.len(),
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
            let sample = match key.as_str() {
                "run" => {
                    format!(r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/>"##)
                }
                "save" | "restore" => format!(
                    r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/><rect x="{x}" y="{sy}" width="14" height="12" fill="url(#hatch-{key})"/>"##
                ),
                "drain" => format!(
                    r##"<rect x="{x}" y="{sy}" width="14" height="12" fill="#9a9a9a"/><rect x="{x}" y="{sy}" width="14" height="12" fill="url(#dots-drain)"/>"##
                ),
                "shade" => format!(
                    r##"<rect x="{x}" y="{sy}" width="5" height="12" fill="#555555" fill-opacity="0.25"/><rect x="{x1}" y="{sy}" width="5" height="12" fill="#555555" fill-opacity="0.6"/><rect x="{x2}" y="{sy}" width="5" height="12" fill="#555555"/>"##,
                    x1 = x + 5.0,
                    x2 = x + 10.0
                ),
                "wait" => format!(
                    r##"<rect x="{x}" y="{y2}" width="14" height="5" fill="{WAIT_FILL}"/>"##,
                    y2 = sy + 7.0
                ),
                "preempt-strip" => format!(
                    r##"<rect x="{x}" y="{sy}" width="14" height="5" fill="{PREEMPT_FILL}"/>"##
                ),
                "mark" => format!(
                    r##"<line x1="{x7}" y1="{sy}" x2="{x7}" y2="{y2}" stroke="{MARK_FILL}" stroke-width="2" stroke-dasharray="3,2"/>"##,
                    x7 = x + 7.0,
                    y2 = sy + 12.0
                ),
                _ => triangle(x + 7.0, sy + 2.0, "preemption"),
            };
            let _ = writeln!(b, "{sample}");
        }
        let _ = writeln!(b, r#"<text x="{}" y="{ly}">{}</text>"#, x + 20.0, esc(text));
    }
    let _ = writeln!(b, "</g>");

    // ---- grid and axis ----
    let step = tick_step(span_ns, 10);
    let (div, uname) = unit(step);
    let _ = writeln!(b, r#"<g class="axis">"#);
    let mut tick = t0.div_ceil(step).saturating_mul(step);
    while tick <= t1 {
        let x = x_of(tick);
        let _ = writeln!(
            b,
            r##"<line x1="{x:.2}" y1="{grid_top}" x2="{x:.2}" y2="{axis_y}" stroke="#dddddd"/><line x1="{x:.2}" y1="{axis_y}" x2="{x:.2}" y2="{ty}" stroke="#333333"/><text x="{x:.2}" y="{ly}" text-anchor="middle">{v}</text>"##,
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
        r##"<line x1="{LEFT}" y1="{axis_y}" x2="{plot_r}" y2="{axis_y}" stroke="#333333"/><text x="{cx}" y="{uy}" text-anchor="middle">time ({uname})</text>"##,
        cx = LEFT + plot_w / 2.0,
        uy = axis_y + 36.0,
    );
    let _ = writeln!(b, "</g>");

    // ---- slot rows ----
    if !slot_rows.is_empty() || hidden_note.is_some() {
        let _ = writeln!(
            b,
            r#"<text x="12" y="{slots_title_y}" font-weight="bold">HQD slots</text>"#
        );
    }
    let _ = writeln!(b, r#"<g class="slots">"#);
    for (r, slot) in slot_rows.iter().enumerate() {
        let ry = slot_y0 + r as f64 * (ROW + GAP);
        row_background(&mut b, r, ry, ROW, plot_w, &slot.label);
        if let Some(ag) = &ag {
            draw_slot_bins(&mut b, t, ag, slot.id, ry, &x_of, &vm_idx);
            continue;
        }
        let spans = t.spans.iter().filter(|s| s.slot == slot.id);
        draw_spans(&mut b, t, spans, ry, &x_of, &vm_idx, 1.0);
        let mut label_end = f64::MIN;
        for p in t.preemptions.iter().filter(|p| p.slot == slot.id) {
            let x = x_of(p.at_ns);
            let victim = t.vm(p.vm).map_or("?", |v| v.name.as_str());
            let by = p.by_vm.and_then(|v| t.vm(v));
            let tip = match by {
                Some(by) => format!("{victim} preempted by {} at {}", by.name, fmt_time(p.at_ns)),
                None => format!("{victim} preempted at {}", fmt_time(p.at_ns)),
            };
            let _ = writeln!(
                b,
                r##"<line x1="{x:.2}" y1="{ry}" x2="{x:.2}" y2="{y2}" stroke="{PREEMPT_FILL}" stroke-width="1.2"/>{}"##,
                triangle(x, ry - 3.0, &tip),
                y2 = ry + ROW,
            );
            // The preemptor named on the picture when there is room.
            if let Some(by) = by {
                let text = format!("by {}", short(&by.name, 14));
                if x + 3.0 > label_end && x + 60.0 < plot_r {
                    let _ = writeln!(
                        b,
                        r##"<text x="{lx:.2}" y="{ty}" font-size="10" fill="{PREEMPT_FILL}" stroke="#ffffff" stroke-width="2.5" paint-order="stroke">{}</text>"##,
                        esc(&text),
                        lx = x + 3.0,
                        ty = ry + ROW - 5.0,
                    );
                    label_end = x + 3.0 + 6.0 * text.chars().count() as f64 + 6.0;
                }
            }
        }
    }
    if let Some(note) = &hidden_note {
        let _ = writeln!(
            b,
            r##"<text x="12" y="{}" fill="#666666" font-style="italic">{}</text>"##,
            slot_y0 + slot_rows.len() as f64 * (ROW + GAP) + 10.0,
            esc(note)
        );
    }
    let _ = writeln!(b, "</g>");

    // ---- VM rows ----
    let sums = summaries(t);
    if vm_rows {
        let _ = writeln!(
            b,
            r#"<text x="12" y="{vms_title_y}" font-weight="bold">VMs (all their slots)</text><text x="{sx}" y="{vms_title_y}" font-weight="bold">over the window</text>"#,
            sx = plot_r + 10.0,
        );
        let _ = writeln!(b, r#"<g class="vms">"#);
        let max_p = ag.as_ref().map_or(0, |ag| {
            ag.preempted
                .values()
                .flat_map(|v| v.iter())
                .copied()
                .max()
                .unwrap_or(0)
        });
        for (r, v) in t.vms.iter().enumerate() {
            let ry = vm_y0 + r as f64 * (vm_row_h + GAP);
            row_background(&mut b, r, ry, vm_row_h, plot_w, &v.name);
            if let Some(ag) = &ag {
                draw_vm_lane(&mut b, ag, v.id, &vm_colour(r), ry, max_p, &x_of);
            } else {
                let spans = t.spans.iter().filter(|s| s.vm == v.id);
                draw_spans(&mut b, t, spans, ry, &x_of, &vm_idx, 0.55);
                for w in t.waits.iter().filter(|w| w.vm == v.id) {
                    let x = x_of(w.start_ns);
                    let ww = (x_of(w.end_ns) - x).max(0.6);
                    let _ = writeln!(
                        b,
                        r#"<rect x="{x:.2}" y="{wy}" width="{ww:.2}" height="{LANE_W}" fill="{WAIT_FILL}"><title>{} waiting {}</title></rect>"#,
                        esc(&v.name),
                        fmt_time(w.end_ns - w.start_ns),
                        wy = ry + ROW - LANE_W,
                    );
                }
                for p in t.preemptions.iter().filter(|p| p.vm == v.id) {
                    let x = x_of(p.at_ns);
                    let _ = writeln!(
                        b,
                        r##"<line x1="{x:.2}" y1="{ry}" x2="{x:.2}" y2="{y2}" stroke="{PREEMPT_FILL}" stroke-width="1.2"/>"##,
                        y2 = ry + ROW,
                    );
                }
            }
            for m in t.marks.iter().filter(|m| m.vm == Some(v.id)) {
                let x = x_of(m.at_ns);
                let _ = writeln!(
                    b,
                    r##"<path d="M{x:.2} {a:.1}l4 4l-4 4l-4 -4z" fill="{MARK_FILL}"><title>{}</title></path>"##,
                    esc(&m.text),
                    a = ry + vm_row_h / 2.0 - 4.0,
                );
            }
            if let Some(s) = sums.get(&v.id) {
                let (head, by) = summary_text(t, s, span_ns);
                let sx = plot_r + 10.0;
                if by.is_empty() || vm_row_h < LANE {
                    let _ = writeln!(
                        b,
                        r##"<text x="{sx}" y="{ty}" font-size="10.5" fill="#222222">{}{}{}</text>"##,
                        esc(&head),
                        if by.is_empty() { "" } else { " " },
                        esc(&by),
                        ty = ry + vm_row_h / 2.0 + 4.0,
                    );
                } else {
                    let _ = writeln!(
                        b,
                        r##"<text x="{sx}" y="{y1}" font-size="10.5" fill="#222222">{}</text><text x="{sx}" y="{y2}" font-size="10.5" fill="{PREEMPT_FILL}">{}</text>"##,
                        esc(&head),
                        esc(&by),
                        y1 = ry + 10.0,
                        y2 = ry + 21.0,
                    );
                }
            }
        }
        let _ = writeln!(b, "</g>");
    }

    // ---- preemptions per bin ----
    if let Some(ag) = &ag {
        let mut total = vec![0u64; ag.busy.n];
        for v in ag.preempted.values() {
            for (i, c) in v.iter().enumerate() {
                total[i] += u64::from(*c);
            }
        }
        let max = total.iter().copied().max().unwrap_or(0);
        let h = 28.0;
        let _ = writeln!(
            b,
            r##"<rect x="{LEFT}" y="{hist_y0}" width="{plot_w:.2}" height="{h}" fill="#f4f4f4"/><text x="{lx}" y="{ty}" text-anchor="end">preemptions/bin</text><text x="{sx}" y="{ty}" font-size="11">max {max} in a bin, {} in all</text>"##,
            total.iter().sum::<u64>(),
            lx = LEFT - 8.0,
            ty = hist_y0 + h - 8.0,
            sx = plot_r + 10.0,
        );
        let mut d = String::new();
        for (i, c) in total.iter().enumerate() {
            if *c == 0 {
                continue;
            }
            let (bs, be) = ag.busy.bounds(i);
            let x = x_of(bs);
            let w = (x_of(be) - x).max(0.5);
            let bh = (h * *c as f64 / max.max(1) as f64).max(1.0);
            let _ = write!(
                d,
                "M{x:.1} {:.1}h{w:.1}v{bh:.1}h{:.1}z",
                hist_y0 + h - bh,
                -w
            );
        }
        if !d.is_empty() {
            let _ = writeln!(b, r#"<path d="{d}" fill="{PREEMPT_FILL}"/>"#);
        }
    }

    // ---- change marks ----
    if !t.marks.is_empty() {
        let _ = writeln!(b, r#"<g class="marks">"#);
        for m in &t.marks {
            let x = x_of(m.at_ns);
            let _ = writeln!(
                b,
                r#"<line x1="{x:.2}" y1="{grid_top}" x2="{x:.2}" y2="{axis_y}" stroke="{MARK_FILL}" stroke-width="1.5" stroke-dasharray="4,3"/>"#
            );
        }
        for (x, ly, text) in &mark_labels {
            let _ = writeln!(
                b,
                r##"<text x="{:.2}" y="{ly}" font-size="11" fill="{MARK_FILL}">{}</text>"##,
                x + 3.0,
                esc(text)
            );
        }
        if unlabelled > 0 {
            let _ = writeln!(
                b,
                r##"<text x="{}" y="{}" font-size="11" fill="{MARK_FILL}">+{unlabelled} more changes (not labelled)</text>"##,
                plot_r + 10.0,
                grid_top - 8.0
            );
        }
        let _ = writeln!(b, "</g>");
    }
    b.push_str("</svg>\n");
    b
}

/// One slot row of the aggregated picture: per bin, the occupancy (all
/// VMs) shaded in the colour of the VM that held the slot longest.
fn draw_slot_bins(
    b: &mut String,
    t: &Timeline,
    ag: &Aggregate,
    slot: u32,
    ry: f64,
    x_of: &impl Fn(u64) -> f64,
    vm_idx: &impl Fn(u32) -> usize,
) {
    let Some(bins) = ag.slot_vm.get(&slot) else {
        return;
    };
    let mut sh = Shades::default();
    let vms: Vec<u32> = t.vms.iter().map(|v| v.id).collect();
    let mut prev: Option<(String, u64, f64)> = None;
    let flush = |sh: &mut Shades, p: &Option<(String, u64, f64)>, x_end: f64| {
        if let Some((c, l, x0)) = p {
            sh.rect(c, *l, *x0, ry, x_end - x0, ROW);
        }
    };
    for i in 0..bins.n {
        let (bs, be) = bins.bounds(i);
        let mut sum = 0u64;
        let mut top: Option<(u32, u64)> = None;
        for v in &vms {
            let ns = bins.lane(*v).get(i).copied().unwrap_or(0);
            sum += ns;
            if ns > 0 && top.is_none_or(|(_, m)| ns > m) {
                top = Some((*v, ns));
            }
        }
        let cur = top.map(|(v, _)| (vm_colour(vm_idx(v)), level(sum, be - bs)));
        let x = x_of(bs);
        let same = match (&prev, &cur) {
            (Some((pc, pl, _)), Some((c, l))) => pc == c && pl == l,
            _ => false,
        };
        if !same {
            flush(&mut sh, &prev, x);
            prev = cur.map(|(c, l)| (c, l, x));
        }
    }
    flush(&mut sh, &prev, x_of(bins.end_ns));
    sh.write(b);
}

/// One VM lane of the aggregated picture (see [`render_svg`]).
fn draw_vm_lane(
    b: &mut String,
    ag: &Aggregate,
    vm: u32,
    colour: &str,
    ry: f64,
    max_p: u32,
    x_of: &impl Fn(u64) -> f64,
) {
    let bins = &ag.busy;
    let width = |i: usize| {
        let (bs, be) = bins.bounds(i);
        be - bs
    };
    let mut sh = Shades::default();
    let strips: [(&[u64], &str, f64, f64); 2] = [
        (ag.busy.lane(vm), colour, ry + LANE_P, LANE_RUN),
        (
            ag.waiting.lane(vm),
            WAIT_FILL,
            ry + LANE_P + LANE_RUN,
            LANE_W,
        ),
    ];
    for (vals, fill, y, h) in strips {
        let levels: Vec<u64> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| level(*v, width(i)))
            .collect();
        for (i0, n, l) in runs(&levels) {
            let x0 = x_of(bins.bounds(i0).0);
            let x1 = x_of(bins.bounds(i0 + n - 1).1);
            sh.rect(fill, l, x0, y, (x1 - x0).max(0.5), h);
        }
    }
    if let Some(p) = ag.preempted.get(&vm) {
        let levels: Vec<u64> = p
            .iter()
            .map(|c| level(u64::from(*c), u64::from(max_p)))
            .collect();
        for (i0, n, l) in runs(&levels) {
            let x0 = x_of(bins.bounds(i0).0);
            let x1 = x_of(bins.bounds(i0 + n - 1).1);
            sh.rect(PREEMPT_FILL, l, x0, ry, (x1 - x0).max(0.5), LANE_P);
        }
    }
    sh.write(b);
}

fn triangle(x: f64, top: f64, tip: &str) -> String {
    format!(
        r##"<path d="M {:.2} {:.2} L {:.2} {:.2} L {:.2} {:.2} Z" fill="{PREEMPT_FILL}"><title>{}</title></path>"##,
        x - 5.0,
        top - 6.0,
        x + 5.0,
        top - 6.0,
        x,
        top + 3.0,
        esc(tip)
    )
}

fn row_background(b: &mut String, r: usize, ry: f64, h: f64, plot_w: f64, label: &str) {
    let fill = if r.is_multiple_of(2) {
        "#f4f4f4"
    } else {
        "#fbfbfb"
    };
    let _ = writeln!(
        b,
        r#"<rect x="{LEFT}" y="{ry}" width="{plot_w:.2}" height="{h}" fill="{fill}"/><text x="{lx}" y="{ty}" text-anchor="end">{}</text>"#,
        esc(&short(label, 24)),
        lx = LEFT - 8.0,
        ty = ry + h / 2.0 + 4.0,
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
        // The preemptor is named on the picture, not only in a tooltip.
        assert!(texts.contains(&"by inference"));
        assert!(texts.iter().any(|x| x.contains("preempted 1")));
        assert!(texts
            .iter()
            .any(|x| x.contains("preempted 1 by inference 1")));
        assert!(texts.iter().any(|x| x.contains("every span drawn")));
    }

    /// Labels every reader needs: the GPU, every VM, the preemptors, the
    /// changes, the waiting key and the bin size.
    fn texts_of(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(str::to_string))
            .collect()
    }

    /// A random but valid timeline: per slot, back-to-back spans of random
    /// VMs; preemptions by random VMs; waits per VM; a few changes.
    fn random_timeline(seed: u64, vms: u32, slots: u32, per_slot: u32, end_ns: u64) -> Timeline {
        let mut x = seed | 1;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        let mut t = Timeline {
            gpu_id: Some(3),
            start_ns: 0,
            end_ns,
            vms: (0..vms)
                .map(|i| VmRow {
                    id: i,
                    name: format!("tenant-{i}"),
                    priority: (i % 16) as u8,
                    weight: 1 + i % 4,
                })
                .collect(),
            slots: (0..slots)
                .map(|i| SlotRow {
                    id: i,
                    label: format!("P0 pipe{} q{}", i / 8, i % 8),
                    partition: 0,
                })
                .collect(),
            ..Default::default()
        };
        let step = (end_ns / u64::from(per_slot.max(1))).max(1);
        for slot in 0..slots {
            let mut at = 0;
            for q in 0..per_slot {
                let start = at + rnd(step / 4 + 1);
                let end = (start + rnd(step) + 1).min(end_ns);
                if start >= end {
                    break;
                }
                let vm = rnd(u64::from(vms)) as u32;
                t.spans.push(Span {
                    slot,
                    vm,
                    queue: u64::from(q),
                    kind: [
                        SpanKind::Run,
                        SpanKind::Save,
                        SpanKind::Restore,
                        SpanKind::Drain,
                    ][rnd(4) as usize],
                    start_ns: start,
                    end_ns: end,
                });
                if rnd(3) == 0 {
                    t.preemptions.push(Preemption {
                        at_ns: end,
                        slot,
                        vm,
                        by_vm: Some(rnd(u64::from(vms)) as u32).filter(|b| *b != vm),
                    });
                }
                at = end;
            }
        }
        for vm in 0..vms {
            let mut at = 0;
            for _ in 0..per_slot / 2 {
                let start = at + rnd(step * 2 + 1);
                let end = (start + rnd(step) + 1).min(end_ns);
                if start >= end {
                    break;
                }
                t.waits.push(crate::Wait {
                    vm,
                    start_ns: start,
                    end_ns: end,
                });
                at = end;
            }
        }
        t.preemptions.sort_by_key(|p| p.at_ns);
        for k in 0..5 {
            t.marks.push(crate::Mark {
                at_ns: end_ns / 6 * (k + 1),
                vm: (k % 2 == 1).then_some(k as u32 % vms.max(1)),
                text: if k % 2 == 1 {
                    "priority 3 -> 12".into()
                } else {
                    "policy fifo".into()
                },
            });
        }
        t
    }

    #[test]
    fn a_minute_of_sixteen_vms_is_aggregated_readable_and_small() {
        // 60 s, 16 VMs, 16 slots, ~3000 spans per slot (48,000 spans).
        let t = random_timeline(7, 16, 16, 3000, 60_000_000_000);
        t.check().unwrap();
        let svg = render_svg(
            &t,
            &RenderOptions {
                width: 1600,
                ..Default::default()
            },
        );
        assert!(svg.len() < 1_000_000, "{} bytes", svg.len());
        let texts = texts_of(&svg);
        assert!(texts.iter().any(|x| x.contains("GPU 3 ·")));
        assert!(texts.iter().any(|x| x.contains("aggregated: 1 bin =")));
        for v in &t.vms {
            assert!(texts.iter().any(|x| x.starts_with(&v.name)), "{}", v.name);
        }
        // Preemptors named in the summary column.
        assert!(texts.iter().any(|x| x.starts_with("by tenant-")));
        // Changes labelled; waiting explained.
        assert!(texts.iter().any(|x| x == "policy fifo"));
        assert!(texts.iter().any(|x| x.contains(": priority 3 -> 12")));
        assert!(texts.iter().any(|x| x.contains("waiting: ready, no slot")));
        assert!(texts.iter().any(|x| x == "preemptions/bin"));
    }

    #[test]
    fn aggregation_is_chosen_by_span_width_and_can_be_forced() {
        let few = sample();
        assert!(!render_svg(&few, &RenderOptions::default()).contains("aggregated:"));
        let forced = render_svg(
            &few,
            &RenderOptions {
                aggregate: Some(true),
                ..Default::default()
            },
        );
        roxmltree::Document::parse(&forced).unwrap();
        assert!(forced.contains("aggregated:"));
        // 200 sub-pixel runs on one slot: aggregated although few.
        let mut t = random_timeline(1, 2, 1, 0, 1_000_000_000);
        for i in 0..200u64 {
            t.spans.push(Span {
                slot: 0,
                vm: (i % 2) as u32,
                queue: i,
                kind: SpanKind::Run,
                start_ns: i * 1_000_000,
                end_ns: i * 1_000_000 + 1_000,
            });
        }
        t.check().unwrap();
        assert!(render_svg(&t, &RenderOptions::default()).contains("aggregated:"));
    }

    #[test]
    fn bins_partition_the_window() {
        let b = Bins::new(10, 110, 7);
        let mut at = 10;
        for i in 0..7 {
            let (s, e) = b.bounds(i);
            assert_eq!(s, at);
            assert!(e >= s);
            at = e;
            for ns in s..e {
                assert_eq!(b.index(ns), i);
            }
        }
        assert_eq!(at, 110);
        // More bins than nanoseconds: still a partition.
        let mut b = Bins::new(0, 3, 10);
        b.add(0, 0, 3);
        assert_eq!(b.lane(0).iter().sum::<u64>(), 3);
        assert!(b.lane(9).is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Aggregation conserves busy and waiting time per VM lane.
        #[test]
        fn aggregation_conserves_time_per_lane(
            seed in 1u64..u64::MAX,
            vms in 1u32..20,
            slots in 1u32..12,
            per_slot in 0u32..300,
            end in 1u64..100_000_000_000,
            n in 1usize..700,
        ) {
            let t = random_timeline(seed, vms, slots, per_slot, end);
            proptest::prop_assert_eq!(t.check(), Ok(()));
            let ag = aggregate(&t, n);
            for v in &t.vms {
                let want: u64 = t.spans.iter().filter(|s| s.vm == v.id).map(|s| s.end_ns - s.start_ns).sum();
                proptest::prop_assert_eq!(ag.busy.lane(v.id).iter().sum::<u64>(), want);
                let want: u64 = t.waits.iter().filter(|w| w.vm == v.id).map(|w| w.end_ns - w.start_ns).sum();
                proptest::prop_assert_eq!(ag.waiting.lane(v.id).iter().sum::<u64>(), want);
                let want = t.preemptions.iter().filter(|p| p.vm == v.id).count() as u64;
                let got: u64 = ag.preempted.get(&v.id).map_or(0, |c| c.iter().map(|x| u64::from(*x)).sum());
                proptest::prop_assert_eq!(got, want);
            }
            for s in &t.slots {
                let want: u64 = t.spans.iter().filter(|x| x.slot == s.id).map(|x| x.end_ns - x.start_ns).sum();
                let got: u64 = ag.slot_vm.get(&s.id).map_or(0, |b| t.vms.iter().map(|v| b.lane(v.id).iter().sum::<u64>()).sum());
                proptest::prop_assert_eq!(got, want);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

        /// Up to 16 VMs and 32 slots, any number of spans, any window, any
        /// width up to 1600 px: the picture is well-formed and under 1 MB.
        #[test]
        fn size_is_bounded_whatever_the_spans(
            seed in 1u64..u64::MAX,
            vms in 1u32..=16,
            slots in 1u32..=32,
            per_slot in 0u32..2500,
            end in 1u64..200_000_000_000,
            width in 0u32..=1600,
            all_slots in proptest::bool::ANY,
        ) {
            let t = random_timeline(seed, vms, slots, per_slot, end);
            let svg = render_svg(&t, &RenderOptions { width, all_slots, ..Default::default() });
            proptest::prop_assert!(svg.len() < 1_000_000, "{} bytes", svg.len());
            proptest::prop_assert!(roxmltree::Document::parse(&svg).is_ok());
        }
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
                aggregate: None,
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
