//! Several KV-cache groups over one block pool: vLLM's hybrid KV-cache coordinator for
//! full-attention, sliding-window and chunked local attention groups (hybrid models such
//! as Gemma 3 and Llama 4).
//!
//! Every group has its own block table per request (group 0's is `Request::block_ids`,
//! the others `Request::extra_tables`) and its own prefix cache in the pool; one pool
//! serves them all, so an allocation succeeds only if every group's blocks fit. A
//! sliding-window group needs only the last `W` tokens, a chunked local group only the
//! current chunk: blocks wholly before them return to the pool and the null block takes
//! their place in the table (so positions stay put), and a prefix hit there needs only
//! the blocks before the hit's end that the next token attends to. A Mamba group holds a
//! fixed set of state blocks per request, from its first step to its end, with prefix
//! caching off; with it on (vLLM's `mamba_cache_mode` "align"), its table has a position
//! per block, the states its steps end at block boundaries, and a hit is one cached state
//! (null blocks before it). Every group has the scheduler's block size.

use crate::config::AttentionKind;
use crate::kv::block_pool::{BlockHash, NULL_BLOCK};
use crate::kv::events::KvEvent;
use crate::kv::layout::{CacheHit, Groups};
use crate::kv::manager::{cdiv, KvManager, SlotRequest};
use crate::request::Request;

/// The last block boundary of the first `tokens` tokens from which a hit can resume an
/// aligned Mamba state: one that leaves the last token (or the tokens lookahead hashes
/// cover) to compute, or under EAGLE's block drop the boundary a block before the last
/// (the attention groups' hits end there) (vLLM's `get_mamba_prefill_checkpoint_position`).
pub(crate) fn mamba_checkpoint_position(tokens: i64, block_size: i64, hash_lookahead: i64, eagle_drop: bool) -> i64 {
    if eagle_drop {
        (tokens / block_size * block_size - block_size).max(0)
    } else {
        ((tokens - hash_lookahead.max(1)) / block_size * block_size).max(0)
    }
}

/// Whether a step computing tokens `start..end` can write the Mamba state at `position`
/// into a prefill checkpoint block from inside the step (vLLM's
/// `is_mamba_prefill_checkpoint_valid`): the step starts on a block boundary, the
/// checkpoint lies a block or more past it, strictly inside the step, a multiple of the
/// layers' `alignment` past its start, and in a block before the one the step ends in and
/// after the one it reads its state from.
pub(crate) fn mamba_checkpoint_exportable(
    start: i64,
    end: i64,
    position: i64,
    block_size: i64,
    alignment: i64,
) -> bool {
    let read_from = (start - 1).div_euclid(block_size);
    let checkpoint_block = cdiv(end, block_size) - 2;
    alignment > 0
        && start % block_size == 0
        && checkpoint_block > read_from
        && start + block_size <= position
        && position < end
        && (position - start) % alignment == 0
}

/// The tokens a step's blocks are counted for (vLLM's `get_num_blocks_to_allocate`).
#[derive(Clone, Copy)]
struct StepTokens {
    /// Every slot's: the computed tokens, the step's and the drafter's lookahead slots.
    num_tokens: i64,
    /// The target model's alone (no lookahead slots).
    num_main: i64,
    total_computed: i64,
}

/// Whether `request` holds blocks it was allocated since it last gave its blocks back
/// (vLLM's `_allocated_block_reqs`): every group's table holds an entry once allocated
/// for, so group 0's tells; read before a lookup's hits are added.
fn allocated_for(request: &Request) -> bool {
    !request.block_ids.is_empty()
}

/// Group `g`'s table of `request`, its settled-entry count, and the request's hashes.
fn table(request: &mut Request, g: usize) -> (&mut Vec<u32>, &mut usize, &[BlockHash]) {
    if g == 0 {
        (&mut request.block_ids, &mut request.num_cached_blocks, &request.block_hashes)
    } else {
        let t = &mut request.extra_tables[g - 1];
        (&mut t.ids, &mut t.num_cached, &request.block_hashes)
    }
}

impl KvManager {
    /// vLLM's hybrid hit, capped at `max_length` tokens (at most `N - 1`): each kind of
    /// group in turn (full attention first) finds its longest hit within the current
    /// candidate, which shrinks to it, until every kind accepts the candidate. Under EAGLE's
    /// block drop a kind looks one block past the candidate and gives back its hit's last
    /// block (vLLM's `eagle_proof_margin`). vLLM drops once per kind and candidate; here
    /// that is every lookup: the kinds looked up are full attention first and a window (one
    /// pass), or windows alone, where a second drop lands where the first did.
    pub(crate) fn find_hybrid_hit(&self, groups: &Groups, request: &Request, max_length: i64) -> CacheHit {
        let hashes = &request.block_hashes;
        let b = self.block_size;
        let simple = groups.lookups.len() == 2 && groups.lookups[0].0 == AttentionKind::Full;
        let mut hit_length = max_length;
        let mut longest_hit_length = 0;
        // Per kind of group, the cached blocks its last lookup found: `start..end`, null
        // blocks before them.
        let mut found: Vec<Option<(usize, usize)>> = vec![None; groups.lookups.len()];
        loop {
            let mut curr = hit_length;
            for (lookup, (kind, members)) in groups.lookups.iter().enumerate() {
                if let (AttentionKind::Full, Some((_, end))) = (kind, found[lookup]) {
                    // Full attention's hit is downward-closed: the first lookup serves.
                    curr = curr.min(end as i64 * b);
                    continue;
                }
                let drop = groups.eagle_drop[members[0]];
                let max_length = if drop { (curr + b).min(hashes.len() as i64 * b) } else { curr };
                let (start, end) = match *kind {
                    AttentionKind::Full => (0, self.full_attention_hit(hashes, max_length, members, drop)),
                    AttentionKind::SlidingWindow { window } => {
                        self.sliding_window_hit(hashes, max_length, members, i64::from(window), drop)
                    }
                    // (No block drop beside chunked local attention: refused.)
                    AttentionKind::ChunkedLocal { chunk } => {
                        self.chunked_local_hit(hashes, max_length, members, i64::from(chunk))
                    }
                    // A hit resumes from the state cached at its end.
                    AttentionKind::Mamba => self.cached_run_hit(hashes, max_length, members, 1),
                };
                found[lookup] = Some((start, end));
                curr = end as i64 * b;
                longest_hit_length = longest_hit_length.max(curr);
            }
            if curr >= hit_length {
                break;
            }
            hit_length = curr;
            if simple {
                break;
            }
        }
        let num_hit_blocks = (hit_length / self.block_size) as usize;
        let mut blocks = vec![NULL_BLOCK; groups.len() * num_hit_blocks];
        for ((_, members), found) in groups.lookups.iter().zip(found) {
            let (start, end) = found.unwrap_or_default();
            for &g in members {
                let run = &mut blocks[g * num_hit_blocks..(g + 1) * num_hit_blocks];
                // Full attention's run is trimmed to the hit; a sliding window's ends there.
                for i in start..end.min(num_hit_blocks) {
                    run[i] = self.pool.get_cached_block(hashes[i], g).expect("a hit block is cached");
                }
            }
        }
        let uncached = longest_hit_length - hit_length;
        CacheHit {
            blocks,
            tokens: hit_length,
            shared_prefix_boundary: if uncached > 0 { hit_length + uncached } else { 0 },
        }
    }

    /// Whether every group of `members` has the block `hash` names cached.
    fn cached_in_all(&self, hash: BlockHash, members: &[usize]) -> bool {
        members.iter().all(|&g| self.pool.get_cached_block(hash, g).is_some())
    }

    /// How many leading blocks within `max_length` tokens are cached, less the last under
    /// EAGLE's block `drop`.
    fn full_attention_hit(&self, hashes: &[BlockHash], max_length: i64, members: &[usize], drop: bool) -> usize {
        let max_blocks = (max_length / self.block_size) as usize;
        let hit = hashes.iter().take(max_blocks).take_while(|&&hash| self.cached_in_all(hash, members)).count();
        hit - usize::from(drop && hit > 0)
    }

    /// vLLM's sliding-window hit, as the cached blocks `start..end`: scanning right to left
    /// from `max_length`, the first run of `cdiv(W - 1, B)` contiguous cached blocks ends
    /// the hit (null blocks before it); with none, the run of cached blocks from block 0.
    /// Under EAGLE's block `drop` the run is one block longer and its last block given back.
    fn sliding_window_hit(
        &self,
        hashes: &[BlockHash],
        max_length: i64,
        members: &[usize],
        window: i64,
        drop: bool,
    ) -> (usize, usize) {
        let need = cdiv(window - 1, self.block_size) as usize + usize::from(drop);
        let (start, end) = self.cached_run_hit(hashes, max_length, members, need);
        (start, end - usize::from(drop && end > 0))
    }

    /// The cached blocks `start..end` that end a hit within `max_length` tokens: scanning
    /// right to left, the first run of `need` contiguous cached blocks (null blocks before
    /// it); with none, the run of cached blocks from block 0.
    fn cached_run_hit(&self, hashes: &[BlockHash], max_length: i64, members: &[usize], need: usize) -> (usize, usize) {
        let max_blocks = (max_length / self.block_size) as usize;
        let mut run = 0;
        for i in (0..max_blocks).rev() {
            if self.cached_in_all(hashes[i], members) {
                run += 1;
                if run >= need {
                    return (i, i + run);
                }
            } else {
                run = 0;
            }
        }
        (0, run)
    }

    /// vLLM's chunked local attention hit, as the cached blocks `start..end`: the blocks of
    /// the chunks before the one `max_length` falls in are never read again (null blocks,
    /// counted as hit); from that chunk's start, the run of cached blocks.
    fn chunked_local_hit(
        &self,
        hashes: &[BlockHash],
        max_length: i64,
        members: &[usize],
        chunk: i64,
    ) -> (usize, usize) {
        let max_blocks = (max_length / self.block_size) as usize;
        let start = (max_length / chunk * chunk / self.block_size) as usize;
        let run = hashes[start..max_blocks].iter().take_while(|&&hash| self.cached_in_all(hash, members)).count();
        (start, start + run)
    }

    /// The hit blocks of group `g` in a lookup of `num_groups` groups (none if no hit).
    fn hits_of(hits: &[u32], g: usize, num_groups: usize) -> &[u32] {
        let per_group = hits.len() / num_groups;
        &hits[g * per_group..(g + 1) * per_group]
    }

    /// `allocate_in_held_blocks` over several groups: the common decode step, where every
    /// attention table already covers the step (they all have one length; a Mamba table
    /// holds its state blocks from the first step), no block left a window and no block
    /// filled. Returns the tables' length, or None, changing nothing, when
    /// the step needs `allocate_group_slots`. Out of line: the one-group running loop
    /// stays as tight as without groups.
    #[cold]
    #[inline(never)]
    pub(crate) fn allocate_in_held_group_blocks(
        &self,
        groups: &Groups,
        request: &mut Request,
        num_new_tokens: i64,
        num_lookahead_tokens: i64,
    ) -> Option<usize> {
        let b = self.block_size;
        let c = request.num_computed_tokens();
        // The attention groups' tables have one length; a Mamba group's holds its state.
        let held = request.group_block_ids(groups.first_attention).len();
        if (c + num_new_tokens + num_lookahead_tokens).min(self.max_model_len) > held as i64 * b {
            return None;
        }
        let processed = (c - request.num_in_flight_tokens()).max(0);
        let upto = (c + num_new_tokens).min(request.num_tokens());
        let full =
            if self.enable_caching() { ((upto / b) as usize).min(request.block_hashes.len()).min(held) } else { 0 };
        for g in 0..groups.len() {
            let ids = request.group_block_ids(g);
            let behind = ((groups.skipped_tokens(g, processed) / b) as usize).min(ids.len());
            // An attention group's nulls form a prefix: the last block behind the window is
            // null or none is. An aligned Mamba group's state blocks lie among nulls.
            let freed = if groups.is_aligned_mamba(g) {
                ids[..behind].iter().all(|&id| id == NULL_BLOCK)
            } else {
                behind == 0 || ids[behind - 1] == NULL_BLOCK
            };
            let settled = if g == 0 { request.num_cached_blocks } else { request.extra_tables[g - 1].num_cached };
            // An aligned Mamba table reaches the state's block and its speculative blocks.
            let short = groups.is_aligned_mamba(g)
                && self.aligned_mamba_table_len(groups, c + num_new_tokens) > ids.len() as i64;
            if !freed || full > settled || short {
                return None;
            }
        }
        for table in &mut request.extra_tables {
            (table.first_new, table.cached_before) = (table.ids.len(), table.num_cached);
        }
        Some(request.block_ids.len())
    }

    /// Blocks group `g` must take from the free queue to hold `tokens`'s slots (its
    /// `num_tokens`, the target model's `num_main` of them) with `total_computed` computed
    /// (vLLM's `get_num_blocks_to_allocate`): those beyond its table, its hits and its
    /// skipped blocks, plus the hits a touch would pull out of the free queue.
    /// `admission_cap`: the whole-sequence gate, where a sliding window never needs more
    /// than its window and the tokens in flight.
    fn group_blocks_needed(
        &self,
        groups: &Groups,
        g: usize,
        request: &Request,
        hits: &[u32],
        tokens: StepTokens,
        admission_cap: bool,
    ) -> i64 {
        let StepTokens { num_tokens, num_main, total_computed } = tokens;
        let kind = groups.kinds[g];
        if groups.is_aligned_mamba(g) {
            return self.aligned_mamba_blocks_needed(groups, g, request, hits, (num_main, total_computed));
        }
        let mut required = match kind {
            AttentionKind::Mamba => groups.mamba_state_blocks,
            _ => cdiv(num_tokens, self.block_size),
        };
        if let (true, Some(cap)) = (admission_cap, groups.block_caps[g]) {
            required = required.min(cap);
        }
        let held = request.group_block_ids(g).len();
        let skipped = groups.skipped_tokens(g, total_computed) / self.block_size;
        let local = (hits.len() + held) as i64;
        let new = (required - skipped.max(local)).max(0) as usize;
        let skipped_hits = ((skipped - held as i64).max(0) as usize).min(hits.len());
        let evictable = hits[skipped_hits..].iter().filter(|&&b| b != NULL_BLOCK && self.pool.ref_cnt(b) == 0).count();
        (new + evictable) as i64
    }

    /// An aligned Mamba group's share of `group_blocks_needed` (vLLM's align mode) for a
    /// step to `num_tokens` target-model tokens (draft models have no Mamba layers): its
    /// table's positions up to the state's block and `S` speculative blocks after it, of
    /// which a step takes at most the block its state ends in and a prefill checkpoint
    /// block (a request's first allocation also the `S`), plus the hits a touch would pull
    /// out of the free queue. Negative where an earlier step's drafts, rejected since, left
    /// more blocks than the step needs: vLLM counts those against the other groups' (a
    /// quirk kept for parity). A hit on a state cached this step, which the step has yet
    /// to write, needs more blocks than the pool holds: the request waits for the next step.
    fn aligned_mamba_blocks_needed(
        &self,
        groups: &Groups,
        g: usize,
        request: &Request,
        hits: &[u32],
        (num_tokens, computed): (i64, i64),
    ) -> i64 {
        if let Some(&last) = hits.last() {
            let hash = self.pool.block_hash(last).map(|hash| (hash, g));
            if hash.is_some_and(|hash| self.mamba_cached_this_step.contains(&hash)) {
                return self.pool.num_blocks() as i64 + 1;
            }
        }
        let ids = request.group_block_ids(g);
        let allocated = allocated_for(request);
        let checkpoint = self.mamba_takes_checkpoint(groups, request, ids, allocated, computed, num_tokens).is_some();
        let mut new = self.aligned_mamba_table_len(groups, num_tokens) - (hits.len() + ids.len()) as i64;
        if new > 0 {
            new = new.min(1 + i64::from(checkpoint) + if allocated { 0 } else { groups.mamba_speculative_blocks });
        }
        let evictable = hits.iter().filter(|&&b| b != NULL_BLOCK && self.pool.ref_cnt(b) == 0).count();
        new + evictable as i64
    }

    /// The length an aligned Mamba table reaches for a step to `num_main` target-model
    /// tokens: a position per block up to the one the state ends in, then `S` speculative
    /// blocks (vLLM's align-mode `num_required_blocks`).
    #[inline]
    fn aligned_mamba_table_len(&self, groups: &Groups, num_main: i64) -> i64 {
        cdiv(num_main, self.block_size) + groups.mamba_speculative_blocks
    }

    /// The prefill checkpoint block an aligned Mamba group takes, if any, for a step
    /// computing tokens `computed..num_tokens`: its index in the table `ids`,
    /// `cdiv(num_tokens, B) - 2`, and the position of the state it holds (vLLM's
    /// `_needs_internal_checkpoint`). Its layers can write the state at the last boundary a
    /// hit can resume from there, the step reaches the end of the prompt (with sparse
    /// retention; every step with dense), and the table holds no block at that index, or
    /// (`allocated`) one of its speculative blocks.
    fn mamba_takes_checkpoint(
        &self,
        groups: &Groups,
        request: &Request,
        ids: &[u32],
        allocated: bool,
        computed: i64,
        num_tokens: i64,
    ) -> Option<(usize, i64)> {
        let b = self.block_size;
        let prefill_end =
            if groups.retention_interval != 0 { 0 } else { request.num_prompt_tokens().max(request.num_tokens() - 1) };
        let index = cdiv(num_tokens, b) - 2;
        let position =
            mamba_checkpoint_position(num_tokens, b, self.hash_lookahead, groups.mamba_checkpoint_eagle_drop);
        let speculative = allocated && index >= ids.len() as i64 - groups.mamba_speculative_blocks;
        let takes = num_tokens >= prefill_end
            && mamba_checkpoint_exportable(computed, num_tokens, position, b, groups.mamba_checkpoint_alignment)
            && index >= 0
            && (ids.get(index as usize).is_none_or(|&id| id == NULL_BLOCK) || speculative);
        takes.then_some((index as usize, position))
    }

    /// Blocks `request` still needs, over every group, to hold `num_tokens` tokens from
    /// its computed ones, under the whole-sequence gate's cap (vLLM's
    /// `_request_remaining_blocks` with the hybrid coordinator).
    pub(crate) fn remaining_blocks_in_groups(&self, request: &Request, num_tokens: i64) -> usize {
        let groups = self.groups.as_ref().expect("several groups");
        let tokens = StepTokens { num_tokens, num_main: num_tokens, total_computed: request.num_computed_tokens() };
        self.blocks_needed_in_all(groups, request, &[], tokens, true).max(0) as usize
    }

    fn blocks_needed_in_all(
        &self,
        groups: &Groups,
        request: &Request,
        hits: &[u32],
        tokens: StepTokens,
        admission_cap: bool,
    ) -> i64 {
        (0..groups.len())
            .map(|g| {
                let hits = Self::hits_of(hits, g, groups.len());
                self.group_blocks_needed(groups, g, request, hits, tokens, admission_cap)
            })
            .sum()
    }

    /// `allocate_slots` over several groups (vLLM's `KVCacheManager.allocate_slots` with
    /// the hybrid coordinator); returns group 0's first new block, the others' in their
    /// tables' `first_new`. None changes nothing but the blocks left behind the window.
    pub(crate) fn allocate_group_slots(
        &mut self,
        request: &mut Request,
        ask: &SlotRequest<'_>,
        watermark: usize,
    ) -> Option<usize> {
        let groups = self.groups.take().expect("several groups");
        let first_new = self.allocate_in_groups(&groups, request, ask, watermark);
        self.groups = Some(groups);
        first_new
    }

    fn allocate_in_groups(
        &mut self,
        groups: &Groups,
        request: &mut Request,
        ask: &SlotRequest<'_>,
        watermark: usize,
    ) -> Option<usize> {
        let (b, m) = (self.block_size, self.max_model_len);
        let hits = ask.new_computed_blocks;
        let local_computed = request.num_computed_tokens() + ask.num_new_computed_tokens;
        // A KV connector's tokens past the local hit (vLLM's `num_external_computed_tokens`).
        let external = ask.num_external_computed_tokens;
        let computed = local_computed + external;
        let total_computed = computed.min(m);
        if request.extra_tables.len() + 1 < groups.len() {
            request.extra_tables.resize_with(groups.len() - 1, Default::default);
        }
        let allocated = allocated_for(request);
        if ask.full_sequence_must_fit {
            let full = request.num_tokens().min(m);
            let tokens = StepTokens { num_tokens: full, num_main: full, total_computed };
            let needed = self.blocks_needed_in_all(groups, request, hits, tokens, true);
            if needed + watermark as i64 > self.pool.num_free_blocks() as i64 {
                return None;
            }
        }
        // The target model's tokens, and theirs with the drafter's lookahead slots.
        let num_main = total_computed + ask.num_new_tokens;
        let tokens_needing_slots = (num_main + ask.num_lookahead_tokens).min(m);
        // Blocks behind the window go back first, even if this allocation fails (fewer
        // evictions), counted on the processed tokens: a step in flight still reads them.
        let processed = (total_computed - request.num_in_flight_tokens()).max(0);
        for g in 0..groups.len() {
            self.remove_skipped_blocks(groups, request, g, processed);
        }
        let tokens = StepTokens { num_tokens: tokens_needing_slots, num_main, total_computed: computed };
        let needed = self.blocks_needed_in_all(groups, request, hits, tokens, false);
        if needed + (watermark + ask.reserved_blocks) as i64 > self.pool.num_free_blocks() as i64 {
            return None;
        }
        // A request without blocks takes its hits, and null blocks for what its computed
        // tokens left behind the window (vLLM's `add_local_computed_blocks`): every group's
        // hits are touched before any group pops a new block.
        for g in 0..groups.len() {
            let (ids, num_cached, _) = table(request, g);
            if !ids.is_empty() {
                debug_assert!(hits.is_empty(), "a hit for a request that holds blocks");
                continue;
            }
            let skipped = (groups.skipped_tokens(g, computed) / b) as usize;
            let group_hits = Self::hits_of(hits, g, groups.len());
            let kept = &group_hits[skipped.min(group_hits.len())..];
            ids.resize(skipped, NULL_BLOCK);
            ids.extend_from_slice(kept);
            *num_cached = ids.len();
            self.pool.touch(kept);
        }
        if external > 0 {
            // Blocks for the connector's tokens within each group's window, every group's
            // after every group's hits are touched (vLLM's `allocate_external_computed_blocks`):
            // a Mamba group's first state block (its blocks span `M` tokens), in group order.
            // An attention group's are zeroed, but where a load across steps writes them
            // (vLLM's default `get_loaded_kv_cache_group_ids`: every attention group).
            for g in 0..groups.len() {
                let kind = groups.kinds[g];
                let skipped = groups.skipped_tokens(g, computed);
                if skipped > 0 && (computed - skipped).min(external) <= 0 {
                    continue;
                }
                let (ids, _, _) = table(request, g);
                let first_new = ids.len();
                let required = if kind == AttentionKind::Mamba { 1 } else { cdiv(computed, b) as usize };
                if required > first_new {
                    self.pool.get_new_blocks(required - first_new, ids);
                    if let (Some(zero), false) =
                        (&mut self.blocks_to_zero, kind == AttentionKind::Mamba || ask.delay_caching)
                    {
                        zero[g].extend_from_slice(&ids[first_new..]);
                    }
                }
            }
        }
        let mut first_new_in_group_0 = 0;
        // Per group, the prefill checkpoint the step writes: its table index and position.
        let mut checkpoints = vec![None; if groups.mamba_aligned { groups.len() } else { 0 }];
        for g in 0..groups.len() {
            let (first_new, cached_before) = if groups.is_aligned_mamba(g) {
                let (first_new, cached_before, checkpoint) =
                    self.allocate_aligned_mamba(groups, request, g, allocated, (computed, num_main));
                checkpoints[g] = checkpoint;
                (first_new, cached_before)
            } else {
                let required = match groups.kinds[g] {
                    AttentionKind::Mamba => groups.mamba_state_blocks as usize,
                    _ => cdiv(tokens_needing_slots, b) as usize,
                };
                let (ids, num_cached, _) = table(request, g);
                let first_new = ids.len();
                if required > first_new {
                    self.pool.get_new_blocks(required - first_new, ids);
                    if let (Some(zero), false) = (&mut self.blocks_to_zero, groups.kinds[g] == AttentionKind::Mamba) {
                        zero[g].extend_from_slice(&ids[first_new..]);
                    }
                }
                (first_new, *num_cached)
            };
            match g {
                0 => first_new_in_group_0 = first_new,
                _ => {
                    let t = &mut request.extra_tables[g - 1];
                    (t.first_new, t.cached_before) = (first_new, cached_before);
                }
            }
        }
        if self.enable_caching() && !ask.delay_caching {
            for g in 0..groups.len() {
                let upto = (total_computed + ask.num_new_tokens).min(request.num_tokens());
                self.cache_group_blocks(groups, request, g, upto);
                if let Some(&Some(checkpoint)) = checkpoints.get(g) {
                    self.cache_mamba_checkpoint(groups, request, g, checkpoint);
                }
            }
        }
        Some(first_new_in_group_0)
    }

    /// An aligned Mamba group's blocks for a step from `computed` to `num_main` target-model
    /// tokens (vLLM's align-mode `allocate_new_blocks`); returns where the step's new
    /// entries begin and the settled count before them. The table reaches the block the
    /// step's state ends in and `S` speculative blocks after it; positions before hold
    /// states no step reads (null), but a prefill checkpoint block's just before the
    /// state's. A request allocated for already moves its speculative blocks that fall
    /// before the state's block to the table's end (the runner's table only grows), nulls
    /// in their place, and reuses them. Also returns the prefill checkpoint the step writes,
    /// if any: its table index and the position of its state.
    fn allocate_aligned_mamba(
        &mut self,
        groups: &Groups,
        request: &mut Request,
        g: usize,
        allocated: bool,
        (computed, num_main): (i64, i64),
    ) -> (usize, usize, Option<(usize, i64)>) {
        let s = groups.mamba_speculative_blocks as usize;
        let required = self.aligned_mamba_table_len(groups, num_main) as usize;
        let taken =
            self.mamba_takes_checkpoint(groups, request, request.group_block_ids(g), allocated, computed, num_main);
        let checkpoint = taken.is_some();
        let (ids, num_cached, _) = table(request, g);
        let first_new = ids.len();
        if required <= first_new && !checkpoint {
            return (first_new, *num_cached, None);
        }
        // Up to the state's block, but a checkpoint's.
        let nulls_end = required - s - 1 - usize::from(checkpoint);
        if first_new < nulls_end {
            ids.resize(nulls_end, NULL_BLOCK);
        }
        if allocated {
            for i in first_new.saturating_sub(s)..first_new {
                if i >= nulls_end {
                    break;
                }
                ids.push(ids[i]);
                ids[i] = NULL_BLOCK;
            }
        }
        if required > ids.len() {
            self.pool.get_new_blocks(required - ids.len(), ids);
        }
        (first_new, *num_cached, taken)
    }

    /// Caches the state a prefill checkpoint block holds where a hit can resume from it
    /// (vLLM's `_cache_partial_tail_block`). The block's table index names the boundary a
    /// block after its state's under EAGLE's block drop (a prompt whose length is not a
    /// multiple of `B`): the block is cached under the hash of its state's boundary
    /// instead, if that is the prompt's last boundary a hit resumes from, a retention
    /// boundary or a shared prefix's end, and leaves the cache otherwise.
    fn cache_mamba_checkpoint(
        &mut self,
        groups: &Groups,
        request: &Request,
        g: usize,
        (index, position): (usize, i64),
    ) {
        let b = self.block_size;
        let at = (position / b) as usize - 1;
        let block = request.group_block_ids(g)[index];
        if at == index || at >= request.block_hashes.len() {
            // Cached at its own index by `cache_group_blocks` if a hit can reach it.
            return;
        }
        let per_segment = groups.retention_interval / b;
        let prompt_boundary = mamba_checkpoint_position(
            request.num_prompt_tokens(),
            b,
            self.hash_lookahead,
            groups.mamba_checkpoint_eagle_drop,
        );
        let reachable = position == prompt_boundary
            || (per_segment > 0 && (per_segment <= 1 || (at as i64 + 1) % per_segment == 0))
            || position == request.shared_prefix_boundary;
        let hash = request.block_hashes[at];
        if reachable && self.pool.block_hash(block) == Some(hash) && self.pool.block_group(block) == g {
            return;
        }
        self.pool.uncache(block);
        if !reachable {
            return;
        }
        self.pool.cache_full_blocks(&[block], &[hash], (0, 1), g, |_| true);
        self.mamba_cached_this_step.push((hash, g));
        let request_id = request.id().clone();
        self.pool.events.record(|| KvEvent::Stored {
            request_id,
            group: g as u32,
            first_block: at as u32,
            blocks: vec![block],
        });
    }

    /// `cache_blocks` over several groups: each group's newly full blocks within `upto`.
    #[cold]
    pub(crate) fn cache_blocks_in_groups(&mut self, request: &mut Request, upto: i64) {
        if !self.enable_caching() {
            return;
        }
        let groups = self.groups.take().expect("several groups");
        for g in 0..groups.len() {
            self.cache_group_blocks(&groups, request, g, upto);
        }
        self.groups = Some(groups);
    }

    #[cold]
    pub(crate) fn num_cached_blocks_in_groups(&self, groups: &Groups, request: &Request) -> usize {
        (0..groups.len())
            .map(|g| {
                let ids = request.group_block_ids(g);
                let last = ids.iter().rposition(|&b| b != NULL_BLOCK && self.pool.block_hash(b).is_some());
                // The blocks its hash names: a Mamba checkpoint block may hold the state of
                // the boundary a block before its index (`cache_mamba_checkpoint`).
                last.map_or(0, |i| {
                    if self.pool.block_hash(ids[i]) == request.block_hashes.get(i).copied() {
                        i + 1
                    } else {
                        i
                    }
                })
            })
            .min()
            .unwrap_or(0)
    }

    /// Frees every group's blocks wholly behind the window of the next token after
    /// `processed` tokens (vLLM frees them when a request finishes under a KV connector,
    /// before the connector is handed the tables). No-op with one group.
    pub(crate) fn remove_skipped_blocks_in_groups(&mut self, request: &mut Request, processed: i64) {
        let Some(groups) = self.groups.take() else { return };
        // A request never allocated for has no tables past group 0's.
        let num_tables = groups.len().min(1 + request.extra_tables.len());
        for g in 0..num_tables {
            self.remove_skipped_blocks(&groups, request, g, processed);
        }
        self.groups = Some(groups);
    }

    /// Frees group `g`'s blocks wholly behind the window of the next token after
    /// `processed` tokens, the null block in their place (vLLM's `remove_skipped_blocks`).
    fn remove_skipped_blocks(&mut self, groups: &Groups, request: &mut Request, g: usize, processed: i64) {
        let skipped = groups.skipped_tokens(g, processed);
        if skipped <= 0 {
            return;
        }
        let (ids, _, _) = table(request, g);
        let end = ((skipped / self.block_size) as usize).min(ids.len());
        if groups.is_aligned_mamba(g) {
            // Its state blocks lie among nulls: each one behind, last first.
            self.pool.free_blocks(ids[..end].iter().rev().copied());
            ids[..end].fill(NULL_BLOCK);
            return;
        }
        // Earlier calls nulled a prefix: free back to it, last block first.
        let start = ids[..end].iter().rposition(|&id| id == NULL_BLOCK).map_or(0, |i| i + 1);
        if start < end {
            self.pool.free_blocks(ids[start..end].iter().rev().copied());
            ids[start..end].fill(NULL_BLOCK);
        }
    }

    /// Registers group `g`'s newly full blocks within the first `upto` tokens; a sliding
    /// window's only where a later hit can use them (vLLM's `reachable_block_mask`).
    fn cache_group_blocks(&mut self, groups: &Groups, request: &mut Request, g: usize, upto: i64) {
        let b = self.block_size;
        let num_prompt_tokens = request.num_prompt_tokens();
        let shared_prefix_boundary = request.shared_prefix_boundary;
        let request_id = request.id().clone();
        let (ids, num_cached, hashes) = table(request, g);
        let full = ((upto.max(0) / b) as usize).min(hashes.len()).min(ids.len());
        let from = *num_cached;
        if full <= from {
            return;
        }
        // Every block of a full-attention group; of a sliding window, the `need` blocks
        // before each boundary a hit can stop at: the last block before the prompt's final
        // token (a resend's hit), a shared prefix's end, and every `per_segment` blocks.
        // Under EAGLE's block drop a hit matches one block past its end and gives it back:
        // a window keeps one block more, up to and including the boundary's (`shift`), and
        // the prompt's boundaries are a block lower (vLLM's `replay_boundaries`), a shared
        // prefix's end also (a sibling that diverges right after it).
        let eagle = groups.eagle_drop[g];
        let shift = usize::from(eagle);
        // An aligned Mamba group keeps the state a hit at each boundary resumes from, as a
        // window of one block would.
        let (every_block, need, per_segment) = match groups.kinds[g] {
            AttentionKind::Full | AttentionKind::ChunkedLocal { .. } => (true, 0, 0),
            kind => {
                let need = match kind {
                    AttentionKind::SlidingWindow { window } => cdiv(i64::from(window) - 1, b) as usize + shift,
                    _ => 1,
                };
                let per_segment = (groups.retention_interval / b) as usize;
                (per_segment > 0 && need >= per_segment, need, per_segment)
            }
        };
        let prompt = if groups.eagle_drop.contains(&true) {
            let (resend, extension) = ((num_prompt_tokens - 1) / b * b, num_prompt_tokens / b * b);
            [resend - b, extension - b]
        } else {
            [num_prompt_tokens - 1; 2]
        };
        let junction = (shared_prefix_boundary > 0).then_some(shared_prefix_boundary);
        let boundaries = [Some(prompt[0]), Some(prompt[1]), junction, junction.filter(|_| eagle).map(|t| t - b)];
        // The blocks `end - need .. end` before each boundary's block `end`.
        let boundary_ends = boundaries.map(|tokens| tokens.map(|tokens| (tokens.max(0) / b) as usize + shift));
        let keep = |i: usize| {
            every_block
                || (per_segment > 0 && i >= shift && (i - shift) % per_segment >= per_segment - need)
                || boundary_ends.iter().flatten().any(|&end| i < end && i + need >= end)
        };
        self.pool.cache_full_blocks(ids, hashes, (from, full), g, keep);
        if groups.is_aligned_mamba(g) {
            // A state cached now is written by this step: no hit may resume from it before
            // the next one.
            let cached = (from..full).filter(|&i| ids[i] != NULL_BLOCK && keep(i));
            self.mamba_cached_this_step.extend(cached.map(|i| (hashes[i], g)));
        }
        self.pool.events.record(|| KvEvent::Stored {
            request_id: request_id.clone(),
            group: g as u32,
            first_block: from as u32,
            blocks: (from..full).map(|i| if ids[i] != NULL_BLOCK && keep(i) { ids[i] } else { NULL_BLOCK }).collect(),
        });
        *num_cached = full;
    }
}
