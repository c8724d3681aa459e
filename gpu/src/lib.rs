//! The physical GPU contract of hqdmux: what a GPU backend is, what it is
//! given and what it reports. The mediation (`hqdmux-mdev`) drives a backend
//! only through these types; a backend (`hqdmux-gpusim`, a future KFD one)
//! implements them and knows nothing of the mediation.
//!
//! * [`backend`]: [`backend::PhysGpu`], the trait the binding drives (map,
//!   unmap with a dequeue mode, doorbell, advance the clock), its events
//!   ([`backend::GpuEvent`]) and errors, and [`backend::CuMask`].
//! * [`mem`]: [`mem::DmaMemory`], bounds-checked access to one VM's memory
//!   (guest RAM as `vm_memory::GuestMemoryMmap`, a host vector in tests, or
//!   sparse memory for large modelled VMs).
//! * [`topology`]: [`topology::GpuTopology`], the hardware-only part of the
//!   `[gpu]` section (XCCs, partition mode, pipes x queues, CUs, the CWSR cost
//!   model) and the list of user HQD slots.
//! * [`admission`]: [`admission::check_mqd`], the static validity rules of a
//!   gfx9 MQD on this topology: the front end runs them when a guest loads an
//!   MQD, and every backend runs them again at `map`.
#![deny(missing_docs)]

pub mod admission;
pub mod backend;
pub mod mem;
pub mod topology;
