//! Several KV-cache groups (a hybrid model): vLLM's rules for a sliding-window group beside
//! a full-attention one, step by step, on 4-token blocks and an 8-token window (a hit needs
//! the `cdiv(8 - 1, 4) = 2` blocks before its end).

mod common;

use common::*;
use llmsched_core::{ConfigParams, CoreError, KvCacheGroups, Scheduler, SchedulerConfig, Step};

/// Groups 0 (sliding window of 8 tokens) and 1 (full attention), Gemma 3's order.
fn hybrid(f: impl FnOnce(&mut ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.block_size = 4;
        p.kv_cache_groups = KvCacheGroups::parse("sliding_window:8,full").unwrap();
        f(p);
    }))
    .unwrap()
}

/// Runs one step with a sampled token for every request at the end of its tokens.
fn step_and_apply(sched: &mut Scheduler) -> Step {
    let step = sched.schedule();
    check_step(sched, &step);
    let (tokens, counts) = sample(sched, &step, false);
    apply(sched, &step, &tokens, &counts);
    sched.check_invariants().unwrap();
    step
}

/// The step's blocks of row `row` in each of `num_groups` groups.
fn row_blocks(step: &Step, row: usize, num_groups: usize) -> Vec<Vec<i32>> {
    let rows = step.len();
    assert_eq!(step.num_block_ids.len(), num_groups * rows);
    let mut offset = 0;
    let mut out = vec![Vec::new(); num_groups];
    for (at, &count) in step.num_block_ids.iter().enumerate() {
        let count = count as usize;
        if at % rows == row {
            out[at / rows] = step.block_ids[offset..offset + count].to_vec();
        }
        offset += count;
    }
    out
}

#[test]
fn a_sliding_window_gives_back_the_blocks_behind_it_and_nulls_them() {
    // Chunks of 4 tokens: the window (8 tokens) leaves a block behind every chunk once the
    // next token is 8 past a block's end.
    let mut sched = hybrid(|p| {
        p.max_num_batched_tokens = 4;
        p.max_num_seqs = 1;
        p.num_gpu_blocks = 64;
    });
    sched.add_request(request("a", 20, 4)).unwrap();
    let usable = sched.num_free_blocks();
    let mut tables = Vec::new();
    for _ in 0..6 {
        // Blocks are freed on the tokens processed when a step allocates (all of them,
        // in a synchronous engine): those wholly before the window of the next token.
        let processed = sched.get_request("a").unwrap().num_computed_tokens();
        step_and_apply(&mut sched);
        let r = sched.get_request("a").unwrap();
        tables.push((processed, r.group_block_ids(0).to_vec(), r.group_block_ids(1).to_vec()));
    }
    for (processed, sliding, full) in &tables {
        // Both tables cover the same positions; the full one never drops a block.
        assert_eq!(sliding.len(), full.len());
        assert!(!full.contains(&0));
        let skipped = ((processed - 8 + 1).max(0) / 4) as usize;
        let nulls = sliding.iter().take_while(|&&b| b == 0).count();
        assert_eq!(nulls, skipped, "{processed} processed: {sliding:?}");
        assert!(!sliding[nulls..].contains(&0));
    }
    // The last step decoded at 20 processed tokens: 13 behind the window, 3 blocks freed;
    // the pool lends 6 full blocks and 3 sliding ones.
    let (processed, sliding, full) = tables.last().unwrap();
    assert_eq!(*processed, 20);
    assert_eq!(usable - sched.num_free_blocks(), full.len() + sliding.iter().filter(|&&b| b != 0).count());
}

#[test]
fn a_hit_needs_only_the_window_before_its_end_in_the_sliding_group() {
    // Every block is cached (an interval of one block): a's 24-token prompt leaves its 6
    // blocks in both groups' caches; its window then frees the first sliding blocks.
    let mut sched = hybrid(|p| {
        p.enable_prefix_caching = true;
        p.prefix_cache_retention_interval = 4;
        p.num_gpu_blocks = 64;
    });
    sched.add_request(request("a", 24, 1)).unwrap();
    let first = step_and_apply(&mut sched);
    let a_blocks = row_blocks(&first, 0, 2);
    assert_eq!(sched.get_request_counts(), (0, 0), "a finished after its first token");

    // b: a's prompt and 8 more tokens. The hit is the longest prefix both groups serve
    // within N - 1 = 31 tokens: the full group has a's 6 blocks, the sliding group needs
    // blocks 4 and 5 (the window before token 24): a 24-token hit, the null block for
    // sliding blocks 0 to 3, which no later token attends.
    let mut b = request("b", 32, 1);
    b.prompt_token_ids[24..].iter_mut().for_each(|t| *t = 9);
    sched.add_request(b).unwrap();
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(step.num_computed_tokens[0], 24);
    assert_eq!(step.num_scheduled_tokens[0], 8);
    let b_blocks = row_blocks(&step, 0, 2);
    assert_eq!(b_blocks[0][..6], [0, 0, 0, 0, a_blocks[0][4], a_blocks[0][5]]);
    assert_eq!(b_blocks[1][..6], a_blocks[1][..6]);
    assert_eq!(b_blocks[0].len(), 8);
    assert_eq!(b_blocks[1].len(), 8);
}

#[test]
fn a_window_cut_short_in_the_cache_shortens_the_hit_for_every_group() {
    // Without the window's blocks cached at the end of the prefix, a sliding-window hit
    // falls back to its run from block 0: here none, so the hit is empty although the full
    // group holds the whole prefix. vLLM's engine default (0) caches only the 2 sliding
    // blocks before a's last prompt token: blocks 4 and 5 of a's 25-token prompt.
    let mut sched = hybrid(|p| {
        p.enable_prefix_caching = true;
        p.num_gpu_blocks = 64;
    });
    sched.add_request(request("a", 25, 1)).unwrap();
    let first = step_and_apply(&mut sched);
    let a_blocks = row_blocks(&first, 0, 2);
    let cached = |sched: &Scheduler, blocks: &[i32]| -> Vec<bool> {
        blocks.iter().map(|&b| sched.cached_block_hash(b as u32).is_some()).collect()
    };
    assert_eq!(cached(&sched, &a_blocks[0][..6]), [false, false, false, false, true, true]);
    assert_eq!(cached(&sched, &a_blocks[1][..6]), [true; 6]);

    // b shares a's first 16 tokens only: the full group could serve 4 blocks, the sliding
    // group's blocks 2 and 3 were never cached, and its run from block 0 is empty.
    let mut b = request("b", 25, 1);
    b.prompt_token_ids[16..].iter_mut().for_each(|t| *t = 9);
    sched.add_request(b).unwrap();
    let step = sched.schedule();
    assert_eq!(step.num_computed_tokens[0], 0);
    // c shares a's whole prompt: the hit stops at 24 tokens (N - 1 = 24), where the
    // sliding group holds blocks 4 and 5.
    sched.add_request(request("c", 25, 1)).unwrap();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    let step = sched.schedule();
    let row = step.req_handles.iter().position(|&h| sched.request(h).unwrap().id().as_ref() == "c").unwrap();
    assert_eq!(step.num_computed_tokens[row], 24);
    sched.check_invariants().unwrap();
}

#[test]
fn a_request_is_refused_only_if_its_blocks_over_every_group_outgrow_the_pool() {
    // 12 usable blocks. A 40-token request holds 10 full blocks and, in the window's group,
    // at most cdiv(8 - 1 + 4 in flight, 4) + 1 = 4: 14 blocks, refused; a 28-token one
    // holds 7 + 4 = 11, accepted.
    let mut sched = hybrid(|p| {
        p.max_num_batched_tokens = 4;
        p.max_num_seqs = 1;
        p.num_gpu_blocks = 13;
    });
    let err = sched.add_request(request("long", 36, 4)).unwrap_err();
    assert!(matches!(err, CoreError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("every KV-cache group counted"), "{err}");
    sched.add_request(request("short", 24, 4)).unwrap();
    while sched.get_request_counts() != (0, 0) {
        step_and_apply(&mut sched);
    }
}

#[test]
fn the_groups_field_names_its_value_when_refused() {
    for bad in ["full,", ",", "sliding", "sliding_window:0", "sliding_window:8,sliding_window:9", "mamba:4"] {
        let err = KvCacheGroups::parse(bad).unwrap_err().to_string();
        assert!(err.contains("kv_cache_groups"), "{bad:?}: {err}");
        assert!(err.contains(&format!("{bad:?}")) || bad.contains(','), "{bad:?}: {err}");
    }
    let groups = KvCacheGroups::parse("sliding_window:8, full").unwrap();
    assert_eq!(groups.to_text(), "sliding_window:8,full");
    let marked = KvCacheGroups::parse("sliding_window:8,full+eagle").unwrap();
    assert_eq!(marked.to_text(), "sliding_window:8,full+eagle");
    assert!(marked.holds_drafter(1) && !marked.holds_drafter(0));
    // EAGLE's block drop beside chunked local attention: vLLM does not serve it.
    let p = ConfigParams {
        kv_cache_groups: KvCacheGroups::parse("chunked_local:8,full").unwrap(),
        num_speculative_tokens: 2,
        num_lookahead_tokens: 2,
        eagle_block_drop: true,
        ..ConfigParams::default()
    };
    let err = SchedulerConfig::new(p).unwrap_err().to_string();
    assert!(err.starts_with("eagle_block_drop") && err.contains("chunked"), "{err}");
    let p = ConfigParams { prefix_cache_retention_interval: 6, block_size: 4, ..ConfigParams::default() };
    let err = SchedulerConfig::new(p).unwrap_err().to_string();
    assert!(err.contains("prefix_cache_retention_interval") && err.contains('6'), "{err}");
}

#[test]
fn a_chunked_local_group_frees_earlier_chunks_and_hits_from_the_current_chunk() {
    // Chunks of 8 tokens (2 blocks): a token attends only within its own chunk.
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = 4;
        p.kv_cache_groups = KvCacheGroups::parse("chunked_local:8,full").unwrap();
        p.enable_prefix_caching = true;
        p.max_num_batched_tokens = 4;
        p.max_num_seqs = 1;
        p.num_gpu_blocks = 64;
    }))
    .unwrap();
    sched.add_request(request("a", 20, 1)).unwrap();
    let mut a_tables = Vec::new();
    while sched.get_request_counts() != (0, 0) {
        let step = step_and_apply(&mut sched);
        if let Some(row) = step.req_handles.iter().position(|&h| sched.request(h).is_some()) {
            let r = sched.request(step.req_handles[row]).unwrap();
            a_tables.push((r.num_computed_tokens(), r.group_block_ids(0).to_vec(), r.group_block_ids(1).to_vec()));
        }
    }
    // The step from 12 processed tokens (its last while running) gave back chunk 0's two
    // blocks: token 12 attends within chunk 1 only. The full group keeps every block.
    let (c, chunked, full) = a_tables.last().unwrap();
    assert_eq!(*c, 16);
    assert_eq!(chunked[..2], [0, 0]);
    assert!(!chunked[2..].contains(&0) && !full.contains(&0));

    // b: a's prompt and 8 more tokens. The full group hits a's 5 blocks (20 tokens); within
    // them the chunked group needs only the blocks of the chunk holding token 20 that come
    // before it: block 4, cached when a computed it. A 20-token hit, 4 nulls before.
    let mut b = request("b", 28, 1);
    b.prompt_token_ids[20..].iter_mut().for_each(|t| *t = 9);
    sched.add_request(b).unwrap();
    let step = sched.schedule();
    check_step(&sched, &step);
    assert_eq!(step.num_computed_tokens[0], 20);
    let b_blocks = row_blocks(&step, 0, 2);
    assert_eq!(b_blocks[0][..4], [0, 0, 0, 0]);
    assert_ne!(b_blocks[0][4], 0);
    assert_eq!(b_blocks[1].len(), 6, "5 hit blocks and one for the step's 4 tokens");
    assert!(!b_blocks[1].contains(&0));
}

/// EAGLE's block drop over a sliding window and full attention (vLLM's hybrid rule): a
/// lookup looks one block past the candidate and gives back its hit's last block, and the
/// window group caches the blocks such a lookup reads (one more, up to the block above
/// the prompt's last whole block), so that a resend hits all but its last whole block.
#[test]
fn the_eagle_block_drop_over_a_window_and_full_attention_gives_back_one_block() {
    // a and b: one 26-token prompt (6 whole blocks, 2 tokens after), 1 token out. The
    // window group caches every block too (an interval of one block) in the last case.
    for (drafter, interval) in
        [("sliding_window:8,full", 0), ("sliding_window:8,full+eagle", 0), ("sliding_window:8,full+eagle", 4)]
    {
        let mut sched = hybrid(|p| {
            p.kv_cache_groups = KvCacheGroups::parse(drafter).unwrap();
            (p.enable_prefix_caching, p.num_gpu_blocks) = (true, 64);
            p.prefix_cache_retention_interval = interval;
            (p.num_speculative_tokens, p.num_lookahead_tokens, p.eagle_block_drop) = (1, 1, true);
        });
        sched.add_request(request("a", 26, 1)).unwrap();
        step_and_apply(&mut sched);
        sched.add_request(request("b", 26, 1)).unwrap();
        let step = sched.schedule();
        check_step(&sched, &step);
        // Full attention: 6 cached blocks within N - 1 + B, the last given back: 20 tokens.
        // The window's kept blocks 3 and 4 (and 5 where its kind drops too) serve it.
        assert_eq!(step.num_computed_tokens, vec![20], "{drafter}, interval {interval}");
        let b_blocks = row_blocks(&step, 0, 2);
        assert_eq!(b_blocks[0][..3], [0, 0, 0], "{drafter}: no later token reads them");
    }
}
