//! The bodies of the operator API as serde types, shared by the HTTP server
//! ([`crate::api`]), the CLI ([`crate::cli`]) and the OpenAPI document
//! (docs/api/openapi.json, checked against these types by the tests below),
//! and the one error type of the API with its HTTP status.
//!
//! Requests are read whole into their type before anything is applied:
//! every field of an update is optional (firecracker's partial update), an
//! unknown, repeated, `null` (where `null` means nothing) or out-of-range
//! field refuses the whole body, and the error names the field.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{PRIORITY_RANGE, WEIGHT_RANGE};
pub use mdev::promise::Demand;

/// Range of `quantum_ms` (a per-VM slice, ms).
pub const QUANTUM_MS_RANGE: RangeInclusive<u64> = 1..=10_000;
/// Range of `preempt_timeout_ms` (as `[[vm]] preempt_timeout_ms`).
pub const PREEMPT_TIMEOUT_MS_RANGE: RangeInclusive<u64> = mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE;

/// An error of the API: what was refused and why. Its HTTP status is
/// [`ApiError::status`], the one place statuses are chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No route has this path (404).
    #[error("no such path '{0}'")]
    NoPath(String),
    /// The path exists, not with this method (405, `Allow` header).
    #[error("method {method} not allowed on {path}")]
    Method {
        /// The method asked for.
        method: String,
        /// The path.
        path: String,
        /// The methods the path has.
        allow: &'static str,
    },
    /// No VM has this name (404).
    #[error("vm '{0}': no such VM")]
    NoVm(String),
    /// No vGPU has this name (404).
    #[error("vgpu '{0}': no such vGPU")]
    NoVgpu(String),
    /// No GPU of the host has this id (404); `known` lists the ids.
    #[error("gpu {id}: no such GPU (the host's GPUs: {known})")]
    NoGpu {
        /// The id asked for.
        id: u32,
        /// The host's GPU ids, comma-separated.
        known: String,
    },
    /// The body is not of the expected media type (415).
    #[error("expected Content-Type {expected}, got '{got}'")]
    MediaType {
        /// What the route reads.
        expected: &'static str,
        /// What the request said.
        got: String,
    },
    /// The body or query is not what the route reads (400): `place` names
    /// the VM or the resource and the field.
    #[error("{place}: {reason}")]
    Invalid {
        /// `vm 'NAME': FIELD`, `policy: FIELD`, `timeline: PARAM`, ...
        place: String,
        /// Why.
        reason: String,
    },
    /// The request is valid but the VM or fleet cannot do it now (409).
    #[error("{0}")]
    Conflict(String),
    /// A VM entry the fleet's config refuses (422).
    #[error("{0}")]
    Unprocessable(String),
    /// The fleet is ending or has no event loop (503).
    #[error("{0}")]
    Unavailable(String),
    /// A host error (500).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::NoPath(_)
            | ApiError::NoVm(_)
            | ApiError::NoVgpu(_)
            | ApiError::NoGpu { .. } => 404,
            ApiError::Method { .. } => 405,
            ApiError::MediaType { .. } => 415,
            ApiError::Invalid { .. } => 400,
            ApiError::Conflict(_) => 409,
            ApiError::Unprocessable(_) => 422,
            ApiError::Unavailable(_) => 503,
            ApiError::Internal(_) => 500,
        }
    }

    /// A 400 naming `place` (e.g. `vm 'a': priority`).
    pub fn invalid(place: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::Invalid {
            place: place.into(),
            reason: reason.into(),
        }
    }
}

impl From<ApiError> for crate::http::Response {
    fn from(e: ApiError) -> Self {
        let r = crate::http::Response::json(
            e.status(),
            &ErrorBody {
                error: e.to_string(),
            },
        );
        match e {
            ApiError::Method { allow, .. } => r.with_header("Allow", allow.into()),
            _ => r,
        }
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What was refused and why (VM, field, reason).
    pub error: String,
}

/// Reads a JSON body into `T`; an error names `place` (the VM or
/// resource), the field's path in the body and the reason.
pub fn decode_json<T: DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
    place: &str,
) -> Result<T, ApiError> {
    if let Some(ct) = content_type {
        if !ct.starts_with("application/json") {
            return Err(ApiError::MediaType {
                expected: "application/json",
                got: ct.to_owned(),
            });
        }
    }
    // Every body is an object (serde would read a struct from an array too).
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => {
            return Err(ApiError::invalid(
                place,
                "empty body (expected a JSON object)",
            ))
        }
        Some(_) => {
            let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
            return Err(ApiError::invalid(
                place,
                format!("expected a JSON object, found {}", shown.trim()),
            ));
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let r: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let r = r
        .map_err(|e| (e.path().to_string(), e.into_inner()))
        .and_then(|v| de.end().map(|()| v).map_err(|e| (String::new(), e)));
    r.map_err(|(path, inner)| {
        let reason = strip_position(&inner.to_string());
        match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                ApiError::invalid(place, format!("invalid JSON: {inner}"))
            }
            _ if path == "." || path.is_empty() => ApiError::invalid(place, reason),
            _ => ApiError::invalid(format!("{place}: {path}"), reason),
        }
    })
}

/// `msg at line L column C` (serde_json's form) without the position.
fn strip_position(s: &str) -> String {
    match s.rsplit_once(" at line ") {
        Some((head, tail)) if tail.split(" column ").all(|n| n.parse::<u64>().is_ok()) => {
            head.to_owned()
        }
        _ => s.to_owned(),
    }
}

/// Integers with a range, checked when read.
macro_rules! ranged {
    ($(#[$m:meta])* $name:ident, $t:ty, $range:expr) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $t);

        impl $name {
            /// The accepted values.
            pub fn range() -> RangeInclusive<u64> {
                let r = $range;
                u64::from(*r.start())..=u64::from(*r.end())
            }

            /// `v` if it is in [`Self::range`], else why not.
            pub fn new(v: u64) -> Result<Self, String> {
                let r = Self::range();
                if !r.contains(&v) {
                    return Err(format!("{v} is out of range {}..={}", r.start(), r.end()));
                }
                <$t>::try_from(v)
                    .map($name)
                    .map_err(|_| format!("{v} is out of range"))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = u64::deserialize(d)?;
                $name::new(v).map_err(D::Error::custom)
            }
        }
    };
}

ranged!(
    /// A GPU priority (higher wins), in [`PRIORITY_RANGE`].
    Priority,
    u8,
    PRIORITY_RANGE
);
ranged!(
    /// A weight among VMs of equal priority, in [`WEIGHT_RANGE`].
    Weight,
    u32,
    WEIGHT_RANGE
);
ranged!(
    /// A per-VM slice (ms), in [`QUANTUM_MS_RANGE`].
    QuantumMs,
    u64,
    QUANTUM_MS_RANGE
);
ranged!(
    /// A preemption timeout (ms), in [`PREEMPT_TIMEOUT_MS_RANGE`].
    PreemptTimeoutMs,
    u64,
    PREEMPT_TIMEOUT_MS_RANGE
);

/// A field that, when present, must hold a `T` (`null` is refused as `T`
/// refuses it): for `#[serde(default, deserialize_with = "present")]`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A field that, when present, is a `T` or `null` (`Some(None)`): for
/// `#[serde(default, deserialize_with = "nullable")]`.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `PATCH /api/v1/vms/{name}`: a full or partial update of a live VM's
/// scheduling. Every field is optional; at least one is given; the whole
/// body is checked (here and by [`VmUpdate::check`]) before any of it
/// applies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmUpdate {
    /// New GPU priority.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority: Option<Priority>,
    /// New weight.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub weight: Option<Weight>,
    /// New slice: `Some(None)` (`null`) returns to the priority level's.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub quantum_ms: Option<Option<QuantumMs>>,
    /// New preemption timeout.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub preempt_timeout_ms: Option<PreemptTimeoutMs>,
    /// Guard limits to replace (the others are kept).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub guard: Option<GuardUpdate>,
}

impl VmUpdate {
    /// Field names, for error messages.
    pub const FIELDS: &'static str = "priority, weight, quantum_ms, preempt_timeout_ms, guard";

    /// True when no field is given.
    pub fn is_empty(&self) -> bool {
        *self == VmUpdate::default()
    }

    /// What serde cannot check: at least one field, and a `guard` with at
    /// least one limit. `vm` names the VM in the error.
    pub fn check(&self, vm: &str) -> Result<(), ApiError> {
        if self.is_empty() {
            return Err(ApiError::invalid(
                format!("vm '{vm}'"),
                format!("empty change (fields: {})", Self::FIELDS),
            ));
        }
        if self.guard.is_some_and(|g| g.is_empty()) {
            return Err(ApiError::invalid(
                format!("vm '{vm}': guard"),
                format!("empty object (fields: {})", GuardUpdate::FIELDS),
            ));
        }
        Ok(())
    }

    /// The first field given (names what a refusal of the whole update
    /// was about).
    pub fn first_field(&self) -> &'static str {
        if self.priority.is_some() {
            "priority"
        } else if self.weight.is_some() {
            "weight"
        } else if self.quantum_ms.is_some() {
            "quantum_ms"
        } else if self.preempt_timeout_ms.is_some() {
            "preempt_timeout_ms"
        } else {
            "guard"
        }
    }
}

/// Some guard limits of a [`VmUpdate`] (ranges checked by
/// [`mdev::guard::GuardConfig::validate`] once merged with the VM's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardUpdate {
    /// Sliding window (ms).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub window_ms: Option<u64>,
    /// Resets tolerated per window.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_resets: Option<u32>,
    /// Other queue errors tolerated per window.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_queue_errors: Option<u32>,
    /// Stale doorbells tolerated per window.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_stale_doorbells: Option<u32>,
    /// Save waits for its own waves without a save point tolerated per
    /// window, in permille of it beyond the longest wait (0..=1000).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_save_wait_permille: Option<u32>,
}

impl GuardUpdate {
    /// Field names, for error messages.
    pub const FIELDS: &'static str =
        "window_ms, max_resets, max_queue_errors, max_stale_doorbells, max_save_wait_permille";

    /// True when no limit is given.
    pub fn is_empty(&self) -> bool {
        *self == GuardUpdate::default()
    }

    /// As the guard's override type.
    pub fn to_override(self) -> mdev::guard::GuardOverride {
        mdev::guard::GuardOverride {
            window_ms: self.window_ms,
            max_resets: self.max_resets,
            max_queue_errors: self.max_queue_errors,
            max_stale_doorbells: self.max_stale_doorbells,
            max_save_wait_permille: self.max_save_wait_permille,
        }
    }
}

/// A scheduling policy by its API name (`hqdmux`, `fifo`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyName(pub scheduler::Policy);

impl PolicyName {
    /// Every policy's name, comma-separated.
    pub fn all() -> String {
        scheduler::Policy::ALL
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Serialize for PolicyName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> Deserialize<'de> for PolicyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        scheduler::Policy::from_name(&s)
            .map(PolicyName)
            .ok_or_else(|| {
                D::Error::custom(format!(
                    "unknown policy '{s}' (one of: {})",
                    PolicyName::all()
                ))
            })
    }
}

/// `GET /api/v1/policy`, and the answer of `PUT`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyView {
    /// The policy in force.
    pub policy: PolicyName,
    /// Every policy.
    pub policies: Vec<PolicyName>,
}

/// `PUT /api/v1/policy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    /// The new policy.
    pub policy: PolicyName,
}

/// Life-cycle state of a VM as the API shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Added through the API, being built.
    #[default]
    Starting,
    /// vCPUs running.
    Running,
    /// vCPUs running, GPU work held (CWSR-saved) until resume.
    Paused,
    /// A stop was asked for and is in progress.
    Stopping,
    /// Stopped by the operator, the run timeout or a signal.
    Stopped,
    /// The guest ended by itself (exit status, fault, ...).
    Exited,
    /// Could not be built or started.
    Failed,
}

impl VmState {
    /// Every state, in life-cycle order.
    pub const ALL: [VmState; 7] = [
        VmState::Starting,
        VmState::Running,
        VmState::Paused,
        VmState::Stopping,
        VmState::Stopped,
        VmState::Exited,
        VmState::Failed,
    ];

    /// Name in the API.
    pub fn name(self) -> &'static str {
        match self {
            VmState::Starting => "starting",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Stopping => "stopping",
            VmState::Stopped => "stopped",
            VmState::Exited => "exited",
            VmState::Failed => "failed",
        }
    }

    /// Running or paused (its vCPUs run).
    pub fn live(self) -> bool {
        matches!(self, VmState::Running | VmState::Paused)
    }
}

/// What a VM (`VmView`) and a vGPU served over vfio-user (`VgpuView`)
/// show alike: the scheduler's knobs of the tenant and what it got. Written
/// flattened into both views (the API's JSON has these fields at the top
/// level of each); `null` where unknown (no live vGPU, no client).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TenantView {
    /// GPU priority.
    pub priority: u32,
    /// Weight.
    pub weight: u32,
    /// Slice (ms): the tenant's override, else its level's quantum.
    pub quantum_ms: Option<f64>,
    /// `quantum_ms` is a per-tenant override.
    pub quantum_override: bool,
    /// Preemption timeout (ms).
    pub preempt_timeout_ms: u64,
    /// GPU time charged (ms; a vGPU: to its current client).
    pub gpu_time_ms: Option<f64>,
    /// Fraction of its own GPU's slot time over the last sample interval
    /// (each GPU's tenants sum to 1 when it was busy).
    pub share: Option<f64>,
    /// Preemptions of its queues.
    pub preemptions: Option<u64>,
    /// Queue errors (a VM: since it was added; a vGPU: of its current or
    /// last client).
    pub queue_errors: Option<u64>,
    /// Quarantined by the guard. A VM: null without a live registration.
    /// A vGPU: connected or idle, since a quarantine belongs to the vGPU and
    /// outlives its connections until the operator clears it
    /// (`POST /api/v1/vgpus/{name}/clear-quarantine`) or removes the vGPU.
    pub quarantined: Option<bool>,
    /// Median packet latency (ms).
    pub latency_p50_ms: Option<f64>,
    /// 99th percentile packet latency (ms).
    pub latency_p99_ms: Option<f64>,
    /// The largest latency the two figures resolve (ms, 30 days: the
    /// longest run timeout); a figure equal to it means "at least".
    pub latency_limit_ms: Option<f64>,
}

impl TenantView {
    /// With the packet latency figures of `latency` (p50, p99 in seconds;
    /// `None` before the first completion) and the limit they resolve.
    pub fn with_latency(mut self, latency: Option<(f64, f64)>) -> Self {
        self.latency_p50_ms = latency.map(|(p50, _)| p50 * 1e3);
        self.latency_p99_ms = latency.map(|(_, p99)| p99 * 1e3);
        self.latency_limit_ms = latency.map(|_| mdev::telemetry::LATENCY_LIMIT_NS as f64 / 1e6);
        self
    }
}

/// One VM as `GET /api/v1/vms/{name}` shows it. Every field is always
/// written (`null` when unknown); read leniently (a missing field is its
/// default) so that a client keeps working with an older server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmView {
    /// VM name.
    pub name: String,
    /// Life-cycle state.
    pub state: VmState,
    /// It has a vGPU.
    pub gpu: bool,
    /// The physical GPU its vGPU is on (`[[gpu]] id`; null without a vGPU
    /// on this fleet's GPUs). A VM never moves.
    pub gpu_id: Option<u32>,
    /// Why it is on `gpu_id`: `gpu_id = N` as written, or the automatic
    /// placement's reason.
    pub placement: Option<String>,
    /// Its `image`.
    pub image: String,
    /// Its scheduling knobs and GPU figures (written flattened: the same
    /// fields as a vGPU's; null without a vGPU).
    #[serde(flatten)]
    pub tenant: TenantView,
    /// That interval (ms).
    pub share_interval_ms: Option<f64>,
    /// Queue maps.
    pub maps: Option<u64>,
    /// CWSR save time (ms).
    pub cwsr_time_ms: Option<f64>,
    /// Queue errors by code.
    pub queue_errors_by_code: Option<BTreeMap<String, u64>>,
    /// Its guard (null without a live vGPU).
    pub guard: Option<GuardView>,
    /// How it ended.
    pub outcome: Option<String>,
    /// Exit status, when the guest exited.
    pub exit_status: Option<u32>,
    /// The promise, live (null without a live vGPU).
    pub promise: Option<PromiseView>,
    /// Only in the answer of `clear-quarantine`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_quarantined: Option<bool>,
}

/// The promise of one live VM (docs/scheduling.md, "The promise, live"):
/// its entitlement under the demands of the last sample interval against
/// what it received, and the cumulative counters `hqdmux promise` takes
/// differences of.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PromiseView {
    /// When the counters were read (ms on the arbiter's clock).
    pub at_ms: f64,
    /// Compute partition.
    pub partition: u32,
    /// Demanding now: a queue with work it could run.
    pub demanding: bool,
    /// How it demanded over the last interval (null before one).
    pub demand: Option<Demand>,
    /// Entitlement over the last interval: fraction of its partition's
    /// compute under the demands seen (water-filling).
    pub entitled_share: Option<f64>,
    /// Received over the last interval: fraction of its partition's
    /// compute (CU time).
    pub got_share: Option<f64>,
    /// Fraction of its partition's slot time charged over the last
    /// interval (apart from compute).
    pub got_slot_share: Option<f64>,
    /// The promise held over the last interval.
    pub held: Option<bool>,
    /// Why (or why not), one line.
    pub why: Option<String>,
    /// Length of the last interval (ms).
    pub interval_ms: Option<f64>,
    /// Its level's slice (ms): the granularity of weighted sharing.
    pub level_quantum_ms: f64,
    /// Compute received since it was added (CU x ms).
    pub cu_time_ms: f64,
    /// Time demanding since it was added (ms).
    pub demanding_ms: f64,
    /// Time waiting for a slot (a queue ready or saved, none running) (ms).
    pub wait_ms: f64,
    /// CWSR save time of its queues (ms), charged to nobody.
    pub cwsr_time_ms: f64,
    /// Aging boosts of its queues.
    pub aging_boosts: u64,
    /// Preemptions of its queues.
    pub preemptions_suffered: u64,
    /// Of those, made for a queue boosted by aging.
    pub preempted_by_aging: u64,
    /// Preemptions of other VMs' queues its queue starts made.
    pub preemptions_caused: u64,
    /// Preemptions of its queues by the VM that made them (where known).
    pub preempted_by: BTreeMap<String, u64>,
}

/// `GET /api/v1/vms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmList {
    /// Every listed VM (config order, then added VMs).
    pub vms: Vec<VmView>,
}

/// The guard of a live vGPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuardView {
    /// Sliding window (ms).
    pub window_ms: u64,
    /// Resets tolerated per window.
    pub max_resets: u32,
    /// Other queue errors tolerated per window.
    pub max_queue_errors: u32,
    /// Stale doorbells tolerated per window.
    pub max_stale_doorbells: u32,
    /// Save waits tolerated per window (permille of it beyond the longest).
    #[serde(default)]
    pub max_save_wait_permille: u32,
    /// Resets in the window.
    pub resets: u64,
    /// Other queue errors in the window.
    pub queue_errors: u64,
    /// Stale doorbells in the window.
    pub stale_doorbells: u64,
    /// Save waits for its own waves without a save point in the window (ms).
    #[serde(default)]
    pub save_wait_ms: f64,
    /// Resets since the VM was added.
    pub total_resets: u64,
    /// Queue errors since the VM was added.
    pub total_queue_errors: u64,
    /// Stale doorbells since the VM was added.
    pub total_stale_doorbells: u64,
    /// Save waits since the VM was added (ms).
    #[serde(default)]
    pub total_save_wait_ms: f64,
    /// Why and since when it is quarantined.
    pub quarantined: Option<QuarantineView>,
}

/// A guard quarantine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuarantineView {
    /// As the log line.
    pub reason: String,
    /// The count past its limit: `resets`, `queue_errors`,
    /// `stale_doorbells`, `save_waits` (its `count` in ns, its `limit` in
    /// permille of the window beyond the longest wait).
    pub what: String,
    /// The count.
    pub count: u64,
    /// The limit.
    pub limit: u32,
    /// When (ms on the arbiter's clock).
    pub since_ms: f64,
}

impl From<mdev::guard::GuardStatus> for GuardView {
    fn from(g: mdev::guard::GuardStatus) -> Self {
        use mdev::guard::GuardEvent;
        GuardView {
            window_ms: g.limits.window_ms,
            max_resets: g.limits.max_resets,
            max_queue_errors: g.limits.max_queue_errors,
            max_stale_doorbells: g.limits.max_stale_doorbells,
            max_save_wait_permille: g.limits.max_save_wait_permille,
            resets: g.resets,
            queue_errors: g.queue_errors,
            stale_doorbells: g.stale_doorbells,
            save_wait_ms: g.save_wait_ns as f64 / 1e6,
            total_resets: g.totals[0],
            total_queue_errors: g.totals[1],
            total_stale_doorbells: g.totals[2],
            total_save_wait_ms: g.totals[3] as f64 / 1e6,
            quarantined: g.quarantined.map(|t| QuarantineView {
                reason: t.to_string(),
                what: match t.what {
                    GuardEvent::Reset => "resets",
                    GuardEvent::QueueError => "queue_errors",
                    GuardEvent::StaleDoorbell => "stale_doorbells",
                    GuardEvent::SaveWait => "save_waits",
                }
                .into(),
                count: t.count,
                limit: t.limit,
                since_ms: t.at as f64 / 1e6,
            }),
        }
    }
}

/// `GET /api/v1/fleet`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FleetView {
    /// Since the API started (ms).
    pub uptime_ms: f64,
    /// VMs listed by `GET /api/v1/vms`.
    pub vms: u64,
    /// Ended VMs no longer listed.
    pub vms_forgotten: u64,
    /// Listed VMs per state name.
    pub states: BTreeMap<String, u64>,
    /// The first GPU with VMs (null without GPU VMs); every GPU is in `gpus`.
    pub gpu: Option<GpuView>,
    /// Every GPU with a running arbiter, in config order.
    #[serde(default)]
    pub gpus: Vec<GpuView>,
}

/// The GPU of [`FleetView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// The GPU's id (`[[gpu]] id`, metrics' `gpu_id`).
    #[serde(default)]
    pub gpu_id: u32,
    /// Scheduling policy.
    pub policy: PolicyName,
    /// XCCs.
    pub xccs: u32,
    /// Compute partitions.
    pub partitions: u32,
    /// Its partition mode as AMD's exporter labels it
    /// (`gpu_compute_partition_type`: `SPX`, `DPX`, `QPX`, `CPX`).
    #[serde(default)]
    pub gpu_compute_partition_type: String,
    /// Running or paused VMs on it.
    #[serde(default)]
    pub vms: u64,
    /// Packets completed.
    pub completions: u64,
    /// Queue maps.
    pub maps: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// VMs quarantined now.
    pub quarantined_vms: u64,
}

/// Whether a client (a VMM) is attached to a vGPU's socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VgpuState {
    /// No client: the socket waits for one (the vGPU holds no GPU state).
    #[default]
    Idle,
    /// A client is attached; the vGPU is registered with the arbiter.
    Connected,
}

impl VgpuState {
    /// Every state.
    pub const ALL: [VgpuState; 2] = [VgpuState::Idle, VgpuState::Connected];

    /// Name in the API.
    pub fn name(self) -> &'static str {
        match self {
            VgpuState::Idle => "idle",
            VgpuState::Connected => "connected",
        }
    }
}

/// `POST /api/v1/vgpus`: a vGPU served by `hqdmux serve`, the fields of a
/// devices file's `[[vgpu]]` (all but `name` optional), read whole and
/// checked before the socket is bound.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VgpuCreate {
    /// Unique name: letters, digits, `-`, `_`, `.` (metrics and timelines
    /// label the vGPU by it).
    pub name: String,
    /// Socket path: a file name in the daemon's vGPU socket directory, or
    /// an absolute path inside it (default `NAME.sock` there).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket: Option<String>,
    /// GPU priority (default 0).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority: Option<Priority>,
    /// Weight (default 1).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub weight: Option<Weight>,
    /// GPU partition (default: the scheduler picks).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub partition: Option<u32>,
    /// The physical GPU (`[[gpu]] id` of the devices file) whose arbiter
    /// serves it (default: placed as an added VM is, by entitlement).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu_id: Option<u32>,
    /// Slice (ms; default: the priority level's).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub quantum_ms: Option<QuantumMs>,
    /// Preemption timeout (ms).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub preempt_timeout_ms: Option<PreemptTimeoutMs>,
    /// Guard limits over the `[gpu.guard]` defaults.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub guard: Option<GuardUpdate>,
    /// Offer BAR2 as an mmap-able doorbell page (default false).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub doorbell_page: Option<bool>,
}

/// One vGPU as `GET /api/v1/vgpus/{name}` shows it (every field always
/// written, `null` when unknown; read leniently).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VgpuView {
    /// Name.
    pub name: String,
    /// Its vfio-user socket.
    pub socket: String,
    /// A client attached or not.
    pub state: VgpuState,
    /// Paused by the operator (kept across connections).
    pub paused: bool,
    /// BAR2 is offered as an mmap-able doorbell page.
    pub doorbell_page: bool,
    /// Doorbells noticed in that page.
    pub mmap_doorbells: u64,
    /// Its scheduling knobs and the current (or last) client's GPU figures
    /// (written flattened: the same fields as a VM's).
    #[serde(flatten)]
    pub tenant: TenantView,
    /// Partition asked for (null: the scheduler picks).
    pub partition: Option<u32>,
    /// The physical GPU (`[[gpu]] id`) whose arbiter serves it.
    pub gpu_id: u32,
    /// Why it is on `gpu_id`: `gpu_id = N` as written (devices file or
    /// request), else the automatic placement's reason.
    pub placement: String,
    /// Loaded queues (vHQDs) of the current client (null when idle).
    pub queues: Option<u64>,
    /// Clients accepted since the vGPU was created.
    pub connections: u64,
    /// Doorbells forwarded over the socket.
    pub doorbells: u64,
}

/// `GET /api/v1/vgpus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VgpuList {
    /// Every vGPU (devices file order, then created ones).
    pub vgpus: Vec<VgpuView>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::Visitor;
    use serde_json::{json, Value};

    /// The field names serde reads for `T` (what `#[derive(Deserialize)]`
    /// hands to `deserialize_struct`).
    fn fields<T: DeserializeOwned>() -> Vec<&'static str> {
        struct Probe(Vec<&'static str>);
        #[derive(Debug)]
        struct Done;
        impl std::fmt::Display for Done {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("done")
            }
        }
        impl std::error::Error for Done {}
        impl serde::de::Error for Done {
            fn custom<M: std::fmt::Display>(_: M) -> Self {
                Done
            }
        }
        impl<'de> Deserializer<'de> for &mut Probe {
            type Error = Done;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Done> {
                Err(Done)
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Done> {
                self.0.extend_from_slice(fields);
                Err(Done)
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
                bytes byte_buf option unit unit_struct newtype_struct seq tuple
                tuple_struct map enum identifier ignored_any
            }
        }
        let mut p = Probe(Vec::new());
        let _ = T::deserialize(&mut p);
        p.0
    }

    fn doc() -> Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api/openapi.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    fn names(v: &Value) -> Vec<String> {
        let mut n: Vec<String> = match v {
            Value::Object(m) => m.keys().cloned().collect(),
            Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().to_owned()).collect(),
            _ => Vec::new(),
        };
        n.sort();
        n
    }

    fn sorted(v: &[&str]) -> Vec<String> {
        let mut n: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        n.sort();
        n
    }

    /// Every body type's fields are the properties of its schema in
    /// docs/api/openapi.json; an answer type writes every required one
    /// (and no other); a request type requires what its schema requires.
    #[test]
    fn the_openapi_document_matches_the_types() {
        let d = doc();
        let s = &d["components"]["schemas"];
        let check = |schema: &str, fields: Vec<&str>| {
            assert_eq!(
                names(&s[schema]["properties"]),
                sorted(&fields),
                "schema {schema}: properties vs the type's fields"
            );
            assert_eq!(s[schema]["additionalProperties"], false, "{schema}");
        };
        // The views with a flattened `TenantView` are read as maps (serde
        // hands no field list over): their fields are what they write,
        // every one of them (the optional `was_quarantined` set).
        let every_vm = VmView {
            was_quarantined: Some(true),
            ..Default::default()
        };
        let vm_fields = names(&serde_json::to_value(&every_vm).unwrap());
        let vgpu_fields = names(&serde_json::to_value(VgpuView::default()).unwrap());
        for f in fields::<TenantView>() {
            assert!(vm_fields.iter().any(|v| v == f), "{f}");
            assert!(vgpu_fields.iter().any(|v| v == f), "{f}");
        }
        check("Vm", vm_fields.iter().map(String::as_str).collect());
        check("VmList", fields::<VmList>());
        check("Promise", fields::<PromiseView>());
        check("Guard", fields::<GuardView>());
        check("Quarantine", fields::<QuarantineView>());
        check("Fleet", fields::<FleetView>());
        check("Policy", fields::<PolicyView>());
        check("PolicyChange", fields::<PolicyChange>());
        check("VmPatch", fields::<VmUpdate>());
        check("GuardPatch", fields::<GuardUpdate>());
        check("Error", fields::<ErrorBody>());
        check("Vgpu", vgpu_fields.iter().map(String::as_str).collect());
        check("VgpuList", fields::<VgpuList>());
        check("VgpuCreate", fields::<VgpuCreate>());
        assert_eq!(
            names(&serde_json::to_value(VgpuView::default()).unwrap()),
            names(&s["Vgpu"]["required"])
        );
        assert_eq!(names(&s["VgpuCreate"]["required"]), ["name"]);
        assert!(serde_json::from_value::<VgpuCreate>(json!({})).is_err());
        assert!(serde_json::from_value::<VgpuCreate>(json!({"name": "a"})).is_ok());
        let vstates: Vec<Value> = VgpuState::ALL.iter().map(|v| json!(v.name())).collect();
        assert_eq!(
            s["Vgpu"]["properties"]["state"]["enum"],
            Value::Array(vstates)
        );
        assert_eq!(
            names(&s["VgpuCreate"]["properties"]["guard"]["properties"]),
            sorted(&fields::<GuardUpdate>())
        );
        assert_eq!(
            names(&s["Fleet"]["properties"]["gpu"]["properties"]),
            sorted(&fields::<GpuView>())
        );

        // A VM entry has the fields of a config file's `[[vm]]`.
        assert_eq!(
            names(&s["VmEntry"]["properties"]),
            sorted(&crate::config::VM_FIELDS)
        );
        assert_eq!(names(&s["VmEntry"]["required"]), ["image", "name"]);
        assert_eq!(
            names(&s["VmEntry"]["properties"]["guard"]["properties"]),
            sorted(&fields::<GuardUpdate>())
        );

        // Answers: what is written is exactly what is required (the
        // optional `was_quarantined` apart).
        let written = |v: Value| names(&v);
        assert_eq!(
            written(serde_json::to_value(PromiseView::default()).unwrap()),
            names(&s["Promise"]["required"])
        );
        let mut vm = written(serde_json::to_value(VmView::default()).unwrap());
        assert_eq!(vm, names(&s["Vm"]["required"]));
        let with = VmView {
            was_quarantined: Some(true),
            ..Default::default()
        };
        vm = written(serde_json::to_value(with).unwrap());
        assert!(vm.contains(&"was_quarantined".to_string()));
        let g = GuardView {
            quarantined: Some(QuarantineView::default()),
            ..Default::default()
        };
        assert_eq!(
            written(serde_json::to_value(&g).unwrap()),
            names(&s["Guard"]["required"])
        );
        assert_eq!(
            written(serde_json::to_value(QuarantineView::default()).unwrap()),
            names(&s["Quarantine"]["required"])
        );
        let gpu = GpuView {
            gpu_id: 0,
            policy: PolicyName(scheduler::Policy::ALL[0]),
            xccs: 1,
            partitions: 1,
            gpu_compute_partition_type: "SPX".into(),
            vms: 0,
            completions: 0,
            maps: 0,
            preemptions: 0,
            quarantined_vms: 0,
        };
        let f = FleetView {
            gpu: Some(gpu.clone()),
            ..Default::default()
        };
        assert_eq!(
            written(serde_json::to_value(&f).unwrap()),
            names(&s["Fleet"]["required"])
        );
        assert_eq!(
            written(serde_json::to_value(&gpu).unwrap()),
            names(&s["Fleet"]["properties"]["gpu"]["required"])
        );
        // Requests: the schema requires exactly what serde requires.
        assert!(s["VmPatch"]["required"].is_null());
        assert!(s["GuardPatch"]["required"].is_null());
        assert!(serde_json::from_value::<VmUpdate>(json!({})).is_ok());
        assert_eq!(names(&s["PolicyChange"]["required"]), ["policy"]);
        assert!(serde_json::from_value::<PolicyChange>(json!({})).is_err());
        // The policy names are the scheduler's.
        let all: Vec<Value> = scheduler::Policy::ALL
            .iter()
            .map(|p| json!(p.name()))
            .collect();
        assert_eq!(s["PolicyName"]["enum"], Value::Array(all));
        let states: Vec<Value> = VmState::ALL.iter().map(|v| json!(v.name())).collect();
        assert_eq!(s["Vm"]["properties"]["state"]["enum"], Value::Array(states));
        // Ranges are the types' ranges.
        for (schema, field, range) in [
            ("VmPatch", "priority", Priority::range()),
            ("VmPatch", "weight", Weight::range()),
            ("VmPatch", "quantum_ms", QuantumMs::range()),
            ("VmPatch", "preempt_timeout_ms", PreemptTimeoutMs::range()),
            ("Vm", "priority", Priority::range()),
            ("Vm", "weight", Weight::range()),
            ("VmEntry", "priority", Priority::range()),
            ("VmEntry", "weight", Weight::range()),
            ("VmEntry", "preempt_timeout_ms", PreemptTimeoutMs::range()),
            ("VgpuCreate", "priority", Priority::range()),
            ("VgpuCreate", "weight", Weight::range()),
            ("VgpuCreate", "quantum_ms", QuantumMs::range()),
            (
                "VgpuCreate",
                "preempt_timeout_ms",
                PreemptTimeoutMs::range(),
            ),
        ] {
            let p = &s[schema]["properties"][field];
            assert_eq!(p["minimum"], json!(range.start()), "{schema}.{field}");
            if schema != "Vm" || field != "preempt_timeout_ms" {
                assert_eq!(p["maximum"], json!(range.end()), "{schema}.{field}");
            }
        }
    }

    /// The refusal of `body` as an update of VM `a` (`Err`: accepted).
    fn update(body: &str) -> Result<ApiError, VmUpdate> {
        match decode_json::<VmUpdate>(Some("application/json"), body.as_bytes(), "vm 'a'")
            .and_then(|u| u.check("a").map(|_| u))
        {
            Ok(u) => Err(u),
            Err(e) => Ok(e),
        }
    }

    #[test]
    fn an_update_is_read_whole_and_a_refusal_names_the_field() {
        let u = update(r#"{"priority": 15, "weight": 1000, "quantum_ms": null}"#).unwrap_err();
        assert_eq!(u.priority, Some(Priority(15)));
        assert_eq!(u.weight, Some(Weight(1000)));
        assert_eq!(u.quantum_ms, Some(None));
        assert_eq!(u.first_field(), "priority");
        // What the CLI sends for `set --quantum-ms 0 --weight 3`.
        let sent = VmUpdate {
            weight: Some(Weight(3)),
            quantum_ms: Some(None),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&sent).unwrap(),
            json!({"weight": 3, "quantum_ms": null})
        );
        assert_eq!(
            update(&serde_json::to_string(&sent).unwrap()).unwrap_err(),
            sent
        );
        let u = update(r#"{"guard": {"max_resets": 2}}"#).unwrap_err();
        assert_eq!(u.guard.unwrap().max_resets, Some(2));
        for (body, want) in [
            (
                r#"{"priority": 16}"#,
                "vm 'a': priority: 16 is out of range 0..=15",
            ),
            (
                r#"{"weight": 0, "priority": 1}"#,
                "vm 'a': weight: 0 is out of range 1..=1000",
            ),
            (r#"{"weight": "x"}"#, "vm 'a': weight: invalid type: string"),
            (r#"{"priority": 2.0}"#, "vm 'a': priority: invalid type"),
            (r#"{"priority": -1}"#, "vm 'a': priority: invalid value"),
            (
                r#"{"priority": null}"#,
                "vm 'a': priority: invalid type: null",
            ),
            (r#"{"colour": 1}"#, "unknown field `colour`"),
            (
                r#"{"priority": 1, "priority": 2}"#,
                "duplicate field `priority`",
            ),
            (
                r#"{"quantum_ms": 0}"#,
                "vm 'a': quantum_ms: 0 is out of range",
            ),
            (
                r#"{"preempt_timeout_ms": 18446744073709551616}"#,
                "vm 'a': preempt_timeout_ms: invalid type: floating point",
            ),
            (r#"{"guard": 3}"#, "vm 'a': guard: invalid type: integer"),
            (
                r#"{"guard": {"max_resets": -1}}"#,
                "vm 'a': guard.max_resets: invalid value",
            ),
            (
                r#"{"guard": {"bogus": 1}}"#,
                "vm 'a': guard.bogus: unknown field `bogus`",
            ),
            (r#"{"guard": {}}"#, "vm 'a': guard: empty object"),
            ("{}", "vm 'a': empty change"),
            ("[1]", "vm 'a': expected a JSON object, found [1]"),
            ("", "vm 'a': empty body"),
            (r#"{"priority": 1"#, "vm 'a': invalid JSON"),
            (r#"{"priority": 1} x"#, "vm 'a': invalid JSON"),
        ] {
            let e = update(body).unwrap_or_else(|u| panic!("{body}: accepted as {u:?}"));
            assert_eq!(e.status(), 400, "{body}: {e}");
            assert!(e.to_string().contains(want), "{body}: {e}");
            if !want.contains("invalid JSON") {
                assert!(!e.to_string().contains(" at line "), "{body}: {e}");
            }
        }
        let e = decode_json::<VmUpdate>(Some("text/plain"), b"{}", "vm 'a'").unwrap_err();
        assert_eq!(e.status(), 415);
    }

    #[test]
    fn a_policy_change_names_the_known_policies() {
        let p: PolicyChange = serde_json::from_str(r#"{"policy": "fifo"}"#).unwrap();
        assert_eq!(p.policy.0.name(), "fifo");
        let e = decode_json::<PolicyChange>(None, br#"{"policy": "lottery"}"#, "policy")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "policy: policy: unknown policy 'lottery' (one of: hqdmux, fifo, poll5ms, timeslice, reset)"
        );
        assert_eq!(
            serde_json::to_value(PolicyChange { policy: p.policy }).unwrap(),
            json!({"policy": "fifo"})
        );
    }

    /// The flattened `TenantView` reads back what it writes, inside a VM's
    /// and a vGPU's view alike, and its fields sit at the top level.
    #[test]
    fn the_shared_tenant_fields_are_flat_and_read_back() {
        let tenant = TenantView {
            priority: 7,
            weight: 3,
            quantum_ms: Some(2.5),
            quantum_override: true,
            preempt_timeout_ms: 40,
            gpu_time_ms: Some(1.25),
            share: Some(0.5),
            preemptions: Some(9),
            queue_errors: Some(2),
            quarantined: Some(false),
            ..Default::default()
        }
        .with_latency(Some((0.001, 0.004)));
        let vm = VmView {
            name: "a".into(),
            tenant: tenant.clone(),
            ..Default::default()
        };
        let j = serde_json::to_value(&vm).unwrap();
        assert_eq!(j["priority"], 7, "{j}");
        assert_eq!(j["latency_p99_ms"], 4.0, "{j}");
        assert!(j.get("tenant").is_none(), "{j}");
        assert_eq!(serde_json::from_value::<VmView>(j).unwrap(), vm);
        let vgpu = VgpuView {
            name: "g".into(),
            tenant,
            ..Default::default()
        };
        let j = serde_json::to_value(&vgpu).unwrap();
        assert_eq!(j["quantum_ms"], 2.5, "{j}");
        assert_eq!(serde_json::from_value::<VgpuView>(j).unwrap(), vgpu);
        // Read leniently, as before: a missing field is its default.
        let v: VmView = serde_json::from_value(json!({"name": "b", "weight": 4})).unwrap();
        assert_eq!((v.tenant.weight, v.tenant.priority), (4, 0));
    }

    #[test]
    fn every_error_has_one_status() {
        let r: crate::http::Response = ApiError::Method {
            method: "DELETE".into(),
            path: "/x".into(),
            allow: "GET",
        }
        .into();
        assert_eq!(r.status, 405);
        let b: ErrorBody = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(b.error, "method DELETE not allowed on /x");
        for (e, st) in [
            (ApiError::NoVm("a".into()), 404),
            (ApiError::NoPath("/".into()), 404),
            (
                ApiError::NoGpu {
                    id: 7,
                    known: "0".into(),
                },
                404,
            ),
            (ApiError::invalid("x", "y"), 400),
            (ApiError::Conflict("c".into()), 409),
            (ApiError::Unprocessable("u".into()), 422),
            (ApiError::Unavailable("u".into()), 503),
            (ApiError::Internal("i".into()), 500),
        ] {
            assert_eq!(e.status(), st, "{e}");
            let r: crate::http::Response = e.into();
            assert_eq!(r.status, st);
        }
    }
}
