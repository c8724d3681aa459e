//! Mediated virtual GPU and physical GPU backends.
//!
//! This crate holds the **physical GPU side** of hqdmux:
//!
//! * [`mem`]: [`mem::DmaMemory`], bounds-checked access to one VM's memory
//!   (guest RAM as `vm_memory::GuestMemoryMmap`, or a host vector in tests).
//! * [`topology`]: [`topology::GpuTopology`], the `[gpu]` section of the fleet TOML,
//!   and the list of user HQD slots.
//! * [`backend`]: [`backend::PhysGpu`], the trait the binding drives (map,
//!   unmap with a dequeue mode, doorbell, advance the clock).
//! * [`sim`]: [`sim::SimGpu`], a discrete-event simulated MI300-class GPU
//!   (command processors, AQL, CUs, CWSR).
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
//! * [`guard`]: the misbehaving-VM guard (per-VM rate windows of resets,
//!   queue errors and stale doorbells; quarantine).
//!
//! See `docs/gpu-model.md` for what the model covers.
#![deny(missing_docs)]

pub mod admission;
pub mod arbiter;
pub mod backend;
pub mod binding;
pub mod guard;
pub mod mem;
pub mod metrics;
pub mod probe;
pub mod ratelimit;
pub mod sim;
pub mod telemetry;
pub mod topology;
pub mod vgpu;

/// The timeline model and SVG renderer ([`arbiter::GpuArbiter::timeline`]).
pub use timeline;
