//! The orders the scheduler keeps, each checked against an order this file computes from
//! the spec's rule, never against the scheduler's own queues: admissions under the
//! priority policy (spec §1.3: by `(priority, arrival_time, request_id)`), and the free
//! block queue as requests release their blocks (spec §5.2).
mod common;

use std::collections::HashMap;

use common::*;
use llmsched_core::{NewRequest, Policy, RequestStatus, Scheduler};
use proptest::prelude::*;

/// A request's priority key, compared as vLLM's `Request.__lt__` does.
type Key = (i32, f64, String);

fn by_priority_then_arrival_then_id(a: &Key, b: &Key) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then(a.1.partial_cmp(&b.1).expect("finite arrival times")).then(a.2.cmp(&b.2))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// One request runs at a time and finishes after its first token: each step admits the
    /// next waiting request, so the admissions are the waiting order. Keys tie often (three
    /// priorities, three arrival times, short ids).
    #[test]
    fn priority_admits_by_priority_then_arrival_then_id(
        keys in prop::collection::hash_map("[a-d]{1,2}", (0i32..3, 0u8..3), 1..16)
    ) {
        let mut sched = Scheduler::new(config(|p| {
            p.policy = Policy::Priority;
            p.max_num_seqs = 1;
        }))
        .unwrap();
        let mut keys: Vec<Key> =
            keys.into_iter().map(|(id, (priority, arrival))| (priority, f64::from(arrival), id)).collect();
        for (priority, arrival_time, id) in &keys {
            let mut r = request(id, 4, 1);
            r.priority = i64::from(*priority);
            r.arrival_time = Some(*arrival_time);
            sched.add_request(r).unwrap();
        }
        keys.sort_by(by_priority_then_arrival_then_id);
        let expected: Vec<&str> = keys.iter().map(|k| k.2.as_str()).collect();
        let waiting: Vec<String> = sched.waiting_ids().iter().map(|id| id.to_string()).collect();
        prop_assert_eq!(&waiting, &expected, "the waiting order");
        let mut admitted = Vec::new();
        while sched.has_requests() {
            let step = sched.schedule();
            for &h in &step.new_reqs {
                admitted.push(sched.request(h).unwrap().id().to_string());
            }
            let (tokens, counts) = sample(&sched, &step, false);
            apply(&mut sched, &step, &tokens, &counts);
        }
        prop_assert_eq!(&admitted, &expected, "the admission order");
    }
}

/// The free queue after `finished` release their blocks, one after the other, computed
/// from the state before (spec §5.2): each request passes its table in reverse; a block
/// no other live request holds is freed, to the head if it has no hash (in the order
/// given), else to the tail (LRU).
fn free_queue_after(sched: &Scheduler, finished: &[&str], live: &[&str]) -> Vec<u32> {
    let mut holders: HashMap<u32, usize> = HashMap::new();
    for id in live {
        for &block in sched.get_request(id).unwrap().block_ids() {
            *holders.entry(block).or_default() += 1;
        }
    }
    let mut queue = sched.free_block_queue();
    for id in finished {
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        for &block in sched.get_request(id).unwrap().block_ids().iter().rev() {
            let held = holders.get_mut(&block).expect("a live request's block");
            *held -= 1;
            if *held == 0 {
                if sched.cached_block_hash(block).is_some() {
                    tail.push(block);
                } else {
                    head.push(block);
                }
            }
        }
        head.extend(queue);
        head.extend(tail);
        queue = head;
    }
    queue
}

fn prefix_caching(block_size: i64, num_gpu_blocks: i64) -> Scheduler {
    Scheduler::new(config(|p| {
        p.block_size = block_size;
        p.num_gpu_blocks = num_gpu_blocks;
        p.enable_prefix_caching = true;
        p.max_model_len = 256;
        p.max_num_batched_tokens = 256;
    }))
    .unwrap()
}

fn abort(sched: &mut Scheduler, id: &str) {
    sched.finish_requests(Some(&[id]), RequestStatus::FinishedAborted).unwrap();
}

/// vLLM's `test_prefill` (spec §5.2): req0 holds [1, 2, 3, 4] (4 partial), req1 shares
/// the three full blocks and holds [1, 2, 3, 5]; freeing req0 then req1 leaves the queue
/// [5, 4, 6, 7, 8, 9, 10, 3, 2, 1].
#[test]
fn the_free_queue_of_vllms_test_prefill() {
    let mut sched = prefix_caching(16, 11);
    let shared: Vec<i64> = (1..=48).collect();
    for (id, own) in [("req0", 100), ("req1", 200)] {
        let prompt = shared.iter().copied().chain(own..own + 7).collect();
        sched.add_request(NewRequest::new(id, prompt, 1)).unwrap();
    }
    sched.schedule();
    assert_eq!(sched.get_request("req0").unwrap().block_ids(), &[1, 2, 3, 4]);
    assert_eq!(sched.get_request("req1").unwrap().block_ids(), &[1, 2, 3, 5]);
    abort(&mut sched, "req0");
    abort(&mut sched, "req1");
    assert_eq!(sched.free_block_queue(), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
}

/// vLLM's `test_evict` (spec §5.2): req0 holds blocks 1-6 (6 partial), req1 holds 7-9,
/// [10] is free; after freeing req0 the queue is [6, 10, 5, 4, 3, 2, 1], after freeing req1
/// [6, 10, 5, 4, 3, 2, 1, 9, 8, 7].
#[test]
fn the_free_queue_of_vllms_test_evict() {
    let mut sched = prefix_caching(16, 11);
    sched.add_request(NewRequest::new("req0", (1..=87).collect(), 1)).unwrap();
    sched.add_request(NewRequest::new("req1", (1001..=1048).collect(), 1)).unwrap();
    sched.schedule();
    assert_eq!(sched.get_request("req0").unwrap().block_ids(), &[1, 2, 3, 4, 5, 6]);
    assert_eq!(sched.get_request("req1").unwrap().block_ids(), &[7, 8, 9]);
    abort(&mut sched, "req0");
    assert_eq!(sched.free_block_queue(), vec![6, 10, 5, 4, 3, 2, 1]);
    abort(&mut sched, "req1");
    assert_eq!(sched.free_block_queue(), vec![6, 10, 5, 4, 3, 2, 1, 9, 8, 7]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Requests sharing prefixes run a few steps, then are aborted in any order, one call
    /// at a time or several in one: after each call the free queue is the one
    /// `free_queue_after` computes.
    #[test]
    fn released_blocks_enter_the_free_queue_tail_block_first(
        prompts in prop::collection::vec((0u8..3, 1usize..14), 2..6),
        steps in 0usize..4,
        order in prop::collection::vec(any::<prop::sample::Index>(), 6),
        together in 1usize..3,
    ) {
        let mut sched = prefix_caching(4, 64);
        let mut live: Vec<String> = Vec::new();
        for (i, &(prefix, len)) in prompts.iter().enumerate() {
            // Three prefixes shared block by block, then the request's own tokens.
            let prompt = (0..len as i64).map(|t| if t < 8 { i64::from(prefix) * 100 + t } else { 1000 * (i as i64 + 1) + t });
            let id = format!("r{i}");
            sched.add_request(NewRequest::new(id.clone(), prompt.collect(), 6)).unwrap();
            live.push(id);
        }
        for _ in 0..steps {
            let step = sched.schedule();
            let (tokens, counts) = sample(&sched, &step, false);
            for e in apply(&mut sched, &step, &tokens, &counts) {
                if e.status.is_finished() {
                    live.retain(|id| sched.get_request(id).is_ok());
                }
            }
        }
        for pick in order {
            if live.is_empty() {
                break;
            }
            let mut chosen = Vec::new();
            for _ in 0..together.min(live.len()) {
                chosen.push(live.remove(pick.index(live.len())));
            }
            let chosen: Vec<&str> = chosen.iter().map(String::as_str).collect();
            let all: Vec<&str> = live.iter().map(String::as_str).chain(chosen.iter().copied()).collect();
            let expected = free_queue_after(&sched, &chosen, &all);
            sched.finish_requests(Some(&chosen), RequestStatus::FinishedAborted).unwrap();
            prop_assert_eq!(sched.free_block_queue(), expected, "after aborting {:?}", chosen);
        }
        sched.check_invariants().unwrap();
    }
}
