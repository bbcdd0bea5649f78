//! A KV connector's scheduler side: tokens a connector loads past the prefix-cache hit
//! (vLLM's `get_num_new_matched_tokens`), synchronously or across steps (WAITING_FOR_REMOTE_KVS),
//! and the blocks of finished requests held until released (`request_finished` asking for a
//! delayed free).

mod common;

use common::*;
use llmsched_core::{Connectors, ExternalKv, ExternalMatch, KvLoad, Request, RequestStatus, Scheduler, Step};

/// A connector that holds the first `tokens` tokens of the requests it names, loaded
/// across steps for those in `remote`, and records each question (request id, local hit).
#[derive(Default)]
struct Store {
    holds: Vec<(&'static str, Option<i64>)>,
    remote: Vec<&'static str>,
    asked: Vec<(String, i64)>,
    /// Its answer to `has_pending_block_frees`, and how often it was asked.
    pending_frees: bool,
    asked_pending: usize,
}

impl ExternalKv for Store {
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<ExternalMatch> {
        self.asked.push((request.id().to_string(), num_local_computed));
        let tokens = match self.holds.iter().find(|(id, _)| **id == **request.id()) {
            Some(&(_, tokens)) => tokens? - num_local_computed,
            None => 0,
        };
        let load_async = self.remote.iter().any(|id| **id == **request.id());
        Some(ExternalMatch { tokens, load_async })
    }

    fn has_pending_block_frees(&mut self) -> bool {
        self.asked_pending += 1;
        self.pending_frees
    }
}

fn connected(f: impl FnOnce(&mut llmsched_core::ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.block_size = 16;
        p.num_gpu_blocks = 64;
        p.max_num_batched_tokens = 512;
        p.kv_connector = true;
        f(p);
    }))
    .unwrap()
}

fn step_with(sched: &mut Scheduler, store: &mut Store) -> Step {
    let step = sched.schedule_with(false, Connectors { kv: Some(store), encoder: None, aux: None });
    check_step(sched, &step);
    step
}

fn run(sched: &mut Scheduler, store: &mut Store) -> Step {
    let step = step_with(sched, store);
    apply_one_token_each(sched, &step);
    step
}

#[test]
fn loaded_tokens_count_as_computed_and_take_new_blocks() {
    let mut sched = connected(|_| {});
    sched.add_request(request("a", 100, 4)).unwrap();
    sched.add_request(request("b", 40, 4)).unwrap();
    let mut store = Store { holds: vec![("a", Some(64))], ..Store::default() };
    let free_before = sched.num_free_blocks();
    let step = step_with(&mut sched, &mut store);
    // a starts at C = 64 with 36 tokens to compute; b has nothing outside.
    assert_eq!(step.num_computed_tokens, vec![64, 0]);
    assert_eq!(step.num_scheduled_tokens, vec![36, 40]);
    assert_eq!(step.external_computed_tokens, vec![64, 0]);
    // a's table covers all 100 tokens: 7 blocks, b's 3.
    assert_eq!(free_before - sched.num_free_blocks(), 7 + 3);
    assert_eq!(store.asked, vec![("a".into(), 0), ("b".into(), 0)]);
}

#[test]
fn the_connector_is_asked_past_the_local_hit_and_loads_only_beyond_it() {
    let mut sched = connected(|p| p.enable_prefix_caching = true);
    let mut store = Store { holds: vec![("b", Some(80))], ..Store::default() };
    sched.add_request(request("a", 40, 1)).unwrap();
    run(&mut sched, &mut store);
    run(&mut sched, &mut store);
    // b shares a's first 32 tokens (two full blocks); the connector is asked past them.
    sched.add_request(request("b", 100, 4)).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(store.asked.last(), Some(&("b".into(), 32)));
    assert_eq!(step.external_computed_tokens, vec![48]);
    assert_eq!(step.num_computed_tokens, vec![80]);
    assert_eq!(step.num_scheduled_tokens, vec![20]);
    assert_eq!(sched.prefix_cache_stats().hits, 32, "the local hit alone counts as a prefix hit");
}

#[test]
fn at_least_the_last_token_is_computed_and_a_negative_answer_loads_nothing() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(100)), ("b", Some(-5))], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    sched.add_request(request("b", 50, 4)).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_computed_tokens, vec![99, 0]);
    assert_eq!(step.num_scheduled_tokens, vec![1, 50]);
    assert_eq!(step.external_computed_tokens, vec![99, 0]);
}

#[test]
fn a_request_the_connector_cannot_answer_for_waits_without_blocking_others() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", None)], ..Store::default() };
    sched.add_request(request("a", 30, 4)).unwrap();
    sched.add_request(request("b", 30, 4)).unwrap();
    let step = run(&mut sched, &mut store);
    assert_eq!(step.len(), 1);
    assert_eq!(sched.request(step.req_handles[0]).unwrap().id().as_ref(), "b");
    // Once it can tell, a is admitted (asked again).
    store.holds = vec![("a", Some(16))];
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_computed_tokens[1], 16);
    assert_eq!(store.asked.iter().filter(|(id, _)| id == "a").count(), 2);
}

#[test]
fn a_request_that_skips_reading_the_cache_is_asked_but_loads_nothing() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(64))], ..Store::default() };
    let mut r = request("a", 100, 4);
    r.skip_reading_prefix_cache = true;
    sched.add_request(r).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(store.asked.len(), 1);
    assert_eq!(step.num_computed_tokens, vec![0]);
    assert_eq!(step.external_computed_tokens, vec![0]);
}

#[test]
fn without_the_config_flag_no_connector_is_asked() {
    let mut sched = connected(|p| p.kv_connector = false);
    let mut store = Store { holds: vec![("a", Some(64))], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert!(store.asked.is_empty());
    assert_eq!(step.num_computed_tokens, vec![0]);
    assert!(step.external_computed_tokens.is_empty());
}

#[test]
fn a_finished_request_holds_its_blocks_until_released() {
    let mut sched = connected(|_| {});
    let mut store = Store::default();
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 40, 2)).unwrap();
    run(&mut sched, &mut store);
    run(&mut sched, &mut store);
    let finished = sched.take_last_finished();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].status(), RequestStatus::FinishedLengthCapped);
    // 41 computed tokens: 3 blocks hold them, all 3 still out of the pool.
    assert_eq!(sched.held_kv_blocks("a", 0).map(<[u32]>::len), Some(3));
    assert_eq!(sched.num_free_blocks(), total - 3);
    // The id cannot be reused while its blocks are held.
    let err = sched.add_request(request("a", 10, 1)).unwrap_err().to_string();
    assert!(err.contains("still holds KV blocks"), "{err}");
    // A bad release changes nothing.
    assert!(sched.release_kv_blocks(&["a", "nope"]).is_err());
    assert_eq!(sched.num_free_blocks(), total - 3);
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
    assert_eq!(sched.held_kv_blocks("a", 0), None);
    sched.check_invariants().unwrap();
    sched.add_request(request("a", 10, 1)).unwrap();
}

#[test]
fn an_aborted_request_holds_its_blocks_too() {
    let mut sched = connected(|_| {});
    let mut store = Store::default();
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 40, 8)).unwrap();
    run(&mut sched, &mut store);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    assert_eq!(sched.num_free_blocks(), total - 3);
    sched.check_invariants().unwrap();
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
}

/// Beside a Mamba group (prefix caching off): a load takes the Mamba group's state block
/// and the attention group's blocks for the loaded tokens group by group (the Mamba group
/// first here: the pool's first block), as vLLM's `allocate_external_computed_blocks`; the
/// loaded tokens' blocks are zeroed before a synchronous load fills them, not where a load
/// across steps writes them; the Mamba state block never.
#[test]
fn a_load_beside_a_mamba_group_takes_its_state_block_with_the_loaded_blocks() {
    for across_steps in [false, true] {
        let mut sched = connected(|p| p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("mamba,full").unwrap());
        let remote = if across_steps { vec!["a"] } else { vec![] };
        let mut store = Store { holds: vec![("a", Some(64))], remote, ..Store::default() };
        let total = sched.num_free_blocks();
        sched.add_request(request("a", 100, 4)).unwrap();
        let step = step_with(&mut sched, &mut store);
        let a = sched.get_request("a").unwrap();
        let (mamba, full) = (a.group_block_ids(0).to_vec(), a.group_block_ids(1).to_vec());
        assert_eq!(mamba, vec![1], "across steps: {across_steps}");
        let (loaded, computing) = full.split_at(4);
        assert_eq!(loaded, &[2, 3, 4, 5]);
        let zeroed: Vec<u32> = step.new_block_ids_to_zero.iter().map(|&b| b as u32).collect();
        if across_steps {
            assert_eq!(a.status(), RequestStatus::WaitingForRemoteKvs);
            assert!(computing.is_empty() && zeroed.is_empty(), "{full:?} {zeroed:?}");
        } else {
            assert_eq!(step.num_scheduled_tokens, vec![36]);
            assert_eq!(zeroed, full, "every attention block, none of Mamba's");
        }
        sched.check_invariants().unwrap();
        sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
        if across_steps {
            // Its blocks go back once the runner reports the load done.
            assert!(sched.release_kv_blocks(&["a"]).is_err());
            sched.finish_kv_transfers(&["a"], &[]);
        } else {
            sched.release_kv_blocks(&["a"]).unwrap();
        }
        assert_eq!(sched.num_free_blocks(), total, "across steps: {across_steps}");
    }
}

#[test]
fn a_load_over_a_sliding_window_and_full_attention_fills_every_groups_table() {
    // Window of 32 tokens (2 blocks); the store holds 96 of a 100-token prompt.
    let mut sched = connected(|p| {
        p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("sliding_window:32,full").unwrap();
    });
    let mut store = Store { holds: vec![("a", Some(96))], ..Store::default() };
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 100, 2)).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.external_computed_tokens, vec![96]);
    assert_eq!(step.num_scheduled_tokens, vec![4]);
    let a = sched.get_request("a").unwrap();
    // The window's group: nulls where the 96 loaded tokens left blocks behind it (the next
    // token attends to tokens 65..96: blocks 4 and 5), then one block for the 4 computed.
    let window = a.group_block_ids(0).to_vec();
    assert_eq!(window.len(), 7);
    assert!(window[..4].iter().all(|&b| b == 0), "{window:?}");
    assert!(window[4..].iter().all(|&b| b != 0), "{window:?}");
    assert_eq!(a.group_block_ids(1).len(), 7);
    assert_eq!(sched.num_free_blocks(), total - 10);
    apply_one_token_each(&mut sched, &step);
    run(&mut sched, &mut store);
    // Finished with 101 tokens computed: the window's table holds blocks 4 to 6 (tokens
    // 70..101 and the next), and a held table per group holds the computed tokens' blocks.
    assert_eq!(sched.take_last_finished().len(), 1);
    let held_window = sched.held_kv_blocks("a", 0).unwrap().to_vec();
    assert_eq!(held_window.iter().filter(|&&b| b != 0).count(), 3, "{held_window:?}");
    assert_eq!(sched.held_kv_blocks("a", 1).map(<[u32]>::len), Some(7));
    assert_eq!(sched.held_kv_blocks("a", 2), None);
    sched.check_invariants().unwrap();
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
}

#[test]
fn a_failed_block_cannot_be_traced_over_several_groups() {
    let mut sched = connected(|p| {
        p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("full,sliding_window:32").unwrap();
    });
    let mut store = Store { holds: vec![("a", Some(48))], ..Store::default() };
    sched.add_request(request("a", 64, 4)).unwrap();
    step_with(&mut sched, &mut store);
    let block = sched.get_request("a").unwrap().group_block_ids(0)[0];
    let before = sched.get_request("a").unwrap().num_computed_tokens();
    let err = sched.fail_kv_loads(&[], &[block]).unwrap_err().to_string();
    assert!(err.contains("invalid_block_ids") && err.contains("several KV-cache groups"), "{err}");
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), before);
    sched.check_invariants().unwrap();
}

#[test]
fn a_request_that_skips_reading_the_cache_never_waits_on_the_connector() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", None)], ..Store::default() };
    let mut r = request("a", 100, 4);
    r.skip_reading_prefix_cache = true;
    sched.add_request(r).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![100]);
    assert_eq!(step.external_computed_tokens, vec![0]);
}

fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

fn status(sched: &Scheduler, id: &str) -> RequestStatus {
    sched.get_request(id).unwrap().status()
}

#[test]
fn an_async_load_holds_blocks_and_waits_until_the_runner_reports_it() {
    let mut sched = connected(|p| p.enable_prefix_caching = true);
    let mut store = Store { holds: vec![("a", Some(64))], remote: vec!["a"], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    sched.add_request(request("b", 40, 4)).unwrap();
    let free_before = sched.num_free_blocks();
    let step = run(&mut sched, &mut store);
    // a takes blocks for the 64 loaded tokens (4), none for the 36 to compute, and waits.
    assert_eq!(ids(&sched, &step), vec!["b"]);
    assert_eq!(step.kv_loads, vec![KvLoad { request_id: "a".into(), num_external_tokens: 64, num_admitted_before: 0 }]);
    assert_eq!(step.external_computed_tokens, vec![0], "b, admitted after a's load started");
    assert_eq!(free_before - sched.num_free_blocks(), 4 + 3);
    assert_eq!(status(&sched, "a"), RequestStatus::WaitingForRemoteKvs);
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), 64);
    assert!(sched.kv_load_in_flight("a"));
    // Not reported yet: a waits, asked nothing more.
    let step = run(&mut sched, &mut store);
    assert_eq!(ids(&sched, &step), vec!["b"]);
    assert!(step.kv_loads.is_empty());
    assert_eq!(store.asked.iter().filter(|(id, _)| id == "a").count(), 1);
    sched.finish_kv_transfers(&["a"], &[]);
    assert!(!sched.kv_load_in_flight("a"));
    let step = step_with(&mut sched, &mut store);
    // Promoted, admitted as a new request from C = 64; no second question.
    assert_eq!(ids(&sched, &step), vec!["b", "a"]);
    assert_eq!(step.num_computed_tokens[1], 64);
    assert_eq!(step.num_scheduled_tokens[1], 36);
    assert_eq!(step.external_computed_tokens, vec![-1]);
    assert_eq!(step.new_reqs.len(), 1);
    assert_eq!(store.asked.iter().filter(|(id, _)| id == "a").count(), 1);
}

#[test]
fn loaded_blocks_enter_the_prefix_cache_only_once_the_load_is_in() {
    let mut sched = connected(|p| p.enable_prefix_caching = true);
    let mut store = Store { holds: vec![("a", Some(64))], remote: vec!["a"], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    run(&mut sched, &mut store);
    // Same prompt: while a's load is in flight, its blocks are no hit for b.
    sched.add_request(request("b", 100, 4)).unwrap();
    let step = run(&mut sched, &mut store);
    assert_eq!(step.num_computed_tokens, vec![0]);
    sched.finish_requests(Some(&["b"]), RequestStatus::FinishedAborted).unwrap();
    sched.release_kv_blocks(&["b"]).unwrap();
    sched.finish_kv_transfers(&["a"], &[]);
    run(&mut sched, &mut store);
    sched.add_request(request("c", 100, 4)).unwrap();
    let step = run(&mut sched, &mut store);
    // a's four loaded blocks (and the two it computed since) are hits now.
    let c = step.num_computed_tokens[ids(&sched, &step).iter().position(|id| id == "c").unwrap()];
    assert_eq!(c, 96);
}

#[test]
fn a_load_of_every_token_computes_the_last_one_again() {
    let mut sched = connected(|_| {});
    let mut store =
        Store { holds: vec![("a", Some(100)), ("b", Some(500))], remote: vec!["a", "b"], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    sched.add_request(request("b", 40, 4)).unwrap();
    let step = run(&mut sched, &mut store);
    // An async answer may cover the whole prompt (kept within it).
    assert_eq!(step.kv_loads.iter().map(|l| l.num_external_tokens).collect::<Vec<_>>(), vec![100, 40]);
    sched.finish_kv_transfers(&["b", "a"], &[]);
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_computed_tokens, vec![99, 39]);
    assert_eq!(step.num_scheduled_tokens, vec![1, 1]);
}

#[test]
fn an_async_answer_of_no_token_is_no_load() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(-3))], remote: vec!["a"], ..Store::default() };
    sched.add_request(request("a", 40, 4)).unwrap();
    let step = step_with(&mut sched, &mut store);
    assert!(step.kv_loads.is_empty());
    assert_eq!(step.num_scheduled_tokens, vec![40]);
}

#[test]
fn a_preempted_request_that_loads_again_resumes() {
    let mut sched = connected(|p| {
        p.num_gpu_blocks = 10;
        p.block_size = 16;
    });
    let mut store = Store::default();
    sched.add_request(request("a", 64, 40)).unwrap();
    sched.add_request(request("b", 64, 40)).unwrap();
    // Both decode until the pool runs out and b is preempted.
    let mut preempted = false;
    for _ in 0..40 {
        let step = run(&mut sched, &mut store);
        if !step.preempted.is_empty() {
            preempted = true;
            break;
        }
    }
    assert!(preempted, "the pool is small enough to preempt");
    let victim = if status(&sched, "b") == RequestStatus::Preempted { "b" } else { "a" };
    sched.finish_requests(Some(&[if victim == "a" { "b" } else { "a" }]), RequestStatus::FinishedAborted).unwrap();
    for id in ["a", "b"] {
        if sched.held_kv_blocks(id, 0).is_some() {
            sched.release_kv_blocks(&[id]).unwrap();
        }
    }
    store.holds = vec![("a", Some(64)), ("b", Some(64))];
    store.remote = vec!["a", "b"];
    let step = run(&mut sched, &mut store);
    assert_eq!(step.kv_loads.len(), 1);
    assert_eq!(status(&sched, victim), RequestStatus::WaitingForRemoteKvs);
    sched.finish_kv_transfers(&[victim], &[]);
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.resumed_reqs.len(), 1, "promoted back to PREEMPTED, so resumed");
    assert_eq!(step.num_computed_tokens, vec![64]);
}

/// a (100 tokens) prefills in chunks of 32 beside b (80 tokens), whose 64 the connector
/// loads across steps, in a pool of `usable` blocks of 16.
fn prefill_beside_a_load(usable: i64) -> (Scheduler, Store, Step) {
    let mut sched = connected(|p| {
        p.num_gpu_blocks = usable + 1; // and the null block
        p.max_num_seqs = 4;
        p.max_num_batched_tokens = 64;
        p.long_prefill_token_threshold = 32;
    });
    let mut store = Store { holds: vec![("b", Some(64))], remote: vec!["b"], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    sched.add_request(request("b", 80, 4)).unwrap();
    let step = run(&mut sched, &mut store);
    (sched, store, step)
}

#[test]
fn an_async_load_leaves_room_for_the_requests_still_prefilling() {
    // a holds 2 blocks and needs 5 more to finish; b's load takes 4: 10 - 2 - 5 < 4.
    let (mut sched, mut store, step) = prefill_beside_a_load(10);
    assert_eq!(ids(&sched, &step), vec!["a"]);
    assert!(step.kv_loads.is_empty());
    assert_eq!(status(&sched, "b"), RequestStatus::Waiting);
    // a gone, its reservation is too: the load starts.
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    sched.release_kv_blocks(&["a"]).unwrap();
    let step = run(&mut sched, &mut store);
    assert_eq!(step.kv_loads.len(), 1);
    // With one block more, 11 - 2 - 5 = 4 is room enough at once.
    let (sched, _, step) = prefill_beside_a_load(11);
    assert_eq!(step.kv_loads.len(), 1);
    assert_eq!(status(&sched, "b"), RequestStatus::WaitingForRemoteKvs);
}

#[test]
fn a_request_aborted_during_its_load_holds_its_blocks_until_the_load_is_reported() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(64))], remote: vec!["a"], ..Store::default() };
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 100, 4)).unwrap();
    run(&mut sched, &mut store);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    sched.check_invariants().unwrap();
    assert!(sched.kv_load_in_flight("a"));
    assert_eq!(sched.held_kv_blocks("a", 0).map(<[u32]>::len), Some(4));
    // The caller cannot release them: the connector may still be writing them.
    let err = sched.release_kv_blocks(&["a"]).unwrap_err().to_string();
    assert!(err.contains("in flight"), "{err}");
    assert_eq!(sched.num_free_blocks(), total - 4);
    sched.finish_kv_transfers(&["a"], &[]);
    assert_eq!(sched.num_free_blocks(), total);
    assert!(!sched.kv_load_in_flight("a"));
    sched.check_invariants().unwrap();
}

#[test]
fn a_request_aborted_after_its_load_is_reported_frees_as_any_other() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(64))], remote: vec!["a"], ..Store::default() };
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 100, 4)).unwrap();
    run(&mut sched, &mut store);
    sched.finish_kv_transfers(&["a"], &[]);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    assert!(!sched.kv_load_in_flight("a"));
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
}

#[test]
fn sent_blocks_of_finished_requests_are_released_by_the_transfer_report() {
    let mut sched = connected(|_| {});
    let mut store = Store::default();
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 40, 1)).unwrap();
    run(&mut sched, &mut store);
    assert_eq!(sched.num_held_kv_requests(), 1);
    // Unknown ids are ignored; a's are freed.
    sched.finish_kv_transfers(&["zz"], &["a", "yy"]);
    assert_eq!(sched.num_free_blocks(), total);
    assert_eq!(sched.num_held_kv_requests(), 0);
}

/// Applies `step`'s output: one token for each of its rows whose request is still live and
/// samples (none for a request aborted since).
fn apply_live(sched: &mut Scheduler, step: &Step) {
    let counts: Vec<i32> =
        step.req_handles.iter().map(|&h| sched.request(h).map_or(0, |r| i32::from(!r.is_prefill_chunk()))).collect();
    let tokens = vec![7; counts.iter().sum::<i32>() as usize];
    apply(sched, step, &tokens, &counts);
    sched.check_invariants().unwrap();
}

fn consumer_in_flight(defer: bool) -> Scheduler {
    connected(|p| {
        p.async_scheduling = true;
        p.defer_block_free = defer;
    })
}

#[test]
fn with_steps_in_flight_a_consumers_freed_blocks_wait_for_them() {
    let mut sched = consumer_in_flight(true);
    let mut store = Store::default();
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 40, 8)).unwrap();
    let first = step_with(&mut sched, &mut store);
    let second = step_with(&mut sched, &mut store);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    sched.release_kv_blocks(&["a"]).unwrap();
    // Both steps that scheduled a may still write its 3 blocks.
    assert_eq!(sched.num_free_blocks(), total - 3);
    sched.check_invariants().unwrap();
    apply_live(&mut sched, &first);
    assert_eq!(sched.num_free_blocks(), total - 3, "the second step is still in flight");
    apply_live(&mut sched, &second);
    assert_eq!(sched.num_free_blocks(), total);
}

#[test]
fn without_the_flag_or_with_no_step_in_flight_blocks_are_freed_at_once() {
    let mut sched = consumer_in_flight(false);
    let mut store = Store::default();
    let total = sched.num_free_blocks();
    sched.add_request(request("a", 40, 8)).unwrap();
    let first = step_with(&mut sched, &mut store);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
    apply_live(&mut sched, &first);
    // With the flag, a request whose steps are all applied frees at once too.
    let mut sched = consumer_in_flight(true);
    sched.add_request(request("b", 40, 8)).unwrap();
    let first = step_with(&mut sched, &mut store);
    apply_live(&mut sched, &first);
    sched.finish_requests(Some(&["b"]), RequestStatus::FinishedAborted).unwrap();
    sched.release_kv_blocks(&["b"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
}

/// Two requests decoding in a pool too small for both, async scheduling (a step in flight
/// each time one is scheduled): the steps' ids and the requests each preempted.
fn decode_into_a_full_pool(defer: bool) -> Vec<(usize, Vec<String>)> {
    let mut sched = connected(|p| {
        p.async_scheduling = true;
        p.defer_block_free = defer;
        p.num_gpu_blocks = 8;
        p.max_num_seqs = 4;
    });
    let mut store = Store::default();
    sched.add_request(request("a", 48, 64)).unwrap();
    sched.add_request(request("b", 48, 64)).unwrap();
    let mut in_flight = std::collections::VecDeque::new();
    let mut trace = Vec::new();
    for _ in 0..60 {
        let step = step_with(&mut sched, &mut store);
        trace.push((step.len(), step.preempted.iter().map(|(_, id)| id.to_string()).collect()));
        in_flight.push_back(step);
        if in_flight.len() == 2 {
            apply_live(&mut sched, &in_flight.pop_front().unwrap());
        }
    }
    trace
}

#[test]
fn a_request_whose_step_is_in_flight_is_not_preempted_for_blocks_it_would_not_free() {
    let freeing = decode_into_a_full_pool(false);
    let deferring = decode_into_a_full_pool(true);
    let first = freeing.iter().position(|(_, preempted)| !preempted.is_empty()).expect("the pool runs out");
    assert_eq!(freeing[..first], deferring[..first]);
    // Preempting b would free nothing before its step in flight is applied: the step
    // schedules a alone, and b goes only once its step is applied.
    assert_eq!(deferring[first], (1, vec![]));
    let later = deferring.iter().position(|(_, preempted)| !preempted.is_empty()).expect("b is preempted later");
    assert!(later > first);
}

/// Without a connector (vLLM lets its attribute be set so), frees wait for the steps in
/// flight all the same, beside Mamba groups too (their state blocks with the rest).
#[test]
fn deferring_frees_needs_no_connector() {
    // a's blocks: 3 of full attention, and beside a Mamba group its state block too.
    for (groups, held) in [("full", 3), ("full,mamba", 4)] {
        let mut sched = Scheduler::new(config(|p| {
            (p.async_scheduling, p.defer_block_free) = (true, true);
            p.kv_cache_groups = llmsched_core::KvCacheGroups::parse(groups).unwrap();
            p.enable_prefix_caching &= groups == "full";
        }))
        .unwrap();
        let total = sched.num_free_blocks();
        sched.add_request(request("a", 40, 8)).unwrap();
        let (first, second) = (sched.schedule(), sched.schedule());
        sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
        assert_eq!(sched.num_free_blocks(), total - held, "{groups}: steps in flight may still write a's blocks");
        apply_live(&mut sched, &first);
        assert_eq!(sched.num_free_blocks(), total - held, "{groups}: the second step is still in flight");
        apply_live(&mut sched, &second);
        assert_eq!(sched.num_free_blocks(), total, "{groups}");
    }
}

/// a (100 tokens) loads 64 across steps; the step that started the load is applied.
fn loading_a(f: impl FnOnce(&mut llmsched_core::ConfigParams)) -> (Scheduler, Store) {
    let mut sched = connected(f);
    let mut store = Store { holds: vec![("a", Some(64))], remote: vec!["a"], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    run(&mut sched, &mut store);
    (sched, store)
}

#[test]
fn a_failed_load_is_recomputed_once_it_is_reported_done() {
    let (mut sched, mut store) = loading_a(|_| {});
    let total = sched.num_free_blocks() + 4;
    assert_eq!(sched.fail_kv_loads(&["a", "nobody"], &[]).unwrap(), Vec::<std::sync::Arc<str>>::new());
    sched.check_invariants().unwrap();
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), 0);
    assert_eq!(sched.get_request("a").unwrap().status(), RequestStatus::WaitingForRemoteKvs);
    // Still waiting for the load to be reported done (its blocks may still be written).
    let step = run(&mut sched, &mut store);
    assert!(step.is_empty());
    sched.finish_kv_transfers(&["a"], &[]);
    // Its blocks went back; it looks up and asks again, this time loading nothing.
    store.holds.clear();
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![100]);
    assert_eq!(step.external_computed_tokens, vec![0]);
    assert_eq!(store.asked.iter().filter(|(id, _)| id == "a").count(), 2);
    assert_eq!(sched.num_free_blocks(), total - 7);
}

#[test]
fn a_load_failed_from_a_block_on_keeps_the_tokens_before_it() {
    let (mut sched, mut store) = loading_a(|_| {});
    let blocks = sched.get_request("a").unwrap().block_ids().to_vec();
    assert_eq!(blocks.len(), 4);
    sched.fail_kv_loads(&[], &[blocks[2], 999]).unwrap();
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), 32);
    sched.finish_kv_transfers(&["a"], &[]);
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_computed_tokens, vec![32]);
    assert_eq!(step.num_scheduled_tokens, vec![68]);
    assert_eq!(step.external_computed_tokens, vec![-1], "it keeps what loaded and asks nothing");
}

#[test]
fn under_the_fail_policy_the_failed_requests_are_named_for_the_caller_to_finish() {
    let (mut sched, _) = loading_a(|p| p.recompute_kv_load_failures = false);
    let total = sched.num_free_blocks() + 4;
    let failed = sched.fail_kv_loads(&["a"], &[]).unwrap();
    assert_eq!(failed.iter().map(|id| id.to_string()).collect::<Vec<_>>(), ["a"]);
    // Failing, it keeps its count (vLLM resets it only to recompute).
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), 64);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedError).unwrap();
    // Held until the load is reported done.
    assert!(sched.kv_load_in_flight("a"));
    assert_eq!(sched.num_free_blocks(), total - 4);
    sched.finish_kv_transfers(&["a"], &[]);
    assert_eq!(sched.num_free_blocks(), total);
    sched.check_invariants().unwrap();
}

/// A synchronous load's failed block while a later step that scheduled its request is in
/// flight (async scheduling): under "recompute" the request starts over (preempted, both
/// steps' outputs dropped, its blocks from the failed one out of the prefix cache) and
/// finds only the blocks before that one cached, without asking the connector again; under
/// "fail" it is named, and once it is finished the later step's output finds it gone. The
/// pool is whole at the end.
#[test]
fn a_failed_block_of_a_running_request_with_a_later_step_in_flight_restarts_or_fails_it() {
    for recompute in [true, false] {
        let mut sched = connected(|p| {
            (p.async_scheduling, p.enable_prefix_caching) = (true, true);
            p.recompute_kv_load_failures = recompute;
        });
        let mut store = Store { holds: vec![("a", Some(64))], ..Store::default() };
        let total = sched.num_free_blocks();
        sched.add_request(request("a", 100, 4)).unwrap();
        // 64 tokens loaded, the other 36 computed (a token sampled), then a decode.
        let first = step_with(&mut sched, &mut store);
        assert_eq!(first.num_computed_tokens, vec![64]);
        let second = step_with(&mut sched, &mut store);
        assert_eq!(second.len(), 1, "the later step schedules a too");
        let failed = sched.get_request("a").unwrap().block_ids()[2];
        let named = sched.fail_kv_loads(&[], &[failed]).unwrap();
        if recompute {
            assert!(named.is_empty());
            let a = sched.get_request("a").unwrap();
            assert_eq!((a.status(), a.num_preemptions(), a.num_computed_tokens()), (RequestStatus::Preempted, 1, 0));
            assert_eq!(a.num_cached_blocks(), 0);
            apply_one_token_each(&mut sched, &first);
            apply_one_token_each(&mut sched, &second);
            assert_eq!(sched.get_request("a").unwrap().output_token_ids().count(), 0, "both outputs dropped");
            // The store still holds a's KV, but its load could fail again: it is not asked.
            let third = run(&mut sched, &mut store);
            assert_eq!(third.preempted.iter().map(|(_, id)| id.to_string()).collect::<Vec<_>>(), ["a"]);
            assert_eq!(third.num_computed_tokens, vec![32], "the blocks before the failed one hit");
            assert_eq!(third.external_computed_tokens, vec![-1]);
            assert_eq!(store.asked.len(), 1, "asked once: {:?}", store.asked);
            while sched.has_unfinished_requests() {
                run(&mut sched, &mut store);
            }
            sched.release_kv_blocks(&["a"]).unwrap();
        } else {
            assert_eq!(named.iter().map(|id| id.to_string()).collect::<Vec<_>>(), ["a"]);
            apply_one_token_each(&mut sched, &first);
            sched.finish_requests(Some(&["a"]), RequestStatus::FinishedError).unwrap();
            sched.release_kv_blocks(&["a"]).unwrap();
            apply_live(&mut sched, &second);
            assert!(!sched.has_unfinished_requests());
        }
        sched.check_invariants().unwrap();
        assert_eq!(sched.num_free_blocks(), total, "recompute={recompute}");
    }
}

#[test]
fn a_failed_block_of_a_synchronous_load_truncates_its_request_and_drops_its_output() {
    let mut sched = connected(|_| {});
    let mut store = Store { holds: vec![("a", Some(64))], ..Store::default() };
    sched.add_request(request("a", 100, 4)).unwrap();
    let step = step_with(&mut sched, &mut store);
    let failed = sched.get_request("a").unwrap().block_ids()[1];
    assert_eq!(sched.fail_kv_loads(&[], &[failed]).unwrap(), Vec::<std::sync::Arc<str>>::new());
    assert_eq!(sched.get_request("a").unwrap().num_computed_tokens(), 16);
    apply_one_token_each(&mut sched, &step);
    let a = sched.get_request("a").unwrap();
    assert_eq!((a.num_computed_tokens(), a.output_token_ids().count()), (16, 0));
    let step = step_with(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![100 - 16]);
    sched.check_invariants().unwrap();
}

#[test]
fn pending_block_frees_hold_back_a_preemption_for_blocks() {
    // Two requests fill the pool; the next decode step needs a block neither has.
    let running = |pending_frees: bool| {
        let mut sched = connected(|p| p.num_gpu_blocks = 5);
        sched.add_request(request("a", 32, 8)).unwrap();
        sched.add_request(request("b", 32, 8)).unwrap();
        let mut store = Store { pending_frees, ..Store::default() };
        run(&mut sched, &mut store);
        assert_eq!(store.asked_pending, 0, "asked only when an allocation fails");
        let step = step_with(&mut sched, &mut store);
        (step, store.asked_pending)
    };
    // Transfers will free blocks: vLLM waits for them, preempting nothing.
    let (step, asked) = running(true);
    assert_eq!(asked, 1);
    assert!(step.preempted.is_empty() && step.is_empty());
    // None pending: the last running request is preempted for the first's block.
    let (step, asked) = running(false);
    assert_eq!(asked, 1);
    assert_eq!(step.preempted.len(), 1);
    assert_eq!(step.len(), 1);
}

#[test]
fn a_one_token_load_queued_with_its_blocks_gives_them_back_when_they_wedge_the_queue() {
    // Deviation 15, found by the fuzz: a load of a one-token prompt leaves nothing computed
    // (the last token is computed again), so the request queues among the other waiting
    // requests, holding its block. Set aside (its connector cannot tell yet), its block is
    // the one the preempted request ahead needs, with nothing running: it gives it back.
    let mut sched = connected(|p| {
        p.block_size = 2;
        p.num_gpu_blocks = 6;
        p.max_model_len = 10;
        p.max_num_seqs = 4;
        p.max_num_batched_tokens = 16;
        p.async_scheduling = false;
        p.enable_prefix_caching = false;
    });
    let mut store = Store { holds: vec![("x", Some(1))], remote: vec!["x"], ..Store::default() };
    sched.add_request(request("big", 8, 2)).unwrap();
    sched.add_request(request("x", 1, 1)).unwrap();
    let step = run(&mut sched, &mut store);
    assert_eq!((ids(&sched, &step), step.kv_loads.len()), (vec!["big".to_string()], 1));
    assert_eq!(sched.num_free_blocks(), 0);
    sched.finish_kv_transfers(&["x"], &[]);
    store.holds = vec![("x", None)];
    // big's ninth token needs a fifth block, x holds the last free one: big preempts itself.
    let step = run(&mut sched, &mut store);
    assert!(step.is_empty() && status(&sched, "big") == RequestStatus::Preempted);
    // x, promoted with nothing computed, is asked again and set aside; big cannot be admitted
    // beside x's block, and nothing runs: x gives its block back, and big runs.
    let step = step_with(&mut sched, &mut store);
    assert_eq!(ids(&sched, &step), vec!["big"]);
    let x = sched.get_request("x").unwrap();
    assert!(x.block_ids().is_empty() && x.num_preemptions() == 1);
    assert_eq!(sched.waiting_ids(), [std::sync::Arc::from("x")]);
}
