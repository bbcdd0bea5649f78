//! `allocate_slots`, the prefix lookup, `cache_blocks` and `free` (spec §5.4 to §5.7):
//! here for one full-attention KV group, the common case and the fast one; several groups
//! (a hybrid model) take `kv::groups`.

use crate::config::SchedulerConfig;
use crate::kv::block_pool::{BlockHash, BlockPool};
use crate::kv::events::{EventLog, KvEvent};
use crate::kv::layout::{CacheHit, Groups};
use crate::kv::residency::{EvictionEvent, Residency};
use crate::request::{Request, RequestStatus};

/// What a loop asks `allocate_slots` for.
#[derive(Clone, Copy, Debug)]
pub struct SlotRequest<'a> {
    /// `n`: tokens to compute this step, draft positions included.
    pub num_new_tokens: i64,
    /// `h`: prefix-hit tokens found for a waiting request (0 in the running loop).
    pub num_new_computed_tokens: i64,
    pub new_computed_blocks: &'a [u32],
    /// Tokens past the hit whose KV an external source (a KV connector) loads before the
    /// step runs: computed as of the step, in new blocks.
    pub num_external_computed_tokens: i64,
    /// `L`: KV slots reserved beyond `n` for a drafter.
    pub num_lookahead_tokens: i64,
    /// The waiting-loop admission gate: the whole sequence must fit now.
    pub full_sequence_must_fit: bool,
    /// Whether `running` is non-empty; only then does the watermark apply.
    pub has_scheduled_reqs: bool,
    /// Free blocks the allocation must leave for others (an asynchronous KV load's
    /// reservation, see `Scheduler::kv_load_reserved_blocks`).
    pub reserved_blocks: usize,
    /// The blocks stay out of the prefix cache for now: a connector is still loading their
    /// KV (cached once it is in).
    pub delay_caching: bool,
}

/// Prefix-cache lookups, recorded when a request is admitted (vLLM's
/// `PrefixCacheStats`): tokens queried and tokens hit, first admissions and
/// re-admissions after a preemption counted apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
    pub preempted_requests: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
}

#[derive(Clone, Debug)]
pub struct KvManager {
    pub(crate) pool: BlockPool,
    /// Several KV-cache groups (None: one full-attention group).
    pub(crate) groups: Option<Box<Groups>>,
    pub(crate) block_size: i64,
    pub(crate) max_model_len: i64,
    watermark_blocks: usize,
    enable_caching: bool,
    /// Tokens after a block that its hash covers (lookahead hashes).
    pub(crate) hash_lookahead: i64,
    /// The last computed tokens a multi-module MTP drafter may compute again, never cached:
    /// `L - 1` for a prefill lookahead `L` (vLLM's `num_reprefillable_tokens`).
    reprefillable: i64,
    /// A prefix hit gives back its last block (EAGLE's block drop).
    eagle_block_drop: bool,
    /// With Mamba groups, the attention groups' blocks allocated since the last step was
    /// built, per group, which the runner zeroes before use (vLLM's
    /// `new_block_ids_to_zero`); None without.
    pub(crate) blocks_to_zero: Option<Vec<Vec<u32>>>,
    /// The hashes (and groups) of the Mamba states cached since the step began (vLLM's
    /// `cached_blocks_this_step`): aligned Mamba groups only.
    pub(crate) mamba_cached_this_step: Vec<(BlockHash, usize)>,
    stats: PrefixCacheStats,
    /// Reused by block hashing, so hashing allocates nothing per block.
    scratch: Vec<u8>,
}

#[inline]
pub(crate) fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

impl KvManager {
    pub fn new(config: &SchedulerConfig) -> Result<Self, std::collections::TryReserveError> {
        let enable_caching = config.enable_prefix_caching();
        let mut pool = BlockPool::try_new(config.num_gpu_blocks() as usize, enable_caching)?;
        pool.events = EventLog::new(config.enable_kv_cache_events());
        let sample = config.kv_cache_metrics_sample();
        pool.residency = (sample > 0.0).then(|| Box::new(Residency::new(sample)));
        let layout = config.kv_cache_groups();
        pool.set_num_groups(layout.len());
        Ok(Self {
            pool,
            groups: layout.is_hybrid().then(|| Box::new(Groups::new(config))),
            block_size: config.block_size(),
            max_model_len: config.max_model_len(),
            watermark_blocks: config.watermark_blocks(),
            enable_caching,
            hash_lookahead: config.num_hash_lookahead_tokens(),
            reprefillable: (config.num_prefill_lookahead_tokens() - 1).max(0),
            eagle_block_drop: config.eagle_block_drop(),
            blocks_to_zero: layout.has_mamba().then(|| vec![Vec::new(); layout.len()]),
            mamba_cached_this_step: Vec::new(),
            stats: PrefixCacheStats::default(),
            scratch: Vec::new(),
        })
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// Blocks out of the free queue: the usable blocks (the null block left out) less the
    /// free ones.
    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_blocks() - 1 - self.pool.num_free_blocks()
    }

    pub fn prefix_cache_stats(&self) -> &PrefixCacheStats {
        &self.stats
    }

    /// `1 - free / usable`, usable excluding the null block; 0 for a pool of the null block
    /// alone (a model without a KV cache), as vLLM reports it.
    pub fn usage(&self) -> f64 {
        let usable = self.pool.num_blocks() - 1;
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.pool.num_free_blocks() as f64 / usable as f64
    }

    /// Tokens per block hash (0 without prefix caching: no hashes are kept).
    pub fn hash_block_size(&self) -> usize {
        if self.enable_caching {
            self.block_size as usize
        } else {
            0
        }
    }

    /// Whether a block's hash covers tokens after the block (lookahead hashes).
    pub fn hashes_look_ahead(&self) -> bool {
        self.hash_lookahead > 0
    }

    /// Hashes the full blocks of `request` not hashed yet, each once the lookahead tokens
    /// after it exist (no-op without caching).
    // Always inlined: every applied step calls it, and the early return is the common case.
    #[inline(always)]
    pub fn update_block_hashes(&mut self, request: &mut Request) {
        if self.enable_caching
            && (request.block_hashes.len() + 1) as i64 * self.block_size + self.hash_lookahead <= request.num_tokens()
        {
            request.extend_block_hashes(
                (self.block_size as usize, self.hash_lookahead as usize),
                self.max_model_len,
                &mut self.scratch,
            );
        }
    }

    /// The longest run of cached full blocks that prefixes the request, capped
    /// at `N - 1` tokens (the last token is recomputed to get its logits), less its
    /// last block under EAGLE's block drop (the drafter recomputes it).
    /// Returns the blocks and the tokens they hold.
    pub fn get_computed_blocks(&self, request: &Request) -> CacheHit {
        self.get_computed_blocks_within(request, request.num_tokens() - 1)
    }

    /// `get_computed_blocks` for a hit of at most `max_length` tokens (clamped to
    /// `[0, N - 1]`: the last token is always computed, for its logits).
    pub fn get_computed_blocks_within(&self, request: &Request, max_length: i64) -> CacheHit {
        if !self.enable_caching {
            return CacheHit::default();
        }
        let max_length = max_length.clamp(0, (request.num_tokens() - 1).max(0));
        if let Some(groups) = &self.groups {
            return self.find_hybrid_hit(groups, request, max_length);
        }
        let max_blocks = (max_length / self.block_size) as usize;
        let mut hits = Vec::new();
        for &hash in request.block_hashes.iter().take(max_blocks) {
            match self.pool.get_cached_block(hash, 0) {
                Some(block) => hits.push(block),
                // Hashes chain: after the first miss nothing further can hit.
                None => break,
            }
        }
        if self.eagle_block_drop {
            hits.pop();
        }
        let hit_tokens = hits.len() as i64 * self.block_size;
        CacheHit { blocks: hits, tokens: hit_tokens, shared_prefix_boundary: 0 }
    }

    /// The request's blocks the prefix cache holds, as a count of leading blocks: with
    /// several groups, the least over groups of the position after its last cached block
    /// (vLLM's `estimate_cached_tokens`, in blocks).
    #[inline]
    pub fn num_cached_blocks(&self, request: &Request) -> usize {
        match &self.groups {
            None => request.num_cached_blocks,
            Some(groups) => self.num_cached_blocks_in_groups(groups, request),
        }
    }

    /// Records a lookup's hit for a request that asks to be told of them
    /// (`KvEvent::Reused`), one event per group (`hits` holds one run per group).
    pub fn report_reused_blocks(&mut self, request: &Request, hits: &[u32]) {
        if request.report_reused_blocks && !hits.is_empty() {
            let num_groups = self.groups.as_ref().map_or(1, |groups| groups.len());
            for group in 0..num_groups as u32 {
                self.pool.events.record(|| KvEvent::Reused {
                    request_id: request.id().clone(),
                    group,
                    num_blocks: (hits.len() / num_groups) as u32,
                });
            }
        }
    }

    /// The attention groups' blocks allocated since the last call, group after group, each
    /// group's in allocation order (vLLM's `take_new_block_ids`); None without Mamba groups.
    /// A step begins: the states cached by the last one are written (vLLM's
    /// `new_step_starts`).
    #[inline]
    pub fn new_step_starts(&mut self) {
        self.mamba_cached_this_step.clear();
    }

    pub fn take_blocks_to_zero(&mut self) -> Option<Vec<i32>> {
        let groups = self.blocks_to_zero.as_mut()?;
        Some(groups.iter_mut().flat_map(|blocks| blocks.drain(..)).map(|id| id as i32).collect())
    }

    /// The sampled blocks evicted since the last call (`kv_cache_metrics_sample`).
    pub fn take_eviction_events(&mut self) -> Vec<EvictionEvent> {
        self.pool.residency.as_mut().map(|r| r.take_events()).unwrap_or_default()
    }

    /// The prefix cache's changes since the last call, oldest first (none unless
    /// `enable_kv_cache_events`).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.events.take()
    }

    /// Counts an admission's lookup (vLLM records it only when the request is admitted).
    pub fn record_prefix_cache_stats(&mut self, request: &Request, hit_tokens: i64) {
        if !self.enable_caching {
            return;
        }
        let (queries, hits) = (request.num_tokens() as u64, hit_tokens as u64);
        if request.num_preemptions > 0 {
            self.stats.preempted_requests += 1;
            self.stats.preempted_queries += queries;
            self.stats.preempted_hits += hits;
        } else {
            self.stats.requests += 1;
            self.stats.queries += queries;
            self.stats.hits += hits;
        }
    }

    /// Blocks a request must take from the free pool to hold `num_tokens`
    /// tokens: missing table entries, plus hit blocks that touching would
    /// pull out of the free queue.
    fn blocks_needed(&self, request: &Request, num_tokens: i64, hits: &[u32]) -> usize {
        let required = cdiv(num_tokens, self.block_size);
        let held = (request.block_ids.len() + hits.len()) as i64;
        let evictable_hits = hits.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        (required - held).max(0) as usize + evictable_hits
    }

    /// Gives `request` KV slots for `C + h + n + L` tokens (capped at `M`), or
    /// returns None and changes nothing (hit blocks included). On success
    /// returns the index in the request's block table of the first block
    /// allocated now, after any hit blocks.
    // Always inlined into the waiting loop, its one caller (the running loop calls
    // `allocate_in_held_blocks` and `allocate_beyond_held_blocks` itself): a request that
    // already holds the blocks it needs returns without a call.
    #[inline(always)]
    pub fn allocate_slots(&mut self, request: &mut Request, ask: SlotRequest<'_>) -> Option<usize> {
        debug_assert!(
            ask.num_new_tokens > 0 || ask.num_new_computed_tokens > 0 || ask.num_external_computed_tokens > 0
        );
        let watermark = self.watermark_for(request, &ask);
        if ask.num_new_computed_tokens == 0
            && ask.num_external_computed_tokens == 0
            && ask.new_computed_blocks.is_empty()
            && !ask.full_sequence_must_fit
            && watermark == 0
        {
            if let Some(held) =
                self.allocate_in_held_blocks::<false>(request, ask.num_new_tokens, ask.num_lookahead_tokens)
            {
                return Some(held);
            }
        }
        self.allocate_new_slots(request, &ask, watermark)
    }

    /// `allocate_slots` for a request whose held blocks the caller already found short
    /// (`allocate_in_held_blocks` returned None): the running loop's growing table, which
    /// other requests' preemptions do not change.
    pub fn allocate_beyond_held_blocks(&mut self, request: &mut Request, ask: SlotRequest<'_>) -> Option<usize> {
        let watermark = self.watermark_for(request, &ask);
        self.allocate_new_slots(request, &ask, watermark)
    }

    /// Free blocks an allocation must leave: the watermark, for an admission while other
    /// requests are scheduled.
    fn watermark_for(&self, request: &Request, ask: &SlotRequest<'_>) -> usize {
        if ask.has_scheduled_reqs && matches!(request.status, RequestStatus::Waiting | RequestStatus::Preempted) {
            self.watermark_blocks
        } else {
            0
        }
    }

    /// `min(C + h + n + L, M)`: lookahead slots never pass the model length.
    #[inline(always)]
    fn tokens_needing_slots(&self, total_computed: i64, num_new_tokens: i64, num_lookahead_tokens: i64) -> i64 {
        (total_computed + num_new_tokens + num_lookahead_tokens).min(self.max_model_len)
    }

    /// `allocate_slots` for a running request (no hit, no gate, no watermark) whose table
    /// already covers the step, the common decode step: caches its newly full blocks and
    /// returns the table's length. None, changing nothing, when the table must grow.
    /// Inlined into the running loop with no call on its way (no division either).
    /// `ONE_GROUP`: the caller knows the pool serves one group, so that check folds away.
    #[inline(always)]
    pub fn allocate_in_held_blocks<const ONE_GROUP: bool>(
        &mut self,
        request: &mut Request,
        num_new_tokens: i64,
        num_lookahead_tokens: i64,
    ) -> Option<usize> {
        debug_assert!(!ONE_GROUP || self.groups.is_none());
        if let (false, Some(groups)) = (ONE_GROUP, &self.groups) {
            return self.allocate_in_held_group_blocks(groups, request, num_new_tokens, num_lookahead_tokens);
        }
        let c = request.num_computed_tokens();
        let held = request.block_ids.len();
        if self.tokens_needing_slots(c, num_new_tokens, num_lookahead_tokens) > held as i64 * self.block_size {
            return None;
        }
        self.cache_group_0_blocks(request, (c + num_new_tokens).min(request.num_tokens()));
        Some(held)
    }

    /// `allocate_slots` when the table must grow, or a hit, the admission gate or the
    /// watermark is involved.
    #[inline(never)]
    fn allocate_new_slots(&mut self, request: &mut Request, ask: &SlotRequest<'_>, watermark: usize) -> Option<usize> {
        if self.groups.is_some() {
            return self.allocate_group_slots(request, ask, watermark);
        }
        let m = self.max_model_len;
        let total_computed =
            (request.num_computed_tokens() + ask.num_new_computed_tokens + ask.num_external_computed_tokens).min(m);
        let tokens_needing_slots =
            self.tokens_needing_slots(total_computed, ask.num_new_tokens, ask.num_lookahead_tokens);
        let hits = ask.new_computed_blocks;
        let free = self.pool.num_free_blocks();
        if ask.full_sequence_must_fit {
            let full = request.num_tokens().min(m);
            if self.blocks_needed(request, full, hits) + watermark > free {
                return None;
            }
        }
        if self.blocks_needed(request, tokens_needing_slots, hits) + watermark + ask.reserved_blocks > free {
            return None;
        }
        if request.block_ids.capacity() == 0 {
            // The first allocation sizes the table for the request's expected length.
            let expected = cdiv(request.expected_num_tokens(m), self.block_size);
            request.block_ids.reserve_exact(cdiv(tokens_needing_slots, self.block_size).max(expected) as usize);
        }
        if !hits.is_empty() {
            // Touch before popping new blocks, so a hit is never evicted for its own request.
            self.pool.touch(hits);
            request.block_ids.extend_from_slice(hits);
            request.num_cached_blocks = request.block_ids.len();
        }
        let first_new = request.block_ids.len();
        let missing = cdiv(tokens_needing_slots, self.block_size) - first_new as i64;
        if missing > 0 {
            self.pool.get_new_blocks(missing as usize, &mut request.block_ids);
        }
        if !ask.delay_caching {
            // Cache what will be computed by this step's end, drafts excluded (capped at N).
            self.cache_group_0_blocks(request, (total_computed + ask.num_new_tokens).min(request.num_tokens()));
        }
        Some(first_new)
    }

    /// Registers the request's full blocks holding its first `upto` tokens.
    // Always inlined: every allocation calls it, and the early return is the common case.
    #[inline(always)]
    pub fn cache_blocks(&mut self, request: &mut Request, upto: i64) {
        if self.groups.is_some() {
            return self.cache_blocks_in_groups(request, upto);
        }
        self.cache_group_0_blocks(request, upto);
    }

    /// `cache_blocks` of the one full-attention group.
    #[inline(always)]
    fn cache_group_0_blocks(&mut self, request: &mut Request, upto: i64) {
        if !self.enable_caching {
            return;
        }
        let upto = upto - self.reprefillable;
        let full = (upto.max(0) as usize).min(request.block_hashes.len() * self.block_size as usize)
            / self.block_size as usize;
        let full = full.min(request.block_ids.len());
        if full > request.num_cached_blocks {
            let first = request.num_cached_blocks;
            self.pool.cache_full_blocks(&request.block_ids, &request.block_hashes, (first, full), 0, |_| true);
            self.pool.events.record(|| KvEvent::Stored {
                request_id: request.id().clone(),
                group: 0,
                first_block: first as u32,
                blocks: request.block_ids[first..full].to_vec(),
            });
            request.num_cached_blocks = full;
        }
    }

    /// Takes the request's blocks from index `from` on out of the prefix cache (their
    /// KV will not be computed after all).
    /// Takes the request's blocks from index `from` on out of the prefix cache (their
    /// KV will not be computed after all); other groups' tables from where this step's
    /// allocation found them.
    pub fn uncache_from(&mut self, request: &mut Request, from: usize) {
        for &block in &request.block_ids[from.min(request.num_cached_blocks)..request.num_cached_blocks] {
            self.pool.uncache(block);
        }
        request.num_cached_blocks = request.num_cached_blocks.min(from);
        for table in &mut request.extra_tables {
            for &block in &table.ids[table.cached_before.min(table.num_cached)..table.num_cached] {
                self.pool.uncache(block);
            }
            table.num_cached = table.num_cached.min(table.cached_before);
        }
    }

    /// Releases a request's blocks, group by group, each table tail first, and empties
    /// its tables.
    pub fn free(&mut self, request: &mut Request) {
        self.pool.free_blocks(request.block_ids.iter().rev().copied());
        request.block_ids.clear();
        request.num_cached_blocks = 0;
        for table in &mut request.extra_tables {
            self.pool.free_blocks(table.ids.iter().rev().copied());
            table.ids.clear();
            table.num_cached = 0;
        }
    }

    /// Takes a request's block tables out of it, group by group (group 0's first): its
    /// blocks stay held, by the caller now, until `free_tables`.
    pub fn take_tables(&self, request: &mut Request) -> Vec<Vec<u32>> {
        let mut tables = Vec::with_capacity(1 + request.extra_tables.len());
        tables.push(std::mem::take(&mut request.block_ids));
        request.num_cached_blocks = 0;
        for table in &mut request.extra_tables {
            tables.push(std::mem::take(&mut table.ids));
            table.num_cached = 0;
        }
        tables
    }

    /// Releases blocks taken out of a request's tables, as one run, tail first.
    pub fn free_blocks(&mut self, blocks: Vec<u32>) {
        self.pool.free_blocks(blocks.into_iter().rev());
    }

    /// Releases tables taken out of a request (`take_tables`) as `free` releases them:
    /// group by group, each tail first.
    pub fn free_tables(&mut self, tables: Vec<Vec<u32>>) {
        for table in tables {
            self.pool.free_blocks(table.into_iter().rev());
        }
    }

    /// Forgets every cached block; fails (false) while any block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        self.pool.check()
    }
}
