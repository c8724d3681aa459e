//! Mediated virtual GPU and physical GPU backends.
