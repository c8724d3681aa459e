//! Mediated virtual GPU and physical GPU backends.
//!
//! This crate holds the **physical GPU side** of hqdmux:
//!
//! * [`mem`]: [`mem::DmaMemory`], bounds-checked access to one VM's memory
//!   (guest RAM as `vm_memory::GuestMemoryMmap`, or a host vector in tests).
//! * [`topology`]: [`topology::GpuTopology`], the `[gpu]` section of the fleet TOML,
//!   and the list of user HQD slots.
//! * [`backend`]: [`backend::PhysGpu`], the trait the mediator / scheduler glue
//!   drives (map, unmap with a dequeue mode, doorbell, advance the clock).
//! * [`sim`]: [`sim::SimGpu`], a discrete-event simulated MI300-class GPU
//!   (command processors, AQL, CUs, CWSR), and [`sim::RealTimeDriver`] that runs
//!   it against the monotonic clock.
//!
//! * [`mediator`]: [`mediator::Mediator`], the guest-visible virtual GPU of
//!   every VM (`docs/vgpu-abi.md`) joined to the scheduler and the GPU.
//!
//! See `docs/gpu-model.md` for what the model covers.
#![deny(missing_docs)]

pub mod admission;
pub mod backend;
pub mod mediator;
pub mod mem;
pub mod sim;
pub mod topology;
