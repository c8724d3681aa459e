//! Hardware formats shared by the host (mdev) and the bare-metal guests (guest-tools).
#![no_std]
