//! Streaming-input sessions (vLLM's resumable requests): a stop ends the session's input,
//! not the request; it keeps the KV of its kept tokens and waits for its next input
//! (`WaitingForStreamingReq`, holding a runner slot) or takes up the next one already
//! added; the end of the session is an input that is not resumable.

mod common;

use common::*;
use llmsched_core::{CoreError, NewRequest, RequestStatus, Scheduler, SessionInputAdded, Step};

fn session(id: &str, prompt_len: usize, max_tokens: i64) -> NewRequest {
    NewRequest { resumable: true, ..request(id, prompt_len, max_tokens) }
}

/// The session's next input: `tokens`, up to `max_tokens` more.
fn input(id: &str, tokens: &[i64], max_tokens: i64) -> NewRequest {
    NewRequest { resumable: true, ..NewRequest::new(id, tokens.to_vec(), max_tokens) }
}

fn ids(sched: &Scheduler, handles: &[llmsched_core::Handle]) -> Vec<String> {
    handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

fn run(sched: &mut Scheduler) -> Step {
    let step = sched.schedule();
    check_step(sched, &step);
    apply_one_token_each(sched, &step);
    step
}

fn status(sched: &Scheduler, id: &str) -> RequestStatus {
    sched.get_request(id).unwrap().status()
}

#[test]
fn a_stopped_session_keeps_its_kv_and_waits_for_input_holding_a_slot() {
    let mut sched = Scheduler::new(config(|p| p.max_num_seqs = 1)).unwrap();
    sched.add_request(session("s", 8, 2)).unwrap();
    let free_at_start = sched.num_free_blocks();
    run(&mut sched);
    let stop = sched.schedule();
    let events = apply(&mut sched, &stop, &[7], &[1]);
    // The stop is reported with its status (the finish reason of this input) ...
    assert_eq!(events[0].status, RequestStatus::FinishedLengthCapped);
    // ... but the request goes on, holding the KV of all but its last sampled token.
    let s = sched.get_request("s").unwrap();
    assert_eq!(s.status(), RequestStatus::WaitingForStreamingReq);
    assert_eq!((s.num_tokens(), s.num_computed_tokens()), (10, 9));
    assert!(!s.block_ids().is_empty());
    assert!(sched.num_free_blocks() < free_at_start);
    assert_eq!(sched.num_waiting_for_streaming_input(), 1);
    assert_eq!(sched.num_skipped_waiting(), 1);
    assert_eq!(sched.get_request_counts(), (0, 1));
    // Nothing to schedule for it: an engine may idle.
    assert_eq!(sched.get_num_unfinished_requests(), 0);
    sched.check_invariants().unwrap();

    // Its runner slot stays taken: with max_num_seqs=1 nothing else is admitted.
    sched.add_request(request("other", 8, 2)).unwrap();
    let step = sched.schedule();
    assert!(step.is_empty());
    assert!(step.finished.is_empty(), "the session did not finish");
    sched.check_invariants().unwrap();
}

#[test]
fn the_next_input_extends_the_kept_tokens_and_runs_as_a_new_request_from_the_kept_kv() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(session("s", 8, 2)).unwrap();
    run(&mut sched);
    run(&mut sched);
    let table = sched.get_request("s").unwrap().block_ids().to_vec();
    let added = sched.add_request_or_input(input("s", &[500, 501, 502], 3)).unwrap().1;
    assert_eq!(added, Some(SessionInputAdded::TakenUp));
    let s = sched.get_request("s").unwrap();
    assert_eq!(s.status(), RequestStatus::Waiting);
    assert_eq!(sched.num_waiting_for_streaming_input(), 0);
    // Every output token but the last sampled one joins the prompt, then the input.
    let mut expected: Vec<i32> = (1..=8).collect();
    expected.extend([7, 500, 501, 502]);
    assert_eq!(s.prompt_token_ids(), &expected[..]);
    assert_eq!((s.num_tokens(), s.num_computed_tokens(), s.max_tokens()), (12, 9, 3));
    sched.check_invariants().unwrap();

    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step.new_reqs), ["s"]);
    assert_eq!((step.num_computed_tokens[0], step.num_scheduled_tokens[0]), (9, 3));
    assert_eq!(step.all_token_ids, expected);
    assert_eq!(&step.block_ids[..table.len()], &table.iter().map(|&b| b as i32).collect::<Vec<_>>()[..]);
    apply_one_token_each(&mut sched, &step);
    run(&mut sched);
    let last = run(&mut sched);
    assert_eq!(last.len(), 1);
    assert_eq!(status(&sched, "s"), RequestStatus::WaitingForStreamingReq);
    assert_eq!(sched.get_request("s").unwrap().num_tokens(), 15);
}

#[test]
fn an_input_added_while_the_session_runs_is_taken_up_at_its_stop() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(session("s", 8, 2)).unwrap();
    run(&mut sched);
    let added = sched.add_request_or_input(input("s", &[600, 601], 4)).unwrap().1;
    assert_eq!(added, Some(SessionInputAdded::Queued));
    assert_eq!(sched.get_request("s").unwrap().num_queued_inputs(), 1);
    let stop = run(&mut sched);
    assert!(stop.finished.is_empty());
    let s = sched.get_request("s").unwrap();
    assert_eq!(s.status(), RequestStatus::Waiting);
    assert_eq!((s.num_tokens(), s.num_computed_tokens(), s.num_inputs_taken()), (11, 9, 1));
    // Back with the requests that hold KV, and not set aside: the next step runs it.
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step.new_reqs), ["s"]);
    assert_eq!(step.num_scheduled_tokens, [2]);
    sched.check_invariants().unwrap();
}

#[test]
fn the_end_of_the_session_finishes_it_queued_or_while_it_waits() {
    // Queued: the session finishes at its stop, with the stop's status.
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(session("s", 8, 2)).unwrap();
    let free_at_start = sched.num_free_blocks();
    run(&mut sched);
    sched.add_request(request("s", 1, 1)).unwrap();
    run(&mut sched);
    assert!(sched.get_request("s").is_err());
    let step = sched.schedule();
    assert_eq!(step.finished.len(), 1);
    assert_eq!(sched.num_free_blocks(), free_at_start);

    // While it waits for input: it finishes now, aborted.
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    sched.add_request(session("s", 8, 1)).unwrap();
    run(&mut sched);
    assert_eq!(status(&sched, "s"), RequestStatus::WaitingForStreamingReq);
    let added = sched.add_request_or_input(request("s", 1, 1)).unwrap().1;
    assert_eq!(added, Some(SessionInputAdded::Finished));
    assert_eq!(sched.take_last_finished()[0].status(), RequestStatus::FinishedAborted);
    assert_eq!((sched.num_waiting_for_streaming_input(), sched.num_skipped_waiting()), (0, 0));
    assert_eq!(sched.num_free_blocks(), free_at_start);
    sched.check_invariants().unwrap();
}

#[test]
fn an_abort_of_a_waiting_session_frees_its_kv_and_its_slot() {
    let mut sched = Scheduler::new(config(|p| p.max_num_seqs = 1)).unwrap();
    sched.add_request(session("s", 8, 1)).unwrap();
    let free_at_start = sched.num_free_blocks();
    run(&mut sched);
    sched.add_request(request("other", 8, 1)).unwrap();
    sched.finish_requests(Some(&["s"]), RequestStatus::FinishedAborted).unwrap();
    assert_eq!(sched.num_waiting_for_streaming_input(), 0);
    assert_eq!(sched.num_free_blocks(), free_at_start);
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step.new_reqs), ["other"]);
    sched.check_invariants().unwrap();
}

#[test]
fn with_a_step_in_flight_the_stop_drops_its_work_and_keeps_the_confirmed_kv() {
    let mut sched = Scheduler::new(config(|p| p.async_scheduling = true)).unwrap();
    sched.add_request(NewRequest { eos_token_id: Some(9), ..session("s", 8, 10) }).unwrap();
    let first = sched.schedule();
    let second = sched.schedule();
    apply(&mut sched, &first, &[7], &[1]);
    let third = sched.schedule();
    // The second step's token stops it; the third, in flight, is its finished input's.
    apply(&mut sched, &second, &[9], &[1]);
    let s = sched.get_request("s").unwrap();
    assert_eq!(s.status(), RequestStatus::WaitingForStreamingReq);
    assert_eq!((s.num_tokens(), s.num_computed_tokens(), s.num_output_placeholders()), (10, 9, 0));
    assert!(s.drop_stale_output());
    assert_eq!(s.num_stale_output_tokens(), 1);
    sched.check_invariants().unwrap();
    // The in-flight step's token is dropped, not appended to the session.
    let events = apply(&mut sched, &third, &[9], &[1]);
    assert!(events.is_empty());
    assert_eq!(sched.get_request("s").unwrap().num_tokens(), 10);
    sched.check_invariants().unwrap();
}

#[test]
fn bad_inputs_are_refused_and_change_nothing() {
    let mut sched = Scheduler::new(config(|p| p.max_model_len = 64)).unwrap();
    sched.add_request(request("plain", 8, 2)).unwrap();
    // Under a live request's id that is not a session: a duplicate.
    let err = sched.add_request(input("plain", &[1], 1)).unwrap_err();
    assert!(matches!(err, CoreError::DuplicateRequest { .. }), "{err}");

    sched.add_request(session("s", 8, 1)).unwrap();
    run(&mut sched);
    run(&mut sched);
    assert_eq!(status(&sched, "s"), RequestStatus::WaitingForStreamingReq);
    let before = format!("{:?}", sched.get_request("s").unwrap());
    let too_long: Vec<i64> = vec![3; 60];
    let err = sched.add_request(input("s", &too_long, 1)).unwrap_err();
    assert!(err.to_string().contains("prompt_token_ids"), "{err}");
    let err = sched.add_request(input("s", &[], 1)).unwrap_err();
    assert!(err.to_string().contains("prompt_token_ids"), "{err}");
    let err = sched.add_request(input("s", &[1], 0)).unwrap_err();
    assert!(err.to_string().contains("max_tokens"), "{err}");
    assert_eq!(format!("{:?}", sched.get_request("s").unwrap()), before);
    assert_eq!(sched.num_waiting_for_streaming_input(), 1);
    sched.check_invariants().unwrap();
}

#[test]
fn a_session_recomputing_its_kv_rehashes_its_tokens_under_lookahead_hashes() {
    // Blocks of 4 whose hashes cover the next token: the session's first input stops at
    // N = 9, so its kept 8 tokens fill two blocks, the second's hash covering the sampled
    // token the next input discards.
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = 4;
        p.enable_prefix_caching = true;
        p.num_hash_lookahead_tokens = 1;
    }))
    .unwrap();
    sched.add_request(session("s", 7, 2)).unwrap();
    run(&mut sched);
    run(&mut sched);
    let stale = sched.get_request("s").unwrap().block_hashes().to_vec();
    sched.add_request(input("s", &[500, 501, 502], 2)).unwrap();
    // Resident KV keeps the stale hash (as vLLM does) ...
    assert_eq!(sched.get_request("s").unwrap().block_hashes()[..2], stale[..2]);
    // ... recomputed KV is hashed from the current tokens.
    let step = sched.schedule();
    apply_one_token_each(&mut sched, &step);
    assert!(sched.reset_prefix_cache(true));
    let tokens: Vec<i64> = sched.get_request("s").unwrap().all_token_ids().map(i64::from).collect();
    let probe = NewRequest::new("probe", tokens, 1);
    sched.schedule();
    let fresh = {
        let mut other = Scheduler::new(sched.config().clone()).unwrap();
        other.add_request(probe).unwrap();
        other.get_request("probe").unwrap().block_hashes().to_vec()
    };
    let rehashed = sched.get_request("s").unwrap().block_hashes().to_vec();
    assert_ne!(stale[1], fresh[1]);
    assert_eq!(rehashed, fresh);
    sched.check_invariants().unwrap();
}

#[test]
fn a_session_wedged_behind_a_request_that_needs_its_blocks_runs_first() {
    // One runner slot, 13 usable blocks of 4 tokens, no chunking: "big" (49 tokens, 13
    // blocks; arriving with its first token computed, a disaggregated decode's, so it waits
    // with the requests that hold KV) can run only in an empty pool.
    let mut sched = Scheduler::new(config(|p| {
        p.max_model_len = 50;
        p.max_num_seqs = 1;
        p.block_size = 4;
        p.num_gpu_blocks = 14;
        p.enable_chunked_prefill = false;
        p.max_num_batched_tokens = 64;
    }))
    .unwrap();
    sched.add_request(NewRequest { stop_token_ids: vec![27], ..session("s", 30, 40) }).unwrap();
    let step = sched.schedule();
    apply(&mut sched, &step, &[9], &[1]);
    sched.add_request(NewRequest { num_computed_tokens: 1, ..request("big", 49, 1) }).unwrap();
    sched.add_request(input("s", &[5, 6, 7], 2)).unwrap();
    // s stops: it takes up its input and waits behind big, keeping 8 blocks big needs.
    let step = sched.schedule();
    assert_eq!(step.len(), 1);
    apply(&mut sched, &step, &[27], &[1]);
    assert_eq!(sched.waiting_ids().iter().map(|id| id.to_string()).collect::<Vec<_>>(), ["big", "s"]);
    sched.check_invariants().unwrap();
    // Nothing runs and big cannot fit: s, behind it, can run, and goes first (vLLM stops at
    // big every step: nothing would ever run).
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step.new_reqs), ["s"]);
    assert_eq!((step.num_computed_tokens[0], step.num_scheduled_tokens[0]), (31, 3));
    apply_one_token_each(&mut sched, &step);
    run(&mut sched);
    // Its input done, s waits for the next holding its KV: big waits for the client.
    assert_eq!(status(&sched, "s"), RequestStatus::WaitingForStreamingReq);
    assert!(sched.schedule().is_empty());
    // The session ends: big runs.
    sched.add_request(request("s", 1, 1)).unwrap();
    let step = sched.schedule();
    assert_eq!(ids(&sched, &step.new_reqs), ["big"]);
}

#[test]
fn sessions_are_refused_where_they_cannot_be_served() {
    // A pooling model samples nothing that could stop an input.
    let mut pooling = Scheduler::new(config(|p| p.num_sampled_tokens_per_step = 0)).unwrap();
    let err = pooling.add_request(session("s", 8, 1)).unwrap_err();
    assert!(err.to_string().contains("resumable") && err.to_string().contains("pooling"), "{err}");
    // Mamba state under async scheduling cannot roll back with the stop.
    let mut mamba = Scheduler::new(config(|p| {
        p.async_scheduling = true;
        p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("mamba,full").unwrap();
    }))
    .unwrap();
    let err = mamba.add_request(session("s", 8, 1)).unwrap_err();
    assert!(err.to_string().contains("Mamba"), "{err}");
    assert_eq!(mamba.num_live_requests(), 0);
    // Synchronous, it is served.
    let mut sync = Scheduler::new(config(|p| {
        p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("mamba,full").unwrap();
    }))
    .unwrap();
    sync.add_request(session("s", 8, 1)).unwrap();
    run(&mut sync);
    assert_eq!(status(&sync, "s"), RequestStatus::WaitingForStreamingReq);
}

#[test]
fn a_later_input_cannot_carry_prompt_embeddings() {
    // Its keys would enter no hash: the session's prompts are token ids (its first too).
    let mut sched = Scheduler::new(config(|p| p.max_model_len = 64)).unwrap();
    sched.add_request(session("s", 8, 1)).unwrap();
    run(&mut sched);
    run(&mut sched);
    assert_eq!(status(&sched, "s"), RequestStatus::WaitingForStreamingReq);
    let before = format!("{:?}", sched.get_request("s").unwrap());
    let embedded = NewRequest { prompt_embeds_keys: vec![b"k".to_vec()], ..input("s", &[0, 0], 1) };
    match sched.add_request(embedded) {
        Err(CoreError::InvalidRequest { field, reason, .. }) => {
            assert_eq!(field, "prompt_embeds_keys");
            assert!(reason.contains("token ids"), "{reason}");
        }
        other => panic!("expected the keys refused, got {other:?}"),
    }
    assert_eq!(format!("{:?}", sched.get_request("s").unwrap()), before);
    sched.check_invariants().unwrap();
}
