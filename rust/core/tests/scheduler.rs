mod common;

use common::*;
use std::collections::{HashMap, VecDeque};

use llmsched_core::limits::MAX_STOP_TOKEN_IDS;
use llmsched_core::{NewRequest, RequestStatus, Scheduler};

fn ids(sched: &Scheduler, step: &llmsched_core::Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

#[test]
fn schedules_every_prompt_in_full_in_arrival_order() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    for i in 0..10 {
        sched.add_request(request(&i.to_string(), 10, 16)).unwrap();
    }
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(step.num_scheduled_tokens, vec![10; 10]);
    assert_eq!(ids(&sched, &step), (0..10).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(step.new_reqs.len(), 10);
    assert_eq!(sched.get_request_counts(), (10, 0));
}

/// The seed boundary (vLLM #53962): a one-token step at C = M - 1 - K is not
/// padded, at C = M - 2 - K it is.
#[test]
fn padding_needs_room_for_the_sampled_token() {
    for async_scheduling in [false, true] {
        for k in [1i64, 3] {
            for (offset, padded) in [(1, false), (2, true)] {
                let m = 2048;
                let mut sched = at_the_padding_edge(m, k, offset, async_scheduling);
                sched.add_request(request("behind", 4, 10)).unwrap();
                let step = sched.schedule();
                check_step(&sched, &step);
                let names = ids(&sched, &step);
                let i = names.iter().position(|n| n == "late").expect("late is scheduled");
                assert!(names.contains(&"behind".to_string()), "no head-of-line block");
                let expect_n = if padded { 1 + k } else { 1 };
                assert_eq!(
                    step.num_scheduled_tokens[i] as i64, expect_n,
                    "async={async_scheduling} K={k} offset={offset}"
                );
                assert_eq!(step.num_spec_tokens[i] as i64, if padded { k } else { 0 });
            }
        }
    }
}

#[test]
fn without_padding_a_one_token_admission_stays_one_token() {
    // Dynamic speculative decoding (K follows the batch): vLLM pads nothing.
    for async_scheduling in [false, true] {
        for (pad, expect) in [(true, (4, 3)), (false, (1, 0))] {
            let mut sched = Scheduler::new(config(|p| {
                p.num_speculative_tokens = 3;
                p.async_scheduling = async_scheduling;
                p.pad_spec_decode = pad;
            }))
            .unwrap();
            sched.add_request(request("decoding", 8, 100)).unwrap();
            let step = sched.schedule();
            let (t, c) = sample(&sched, &step, false);
            apply(&mut sched, &step, &t, &c);
            let mut late = request("late", 101, 100);
            late.num_computed_tokens = 100;
            sched.add_request(late).unwrap();
            let step = sched.schedule();
            check_step(&sched, &step);
            let i = ids(&sched, &step).iter().position(|n| n == "late").expect("late is scheduled");
            assert_eq!(
                (step.num_scheduled_tokens[i] as i64, step.num_spec_tokens[i] as i64),
                expect,
                "pad_spec_decode={pad} async={async_scheduling}"
            );
        }
    }
}

#[test]
fn preemption_takes_the_tail_and_blocks_admissions() {
    // 11 blocks (10 usable) of 16 tokens; two 80-token prompts of 5 blocks each.
    let mut sched = Scheduler::new(config(|p| {
        p.num_gpu_blocks = 11;
        p.block_size = 16;
        p.max_num_batched_tokens = 200;
    }))
    .unwrap();
    sched.add_request(request("0", 80, 16)).unwrap();
    sched.add_request(request("1", 80, 16)).unwrap();
    let step = sched.schedule();
    assert_eq!(step.len(), 2);
    let (t, c) = sample(&sched, &step, false);
    apply(&mut sched, &step, &t, &c);
    sched.add_request(request("2", 4, 10)).unwrap();
    // Request 0 needs a sixth block: the tail (request 1) is preempted, nothing is admitted.
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(ids(&sched, &step), vec!["0"]);
    assert_eq!(step.preempted.len(), 1);
    assert_eq!(&*step.preempted[0].1, "1");
    assert_eq!(sched.get_request("1").unwrap().status(), RequestStatus::Preempted);
    assert_eq!(sched.waiting_ids().iter().map(|s| s.to_string()).collect::<Vec<_>>(), vec!["1", "2"]);
}

#[test]
fn stop_conditions_in_vllm_order_and_trim() {
    let mut sched = Scheduler::new(config(|p| p.num_speculative_tokens = 2)).unwrap();
    let mut a = request("eos", 4, 10);
    a.eos_token_id = Some(9);
    let mut b = request("stop", 4, 10);
    b.stop_token_ids = vec![42];
    let c = request("cap", 4, 2);
    // A finished request's record is freed at once: its events are named by their handles.
    let mut names = std::collections::HashMap::new();
    for r in [a, b, c] {
        let id = r.request_id.clone();
        names.insert(sched.add_request(r).unwrap(), id);
    }
    let step = sched.schedule();
    apply(&mut sched, &step, &[1, 1, 1], &[1, 1, 1]);
    sched.update_draft_token_ids(&["eos", "stop", "cap"], &[5, 6, 5, 6, 5, 6], &[2, 2, 2]).unwrap();
    let step = sched.schedule();
    assert_eq!(step.num_scheduled_tokens, vec![3, 3, 3]);
    let events = apply(&mut sched, &step, &[9, 3, 3, 10, 42, 12, 10, 11, 12], &[3, 3, 3]);
    let delivered: Vec<(String, usize, RequestStatus, Option<i32>)> =
        events.iter().map(|e| (names[&e.handle].clone(), e.num_tokens, e.status, e.stop_reason)).collect();
    assert_eq!(
        delivered,
        vec![
            ("eos".into(), 1, RequestStatus::FinishedStopped, None),
            ("stop".into(), 2, RequestStatus::FinishedStopped, Some(42)),
            ("cap".into(), 1, RequestStatus::FinishedLengthCapped, None),
        ]
    );
    assert!(!sched.has_unfinished_requests());
    assert!(sched.has_requests(), "finished ids await the next step");
    let step = sched.schedule();
    assert_eq!(step.finished.len(), 3);
    assert!(!sched.has_requests());
    sched.check_invariants().unwrap();
}

/// vLLM's `test_stop_by_max_tokens`: the async "already done" skip means no
/// step is scheduled whose output could not be used.
#[test]
fn async_total_tokens_are_prompt_plus_max_tokens_minus_one() {
    for max_tokens in [1, 2, 3, 5] {
        let mut sched = Scheduler::new(config(|p| p.async_scheduling = true)).unwrap();
        let mut queue = std::collections::VecDeque::new();
        let first = sched.add_request(request("0", 10, max_tokens)).unwrap();
        queue.push_back(sched.schedule());
        sched.add_request(request("1", 10, max_tokens)).unwrap();
        queue.push_back(sched.schedule());
        let name = |handle| if handle == first { "0" } else { "1" };
        let mut total = 0;
        let mut outputs = std::collections::HashMap::<String, usize>::new();
        while let Some(step) = queue.pop_front() {
            check_step(&sched, &step);
            total += step.total_num_scheduled_tokens;
            let (t, c) = sample(&sched, &step, false);
            for e in apply(&mut sched, &step, &t, &c) {
                *outputs.entry(name(e.handle).to_string()).or_default() += e.num_tokens;
            }
            sched.check_invariants().unwrap();
            let next = sched.schedule();
            if !next.is_empty() {
                queue.push_back(next);
            }
        }
        assert_eq!(sched.get_num_unfinished_requests(), 0);
        assert_eq!(outputs["0"], max_tokens as usize);
        assert_eq!(outputs["1"], max_tokens as usize);
        assert_eq!(total, 2 * (10 + max_tokens - 1), "max_tokens={max_tokens}");
    }
}

#[test]
fn invalid_requests_leave_the_state_unchanged() {
    let mut sched = Scheduler::new(config(|p| p.max_model_len = 32)).unwrap();
    sched.add_request(request("a", 4, 4)).unwrap();
    let before = sched.debug_snapshot();
    let bad = [
        request("a", 4, 4),
        NewRequest::new("b", vec![], 4),
        request("b", 32, 4),
        NewRequest::new("b", vec![1, -2], 4),
        request("b", 4, 0),
        NewRequest { num_computed_tokens: 4, ..request("b", 4, 4) },
        NewRequest { stop_token_ids: vec![5; MAX_STOP_TOKEN_IDS + 1], ..request("b", 4, 4) },
        // Could outgrow the whole KV pool (10000 blocks of 16) only past M: fine; this one
        // is refused by the pool check of a smaller scheduler below.
    ];
    for r in bad {
        assert!(sched.add_request(r).is_err());
        assert_eq!(sched.debug_snapshot(), before);
    }
    let longest = sched.config().prompt_limit();
    assert_eq!(longest.max, 31, "M - s");
    let err = sched.add_request(request("b", 32, 4)).unwrap_err();
    assert_eq!(err, longest.too_long("prompt_token_ids", 32));
    assert!(err.to_string().starts_with("prompt_token_ids=<32 tokens>: at most 31 tokens"), "{err}");
    sched.add_request(request("b", 31, 1)).unwrap();
    let many_stops = NewRequest { stop_token_ids: vec![5; MAX_STOP_TOKEN_IDS], ..request("c", 4, 4) };
    sched.add_request(many_stops).unwrap();
    // 3 usable blocks of 16 tokens hold a request of 49 tokens: a prompt of 48 at most.
    let mut small = Scheduler::new(config(|p| p.num_gpu_blocks = 4)).unwrap();
    let before = small.debug_snapshot();
    let err = small.add_request(request("outgrows", 49, 1)).unwrap_err().to_string();
    assert!(err.starts_with("prompt_token_ids=<49 tokens>: at most 48 tokens"), "{err}");
    assert!(err.contains("3 usable blocks"), "{err}");
    assert_eq!(small.debug_snapshot(), before);
    small.add_request(request("fits", 48, 1000)).unwrap();
}

/// With a KV connector and drafts, the longest request also leaves a speculative step's
/// blocks free beside an asynchronous load of all its tokens (vLLM's reservation: a load that
/// cannot have both never starts, and the waiting queue blocks behind it).
#[test]
fn with_a_connector_and_drafts_the_longest_request_leaves_room_for_a_speculative_step() {
    // 2 usable blocks of 16: 33 tokens alone; a load of 16 beside a step of 1 + K slots.
    let longest = |kv_connector: bool, k: i64| {
        config(|p| (p.num_gpu_blocks, p.kv_connector, p.num_speculative_tokens) = (3, kv_connector, k))
            .max_request_len()
    };
    assert_eq!(longest(false, 3), 33);
    assert_eq!(longest(true, 0), 33);
    assert_eq!(longest(true, 3), 16);
    let mut sched =
        Scheduler::new(config(|p| (p.num_gpu_blocks, p.kv_connector, p.num_speculative_tokens) = (3, true, 3)))
            .unwrap();
    let err = sched.add_request(request("loaded", 16, 4)).unwrap_err().to_string();
    assert!(err.starts_with("prompt_token_ids=<16 tokens>: at most 15 tokens"), "{err}");
    sched.add_request(request("loaded", 15, 4)).unwrap();
}

/// Deviation 4: a pool that cannot hold a request of `max_model_len` tokens (vLLM's engine
/// refuses one at startup; vLLM's scheduler lets a request outgrow it and preempt itself
/// forever) caps every request at the longest it holds, `T - L + s` for `T` the pool's
/// slots: `C + n + s` stays within that, so a step's `C + n + L` slots always fit the
/// whole pool, and the request stops there, length-capped, as at `max_model_len`.
#[test]
fn a_request_stops_length_capped_at_the_longest_the_pool_holds() {
    // 7 usable blocks of 4 tokens: 28 slots.
    for (k, lookahead, async_scheduling) in [(0, 0, false), (2, 0, false), (3, 3, false), (3, 3, true)] {
        let case = format!("K={k} L={lookahead} async={async_scheduling}");
        let mut sched = Scheduler::new(config(|p| {
            (p.max_model_len, p.block_size, p.num_gpu_blocks) = (64, 4, 8);
            (p.num_speculative_tokens, p.num_lookahead_tokens, p.async_scheduling) = (k, lookahead, async_scheduling);
        }))
        .unwrap();
        let longest = 28 - lookahead + 1;
        assert_eq!(sched.config().max_request_len(), longest, "{case}");
        let ids = HashMap::from([(sched.add_request(request("long", 10, 100)).unwrap(), "long")]);
        let mut delivered = HashMap::new();
        let mut finished = Vec::new();
        let mut in_flight = VecDeque::new();
        for _ in 0..200 {
            let step = sched.schedule();
            check_step(&sched, &step);
            for i in 0..step.len() {
                let (c, n) = (step.num_computed_tokens[i] as i64, step.num_scheduled_tokens[i] as i64);
                assert!(c + n < longest, "{case}: C + n + s = {} > {longest}", c + n + 1);
            }
            in_flight.push_back(step);
            if in_flight.len() <= usize::from(async_scheduling) {
                continue;
            }
            let step = in_flight.pop_front().unwrap();
            let (tokens, counts) = sample(&sched, &step, true);
            for e in apply(&mut sched, &step, &tokens, &counts) {
                let id = ids[&e.handle];
                *delivered.entry(id).or_insert(0) += e.num_tokens as i64;
                if e.status.is_finished() {
                    finished.push((id, e.status));
                } else if k > 0 {
                    sched.update_draft_token_ids(&[id], &vec![7; k as usize], &[k]).unwrap();
                }
            }
            if !sched.has_requests() {
                break;
            }
        }
        assert_eq!(finished, [("long", RequestStatus::FinishedLengthCapped)], "{case}");
        assert_eq!(delivered["long"], longest - 10, "{case}: the request's outputs");
        assert_eq!(sched.stats().num_preemptions, 0, "{case}: a request preempted itself");
    }
}

/// Aborted waiting requests whose keys never reach the front (low priority
/// behind a steady stream of better ones) must not pile up in the queue.
#[test]
fn aborted_waiting_requests_do_not_accumulate_in_either_policy() {
    for policy in [llmsched_core::Policy::Fcfs, llmsched_core::Policy::Priority] {
        let cfg = config(|p| {
            p.policy = policy;
            p.max_num_seqs = 1;
        });
        let mut sched = Scheduler::new(cfg).unwrap();
        sched.add_request(request("busy", 4, 1_000_000)).unwrap();
        let step = sched.schedule();
        let (tokens, counts) = sample(&sched, &step, false);
        apply(&mut sched, &step, &tokens, &counts);
        // "keeper" waits at the front for the whole test (max_num_seqs = 1).
        let mut keeper = request("keeper", 4, 4);
        keeper.priority = 0;
        sched.add_request(keeper).unwrap();
        for i in 0..5_000 {
            let id = format!("low-{i}");
            let mut low = request(&id, 4, 4);
            low.priority = 9;
            sched.add_request(low).unwrap();
            sched.finish_requests(Some(&[id.as_str()]), llmsched_core::RequestStatus::FinishedAborted).unwrap();
            if i % 500 == 0 {
                let step = sched.schedule();
                let (tokens, counts) = sample(&sched, &step, false);
                apply(&mut sched, &step, &tokens, &counts);
            }
        }
        // The invariant bounds the entries a queue keeps by its live requests.
        sched.check_invariants().unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(sched.get_request_counts(), (1, 1));
    }
}

/// The bound on dead queue entries must survive the queue draining: aborted
/// entries behind (FCFS) or below (priority) the live ones stay until swept.
#[test]
fn dead_entries_stay_bounded_while_the_queue_drains() {
    for policy in [llmsched_core::Policy::Fcfs, llmsched_core::Policy::Priority] {
        let cfg = config(|p| {
            p.policy = policy;
            p.max_num_seqs = 4;
        });
        let mut sched = Scheduler::new(cfg).unwrap();
        for i in 0..150 {
            sched.add_request(request(&format!("live-{i}"), 4, 1)).unwrap();
        }
        for i in 0..150 {
            let mut doomed = request(&format!("doomed-{i}"), 4, 1);
            doomed.priority = 9;
            sched.add_request(doomed).unwrap();
        }
        let doomed: Vec<String> = (0..150).map(|i| format!("doomed-{i}")).collect();
        let doomed: Vec<&str> = doomed.iter().map(String::as_str).collect();
        sched.finish_requests(Some(&doomed), llmsched_core::RequestStatus::FinishedAborted).unwrap();
        sched.check_invariants().unwrap();
        while sched.has_requests() {
            let step = sched.schedule();
            check_step(&sched, &step);
            if !step.is_empty() {
                let (tokens, counts) = sample(&sched, &step, false);
                apply(&mut sched, &step, &tokens, &counts);
            }
            sched.check_invariants().unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        }
    }
}

/// A step that scheduled nothing is not in flight: its empty output applies as a
/// no-op however often it comes, and tokens for it are refused.
#[test]
fn an_empty_step_applies_as_a_no_op() {
    let mut sched = Scheduler::new(config(|_| {})).unwrap();
    let empty = sched.schedule();
    assert_eq!(empty.len(), 0);
    let before = sched.debug_snapshot();
    for _ in 0..2 {
        assert_eq!(apply(&mut sched, &empty, &[], &[]), vec![]);
    }
    let tokens = llmsched_core::RunnerOutput { sampled_token_ids: &[7], num_sampled: &[1], row_of_entry: None };
    let refused = sched.update_from_output(empty.step_id, &tokens).unwrap_err();
    assert!(refused.to_string().contains("scheduled nothing"), "{refused}");
    assert_eq!(sched.debug_snapshot(), before);
    // A step this scheduler never scheduled is refused, empty or not.
    let none = llmsched_core::RunnerOutput { sampled_token_ids: &[], num_sampled: &[], row_of_entry: None };
    assert!(sched.update_from_output(empty.step_id + 1, &none).is_err());
    assert!(sched.update_from_output(0, &none).is_err());
}

/// A draft is a token id in [0, 2^31) or the -1 padding: both ends are kept, one past
/// either end is refused naming its row and column, and nothing changes.
#[test]
fn drafts_are_checked_at_both_ends_of_their_range() {
    let mut sched = Scheduler::new(config(|p| p.num_speculative_tokens = 3)).unwrap();
    sched.add_request(request("a", 4, 16)).unwrap();
    sched.add_request(request("b", 4, 16)).unwrap();
    let step = sched.schedule();
    let out = llmsched_core::RunnerOutput { sampled_token_ids: &[7, 7], num_sampled: &[1, 1], row_of_entry: None };
    sched.update_from_output(step.step_id, &out).unwrap();
    let spec = |sched: &Scheduler, id: &str| sched.get_request(id).unwrap().spec_token_ids().to_vec();

    let max = i32::MAX as i64;
    sched.update_draft_token_ids(&["a", "b"], &[-1, 0, max, max], &[3, 1]).expect("in range");
    assert_eq!(spec(&sched, "a"), vec![-1, 0, i32::MAX]);
    assert_eq!(spec(&sched, "b"), vec![i32::MAX]);
    for bad in [-2, max + 1] {
        let err = sched.update_draft_token_ids(&["a", "b"], &[5, 5, 5, 5, bad], &[2, 3]).unwrap_err().to_string();
        assert!(err.starts_with(&format!("draft_token_ids[1][2]={bad}:")), "{err}");
        assert_eq!(spec(&sched, "a"), vec![-1, 0, i32::MAX], "a refused call changed the drafts");
    }
}

/// Priority preemption can take a request the running loop already scheduled in this
/// step: the victim is then left as that step found it (no tokens in flight, its prefill
/// flag, even where the undone chunk was its last; under async scheduling with a decode
/// cadence, the bound its last decode recorded), preempted, and absent from the step.
#[test]
fn a_victim_scheduled_earlier_in_the_step_is_left_as_the_step_found_it() {
    let (mut undone, mut undone_last_chunks, mut undone_bounds) = (0, 0, 0);
    for (async_scheduling, a_len, b_len, blocks, threshold) in [false, true].into_iter().flat_map(|s| {
        (6..=16).flat_map(move |a| {
            (6..=16).flat_map(move |b| (6..=12).flat_map(move |k| (1..=4).map(move |t| (s, a, b, k, t))))
        })
    }) {
        let mut sched = Scheduler::new(config(|p| {
            p.async_scheduling = async_scheduling;
            p.policy = llmsched_core::Policy::Priority;
            p.max_model_len = 64;
            p.block_size = 4;
            p.num_gpu_blocks = blocks;
            p.max_num_seqs = 2;
            p.max_num_batched_tokens = 8;
            p.long_prefill_token_threshold = threshold;
        }))
        .unwrap();
        if async_scheduling {
            sched.set_decode_stagger(1).unwrap();
        }
        let mut a = request("a", a_len, 4);
        (a.priority, a.arrival_time) = (1, Some(0.0));
        sched.add_request(a).unwrap();
        let step = sched.schedule();
        let (tokens, counts) = sample(&sched, &step, false);
        apply(&mut sched, &step, &tokens, &counts);
        let mut b = request("b", b_len, 4);
        (b.priority, b.arrival_time) = (0, Some(1.0));
        sched.add_request(b).unwrap();

        for _ in 0..60 {
            let Ok(a) = sched.get_request("a") else { break };
            let running = a.status() == RequestStatus::Running;
            let (in_flight, prefill) = (a.num_in_flight_tokens(), a.is_prefill_chunk());
            let bound = a.next_decode_eligible_step();
            let last_chunk = prefill && a.num_computed_tokens() + threshold >= a.num_tokens();
            let step = sched.schedule();
            check_step(&sched, &step);
            let a = sched.get_request("a").unwrap();
            if running && step.preempted.iter().any(|(_, id)| &**id == "a") {
                undone += 1;
                undone_last_chunks += i32::from(last_chunk);
                assert!(!ids(&sched, &step).contains(&"a".to_string()), "a is preempted and scheduled");
                assert_eq!(a.status(), RequestStatus::Preempted);
                assert_eq!(a.num_in_flight_tokens(), in_flight, "the undone step's tokens are in flight");
                assert_eq!(a.num_stale_output_tokens(), in_flight);
                assert_eq!(a.is_prefill_chunk(), prefill, "the undone step changed the prefill flag");
                assert_eq!(a.next_decode_eligible_step(), bound, "the undone step changed the decode bound");
                undone_bounds += i32::from(bound > 0);
            }
            let (tokens, counts) = sample(&sched, &step, false);
            apply(&mut sched, &step, &tokens, &counts);
        }
    }
    assert!(
        undone > 0 && undone_last_chunks > 0 && undone_bounds > 0,
        "no preemption of a running `a` ({undone}) at its last chunk ({undone_last_chunks}) or \
         after a decode ({undone_bounds})"
    );
}

/// A finished request keeps no record, only its handle and id until a step reports it: its
/// slot is free at once (a new request may take it while the step that scheduled the
/// finished one is still in flight), and that step's output skips it.
#[test]
fn a_finished_request_frees_its_record_at_once() {
    let mut sched = Scheduler::new(config(|p| p.enable_prefix_caching = true)).unwrap();
    let a = sched.add_request(request("a", 40, 8)).unwrap();
    let b = sched.add_request(request("b", 40, 8)).unwrap();
    let step = sched.schedule();
    assert_eq!(step.req_handles, vec![a, b]);
    // Aborted while its step is in flight: the slot is free, and "c" takes it.
    assert_eq!(sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap().len(), 1);
    assert!(sched.request(a).is_none(), "the aborted request's record is freed");
    assert!(sched.get_request("a").is_err());
    let c = sched.add_request(request("c", 8, 8)).unwrap();
    assert_eq!(c.index, a.index, "the freed slot is reused");
    sched.check_invariants().unwrap();
    let events = apply(&mut sched, &step, &[7, 9], &[1, 1]);
    assert_eq!(events.iter().map(|e| e.handle).collect::<Vec<_>>(), vec![b], "only b had an event");
    let c_request = sched.request(c).unwrap();
    assert_eq!((c_request.num_output_tokens(), c_request.num_computed_tokens()), (0, 0), "c is untouched");
    assert_eq!(sched.request(b).unwrap().output_token_ids().collect::<Vec<_>>(), vec![9]);
    sched.check_invariants().unwrap();
    // "b" stops in the next output: freed at once too, and both are reported once.
    let mut b_new = request("b2", 4, 8);
    b_new.stop_token_ids = vec![5];
    let b2 = sched.add_request(b_new).unwrap();
    let step = sched.schedule();
    let ids: Vec<String> = step.finished.iter().map(|(_, id)| id.to_string()).collect();
    assert_eq!(ids, vec!["a"], "the next step reports the aborted request");
    assert_eq!(step.finished[0].0, a, "by the handle it had");
    // b2 samples its stop token; b decodes; c's prompt chunk samples one token.
    let (mut tokens, mut counts) = (Vec::new(), Vec::new());
    for &h in &step.req_handles {
        let count = i32::from(!sched.request(h).unwrap().is_prefill_chunk());
        counts.push(count);
        tokens.extend(std::iter::repeat_n(if h == b2 { 5 } else { 7 }, count as usize));
    }
    let events = apply(&mut sched, &step, &tokens, &counts);
    assert!(events.iter().any(|e| e.handle == b2 && e.status == RequestStatus::FinishedStopped));
    assert!(sched.request(b2).is_none(), "a stopped request's record is freed");
    sched.check_invariants().unwrap();
    let step = sched.schedule();
    assert_eq!(step.finished.iter().map(|(_, id)| id.to_string()).collect::<Vec<_>>(), vec!["b2"]);
    sched.check_invariants().unwrap();
}

/// Sync, K = 1: drafts handed in for a request whose step is still in flight would make
/// the next step schedule a draft slot where the in-flight step's token belongs (vLLM
/// 0.33 does, and ends with C = N - 2). Refused, naming the request, with nothing changed;
/// the same drafts after the output is applied are scheduled and keep C = N - 1.
#[test]
fn drafts_for_a_request_whose_step_is_in_flight_are_refused() {
    let mut sched = Scheduler::new(config(|p| p.num_speculative_tokens = 1)).unwrap();
    sched.add_request(request("r", 5, 20)).unwrap();
    sched.add_request(request("other", 40, 20)).unwrap();
    let prefill = sched.schedule();
    let (t, c) = sample(&sched, &prefill, false);
    apply(&mut sched, &prefill, &t, &c);
    let decode = sched.schedule();
    assert_eq!(decode.num_scheduled_tokens, vec![1, 1]);
    let before = sched.debug_snapshot();
    let err = sched.update_draft_token_ids(&["r"], &[77], &[1]).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "req_ids[0]=\"r\": drafts for a request whose step {} is still in flight",
            decode.step_id
        )),
        "{message}"
    );
    assert_eq!(sched.debug_snapshot(), before, "a refused call changes nothing");
    // Rows without drafts, and drafts for ids not live, are not refused.
    sched.update_draft_token_ids(&["r", "gone"], &[5], &[0, 1]).unwrap();
    assert_eq!(sched.debug_snapshot(), before);
    // A second step now schedules no draft slot: there is nothing to compute before the
    // in-flight token returns.
    assert!(sched.schedule().is_empty());
    let (t, c) = sample(&sched, &decode, false);
    apply(&mut sched, &decode, &t, &c);
    sched.check_invariants().unwrap();
    // In order, the same drafts are taken and verified.
    sched.update_draft_token_ids(&["r"], &[77], &[1]).unwrap();
    let verify = sched.schedule();
    assert_eq!((verify.num_spec_tokens[0], verify.spec_token_ids.clone()), (1, vec![77]));
    let (t, c) = sample(&sched, &verify, false);
    apply(&mut sched, &verify, &t, &c);
    sched.check_invariants().unwrap();
    let r = sched.get_request("r").unwrap();
    assert_eq!(r.num_computed_tokens(), r.num_tokens() - 1);
}

/// A request in flight with a prefill chunk that does not reach the end of its prompt: its
/// drafts are dropped, as vLLM drops drafts for prefill chunks, not refused.
#[test]
fn drafts_for_a_prefill_chunk_in_flight_are_dropped() {
    let mut sched = Scheduler::new(config(|p| {
        p.num_speculative_tokens = 1;
        p.max_num_batched_tokens = 256;
        p.max_num_seqs = 2;
    }))
    .unwrap();
    sched.add_request(request("long", 600, 20)).unwrap();
    let chunk = sched.schedule();
    assert!(sched.get_request("long").unwrap().is_prefill_chunk());
    sched.update_draft_token_ids(&["long"], &[77], &[1]).unwrap();
    assert!(sched.get_request("long").unwrap().spec_token_ids().is_empty());
    apply(&mut sched, &chunk, &[], &[0]);
    sched.check_invariants().unwrap();
}

/// A multi-token output (accepted drafts and the bonus token) that stops part way: the
/// tokens after the stop are not delivered, though each would stop the request again
/// (another stop id, the EOS, the length cap), and the stop reason is the first stop's.
#[test]
fn tokens_after_a_stop_in_a_multi_token_output_are_not_delivered() {
    let mut sched = Scheduler::new(config(|p| {
        p.num_speculative_tokens = 3;
        p.block_size = 2;
        p.enable_prefix_caching = true;
    }))
    .unwrap();
    let new = |id: &str, max_tokens: i64, eos: Option<i64>, stops: &[i64]| {
        let mut r = request(id, 4, max_tokens);
        r.eos_token_id = eos;
        r.stop_token_ids = stops.to_vec();
        r
    };
    // (request, the runner's tokens: 1 sampled + 3 accepted drafts, what is delivered,
    // status, stop reason)
    #[allow(clippy::type_complexity)]
    let cases: [(NewRequest, [i32; 4], &[i32], RequestStatus, Option<i32>); 5] = [
        (new("eos", 20, Some(9), &[]), [5, 9, 6, 9], &[5, 9], RequestStatus::FinishedStopped, None),
        (new("stop", 20, None, &[42, 43]), [5, 42, 43, 8], &[5, 42], RequestStatus::FinishedStopped, Some(42)),
        (new("cap", 3, Some(9), &[]), [5, 6, 9, 8], &[5, 6], RequestStatus::FinishedLengthCapped, None),
        (new("eos-first", 4, Some(9), &[6]), [9, 6, 7, 8], &[9], RequestStatus::FinishedStopped, None),
        (new("stop-last", 20, Some(9), &[8]), [5, 6, 7, 8], &[5, 6, 7, 8], RequestStatus::FinishedStopped, Some(8)),
    ];
    let mut handles = Vec::new();
    for (r, ..) in &cases {
        handles.push(sched.add_request(r.clone()).unwrap());
    }
    let prefill = sched.schedule();
    apply(&mut sched, &prefill, &[1; 5], &[1; 5]);
    let ids: Vec<&str> = cases.iter().map(|(r, ..)| r.request_id.as_str()).collect();
    let drafts: Vec<i64> = cases.iter().flat_map(|(_, tokens, ..)| tokens[1..].iter().map(|&t| i64::from(t))).collect();
    sched.update_draft_token_ids(&ids, &drafts, &[3; 5]).unwrap();
    let verify = sched.schedule();
    assert_eq!(verify.req_handles, handles);
    assert_eq!(verify.num_spec_tokens, vec![3; 5]);
    let tokens: Vec<i32> = cases.iter().flat_map(|(_, tokens, ..)| *tokens).collect();
    let events = apply(&mut sched, &verify, &tokens, &[4; 5]);
    assert_eq!(events.len(), 5);
    for ((r, _, delivered, status, reason), e) in cases.iter().zip(&events) {
        let id = &r.request_id;
        let got = &tokens[e.token_offset..e.token_offset + e.num_tokens];
        assert_eq!(got, *delivered, "{id}: delivered tokens");
        assert_eq!((e.status, e.stop_reason), (*status, *reason), "{id}");
        // Prefix caching keeps the KV of the delivered tokens only: C = N - 1 after the
        // trim, N = 4 prompt tokens, 1, then the delivered ones; blocks of 2.
        let n = 4 + 1 + delivered.len();
        assert_eq!(e.num_cached_blocks, (n - 1) / 2, "{id}: cached blocks");
    }
    sched.check_invariants().unwrap();
}

/// The blocks in use (what a step's attention reads, which the step log records) count a
/// shared prompt's full blocks once, and not the cached blocks of finished requests.
#[test]
fn used_blocks_count_a_shared_prefix_once_and_no_free_cached_block() {
    let mut sched = Scheduler::new(config(|p| p.enable_prefix_caching = true)).unwrap();
    let usable = sched.config().num_gpu_blocks() as usize - 1;
    // 40 tokens of 16-token blocks: 2 full, 1 partial.
    sched.add_request(request("a", 40, 2)).unwrap();
    let step = sched.schedule();
    assert_eq!(sched.num_used_blocks(), 3);
    apply_one_token_each(&mut sched, &step);
    // The same prompt: its 2 full blocks hit, its partial block its own.
    sched.add_request(request("b", 40, 2)).unwrap();
    let step = sched.schedule();
    assert_eq!(sched.num_used_blocks(), 3 + 1);
    assert_eq!(sched.num_used_blocks() + sched.num_free_blocks(), usable);
    apply_one_token_each(&mut sched, &step);
    while sched.has_requests() {
        let step = sched.schedule();
        apply_one_token_each(&mut sched, &step);
    }
    // Finished: their full blocks stay cached in the free queue, not in use.
    assert_eq!(sched.num_used_blocks(), 0);
    assert_eq!(sched.num_free_blocks(), usable);
}
