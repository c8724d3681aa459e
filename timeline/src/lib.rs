//! Timelines of a shared GPU: which VM's queue held which HQD slot when,
//! while running, being saved (CWSR) or restored, and where preemptions
//! happened.
//!
//! * [`Timeline`]: the data model (serde JSON for the live API route);
//! * [`Recorder`]: a sans-IO, bounded builder fed with "queue mapped",
//!   "dequeue finished", "restore finished", "preempted" at model times;
//!   both eval's virtual-time driver and the GPU arbiter feed one (through
//!   `mdev::telemetry`);
//! * [`render_svg`]: a Gantt chart per HQD slot and per VM, coloured by VM.
//!
//! Times are nanoseconds of the recorder's clock (virtual time in `hqdmux
//! sim`, time since the arbiter started for a live fleet).

mod recorder;
mod svg;

pub use recorder::{Recorder, RingLimits};
pub use svg::{aggregate, Aggregate, Bins, DETAIL_MAX_ITEMS};
pub use svg::{render_svg, RenderOptions};

use serde::{Deserialize, Serialize};

/// A VM of a timeline (one legend entry and one per-VM row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRow {
    /// VM id (the `vm` of spans and preemptions).
    pub id: u32,
    /// Name shown in the legend.
    pub name: String,
    /// Priority (0..=15, higher wins) when the timeline was taken.
    pub priority: u8,
    /// Weight when the timeline was taken.
    pub weight: u32,
}

/// An HQD slot of a timeline (one Gantt row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRow {
    /// Slot index (the `slot` of spans and preemptions).
    pub id: u32,
    /// Row label, e.g. `P0 pipe1 q2`.
    pub label: String,
    /// GPU partition the slot belongs to.
    pub partition: u32,
}

/// What a queue was doing on its slot during a [`Span`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// Mapped: the queue holds the slot and its packets are dispatched.
    Run,
    /// CWSR save: a dequeue that saves the queue's waves is in progress.
    Save,
    /// CWSR restore: the queue was mapped with saved waves being restored.
    Restore,
    /// A dequeue without a CWSR save (drain or reset) is in progress.
    Drain,
}

impl SpanKind {
    /// Name used in JSON, legends and tooltips.
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Run => "run",
            SpanKind::Save => "cwsr save",
            SpanKind::Restore => "cwsr restore",
            SpanKind::Drain => "drain",
        }
    }
}

/// One queue of one VM on one HQD slot for `[start_ns, end_ns)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Slot id.
    pub slot: u32,
    /// VM id.
    pub vm: u32,
    /// Queue id (unique in the recorder).
    pub queue: u64,
    /// What it was doing.
    pub kind: SpanKind,
    /// Start (ns).
    pub start_ns: u64,
    /// End (ns), `>= start_ns`.
    pub end_ns: u64,
}

/// A dequeue that interrupted work (CWSR save or reset) on a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// When the dequeue was requested (ns).
    pub at_ns: u64,
    /// Slot id.
    pub slot: u32,
    /// The preempted VM.
    pub vm: u32,
    /// The VM whose queue took the slot next (if another VM's, and known).
    pub by_vm: Option<u32>,
}

/// A VM that had work ready but no queue on the GPU for `[start_ns, end_ns)`
/// (waiting for a slot, as opposed to idle: nothing to run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// VM id.
    pub vm: u32,
    /// Start (ns).
    pub start_ns: u64,
    /// End (ns), `>= start_ns`.
    pub end_ns: u64,
}

/// An operator change during the window: the policy (`vm: None`) or a VM's
/// priority or weight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// When it took effect (ns; when the recorder first saw it).
    pub at_ns: u64,
    /// The VM changed (none: the whole GPU, e.g. the policy).
    pub vm: Option<u32>,
    /// What changed, e.g. `policy fifo` or `priority 3 -> 12`.
    pub text: String,
}

/// A window of GPU sharing history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// The physical GPU the slots belong to (a fleet can have several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<u32>,
    /// Window start (ns).
    pub start_ns: u64,
    /// Window end (ns).
    pub end_ns: u64,
    /// VMs, by id.
    pub vms: Vec<VmRow>,
    /// HQD slots, by id.
    pub slots: Vec<SlotRow>,
    /// Spans, in start order per slot.
    pub spans: Vec<Span>,
    /// Preemptions, in time order.
    pub preemptions: Vec<Preemption>,
    /// Times VMs waited ready for a slot, in start order per VM.
    #[serde(default)]
    pub waits: Vec<Wait>,
    /// Policy, priority and weight changes, in time order.
    #[serde(default)]
    pub marks: Vec<Mark>,
}

/// A timeline that breaks the model's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimelineError {
    /// A span ends before it starts or lies outside the window.
    #[error("span {0:?} is inverted or outside [{1}, {2}]")]
    SpanOutside(Span, u64, u64),
    /// Two spans overlap on one slot.
    #[error("spans {0:?} and {1:?} overlap on slot {2}")]
    Overlap(Span, Span, u32),
    /// A wait ends before it starts or lies outside the window.
    #[error("wait {0:?} is inverted or outside [{1}, {2}]")]
    WaitOutside(Wait, u64, u64),
    /// A span or preemption names a slot that is not in `slots`.
    #[error("unknown slot {0}")]
    UnknownSlot(u32),
    /// A span or preemption names a VM that is not in `vms`.
    #[error("unknown vm {0}")]
    UnknownVm(u32),
    /// JSON could not be parsed.
    #[error("timeline JSON: {0}")]
    Json(String),
}

impl Timeline {
    /// The VM row of `id`.
    pub fn vm(&self, id: u32) -> Option<&VmRow> {
        self.vms.iter().find(|v| v.id == id)
    }

    /// Checks the model's rules: spans inside the window and not inverted,
    /// no two spans overlapping on one slot, every slot and VM named known.
    pub fn check(&self) -> Result<(), TimelineError> {
        let known_slot = |s: u32| self.slots.iter().any(|r| r.id == s);
        let known_vm = |v: u32| self.vms.iter().any(|r| r.id == v);
        let mut by_slot: std::collections::BTreeMap<u32, Vec<Span>> = Default::default();
        for s in &self.spans {
            if s.start_ns > s.end_ns || s.start_ns < self.start_ns || s.end_ns > self.end_ns {
                return Err(TimelineError::SpanOutside(*s, self.start_ns, self.end_ns));
            }
            if !known_slot(s.slot) {
                return Err(TimelineError::UnknownSlot(s.slot));
            }
            if !known_vm(s.vm) {
                return Err(TimelineError::UnknownVm(s.vm));
            }
            by_slot.entry(s.slot).or_default().push(*s);
        }
        for (slot, mut v) in by_slot {
            v.sort_by_key(|s| (s.start_ns, s.end_ns));
            for w in v.windows(2) {
                if w[1].start_ns < w[0].end_ns {
                    return Err(TimelineError::Overlap(w[0], w[1], slot));
                }
            }
        }
        for w in &self.waits {
            if w.start_ns > w.end_ns || w.start_ns < self.start_ns || w.end_ns > self.end_ns {
                return Err(TimelineError::WaitOutside(*w, self.start_ns, self.end_ns));
            }
            if !known_vm(w.vm) {
                return Err(TimelineError::UnknownVm(w.vm));
            }
        }
        for m in &self.marks {
            if let Some(v) = m.vm.filter(|v| !known_vm(*v)) {
                return Err(TimelineError::UnknownVm(v));
            }
        }
        for p in &self.preemptions {
            if !known_slot(p.slot) {
                return Err(TimelineError::UnknownSlot(p.slot));
            }
            for v in std::iter::once(p.vm).chain(p.by_vm) {
                if !known_vm(v) {
                    return Err(TimelineError::UnknownVm(v));
                }
            }
        }
        Ok(())
    }

    /// The timeline as JSON (the live API's `application/json` body).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a timeline always serialises")
    }

    /// Parses [`Timeline::to_json`] output (e.g. the live API's answer) and
    /// checks it.
    pub fn from_json(s: &str) -> Result<Self, TimelineError> {
        let t: Timeline =
            serde_json::from_str(s).map_err(|e| TimelineError::Json(e.to_string()))?;
        t.check()?;
        Ok(t)
    }

    /// The part of the timeline in `[from_ns, to_ns]` (clamped to the
    /// window), spans clipped to it.
    pub fn clip(&self, from_ns: u64, to_ns: u64) -> Timeline {
        let from = from_ns.clamp(self.start_ns, self.end_ns);
        let to = to_ns.clamp(from, self.end_ns);
        Timeline {
            gpu_id: self.gpu_id,
            start_ns: from,
            end_ns: to,
            vms: self.vms.clone(),
            slots: self.slots.clone(),
            spans: self
                .spans
                .iter()
                .filter(|s| s.end_ns > from && s.start_ns < to)
                .map(|s| Span {
                    start_ns: s.start_ns.max(from),
                    end_ns: s.end_ns.min(to),
                    ..*s
                })
                .collect(),
            preemptions: self
                .preemptions
                .iter()
                .filter(|p| p.at_ns >= from && p.at_ns <= to)
                .copied()
                .collect(),
            waits: self
                .waits
                .iter()
                .filter(|w| w.end_ns > from && w.start_ns < to)
                .map(|w| Wait {
                    start_ns: w.start_ns.max(from),
                    end_ns: w.end_ns.min(to),
                    ..*w
                })
                .collect(),
            marks: self
                .marks
                .iter()
                .filter(|m| m.at_ns >= from && m.at_ns <= to)
                .cloned()
                .collect(),
        }
    }

    /// GPU time (ns) each VM held slots in `kind` spans, by VM id.
    pub fn held_ns(&self, kind: SpanKind) -> std::collections::BTreeMap<u32, u64> {
        let mut m = std::collections::BTreeMap::new();
        for s in self.spans.iter().filter(|s| s.kind == kind) {
            *m.entry(s.vm).or_insert(0) += s.end_ns - s.start_ns;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Timeline {
        Timeline {
            start_ns: 0,
            end_ns: 100,
            vms: vec![VmRow {
                id: 0,
                name: "a".into(),
                priority: 1,
                weight: 1,
            }],
            slots: vec![SlotRow {
                id: 0,
                label: "P0 pipe0 q0".into(),
                partition: 0,
            }],
            spans: vec![Span {
                slot: 0,
                vm: 0,
                queue: 1,
                kind: SpanKind::Run,
                start_ns: 10,
                end_ns: 50,
            }],
            preemptions: vec![],
            ..Default::default()
        }
    }

    #[test]
    fn check_finds_overlap_and_unknown_ids() {
        let mut t = small();
        assert_eq!(t.check(), Ok(()));
        t.spans.push(Span {
            start_ns: 40,
            end_ns: 60,
            ..t.spans[0]
        });
        assert!(matches!(t.check(), Err(TimelineError::Overlap(..))));
        let mut t = small();
        t.spans[0].vm = 7;
        assert_eq!(t.check(), Err(TimelineError::UnknownVm(7)));
        let mut t = small();
        t.spans[0].end_ns = 101;
        assert!(matches!(t.check(), Err(TimelineError::SpanOutside(..))));
    }

    #[test]
    fn clip_keeps_the_rules() {
        let t = small();
        let c = t.clip(20, 30);
        assert_eq!((c.start_ns, c.end_ns), (20, 30));
        assert_eq!((c.spans[0].start_ns, c.spans[0].end_ns), (20, 30));
        c.check().unwrap();
        assert!(t.clip(60, 1000).spans.is_empty());
        assert_eq!(t.clip(500, 5).end_ns, 100);
    }

    #[test]
    fn json_round_trips() {
        let t = small();
        let j = t.to_json();
        assert!(j.contains("\"kind\":\"run\""));
        assert_eq!(Timeline::from_json(&j), Ok(t));
        assert!(matches!(
            Timeline::from_json("{"),
            Err(TimelineError::Json(_))
        ));
    }
}
