//! The timer table (docs/scheduling.md, "The timer"): every deadline the
//! engine waits for, by kind; the single timer is armed at the earliest
//! one strictly in the future.

use super::*;

/// What the engine's single timer is armed for (the timer table,
/// [`Scheduler::deadlines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TimerKind {
    /// An idle mapped queue gives its slot back (`idle_unmap_ns`).
    IdleUnmap,
    /// Aging: the running batch ends or the next one is due.
    Aging,
    /// The slice owner's anticipation grace ends.
    Grace,
    /// The slice owner's quantum ends while equals wait.
    SliceEnd,
    /// A woken equal becomes eligible against the owner (lag).
    LagWake,
    /// A lower queue's minimum run ends (shared modes).
    MinRun,
    /// fifo's round-robin slice ends.
    FifoSlice,
    /// poll5ms's poll.
    Poll,
    /// A CU reservation's hold across its owner's idle gap ends.
    CuHold,
    /// A co-residence ends: its owner stayed demanding past one doubled
    /// job (`Scheduler::coreside_backlogged`).
    CoresideEnd,
    /// A drained reservation's lower workgroups must have ended
    /// (`engine/drain_due.rs`).
    DrainDue,
}

/// One entry of the timer table.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    /// What it is for (read by tests and debugging).
    #[allow(dead_code)]
    pub(super) kind: TimerKind,
    /// Partition it belongs to (`None`: any).
    pub(super) part: Option<usize>,
    /// When.
    pub(super) at: Nanos,
}

impl Scheduler {
    /// The timer table: every deadline the engine waits for, by kind and
    /// partition (`None`: not tied to one). Candidates may be at or before
    /// `now` (a deadline of a partition this event did not decide);
    /// [`Self::arm_timer`] handles those at once.
    pub(super) fn deadlines(&self, out: &mut Vec<Deadline>) {
        out.clear();
        let now = self.now;
        let prio = self.ops().by_priority;
        let mut any_busy = false;
        for (pi, p) in self.parts.iter().enumerate() {
            let mut add = |kind, at| {
                out.push(Deadline {
                    kind,
                    part: Some(pi),
                    at,
                })
            };
            if let Some(&(since, _)) = p.idle_mapped.first() {
                add(TimerKind::IdleUnmap, since + self.cfg.idle_unmap_ns);
            }
            if prio {
                if let Some(t) = self.aging_due(pi, p) {
                    add(TimerKind::Aging, t);
                }
            }
            if let Some(t) = self.wide_deadline(pi) {
                if t > now {
                    add(TimerKind::CoresideEnd, t);
                }
            }
            if let Some(t) = self.drain_deadline(pi) {
                add(TimerKind::DrainDue, t);
            }
            if let Some(t) = self.coreside_deadline(pi) {
                if t > now {
                    add(TimerKind::CoresideEnd, t);
                }
            }
            let Some(top) = p.top() else { continue };
            any_busy = true;
            let decision = self.ops().decision;
            match decision {
                Decision::Priority | Decision::Timeslice
                    if self.slices() || decision == Decision::Timeslice =>
                {
                    if let Some(o) = p.owner {
                        if let Some(d) = o.drained {
                            let hold = self.grace(o.vm).max(self.cost_hold(pi, &o));
                            let until = d.saturating_add(hold);
                            if until > now {
                                add(TimerKind::Grace, until);
                            }
                        }
                        // The quantum only ends a slice the owner is using
                        // at the top level with equals waiting: an owner
                        // in its grace (not busy at `top`) is ended by the
                        // grace deadline, never by a slice end already
                        // past (the timer storm of issue 18).
                        let cands = &p.busy[&top];
                        if o.level >= top && cands.len() > 1 && cands.contains_key(&o.vm) {
                            add(TimerKind::SliceEnd, self.slice_end(pi, o, top));
                            if let Some(t) = self.lag_ready_at(pi, o, top) {
                                let t = t.max(o.since.saturating_add(self.waker_hold(pi, o, top)));
                                if t > now {
                                    add(TimerKind::LagWake, t);
                                }
                            }
                        }
                    }
                }
                Decision::Priority => {
                    // A lower running queue protected by its minimum run
                    // while a higher one waits (or, exclusive, is busy).
                    if let Some(&(l, since, _)) = p.running.first() {
                        let waiting_above = p.ready.first().is_some_and(|r| r.0 .0 > l);
                        let below_top = self.cfg.exclusive && l < top;
                        let until = since + self.cfg.min_run_ns;
                        if (waiting_above || below_top) && until > now {
                            add(TimerKind::MinRun, until);
                        }
                    }
                }
                Decision::RoundRobin => {
                    if let (Some(&(_, since, q)), false) = (p.running.first(), p.ready.is_empty()) {
                        add(TimerKind::FifoSlice, since + self.queue_slice(q));
                    }
                }
                _ => {}
            }
        }
        if self.ops().decision == Decision::PollFix && any_busy {
            out.push(Deadline {
                kind: TimerKind::Poll,
                part: None,
                at: self.next_poll,
            });
        }
        if let Some(t) = self.spatial_deadline() {
            out.push(Deadline {
                kind: TimerKind::CuHold,
                part: None,
                at: t,
            });
        }
    }

    /// Arms the timer at the earliest deadline of the table that is
    /// strictly in the future. A deadline at or before `now` is handled
    /// now: its partition decides again (an event decides only its own
    /// partition, so another one's deadline may have passed); one still
    /// due after that waits for an event, not a time (e.g. fifo's slice
    /// end while a dequeue is in flight), and is dropped
    /// ([`EngineStats::stale_deadlines`]). Never `now + 1`: that re-armed
    /// a past deadline at every virtual ns (issue 18).
    pub(super) fn arm_timer(&mut self) {
        let now = self.now;
        let mut table = std::mem::take(&mut self.timer_buf);
        self.deadlines(&mut table);
        if table.iter().any(|d| d.at <= now) {
            let mut again: Vec<usize> = Vec::new();
            for d in table.iter().filter(|d| d.at <= now) {
                match d.part {
                    Some(p) => again.push(p),
                    None => again.extend(0..self.parts.len()),
                }
            }
            again.sort_unstable();
            again.dedup();
            self.stats.past_deadlines += again.len() as u64;
            // Not split: the event's own decision already was (or not).
            let split = self.split.take();
            for p in again {
                self.decide(p, false);
            }
            self.split = split;
            self.deadlines(&mut table);
            self.stats.stale_deadlines += table.iter().filter(|d| d.at <= now).count() as u64;
        }
        let at = table.iter().map(|d| d.at).filter(|&t| t > now).min();
        self.timer_buf = table;
        if let Some(t) = at {
            if self.armed != Some(t) || self.armed.is_some_and(|a| a <= now) {
                self.armed = Some(t);
                self.actions.push_back(Action::ArmTimer { at: t });
            }
        }
    }
}
