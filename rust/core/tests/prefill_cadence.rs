//! vLLM's prefill cadence (`prefill_schedule_interval`) and throttled steps
//! (`throttle_prefills`): while a request decodes, prefill waits for its step.

mod common;

use common::*;
use llmsched_core::{Scheduler, Step};

fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

fn run(sched: &mut Scheduler, step: &Step) {
    let (tokens, counts) = sample(sched, step, false);
    apply(sched, step, &tokens, &counts);
}

/// "a" decodes from the second step on; "b" arrives then.
fn decoding_with_a_newcomer(interval: i64) -> Scheduler {
    let mut sched = Scheduler::new(config(|p| p.prefill_schedule_interval = interval)).unwrap();
    sched.add_request(request("a", 8, 50)).unwrap();
    let step = sched.schedule();
    run(&mut sched, &step);
    sched.add_request(request("b", 8, 50)).unwrap();
    sched
}

#[test]
fn prefill_waits_for_the_interval_since_the_last_prefill_step() {
    let mut sched = decoding_with_a_newcomer(3);
    // Step 1 carried a's prefill: steps 2 and 3 decode alone, step 4 admits b.
    let mut admitted_at = None;
    for executed in 2..=4 {
        let step = sched.schedule();
        check_step(&sched, &step);
        if ids(&sched, &step).contains(&"b".to_string()) {
            admitted_at = Some(executed);
            break;
        }
        assert_eq!(ids(&sched, &step), ["a"]);
        run(&mut sched, &step);
    }
    assert_eq!(admitted_at, Some(4));
    sched.check_invariants().unwrap();
}

#[test]
fn an_interval_of_one_never_holds_prefill() {
    let mut sched = decoding_with_a_newcomer(1);
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["a", "b"]);
}

#[test]
fn a_throttled_step_carries_no_prefill_while_a_request_decodes() {
    let mut sched = decoding_with_a_newcomer(1);
    let step = sched.schedule_throttled(true);
    assert_eq!(ids(&sched, &step), ["a"]);
    run(&mut sched, &step);
    // The step after admits: throttling is the caller's, step by step.
    let step = sched.schedule_throttled(false);
    assert_eq!(ids(&sched, &step), ["a", "b"]);
}

#[test]
fn nothing_is_held_without_a_decoding_request() {
    // No request decodes yet: the first prompt is never held, throttled or not.
    let mut sched = Scheduler::new(config(|p| p.prefill_schedule_interval = 5)).unwrap();
    sched.add_request(request("a", 8, 4)).unwrap();
    let step = sched.schedule_throttled(true);
    assert_eq!(ids(&sched, &step), ["a"]);
}

#[test]
fn a_backlog_left_by_the_last_prefill_step_releases_the_hold() {
    // One sequence slot at a time past a: after b's admission step, c is still waiting (not
    // set aside), so the cadence lets the next step admit again.
    let mut sched = Scheduler::new(config(|p| {
        p.prefill_schedule_interval = 4;
        p.max_num_seqs = 2;
        p.max_num_batched_tokens = 16;
    }))
    .unwrap();
    sched.add_request(request("a", 8, 50)).unwrap();
    let step = sched.schedule();
    run(&mut sched, &step);
    sched.add_request(request("b", 8, 1)).unwrap();
    sched.add_request(request("c", 8, 50)).unwrap();
    // a decodes and the cadence holds b and c; then b is admitted with c left behind
    // (a full batch), and b finishes at once.
    let mut steps = Vec::new();
    for _ in 0..5 {
        let step = sched.schedule();
        check_step(&sched, &step);
        steps.push(ids(&sched, &step));
        run(&mut sched, &step);
    }
    let b_at = steps.iter().position(|s| s.contains(&"b".to_string())).unwrap();
    let c_at = steps.iter().position(|s| s.contains(&"c".to_string())).unwrap();
    assert_eq!(steps[..b_at], vec![vec!["a".to_string()]; b_at][..]);
    // Capacity-bound: c is admitted the step after b finished, not an interval later.
    assert_eq!(c_at, b_at + 1, "steps: {steps:?}");
}
