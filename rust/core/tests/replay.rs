//! The replay behind `llmsched simulate`: its clock, worked out by hand on small cases.
//! (`tests/test_core_replay.py` checks it against the Python engine loop at scale.)

mod common;

use llmsched_core::replay::cost::StepCost;
use llmsched_core::replay::tokens::TokenModel;
use llmsched_core::replay::{Replay, ReplayOptions, ReplayRequest};
use std::time::Duration;

/// Warmed up with every one-request step the tests' configs can schedule.
const OPTIONS: ReplayOptions =
    ReplayOptions { seed: 0, vocab_size: 32000, acceptance_rate: 0.7, check_invariants: true, warm_up_tokens: 4095 };

fn cost(terms: &[(&str, f64)]) -> StepCost {
    let mut cost = StepCost { terms: [0.0; StepCost::TERMS.len()] };
    for &(name, ms) in terms {
        let i = StepCost::TERMS.iter().position(|&t| t == name).expect("a term");
        cost.terms[i] = ms;
    }
    cost
}

fn request(id: &str, arrival_time: f64, prompt_len: usize, output_len: i64) -> ReplayRequest {
    ReplayRequest { request_id: id.into(), arrival_time, prompt_len, output_len, key: 1, prefix_blocks: Vec::new() }
}

fn run(replay: &mut Replay) {
    assert!(replay.run_for(Duration::from_secs(60)).expect("the replay runs"));
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn one_request_waits_for_the_wake_up_and_its_arrival_then_steps_at_the_fixed_cost() {
    let config = common::config(|_| {});
    let cost = cost(&[("fixed_ms", 1.0), ("add_request_ms", 0.5), ("wake_ms", 0.25)]);
    let mut replay = Replay::new(config, cost, vec![request("a", 0.0, 10, 3)], OPTIONS).unwrap();
    run(&mut replay);
    let t = replay.times()[0];
    // Woken (0.25 ms) and taken in (0.5 ms), then a prefill step and two decode steps of 1 ms.
    assert!(close(t.scheduled, 0.000_75), "{t:?}");
    assert!(close(t.first_token, 0.001_75), "{t:?}");
    assert!(close(t.finished, 0.003_75), "{t:?}");
    // A fourth, empty step tells the runner the request finished (vLLM's `has_requests`).
    assert_eq!((t.num_output, t.preemptions, replay.num_steps()), (3, 0, 4));
    assert_eq!(t.status.and_then(|s| s.finish_reason()), Some("length"));
    assert_eq!(replay.timeline().time.len(), 4);
    assert!(close(replay.clock(), 0.003_75));
}

#[test]
fn requests_taken_in_together_pay_the_batch_term_once() {
    let config = common::config(|_| {});
    let cost = cost(&[("fixed_ms", 1.0), ("add_request_ms", 0.5), ("add_batch_ms", 2.0)]);
    // a and b arrive together; c while they are taken in (after the engine last looked) or
    // during the first step: it is taken in after that step, on its own.
    let requests = vec![request("a", 0.0, 10, 3), request("b", 0.0, 10, 3), request("c", 0.002, 10, 3)];
    let mut replay = Replay::new(config, cost, requests, OPTIONS).unwrap();
    run(&mut replay);
    let [a, b, c] = [0, 1, 2].map(|i| replay.times()[i]);
    // 0.5 ms each and 2 ms for the two, then a 1 ms step.
    assert!(close(a.scheduled, 0.003) && close(b.scheduled, 0.003), "{a:?} {b:?}");
    // After it, c: 0.5 + 2 ms, then the step that prefills it.
    assert!(close(c.scheduled, 0.006_5) && close(c.first_token, 0.007_5), "{c:?}");
}

#[test]
fn an_idle_engine_waits_for_the_next_arrival_and_wakes_for_it() {
    let config = common::config(|_| {});
    let cost = cost(&[("fixed_ms", 1.0), ("wake_ms", 0.25)]);
    let requests = vec![request("a", 0.0, 10, 1), request("b", 1.0, 10, 1)];
    let mut replay = Replay::new(config, cost, requests, OPTIONS).unwrap();
    run(&mut replay);
    let b = replay.times()[1];
    assert!(close(b.scheduled, 1.000_25) && close(b.finished, 1.001_25), "{b:?}");
    assert!(close(replay.clock(), 1.001_25));
}

#[test]
fn a_batch_shape_costs_more_the_first_time_only_and_one_request_shapes_are_warm() {
    // Two requests decode together: the shape (2 requests, 2 tokens) is new once.
    let config = common::config(|p| {
        p.max_num_batched_tokens = 64;
        p.max_num_seqs = 8;
    });
    let cost = cost(&[("fixed_ms", 1.0), ("new_shape_ms", 10.0)]);
    let requests = vec![request("a", 0.0, 8, 3), request("b", 0.0, 8, 3)];
    let mut replay = Replay::new(config, cost, requests, OPTIONS).unwrap();
    run(&mut replay);
    // Step 1 prefills both (2 requests, 16 tokens: new), steps 2 and 3 decode both
    // ((2, 2): new once): 1 + 10, 1 + 10, 1 ms.
    let finished: Vec<f64> = replay.times().iter().map(|t| t.finished).collect();
    assert!(finished.iter().all(|&f| close(f, 0.023)), "{finished:?}");
    let alone = Replay::new(common::config(|_| {}), cost, vec![request("c", 0.0, 8, 3)], OPTIONS);
    let mut alone = alone.unwrap();
    run(&mut alone);
    assert!(close(alone.times()[0].finished, 0.003));
    // Not warmed up, the engine has not run those one-request shapes either: (1, 8) and (1, 1).
    let cold = ReplayOptions { warm_up_tokens: 0, ..OPTIONS };
    let mut cold = Replay::new(common::config(|_| {}), cost, vec![request("c", 0.0, 8, 3)], cold).unwrap();
    run(&mut cold);
    assert!(close(cold.times()[0].finished, 0.023));
}

#[test]
fn every_token_counts_its_term() {
    // One request of 8 prompt tokens and 2 outputs, block size 16: a prefill step
    // (1 request set up, 8 tokens attending to 36 positions, 1 block) then a decode step
    // (its first, 9 context tokens, 1 block; then the finished request lets go).
    let config = common::config(|p| p.block_size = 16);
    let terms = [
        ("prefill_request_ms", 1.0),
        ("new_request_ms", 2.0),
        ("prefill_token_ms", 3.0),
        ("prefill_attention_ms", 4.0),
        ("decode_request_ms", 5.0),
        ("first_decode_ms", 6.0),
        ("decode_context_ms", 7.0),
        ("kv_block_ms", 8.0),
        ("scheduler_step_ms", 9.0),
        ("scheduler_request_ms", 10.0),
        ("scheduler_token_ms", 11.0),
    ];
    let mut replay = Replay::new(config, cost(&terms), vec![request("a", 0.0, 8, 2)], OPTIONS).unwrap();
    run(&mut replay);
    let prefill = 1.0 + 2.0 + 3.0 * 8.0 + 4.0 * 36.0 + 8.0 + 9.0 + 10.0 + 11.0 * 8.0;
    let decode = 5.0 + 6.0 + 7.0 * 9.0 + 8.0 + 9.0 + 10.0 + 11.0;
    let t = replay.times()[0];
    assert!(close(t.first_token, prefill / 1000.0), "{t:?}");
    assert!(close(t.finished, (prefill + decode) / 1000.0), "{t:?}");
}

#[test]
fn requests_out_of_arrival_order_or_bad_terms_are_refused() {
    let config = common::config(|_| {});
    let late_first = vec![request("a", 1.0, 10, 1), request("b", 0.5, 10, 1)];
    let e = Replay::new(config.clone(), cost(&[]), late_first, OPTIONS).err().expect("refused");
    assert!(e.to_string().contains("arrival order"), "{e}");
    let e = Replay::new(config, cost(&[("kv_block_ms", f64::NAN)]), Vec::new(), OPTIONS).err().expect("refused");
    assert!(e.to_string().contains("kv_block_ms"), "{e}");
    // A diffusion LLM: the replay's model samples, it does not denoise.
    let diffusion = common::config(|p| {
        p.num_sampled_tokens_per_step = 0;
        p.num_speculative_tokens = 4;
    });
    let e = Replay::new(diffusion, cost(&[]), vec![request("a", 0.0, 10, 1)], OPTIONS).err().expect("refused");
    assert!(e.to_string().contains("diffusion LLM"), "{e}");
}

#[test]
fn drafts_are_accepted_at_the_acceptance_rate() {
    let model = TokenModel::new(7, 32000, 0.7);
    let key = model.request_key("r");
    let hits = (0..20_000).filter(|&i| model.proposal(key, i) == model.target(key, i)).count();
    assert!((13_600..14_400).contains(&hits), "{hits} of 20,000 accepted");
    let never = TokenModel::new(7, 32000, 0.0);
    assert!((0..1000).all(|i| never.proposal(key, i) != never.target(key, i)));
}
