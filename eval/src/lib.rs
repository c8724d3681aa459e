//! Evaluation harness.
