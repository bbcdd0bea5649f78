//! Mamba groups without prefix caching (vLLM's `MambaSpec` in `mamba_cache_mode` "none"):
//! a request holds `1 + K` state blocks in each Mamba group from its first step to its
//! end, beside the attention groups' growing tables, all from one pool.

mod common;

use common::*;
use llmsched_core::{ConfigParams, KvCacheGroups, NewRequest, RequestStatus, Scheduler, SchedulerConfig, Step};

/// A Mamba group first (as Granite 4's layers come), then full attention, then Mamba.
fn mamba(f: impl FnOnce(&mut ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.block_size = 4;
        p.kv_cache_groups = KvCacheGroups::parse("mamba,full,mamba").unwrap();
        f(p);
    }))
    .unwrap()
}

fn step_and_apply(sched: &mut Scheduler, accept_drafts: bool) -> Step {
    let step = sched.schedule();
    check_step(sched, &step);
    let (tokens, counts) = sample(sched, &step, accept_drafts);
    apply(sched, &step, &tokens, &counts);
    sched.check_invariants().unwrap();
    step
}

fn tables(sched: &Scheduler, id: &str) -> Vec<Vec<u32>> {
    let r = sched.get_request(id).unwrap();
    (0..3).map(|g| r.group_block_ids(g).to_vec()).collect()
}

#[test]
fn a_request_holds_its_state_blocks_from_its_first_step_to_its_end() {
    for k in [0, 3] {
        let mut sched = mamba(|p| (p.num_speculative_tokens, p.max_num_batched_tokens, p.max_num_seqs) = (k, 8, 1));
        let free = sched.num_free_blocks();
        sched.add_request(request("a", 10, 12)).unwrap();
        // A 10-token prompt in chunks of 8: the first chunk takes every state block.
        step_and_apply(&mut sched, false);
        let first = tables(&sched, "a");
        assert_eq!(first[0].len() as i64, 1 + k, "K = {k}: {first:?}");
        assert_eq!(first[2].len() as i64, 1 + k);
        let mut attention_lengths = vec![first[1].len()];
        while sched.get_request("a").is_ok() {
            step_and_apply(&mut sched, false);
            let Ok(_) = sched.get_request("a") else { break };
            let now = tables(&sched, "a");
            // The state blocks stay the same blocks; only the attention table grows.
            assert_eq!((&now[0], &now[2]), (&first[0], &first[2]));
            attention_lengths.push(now[1].len());
        }
        assert!(attention_lengths.last() > attention_lengths.first(), "{attention_lengths:?}");
        // Finished: every group's blocks are back.
        assert_eq!(sched.num_free_blocks(), free);
    }
}

#[test]
fn the_pool_counts_state_blocks_at_admission_and_preemption_frees_them() {
    // 11 usable blocks: a request of 8 + 8 tokens needs 2 state blocks (one per Mamba
    // group) and 4 attention blocks at its end; two fit at admission (2 x (2 + 2)), and one
    // is preempted when both grow.
    let mut sched = mamba(|p| {
        (p.num_gpu_blocks, p.max_num_batched_tokens, p.max_num_seqs) = (12, 32, 4);
        p.scheduler_reserve_full_isl = false;
    });
    for id in ["a", "b", "c"] {
        sched.add_request(request(id, 8, 8)).unwrap();
    }
    let step = step_and_apply(&mut sched, false);
    // c waits: a third request's 2 state blocks and 2 attention blocks do not fit in 11 - 8.
    assert_eq!(step.len(), 3 - 1, "{:?}", step.req_handles);
    let mut preempted = 0;
    while sched.has_requests() {
        let step = step_and_apply(&mut sched, false);
        preempted += step.preempted.len();
        for id in ["a", "b", "c"] {
            if let Ok(r) = sched.get_request(id) {
                if r.status() == RequestStatus::Preempted || r.status() == RequestStatus::Waiting {
                    assert!(tables(&sched, id).iter().all(Vec::is_empty), "{id} waits holding blocks");
                }
            }
        }
    }
    assert!(preempted > 0);
    assert_eq!(sched.num_free_blocks(), 11);
}

#[test]
fn a_mamba_group_needs_an_attention_group_and_serves_drafts_either_way() {
    let refused = |groups: &str, caching: bool, k: i64| {
        let p = ConfigParams {
            kv_cache_groups: KvCacheGroups::parse(groups).unwrap(),
            enable_prefix_caching: caching,
            num_speculative_tokens: k,
            ..ConfigParams::default()
        };
        SchedulerConfig::new(p).err().map(|e| e.to_string())
    };
    assert_eq!(refused("mamba,full", true, 0), None);
    assert_eq!(refused("mamba,full", true, 2), None);
    assert_eq!(refused("mamba,full", false, 2), None);
    assert!(refused("mamba,mamba", false, 0).unwrap().contains("kv_cache_groups"));
    // A short request still needs its state blocks in every Mamba group.
    let mut sched = mamba(|p| (p.num_gpu_blocks, p.num_speculative_tokens) = (7, 2));
    let err = sched.add_request(NewRequest::new("r", vec![1, 2], 1)).unwrap_err().to_string();
    // 1 + K = 3 blocks in each Mamba group take the 6 usable ones: no attention block is left
    // for a prompt.
    assert!(err.contains("at most 0 tokens") && err.contains("6 usable blocks"), "{err}");
}
