//! A KV connector's scheduler side: tokens a connector loads past the prefix-cache hit
//! (vLLM's `get_num_new_matched_tokens`, synchronous loads), and the blocks of finished
//! requests held until released (`request_finished` asking for a delayed free).

mod common;

use common::*;
use llmsched_core::{ExternalKv, Request, RequestStatus, Scheduler, Step};

/// A connector that holds the first `tokens` tokens of the requests it names, and records
/// each question (request id, local hit).
#[derive(Default)]
struct Store {
    holds: Vec<(&'static str, Option<i64>)>,
    asked: Vec<(String, i64)>,
}

impl ExternalKv for Store {
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<i64> {
        self.asked.push((request.id().to_string(), num_local_computed));
        match self.holds.iter().find(|(id, _)| **id == **request.id()) {
            Some(&(_, tokens)) => tokens.map(|t| t - num_local_computed),
            None => Some(0),
        }
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
    let step = sched.schedule_with(false, Some(store));
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
    assert_eq!(sched.held_kv_blocks("a").map(<[u32]>::len), Some(3));
    assert_eq!(sched.num_free_blocks(), total - 3);
    // The id cannot be reused while its blocks are held.
    let err = sched.add_request(request("a", 10, 1)).unwrap_err().to_string();
    assert!(err.contains("still holds KV blocks"), "{err}");
    // A bad release changes nothing.
    assert!(sched.release_kv_blocks(&["a", "nope"]).is_err());
    assert_eq!(sched.num_free_blocks(), total - 3);
    sched.release_kv_blocks(&["a"]).unwrap();
    assert_eq!(sched.num_free_blocks(), total);
    assert_eq!(sched.held_kv_blocks("a"), None);
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

#[test]
fn a_connector_over_several_groups_is_refused() {
    let err = llmsched_core::SchedulerConfig::new(llmsched_core::ConfigParams {
        kv_connector: true,
        kv_cache_groups: llmsched_core::KvCacheGroups::parse("full,sliding_window:32").unwrap(),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("kv_connector"), "{err}");
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
