//! hqdmux VMM.
