//! Sans-IO scheduler core (see docs/scheduling.md).
