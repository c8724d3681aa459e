//! Valid scenarios whose arrivals far outrun the GPU over a long run end
//! with an error naming the scenario, not with host memory exhausted by job
//! records (review).

use eval::driver::{simulate, EvalError, MAX_JOBS};
use eval::scenario::Scenario;
use scheduler::Policy;

#[test]
fn an_overloaded_open_loop_run_stops_at_the_job_limit() {
    // 64 queues x one job per microsecond, each job 64 x 1 ms workgroups:
    // the backlog grows by ~64 jobs per us; 4 M jobs arrive after ~62 ms.
    let text = r#"
name = "overload"
duration_ms = 3600000
[[tenant]]
name = "t"
priority = 3
class = "lo"
queues = 64
arrival = { kind = "uniform", period_us = 1 }
[[tenant.kernel]]
workgroups = 64
wg_cost_us = 1000
"#;
    let sc = Scenario::parse(text, "overload.toml").unwrap();
    match simulate(&sc, Policy::Hqdmux, 1) {
        Err(e @ EvalError::TooManyJobs(..)) => {
            let msg = e.to_string();
            assert!(msg.contains("'overload'"), "{msg}");
            assert!(msg.contains(&MAX_JOBS.to_string()), "{msg}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(r) => panic!("ran to the end with {} jobs recorded", r.jobs.len()),
    }
}
