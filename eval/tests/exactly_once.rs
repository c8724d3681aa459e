//! Property: whatever the fleet (tenants, VMs per tenant, VM and queue
//! priorities, weights, arrivals, kernel sizes, queues per VM — up to 160
//! queues, so the 24 HQD slots are often oversubscribed and even `fifo`
//! preempts), every policy but `reset`
//! applies every workgroup's effect exactly once under the real scheduler
//! and the simulated GPU with CWSR.

use eval::driver::simulate;
use eval::scenario::Scenario;
use proptest::prelude::*;
use scheduler::Policy;

/// One random tenant as scenario TOML.
fn tenant(
    i: usize,
    (prio, qprio, weight, queues, count): (u8, u8, u8, u8, u8),
    (closed, mean_us): (bool, u32),
    (wgs, cost_us, hi): (u32, u32, bool),
) -> String {
    let arrival = if closed {
        "{ kind = \"closed\", outstanding = 2 }".to_string()
    } else {
        format!("{{ kind = \"poisson\", mean_us = {mean_us} }}")
    };
    let class = if hi {
        "class = \"hi\"\nsla_ms = 50"
    } else {
        "class = \"lo\""
    };
    format!(
        "[[tenant]]\nname = \"t{i}\"\ncount = {count}\npriority = {prio}\nqueue_priority = {qprio}\n\
         weight = {weight}\nqueues = {queues}\n{class}\narrival = {arrival}\n\
         [[tenant.kernel]]\nworkgroups = {wgs}\nwg_cost_us = {cost_us}\n"
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_but_reset_is_exactly_once(
        tenants in prop::collection::vec(tenant_strategy_args(), 2..5),
        policy in prop::sample::select(vec![Policy::Hqdmux, Policy::Fifo, Policy::Poll5ms, Policy::Timeslice]),
        seed in 0u64..1000,
    ) {
        let mut text = "name = \"random\"\nduration_ms = 300\n".to_string();
        for (i, (a, b, c)) in tenants.into_iter().enumerate() {
            text += &tenant(i, a, b, c);
        }
        let s = Scenario::parse(&text, "random.toml").unwrap();
        let r = simulate(&s, policy, seed).unwrap();
        prop_assert!(r.workgroups > 0, "the fleet ran work");
        prop_assert_eq!(
            (r.lost_effects, r.duplicate_effects, r.queue_errors),
            (0, 0, 0),
            "{:?} seed {}: {}", policy, seed, text
        );
    }
}

type TenantArgs = ((u8, u8, u8, u8, u8), (bool, u32), (u32, u32, bool));

fn tenant_strategy_args() -> impl Strategy<Value = TenantArgs> {
    (
        (0u8..16, 0u8..16, 1u8..4, 1u8..9, 1u8..6),
        (any::<bool>(), 500u32..5000),
        (1u32..700, 20u32..3000, any::<bool>()),
    )
}
