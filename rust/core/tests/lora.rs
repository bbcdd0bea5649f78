//! LoRA adapters: vLLM's `max_loras` rule in the waiting loop, the adapter in every block
//! hash, the step's adapter set.

mod common;

use common::*;
use llmsched_core::{CoreError, NewRequest, RequestStatus, Scheduler, Step};

fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

fn under(id: &str, prompt_len: usize, lora_id: Option<i64>) -> NewRequest {
    NewRequest { lora_id, ..request(id, prompt_len, 4) }
}

fn waiting(sched: &Scheduler) -> Vec<String> {
    sched.waiting_ids().iter().map(|id| id.to_string()).collect()
}

#[test]
fn a_request_under_a_further_adapter_waits_without_blocking_the_others() {
    let mut sched = Scheduler::new(config(|p| p.max_loras = 1)).unwrap();
    sched.add_request(under("a1", 8, Some(1))).unwrap();
    sched.add_request(under("b2", 8, Some(2))).unwrap();
    sched.add_request(under("c1", 8, Some(1))).unwrap();
    sched.add_request(under("d", 8, None)).unwrap();
    sched.add_request(under("e2", 8, Some(2))).unwrap();
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step), ["a1", "c1", "d"]);
    assert_eq!(step.lora_ids, [1]);
    // Set aside in this step, they keep their places at the front, in order, and count
    // as skipped waiting requests until admitted or finished.
    assert_eq!(waiting(&sched), ["b2", "e2"]);
    assert_eq!(sched.num_skipped_waiting(), 2);
    sched.finish_requests(Some(&["e2"]), RequestStatus::FinishedAborted).unwrap();
    assert_eq!(sched.num_skipped_waiting(), 1);
    sched.check_invariants().unwrap();
}

#[test]
fn a_skipped_request_stays_skipped_until_admitted() {
    let mut sched = Scheduler::new(config(|p| p.max_loras = 1)).unwrap();
    sched.add_request(under("a1", 8, Some(1))).unwrap();
    sched.add_request(under("b2", 8, Some(2))).unwrap();
    let step = sched.schedule();
    assert_eq!(sched.num_skipped_waiting(), 1);
    // Further steps consider it again (and set it aside again): still one.
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["a1"]);
    assert_eq!(sched.num_skipped_waiting(), 1);
    sched.check_invariants().unwrap();
    // a1 runs to its end; b2 is admitted and no longer skipped.
    let mut step = step;
    while !step.req_handles.is_empty() && ids(&sched, &step) == ["a1"] {
        let (tokens, counts) = sample(&sched, &step, false);
        apply(&mut sched, &step, &tokens, &counts);
        step = sched.schedule();
    }
    assert_eq!(ids(&sched, &step), ["b2"]);
    assert_eq!(sched.num_skipped_waiting(), 0);
    sched.check_invariants().unwrap();
}

#[test]
fn running_requests_hold_their_adapter_until_they_leave() {
    let mut sched = Scheduler::new(config(|p| p.max_loras = 1)).unwrap();
    sched.add_request(NewRequest { lora_id: Some(1), ..request("a1", 8, 2) }).unwrap();
    let step = sched.schedule();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    sched.add_request(under("b2", 8, Some(2))).unwrap();
    // a1 decodes; b2's adapter is a second one.
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step), ["a1"]);
    let (tokens, counts) = sample(&sched, &step, false);
    let events = apply(&mut sched, &step, &tokens, &counts);
    assert!(events.iter().any(|e| e.status == RequestStatus::FinishedLengthCapped));
    // a1 finished: its adapter's slot is free.
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step), ["b2"]);
    assert_eq!(step.lora_ids, [2]);
}

#[test]
fn max_loras_adapters_run_together() {
    let mut sched = Scheduler::new(config(|p| p.max_loras = 2)).unwrap();
    for (id, lora) in [("a1", 1), ("b2", 2), ("c3", 3), ("d2", 2), ("e1", 1)] {
        sched.add_request(under(id, 8, Some(lora))).unwrap();
    }
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step), ["a1", "b2", "d2", "e1"]);
    assert_eq!(step.lora_ids, [1, 2]);
    assert_eq!(waiting(&sched), ["c3"]);
}

#[test]
fn requests_under_different_adapters_never_share_blocks() {
    let mut sched = Scheduler::new(config(|p| {
        p.max_loras = 2;
        p.enable_prefix_caching = true;
        p.block_size = 4;
    }))
    .unwrap();
    // The same 12-token prompt under adapter 1, then under 1, 2 and none.
    sched.add_request(under("first", 12, Some(1))).unwrap();
    let step = sched.schedule();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    for (id, lora, hit) in [("same", Some(1), 8), ("other", Some(2), 0), ("plain", None, 0)] {
        let h = sched.add_request(under(id, 12, lora)).unwrap();
        let request = sched.request(h).unwrap();
        assert_eq!(sched.prefix_cache_hit_tokens(request), hit, "{id}");
    }
}

#[test]
fn an_adapter_needs_lora_on_and_a_positive_id() {
    let mut off = Scheduler::new(config(|_| {})).unwrap();
    let before = off.debug_snapshot();
    match off.add_request(under("x", 4, Some(1))) {
        Err(CoreError::InvalidRequest { field, value, reason }) => {
            assert_eq!((field.as_str(), value.as_str()), ("lora_id", "1"));
            assert!(reason.contains("max_loras=0"), "{reason}");
        }
        other => panic!("expected an invalid lora_id, got {other:?}"),
    }
    assert_eq!(off.debug_snapshot(), before);
    let mut on = Scheduler::new(config(|p| p.max_loras = 1)).unwrap();
    for bad in [0, -1, 1 << 31] {
        assert!(matches!(
            on.add_request(under("x", 4, Some(bad))),
            Err(CoreError::InvalidRequest { ref field, .. }) if field == "lora_id"
        ));
    }
    assert_eq!(on.add_request(under("x", 4, Some(i32::MAX as i64))).map(|_| ()), Ok(()));
}

#[test]
fn without_lora_the_step_names_no_adapter() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(request("a", 4, 2)).unwrap();
    assert!(sched.schedule().lora_ids.is_empty());
}
