//! A discrete-event simulated MI300-class GPU behind the `hqdmux-gpu`
//! contract ([`gpu::backend::PhysGpu`]). It depends on the contract and on
//! `abi` only, never on the mediation (`hqdmux-mdev`): the binding and the
//! arbiter drive it as they would any backend, and the process that
//! assembles them (the VMM, the virtual-time harness) picks it.
//!
//! * [`sim`]: [`SimGpu`] (command processors, AQL, CUs, CWSR), its occupancy
//!   and CWSR models, the real-time driver and the test kit (guest-memory
//!   queues for tests and harnesses).
//! * [`params`]: [`SimParams`], the simulator knobs (`[gpu.sim]`), and the
//!   check that the simulator's records fit a topology.
//!
//! See `docs/gpu-model.md` for what the model covers.
#![deny(missing_docs)]

// The contract's modules, imported at the crate root so the simulator's
// files name them `crate::backend`, `crate::mem`, ... as they did inside
// `mdev`.
use gpu::{admission, backend, mem, topology};

pub mod params;
pub mod sim;

pub use params::SimParams;
pub use sim::{RealTimeDriver, SimGpu, SimStats};

/// Simulated-GPU events processed per service-loop turn in real time (about
/// 0.5 ms of host time at ~120 ns per workgroup): a guest that floods the
/// model with tiny workgroups makes it lag wall time but cannot keep a
/// real-time caller (the arbiter's service thread) from other VMs' doorbells.
pub const REALTIME_EVENT_BUDGET: usize = 4096;

/// A simulated GPU for real-time use (the arbiter's backend): [`SimGpu`]
/// with `params` and the event budget [`REALTIME_EVENT_BUDGET`].
pub fn realtime_backend(
    topo: &topology::GpuTopology,
    params: &SimParams,
    seed: u64,
) -> Result<Box<dyn backend::PhysGpu + Send>, topology::TopologyError> {
    let mut g = SimGpu::with_params(topo.clone(), params.clone(), seed)?;
    g.set_event_budget(Some(REALTIME_EVENT_BUDGET));
    Ok(Box::new(g))
}
