//! Virtual-time evaluation harness: scenarios (data) x scheduling policies,
//! run over the simulated GPU, reported as JSON or a table.

pub mod be_bound;
pub mod driver;
pub mod fuzz;
pub mod promises;
pub mod report;
pub mod scenario;
