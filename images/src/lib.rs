//! Embedded guest images.
