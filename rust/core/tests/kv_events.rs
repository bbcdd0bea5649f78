//! KV cache events: the prefix cache's changes in the order the scheduler makes them.

mod common;

use common::*;
use llmsched_core::{KvEvent, NewRequest, RequestStatus, Scheduler};

fn cached(f: impl FnOnce(&mut llmsched_core::ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.enable_prefix_caching = true;
        p.enable_kv_cache_events = true;
        p.block_size = 4;
        f(p);
    }))
    .unwrap()
}

fn stored(id: &str, first_block: u32, blocks: &[u32]) -> KvEvent {
    KvEvent::Stored { request_id: id.into(), group: 0, first_block, blocks: blocks.to_vec() }
}

fn step_and_apply(sched: &mut Scheduler) {
    let step = sched.schedule();
    let (tokens, counts) = sample(sched, &step, false);
    apply(sched, &step, &tokens, &counts);
}

#[test]
fn a_prefill_stores_its_full_blocks_and_a_decode_the_block_it_fills() {
    let mut sched = cached(|_| {});
    // 10 tokens: two full blocks, a partial third.
    sched.add_request(request("a", 10, 3)).unwrap();
    let step = sched.schedule();
    let table = sched.get_request("a").unwrap().block_ids().to_vec();
    assert_eq!(sched.take_kv_events(), [stored("a", 0, &table[..2])]);
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    assert_eq!(sched.take_kv_events(), []);
    // Tokens 11 and 12 fill the third block: the step that computes token 12 stores it.
    step_and_apply(&mut sched);
    assert_eq!(sched.take_kv_events(), []);
    step_and_apply(&mut sched);
    assert_eq!(sched.take_kv_events(), [stored("a", 2, &table[2..3])]);
}

#[test]
fn a_hit_is_reported_only_to_a_request_that_asks_and_eviction_removes_blocks() {
    // 1 + 5 blocks of 4 tokens: room for one 16-token prompt and its sampled token.
    let mut sched = cached(|p| p.num_gpu_blocks = 6);
    sched.add_request(request("a", 16, 1)).unwrap();
    step_and_apply(&mut sched);
    let events = sched.take_kv_events();
    let [KvEvent::Stored { blocks: a_blocks, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(a_blocks.len(), 4);
    assert_eq!(sched.get_request_counts(), (0, 0), "a finished after one token");

    // The same prompt twice: each hits a's first three blocks (the last token is
    // recomputed) and needs one block more. b takes the one block a never used; c then
    // evicts a's cached fourth block. Only b asked to be told of its hits.
    sched.add_request(NewRequest { report_reused_blocks: true, ..request("b", 16, 1) }).unwrap();
    sched.add_request(request("c", 16, 1)).unwrap();
    let step = sched.schedule();
    assert_eq!(step.len(), 2);
    let fourth = |id: &str| sched.get_request(id).unwrap().block_ids()[3];
    let (b_fourth, c_fourth) = (fourth("b"), fourth("c"));
    assert!(!a_blocks.contains(&b_fourth));
    assert_eq!(c_fourth, a_blocks[3]);
    assert_eq!(
        sched.take_kv_events(),
        [
            KvEvent::Reused { request_id: "b".into(), group: 0, num_blocks: 3 },
            stored("b", 3, &[b_fourth]),
            KvEvent::Removed { block: a_blocks[3], group: 0 },
            stored("c", 3, &[a_blocks[3]]),
        ]
    );
    sched.check_invariants().unwrap();
}

#[test]
fn reset_prefix_cache_clears_once_no_block_is_in_use() {
    let mut sched = cached(|_| {});
    sched.add_request(request("a", 8, 2)).unwrap();
    let step = sched.schedule();
    assert!(!sched.reset_prefix_cache(false), "a holds blocks");
    let _ = sched.take_kv_events();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    sched.finish_requests(Some(&["a"]), RequestStatus::FinishedAborted).unwrap();
    assert!(sched.reset_prefix_cache(false));
    assert_eq!(sched.take_kv_events(), [KvEvent::Cleared]);
}

#[test]
fn nothing_is_recorded_while_events_are_off() {
    let mut sched = cached(|p| p.enable_kv_cache_events = false);
    sched.add_request(NewRequest { report_reused_blocks: true, ..request("a", 16, 2) }).unwrap();
    step_and_apply(&mut sched);
    step_and_apply(&mut sched);
    assert!(sched.reset_prefix_cache(false));
    assert_eq!(sched.take_kv_events(), []);
}
