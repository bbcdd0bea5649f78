//! EAGLE's prefix-cache rules (the drop of a hit's last block, lookahead block hashes) and
//! the step's `drafts_unused` (vLLM's `skip_drafts`).

mod common;

use common::*;
use llmsched_core::{ConfigParams, NewRequest, RequestStatus, Scheduler};

const B: usize = 16;

fn eagle(f: impl FnOnce(&mut ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.enable_prefix_caching = true;
        p.num_speculative_tokens = 3;
        p.num_lookahead_tokens = 3;
        f(p);
    }))
    .unwrap()
}

fn tokens(len: usize) -> Vec<i64> {
    (0..len as i64).map(|t| t % 1000 + 1).collect()
}

/// Runs `first` (a prompt of `tokens`) to its end, then admits `second` and returns the
/// tokens its prefix hit covered.
fn hit_after(sched: &mut Scheduler, first: Vec<i64>, second: Vec<i64>) -> i64 {
    sched.add_request(NewRequest::new("first", first, 1)).unwrap();
    while sched.has_unfinished_requests() {
        let step = sched.schedule();
        let (t, c) = sample(sched, &step, false);
        apply(sched, &step, &t, &c);
    }
    sched.add_request(NewRequest::new("second", second, 1)).unwrap();
    let step = sched.schedule();
    check_step(sched, &step);
    i64::from(step.num_computed_tokens[0])
}

#[test]
fn a_hit_gives_back_its_last_block_under_the_block_drop() {
    // 4 full blocks of a 70-token prompt are cached; a resend hits 4 blocks plainly,
    // 3 under the drop.
    let plain = hit_after(&mut eagle(|_| {}), tokens(70), tokens(70));
    let dropped = hit_after(&mut eagle(|p| p.eagle_block_drop = true), tokens(70), tokens(70));
    assert_eq!(plain, 4 * B as i64);
    assert_eq!(dropped, 3 * B as i64);
}

#[test]
fn a_lookahead_hash_needs_the_token_after_its_block() {
    // The prompt ends exactly at 4 blocks: the 4th block's hash needs a 65th token, which
    // the first request's sampled token gives it, so a resend followed by another token hits
    // all 4 (capped at N - 1 = 64), and one followed by a different token hits only 3.
    let mut same = tokens(65);
    same[64] = 7; // the token `sample` gives
    let hit = hit_after(&mut eagle(|p| p.num_hash_lookahead_tokens = 1), tokens(64), same.clone());
    assert_eq!(hit, 4 * B as i64);
    let mut other = same;
    other[64] = 8;
    let hit = hit_after(&mut eagle(|p| p.num_hash_lookahead_tokens = 1), tokens(64), other.clone());
    assert_eq!(hit, 3 * B as i64);
    // Without lookahead hashes the 4th block hits whatever follows.
    let hit = hit_after(&mut eagle(|_| {}), tokens(64), other);
    assert_eq!(hit, 4 * B as i64);
}

#[test]
fn a_block_enters_the_cache_only_once_its_lookahead_tokens_exist() {
    // A 64-token prompt, max_tokens 1: its 4th block has no 65th token before the request
    // finishes, so it is never cached; a longer resend hits 3 blocks.
    let mut sched = eagle(|p| p.num_hash_lookahead_tokens = 1);
    sched.add_request(NewRequest::new("first", tokens(64), 1)).unwrap();
    let step = sched.schedule();
    let first = sched.request(step.req_handles[0]).unwrap();
    assert_eq!(first.block_hashes().len(), 3);
    sched.finish_requests(Some(&["first"]), RequestStatus::FinishedAborted).unwrap();
    sched.add_request(NewRequest::new("second", tokens(80), 1)).unwrap();
    let step = sched.schedule();
    assert_eq!(step.num_computed_tokens[0], 3 * B as i32);
}

#[test]
fn drafts_are_unused_by_a_prefill_chunk_and_by_a_last_token() {
    let mut sched = eagle(|p| (p.max_num_batched_tokens, p.max_num_seqs) = (40, 8));
    sched.add_request(NewRequest::new("long", tokens(60), 5)).unwrap();
    // A non-final chunk of 40 tokens samples nothing.
    let step = sched.schedule();
    assert!(step.drafts_unused);
    let (t, c) = sample(&sched, &step, false);
    apply(&mut sched, &step, &t, &c);
    // The final chunk samples the first of 5 tokens: a later step verifies the drafts.
    let step = sched.schedule();
    assert!(!step.drafts_unused);

    // A request of max_tokens 1: its only step samples its last token.
    let mut sched = eagle(|_| {});
    sched.add_request(NewRequest::new("one", tokens(20), 1)).unwrap();
    assert!(sched.schedule().drafts_unused);
    // An empty step has none to use.
    let mut sched = eagle(|_| {});
    assert!(sched.schedule().drafts_unused);
}

#[test]
fn a_step_in_flight_counts_toward_the_last_token() {
    // Async: a request of max_tokens 2 whose first decode is in flight samples its last
    // token in the next step, whatever the drafts.
    let mut sched = eagle(|p| p.async_scheduling = true);
    sched.add_request(NewRequest::new("two", tokens(20), 2)).unwrap();
    let first = sched.schedule();
    assert!(!first.drafts_unused);
    let second = sched.schedule();
    assert_eq!(second.len(), 1);
    assert!(second.drafts_unused);
}

#[test]
fn the_rules_are_checked_together() {
    let both = ConfigParams { eagle_block_drop: true, num_hash_lookahead_tokens: 1, ..ConfigParams::default() };
    let err = llmsched_core::SchedulerConfig::new(both).unwrap_err().to_string();
    assert!(err.contains("eagle_block_drop"), "{err}");
    // Beside a window, served; beside chunked local attention, refused (vLLM asserts).
    let groups = |text| ConfigParams {
        eagle_block_drop: true,
        kv_cache_groups: llmsched_core::KvCacheGroups::parse(text).unwrap(),
        ..ConfigParams::default()
    };
    assert!(llmsched_core::SchedulerConfig::new(groups("full,sliding_window:32")).is_ok());
    let err = llmsched_core::SchedulerConfig::new(groups("full,chunked_local:32")).unwrap_err().to_string();
    assert!(err.starts_with("eagle_block_drop"), "{err}");
}

/// A multi-module MTP drafter (prefill lookahead `L = K = 3`): a chunk never ends fewer than
/// `L` tokens before the prompt's end (vLLM's `_reserve_prefill_lookahead`), and the last
/// `L - 1` computed tokens are not cached (the drafter may compute them again).
#[test]
fn a_multi_module_drafter_keeps_its_prefill_lookahead() {
    let chunks = |l: i64| {
        let mut sched = eagle(|p| {
            p.max_num_batched_tokens = 32;
            p.max_num_seqs = 4;
            p.num_prefill_lookahead_tokens = l;
        });
        // 34 tokens: a 32-token chunk would leave 2 < L = 3 of them.
        sched.add_request(NewRequest::new("r", tokens(34), 1)).unwrap();
        let step = sched.schedule();
        check_step(&sched, &step);
        step.num_scheduled_tokens[0]
    };
    assert_eq!(chunks(3), 31);
    assert_eq!(chunks(1), 32);
    // Cached after a 65-token prompt is computed: its first 64 tokens, 4 blocks; with L = 3
    // the last 2 computed tokens do not count: 63 tokens, 3 blocks.
    let hit = |l: i64, len: usize| {
        let mut sched = eagle(|p| p.num_prefill_lookahead_tokens = l);
        let mut again = tokens(len);
        again.push(7); // the token `sample` gives
        again.push(7);
        hit_after(&mut sched, tokens(len), again)
    };
    assert_eq!(hit(1, 65), 4 * B as i64);
    assert_eq!(hit(3, 65), 3 * B as i64);
}

#[test]
fn a_prefill_lookahead_no_step_can_hold_is_refused() {
    let err = |f: fn(&mut ConfigParams)| {
        let mut p = ConfigParams { num_speculative_tokens: 3, num_lookahead_tokens: 3, ..ConfigParams::default() };
        f(&mut p);
        llmsched_core::SchedulerConfig::new(p).err().map(|e| e.to_string())
    };
    assert_eq!(err(|p| p.num_prefill_lookahead_tokens = 3), None);
    assert!(err(|p| p.num_prefill_lookahead_tokens = 4).unwrap().contains("num_prefill_lookahead_tokens=4"));
    assert!(err(|p| {
        p.num_prefill_lookahead_tokens = 3;
        p.long_prefill_token_threshold = 2;
    })
    .unwrap()
    .contains("long_prefill_token_threshold=2"));
    assert!(err(|p| {
        p.num_prefill_lookahead_tokens = 3;
        p.kv_cache_groups = llmsched_core::KvCacheGroups::parse("sliding_window:64,full").unwrap();
    })
    .unwrap()
    .contains("several KV-cache groups"));
    assert!(err(|p| {
        p.num_prefill_lookahead_tokens = 3;
        p.max_num_encoder_input_tokens = 16;
        p.encoder_cache_size = 16;
    })
    .unwrap()
    .contains("with multimodal inputs"));
    assert!(err(|p| {
        p.num_prefill_lookahead_tokens = 1;
        p.num_lookahead_tokens = 0;
    })
    .unwrap()
    .contains("0 without"));
}
