//! Mamba groups with prefix caching (vLLM's `mamba_cache_mode` "align"): prompt chunks end
//! on block boundaries, a Mamba table has a position per block but holds only the states a
//! step reads and writes (null blocks elsewhere), the state a resend can resume from is
//! cached, and a hit resumes from a cached state, never from one its own step writes.
//! Multimodal inputs cut chunks after the alignment, as vLLM's do, and a chunk that begins
//! mid-block (after such a cut, or a session's later input) realigns at the next boundary.

mod common;

use common::*;
use llmsched_core::{KvCacheGroups, MmInputSpec, NewRequest, RequestStatus, Scheduler, Step};

const B: usize = 4;

/// Full attention then a Mamba group, prefix caching on, blocks of `B` tokens.
fn aligned(budget: i64) -> Scheduler {
    with_checkpoints(budget, 0)
}

/// `aligned`, its Mamba layers writing prefill checkpoints of `alignment` (0: none).
fn with_checkpoints(budget: i64, alignment: i64) -> Scheduler {
    Scheduler::new(config(|p| {
        p.block_size = B as i64;
        p.kv_cache_groups = KvCacheGroups::parse("full,mamba").unwrap();
        p.enable_prefix_caching = true;
        (p.max_num_batched_tokens, p.max_num_seqs) = (budget, 4);
        p.scheduler_reserve_full_isl = false;
        p.mamba_prefill_checkpoint_alignment = alignment;
    }))
    .unwrap()
}

/// One step, run: each entry's request id, `C` and `n`.
fn step_and_apply(sched: &mut Scheduler) -> Vec<(String, i64, i64)> {
    let step = sched.schedule();
    apply_listing(sched, step)
}

/// `step`, run: its entries (see `entries`).
fn apply_listing(sched: &mut Scheduler, step: Step) -> Vec<(String, i64, i64)> {
    check_step(sched, &step);
    let entries = entries(sched, &step);
    let (tokens, counts) = sample(sched, &step, false);
    if !step.is_empty() {
        apply(sched, &step, &tokens, &counts);
    }
    sched.check_invariants().unwrap();
    entries
}

fn entries(sched: &Scheduler, step: &Step) -> Vec<(String, i64, i64)> {
    (0..step.len())
        .map(|i| {
            let id = sched.request(step.req_handles[i]).unwrap().id().to_string();
            (id, i64::from(step.num_computed_tokens[i]), i64::from(step.num_scheduled_tokens[i]))
        })
        .collect()
}

#[test]
fn prompt_chunks_end_on_block_boundaries_among_null_blocks() {
    // A 23-token prompt in a budget of 10: chunks of 8, 8, then the last boundary a hit
    // can resume from (20), then the prompt's last 3 tokens.
    let mut sched = aligned(10);
    sched.add_request(request("a", 23, 2)).unwrap();
    let mut chunks = Vec::new();
    while sched.get_request("a").is_ok_and(|r| r.num_computed_tokens() < 23) {
        chunks.extend(step_and_apply(&mut sched).into_iter().map(|(_, c, n)| (c, n)));
        let r = sched.get_request("a").unwrap();
        let mamba = r.group_block_ids(1);
        // A position per block, as full attention's table: the state the step wrote at
        // the end, the one it read (until the next step frees it), nulls elsewhere.
        assert_eq!(mamba.len(), r.group_block_ids(0).len());
        let held: Vec<usize> = (0..mamba.len()).filter(|&i| mamba[i] != 0).collect();
        assert!(held.last() == Some(&(mamba.len() - 1)) && held.len() <= 2, "{mamba:?}");
    }
    assert_eq!(chunks, [(0, 8), (8, 8), (16, 4), (20, 3)]);
}

#[test]
fn a_resend_resumes_from_the_cached_state_at_its_last_boundary() {
    let mut sched = aligned(64);
    sched.add_request(request("a", 23, 1)).unwrap();
    while sched.has_requests() {
        step_and_apply(&mut sched);
    }
    // The same prompt again: full attention caches every block, the Mamba group only the
    // state after 20 tokens, the last boundary before the prompt's last token.
    sched.add_request(request("again", 23, 1)).unwrap();
    assert_eq!(step_and_apply(&mut sched), [("again".to_string(), 20, 3)]);
    // A prompt that shares only 14 tokens finds no state at 12: no hit at all. Its first
    // chunk ends where full attention's cached prefix does (the junction), so that the
    // state there is cached for the next prompt that shares it.
    let sibling = |id: &str| {
        let mut r = request(id, 23, 1);
        r.prompt_token_ids[14] = 999;
        r
    };
    sched.add_request(sibling("other")).unwrap();
    while sched.get_request("again").is_ok() {
        step_and_apply(&mut sched);
    }
    assert_eq!(step_and_apply(&mut sched), [("other".to_string(), 0, 12)]);
    while sched.has_requests() {
        step_and_apply(&mut sched);
    }
    // One that shares 17 tokens with it resumes from that state, and stops at its own
    // junction (16, full attention's end) for the next.
    let mut third = sibling("third");
    third.prompt_token_ids[17] = 555;
    sched.add_request(third).unwrap();
    assert_eq!(step_and_apply(&mut sched), [("third".to_string(), 12, 4)]);
}

#[test]
fn a_hit_waits_for_a_state_its_own_step_writes() {
    // Two equal prompts arrive together: the first caches its state after 20 tokens in
    // step 1, which the second could hit but not read until the step has run.
    let mut sched = aligned(64);
    sched.add_request(request("a", 23, 1)).unwrap();
    sched.add_request(request("b", 23, 1)).unwrap();
    assert_eq!(step_and_apply(&mut sched), [("a".to_string(), 0, 20)]);
    assert_eq!(step_and_apply(&mut sched), [("a".to_string(), 20, 3), ("b".to_string(), 20, 3)]);
}

#[test]
fn a_step_frees_the_states_behind_the_one_it_reads() {
    let mut sched = aligned(8);
    let free = sched.num_free_blocks();
    sched.add_request(request("a", 17, 12)).unwrap();
    let mut most_held = 0;
    while sched.has_requests() {
        step_and_apply(&mut sched);
        if let Ok(r) = sched.get_request("a") {
            most_held = most_held.max(r.group_block_ids(1).iter().filter(|&&b| b != 0).count());
        }
    }
    // The state a step reads and the one it writes, at most.
    assert_eq!(most_held, 2);
    assert_eq!(sched.num_free_blocks(), free);
}

#[test]
fn a_prefill_checkpoint_keeps_the_last_chunk_whole() {
    // The state after 20 tokens, the last boundary a resend can resume from, is written
    // into a checkpoint block from inside the step that computes the whole prompt, when 20
    // is a multiple of the layers' alignment past the chunk's start.
    for (alignment, chunks) in [(1, vec![(0, 23)]), (5, vec![(0, 23)]), (3, vec![(0, 20), (20, 3)])] {
        let mut sched = with_checkpoints(64, alignment);
        sched.add_request(request("a", 23, 1)).unwrap();
        let step = sched.schedule();
        check_step(&sched, &step);
        let mamba = sched.request(step.req_handles[0]).unwrap().group_block_ids(1).to_vec();
        let first: Vec<(i64, i64)> = entries(&sched, &step).into_iter().map(|(_, c, n)| (c, n)).collect();
        assert_eq!(first, chunks[..1], "alignment {alignment}");
        if chunks.len() == 1 {
            // The checkpoint block, then the block the prompt's state ends in.
            assert!(mamba[..4].iter().all(|&b| b == 0) && mamba[4] != 0 && mamba[5] != 0, "{mamba:?}");
        }
        let (tokens, counts) = sample(&sched, &step, false);
        apply(&mut sched, &step, &tokens, &counts);
        while sched.has_requests() {
            step_and_apply(&mut sched);
        }
        sched.add_request(request("again", 23, 1)).unwrap();
        assert_eq!(step_and_apply(&mut sched), [("again".to_string(), 20, 3)], "alignment {alignment}");
    }
}

#[test]
fn an_encoder_cache_cut_realigns_at_the_next_boundary() {
    // vLLM's test_mamba_align_encoder_cache_cap_makes_progress, in blocks of 8: two images
    // the encoder cache holds one at a time. The first step's chunk stops before the
    // second image (mid-block), the next realigns at the block's end with that image
    // encoded, and the last finishes the prompt. A resend resumes from the state cached at
    // 8, inside the second image, whose output the encoder cache still holds.
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = 8;
        p.kv_cache_groups = KvCacheGroups::parse("full,mamba").unwrap();
        p.enable_prefix_caching = true;
        (p.max_num_batched_tokens, p.max_num_seqs) = (64, 4);
        (p.max_num_encoder_input_tokens, p.encoder_cache_size) = (6, 6);
    }))
    .unwrap();
    let with_images = |id: &str| {
        let mut r = request(id, 11, 1);
        r.mm_inputs = ["x", "y"]
            .iter()
            .zip([0, 6])
            .map(|(&identifier, offset)| MmInputSpec {
                identifier: identifier.into(),
                offset,
                length: 5,
                is_embed: None,
            })
            .collect();
        r
    };
    sched.add_request(with_images("a")).unwrap();
    let mut steps = Vec::new();
    while sched.has_requests() {
        let step = sched.schedule();
        let inputs: Vec<i32> = step.encoder_input_ids.clone();
        steps.push((apply_listing(&mut sched, step), inputs));
    }
    let chunks: Vec<(i64, i64, Vec<i32>)> =
        steps.into_iter().filter(|(e, _)| !e.is_empty()).map(|(e, inputs)| (e[0].1, e[0].2, inputs)).collect();
    assert_eq!(chunks[..3], [(0, 6, vec![0]), (6, 2, vec![1]), (8, 3, vec![])]);
    sched.add_request(with_images("again")).unwrap();
    let step = sched.schedule();
    assert!(step.encoder_input_ids.is_empty());
    assert_eq!(apply_listing(&mut sched, step), [("again".to_string(), 8, 3)]);
}

#[test]
fn a_session_input_resumes_from_the_kept_state_and_realigns() {
    // A session of 10 prompt tokens stops after 2 outputs, keeping 11 tokens of state; its
    // next input (6 tokens) resumes from the state after 11, mid-block, realigns at 12,
    // then runs to the last boundary a hit can resume from (16) and the prompt's end.
    let mut sched = aligned(64);
    sched.add_request(NewRequest { resumable: true, ..request("s", 10, 2) }).unwrap();
    while sched.get_request("s").unwrap().status() != RequestStatus::WaitingForStreamingReq {
        step_and_apply(&mut sched);
    }
    let input = NewRequest { resumable: true, ..NewRequest::new("s", vec![500; 6], 1) };
    sched.add_request_or_input(input).unwrap();
    let mut chunks = Vec::new();
    while sched.get_request("s").is_ok_and(|r| r.num_computed_tokens() < 17) {
        let r = sched.get_request("s").unwrap();
        // The table holds the state the next step continues from, after C tokens.
        let c = r.num_computed_tokens() as usize;
        assert_ne!(r.group_block_ids(1)[(c - 1) / B], 0, "no state after C = {c}");
        chunks.extend(step_and_apply(&mut sched).into_iter().map(|(_, c, n)| (c, n)));
    }
    assert_eq!(chunks, [(11, 1), (12, 4), (16, 1)]);
}

#[test]
fn a_paused_session_holding_every_used_block_gives_it_back_rather_than_wedge() {
    // Blocks of 2, 6 usable. A session of 5 tokens pauses after one output holding 3
    // attention blocks and 2 Mamba states (the one its last step read, the one it wrote):
    // 1 block is free. Its next input (2 tokens) asks room for its whole sequence, 2 blocks
    // (the read state is freed only by its next step), and so does a one-token request
    // behind it. vLLM would schedule nothing, step after step (deviation 15): the session
    // gives its KV back, the request behind runs, then the session from its cached prefix.
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = 2;
        p.num_gpu_blocks = 7;
        p.kv_cache_groups = KvCacheGroups::parse("full,mamba").unwrap();
        p.enable_prefix_caching = true;
        (p.max_model_len, p.max_num_batched_tokens, p.max_num_seqs) = (8, 8, 4);
        p.scheduler_reserve_full_isl = true;
    }))
    .unwrap();
    sched.add_request(NewRequest { resumable: true, ..request("s", 5, 1) }).unwrap();
    while sched.get_request("s").unwrap().status() != RequestStatus::WaitingForStreamingReq {
        step_and_apply(&mut sched);
    }
    assert_eq!(sched.num_free_blocks(), 1);
    sched.add_request_or_input(NewRequest { resumable: true, ..NewRequest::new("s", vec![500; 2], 1) }).unwrap();
    sched.add_request(request("x", 1, 1)).unwrap();
    assert_eq!(step_and_apply(&mut sched), [("x".to_string(), 0, 1)]);
    assert_eq!(sched.get_request("s").unwrap().num_preemptions(), 1);
    // It runs again from the state cached at 4 (the blocks it gave back stay cached).
    let mut runs = Vec::new();
    while sched.get_request("s").unwrap().status() != RequestStatus::WaitingForStreamingReq {
        runs.extend(step_and_apply(&mut sched).into_iter().filter(|(id, ..)| id == "s").map(|(_, c, n)| (c, n)));
    }
    assert_eq!(runs, [(4, 2), (6, 1)]);
}

#[test]
fn a_chunk_past_a_boundary_moves_the_speculative_blocks_it_leaves_behind_to_the_end() {
    // K = 2 drafts (vLLM's MambaSpec.num_speculative_blocks): a Mamba table reaches the
    // block its state ends in and one block per draft token after it.
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = B as i64;
        p.kv_cache_groups = KvCacheGroups::parse("full,mamba").unwrap();
        p.enable_prefix_caching = true;
        (p.max_num_batched_tokens, p.max_num_seqs, p.num_speculative_tokens) = (8, 4, 2);
        p.scheduler_reserve_full_isl = false;
    }))
    .unwrap();
    sched.add_request(request("a", 20, 4)).unwrap();
    assert_eq!(step_and_apply(&mut sched), [("a".to_string(), 0, 8)]);
    let first = sched.get_request("a").unwrap().group_block_ids(1).to_vec();
    // The state after 8 tokens at index 1, then the two speculative blocks.
    assert!(first.len() == 4 && first[0] == 0 && !first[1..].contains(&0), "{first:?}");
    let free = sched.num_free_blocks();
    assert_eq!(step_and_apply(&mut sched), [("a".to_string(), 8, 8)]);
    let second = sched.get_request("a").unwrap().group_block_ids(1).to_vec();
    // The state after 16 tokens ends in block 3: the speculative block at index 2 falls
    // behind it and moves to the end (the runner's table only grows), the one at index 3
    // holds the state, and one new block follows as the second speculative block.
    assert_eq!(second.len(), 6, "{second:?}");
    assert_eq!((second[1], second[2], second[3], second[4]), (first[1], 0, first[3], first[2]));
    assert!(!first.contains(&second[5]));
    // One block for the Mamba group and two for full attention's next 8 tokens.
    assert_eq!(free - sched.num_free_blocks(), 1 + 2);
}
