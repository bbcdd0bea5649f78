//! A finished request's final record: kept by the call that finished it, for a caller
//! that mirrors requests (vLLM's `Request` objects) to read once, then dropped.

mod common;

use common::*;
use llmsched_core::{RequestStatus, Scheduler};

fn outputs(sched: &mut Scheduler) -> Vec<(String, RequestStatus, Vec<i32>, i64)> {
    sched
        .take_last_finished()
        .iter()
        .map(|r| (r.id().to_string(), r.status(), r.output_token_ids().collect(), r.num_computed_tokens()))
        .collect()
}

#[test]
fn a_request_that_stops_leaves_its_final_record_with_the_update() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(request("short", 8, 2)).unwrap();
    sched.add_request(request("long", 8, 5)).unwrap();
    let mut finished = Vec::new();
    for _ in 0..3 {
        let step = sched.schedule();
        let (tokens, counts) = sample(&sched, &step, false);
        apply(&mut sched, &step, &tokens, &counts);
        finished.push(outputs(&mut sched));
    }
    // "short" stops at its second output token: C counts the prompt and the token before
    // the sampled one.
    assert_eq!(finished[0], []);
    assert_eq!(finished[1], [("short".to_string(), RequestStatus::FinishedLengthCapped, vec![7, 7], 9)]);
    assert_eq!(finished[2], []);
    // Its blocks went back to the pool, and it is no longer live.
    assert!(sched.get_request("short").is_err());
}

#[test]
fn an_abort_leaves_the_records_of_what_it_finished() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    for id in ["a", "b", "c"] {
        sched.add_request(request(id, 8, 4)).unwrap();
    }
    let step = sched.schedule();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    let finished = sched.finish_requests(Some(&["c", "a", "nobody"]), RequestStatus::FinishedAborted).unwrap();
    assert_eq!(finished.iter().map(|id| &**id).collect::<Vec<_>>(), ["c", "a"]);
    let records = sched.take_last_finished();
    let summary: Vec<_> = records.iter().map(|r| (&**r.id(), r.status(), r.block_ids().len())).collect();
    assert_eq!(summary, [("c", RequestStatus::FinishedAborted, 0), ("a", RequestStatus::FinishedAborted, 0)]);
    assert_eq!(records[0].output_token_ids().collect::<Vec<_>>(), [7]);
    // Taken once: nothing is left.
    assert!(sched.take_last_finished().is_empty());
}

#[test]
fn records_nobody_takes_are_dropped_by_the_next_finishing_call() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(request("a", 8, 4)).unwrap();
    sched.add_request(request("b", 8, 4)).unwrap();
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    // The next call that may finish requests replaces them, even when it finishes none.
    sched.finish_requests(Some(&["nobody"]), RequestStatus::FinishedAborted).unwrap();
    assert!(sched.take_last_finished().is_empty());
    sched.finish_requests(Some(&["b"]), RequestStatus::FinishedAborted).unwrap();
    let step = sched.schedule();
    assert!(step.is_empty());
    // A schedule() finishes nothing and keeps them; only an update or an abort replaces them.
    assert_eq!(sched.take_last_finished().len(), 1);
}
