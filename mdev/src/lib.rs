//! The mediation: per-VM virtual GPUs multiplexed onto one physical GPU.
//!
//! This crate drives a physical GPU only through the contract of
//! `hqdmux-gpu` ([`gpu::backend::PhysGpu`], [`gpu::mem::DmaMemory`],
//! [`gpu::topology::GpuTopology`]); it never names a backend. The process
//! that assembles a fleet (the VMM, the virtual-time harness) picks one
//! (`hqdmux-gpusim`'s `SimGpu` today) and hands it to the arbiter or the
//! binding.
//!
//! * [`binding`]: [`binding::Binding`], the one sans-IO scheduler <-> GPU
//!   binding (FIFO event order), run by the arbiter in real time and by
//!   eval in virtual time.
//! * [`vgpu`]: [`vgpu::VgpuFrontEnd`], one VM's guest-visible vGPU
//!   (`docs/vgpu-abi.md`): registers, doorbell eventfds, mailboxes and
//!   MSI-X vectors through an [`vgpu::InterruptSink`].
//! * [`arbiter`]: [`arbiter::GpuArbiter`], one per fleet: the binding, the
//!   backend (`Box<dyn PhysGpu + Send>`) and the epoll service thread.
//! * [`telemetry`]: per-VM counters, histograms and the HQD-slot timeline
//!   recorder, fed from binding notices; [`metrics`]: their Prometheus text.
//! * [`ratelimit`]: per-VM limiter of guest-triggered log lines.
//! * [`promise`]: the water-filling of the promise and its per-window check.
//! * [`guard`]: the misbehaving-VM guard (per-VM rate windows of resets,
//!   queue errors and stale doorbells; quarantine).
//! * `probe` (feature `probe`): the arbiter measurement rig of the benches,
//!   and the interrupt sinks of tests, examples and fuzz harnesses.
#![deny(missing_docs)]

// The contract's modules, imported at the crate root so this crate's files
// name them `crate::backend`, `crate::mem`, ... (they lived here before the
// split). Importers outside use `gpu::...`.
use gpu::{admission, backend, mem, topology};
// The simulator, for tests and the probe rig only (a dev-dependency, or the
// optional dependency of the `probe` feature).
#[cfg(any(test, feature = "probe"))]
use gpusim::sim;

pub mod arbiter;
pub mod binding;
pub mod guard;
pub mod metrics;
#[cfg(any(test, feature = "probe"))]
pub mod probe;
pub mod promise;
pub mod ratelimit;
pub mod telemetry;
pub mod vgpu;

/// The timeline model and SVG renderer ([`arbiter::GpuArbiter::timeline`]).
pub use timeline;
