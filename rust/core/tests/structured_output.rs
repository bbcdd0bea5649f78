//! Structured output: a request waits for its grammar without blocking the others, is
//! admitted once the grammar compiled, fails (FinishedError) at the next
//! `finish_failed_grammars` once a waiting loop saw its grammar fail; steps name the rows a
//! grammar constrains.

mod common;

use common::*;
use llmsched_core::{CoreError, NewRequest, RequestRef, RequestStatus, Scheduler, Step};

fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

fn run(sched: &mut Scheduler, step: &Step) {
    let (tokens, counts) = sample(sched, step, false);
    apply(sched, step, &tokens, &counts);
}

fn structured(id: &str, prompt_len: usize, max_tokens: i64) -> NewRequest {
    NewRequest { structured_output: true, ..request(id, prompt_len, max_tokens) }
}

fn status(sched: &Scheduler, id: &str) -> RequestStatus {
    sched.get_request(id).unwrap().status()
}

#[test]
fn a_request_waits_for_its_grammar_without_blocking_the_others() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(structured("g", 8, 4)).unwrap();
    sched.add_request(request("plain", 8, 4)).unwrap();
    assert_eq!(status(&sched, "g"), RequestStatus::WaitingForStructuredOutputGrammar);
    // Blocked from the start: a skipped waiting request, as vLLM counts it.
    assert_eq!(sched.num_skipped_waiting(), 1);

    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["plain"]);
    assert_eq!(status(&sched, "g"), RequestStatus::WaitingForStructuredOutputGrammar);
    assert_eq!(sched.waiting_ids().iter().map(|id| id.to_string()).collect::<Vec<_>>(), ["g"]);
    sched.check_invariants().unwrap();
    run(&mut sched, &step);

    sched.resolve_grammar(RequestRef::Id("g"), true).unwrap();
    // Reported, not yet acted on: the waiting loop promotes it when it reaches it.
    assert_eq!(status(&sched, "g"), RequestStatus::WaitingForStructuredOutputGrammar);
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["plain", "g"]);
    assert_eq!(status(&sched, "g"), RequestStatus::Running);
    assert_eq!(sched.num_skipped_waiting(), 0);
    sched.check_invariants().unwrap();
}

#[test]
fn waiting_requests_keep_their_order_behind_a_blocked_one() {
    let mut sched = Scheduler::new(config(|p| p.max_num_seqs = 1)).unwrap();
    sched.add_request(structured("g", 8, 2)).unwrap();
    sched.add_request(request("a", 8, 2)).unwrap();
    sched.add_request(request("b", 8, 2)).unwrap();
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["a"]);
    // Set aside in this step, g goes back to the front, before b.
    let waiting: Vec<String> = sched.waiting_ids().iter().map(|id| id.to_string()).collect();
    assert_eq!(waiting, ["g", "b"]);
}

#[test]
fn a_failed_grammar_fails_its_request_once_a_waiting_loop_saw_it() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(structured("bad", 8, 4)).unwrap();
    sched.add_request(request("plain", 8, 4)).unwrap();
    let free_before = sched.num_free_blocks();
    sched.resolve_grammar(RequestRef::Id("bad"), false).unwrap();
    // Not seen by a waiting loop yet: nothing to fail.
    assert!(sched.finish_failed_grammars().is_empty());
    assert_eq!(status(&sched, "bad"), RequestStatus::WaitingForStructuredOutputGrammar);

    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["plain"]);
    // Seen again by a second loop before the update: failed once all the same.
    run(&mut sched, &step);
    let step = sched.schedule();
    let failed: Vec<String> = sched.finish_failed_grammars().into_iter().map(|(_, id)| id.to_string()).collect();
    assert_eq!(failed, ["bad"]);
    assert!(sched.finish_failed_grammars().is_empty());
    let finals = sched.take_last_finished();
    assert_eq!(finals.len(), 1);
    assert_eq!(finals[0].status(), RequestStatus::FinishedError);
    assert!(sched.get_request("bad").is_err());
    run(&mut sched, &step);
    let next = sched.schedule();
    let finished: Vec<String> = next.finished.iter().map(|(_, id)| id.to_string()).collect();
    assert_eq!(finished, ["bad"]);
    sched.check_invariants().unwrap();
    // It never held a block: "plain" holds what is missing.
    let held: usize = sched.get_request("plain").unwrap().block_ids().len();
    assert_eq!(sched.num_free_blocks() + held, free_before);
}

#[test]
fn an_aborted_request_is_not_failed_for_its_grammar_later() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(structured("bad", 8, 4)).unwrap();
    sched.resolve_grammar(RequestRef::Id("bad"), false).unwrap();
    sched.schedule();
    sched.finish_requests(Some(&["bad"]), RequestStatus::FinishedAborted).unwrap();
    assert!(sched.finish_failed_grammars().is_empty());
    sched.check_invariants().unwrap();
}

#[test]
fn resolving_a_grammar_twice_or_of_a_plain_request_is_an_error_that_changes_nothing() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(structured("g", 8, 4)).unwrap();
    sched.add_request(request("plain", 8, 4)).unwrap();
    sched.resolve_grammar(RequestRef::Id("g"), true).unwrap();
    let again = sched.resolve_grammar(RequestRef::Id("g"), false).unwrap_err();
    assert!(matches!(again, CoreError::InvalidRequest { .. }), "{again}");
    assert!(again.to_string().contains("already resolved"), "{again}");
    let plain = sched.resolve_grammar(RequestRef::Id("plain"), true).unwrap_err();
    assert!(plain.to_string().contains("does not use structured output"), "{plain}");
    let unknown = sched.resolve_grammar(RequestRef::Id("nobody"), true).unwrap_err();
    assert!(matches!(unknown, CoreError::UnknownRequest { .. }), "{unknown}");
    // The first report stands: g is admitted.
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step), ["g", "plain"]);
}

#[test]
fn the_rows_a_grammar_constrains_exclude_prefill_chunks() {
    // A 40-token prompt in chunks of 16: constrained only from the chunk that completes it.
    let mut sched = Scheduler::new(config(|p| {
        p.max_num_batched_tokens = 16;
        p.max_num_seqs = 4;
    }))
    .unwrap();
    sched.add_request(structured("g", 40, 4)).unwrap();
    sched.resolve_grammar(RequestRef::Id("g"), true).unwrap();
    let mut rows_per_step = Vec::new();
    for _ in 0..5 {
        let step = sched.schedule();
        rows_per_step.push(step.structured_output_rows.clone());
        assert!(!step.pending_structured_output_tokens);
        run(&mut sched, &step);
    }
    assert_eq!(rows_per_step, [vec![], vec![], vec![0], vec![0], vec![0]]);
}

#[test]
fn async_steps_mark_rows_awaiting_an_earlier_output_as_pending() {
    let mut sched = Scheduler::new(config(|p| p.async_scheduling = true)).unwrap();
    sched.add_request(request("plain", 8, 8)).unwrap();
    sched.add_request(structured("g", 8, 8)).unwrap();
    sched.resolve_grammar(RequestRef::Id("g"), true).unwrap();
    let first = sched.schedule();
    assert_eq!(ids(&sched, &first), ["plain", "g"]);
    assert_eq!(first.structured_output_rows, [1]);
    assert!(!first.pending_structured_output_tokens);
    // The second step is decided before the first one's output arrives: g's token from
    // step 1 is still a placeholder.
    let second = sched.schedule();
    assert_eq!(second.structured_output_rows, [1]);
    assert!(second.pending_structured_output_tokens);
    run(&mut sched, &first);
    run(&mut sched, &second);
    let third = sched.schedule();
    assert!(!third.pending_structured_output_tokens);
    sched.check_invariants().unwrap();
}
