//! `allocate_slots` and `free` for one full-attention KV group (spec §5.5, §5.7).

use crate::kv::block_pool::BlockPool;
use crate::request::{Request, RequestStatus};

/// What a loop asks `allocate_slots` for.
#[derive(Clone, Copy, Debug)]
pub struct SlotRequest<'a> {
    /// `n`: tokens to compute this step, draft positions included.
    pub num_new_tokens: i64,
    /// `h`: prefix-hit tokens found for a waiting request (0 in the running loop).
    pub num_new_computed_tokens: i64,
    pub new_computed_blocks: &'a [u32],
    /// `L`: KV slots reserved beyond `n` for a drafter.
    pub num_lookahead_tokens: i64,
    /// The waiting-loop admission gate: the whole sequence must fit now.
    pub full_sequence_must_fit: bool,
    /// Whether `running` is non-empty; only then does the watermark apply.
    pub has_scheduled_reqs: bool,
}

#[derive(Clone, Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: i64,
    max_model_len: i64,
    watermark_blocks: usize,
}

#[inline]
fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

impl KvManager {
    pub fn new(num_gpu_blocks: usize, block_size: i64, max_model_len: i64, watermark_blocks: usize) -> Self {
        Self { pool: BlockPool::new(num_gpu_blocks, false), block_size, max_model_len, watermark_blocks }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn block_size(&self) -> i64 {
        self.block_size
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// `1 - free / usable`, usable excluding the null block.
    pub fn usage(&self) -> f64 {
        let usable = (self.pool.num_blocks() - 1) as f64;
        1.0 - self.pool.num_free_blocks() as f64 / usable
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
    /// returns None and changes nothing. On success returns the index in the
    /// request's block table of the first block allocated now.
    pub fn allocate_slots(&mut self, request: &mut Request, ask: SlotRequest<'_>) -> Option<usize> {
        debug_assert!(ask.num_new_tokens > 0 || ask.num_new_computed_tokens > 0);
        let m = self.max_model_len;
        let total_computed = (request.num_computed_tokens + ask.num_new_computed_tokens).min(m);
        let watermark =
            if ask.has_scheduled_reqs && matches!(request.status, RequestStatus::Waiting | RequestStatus::Preempted) {
                self.watermark_blocks
            } else {
                0
            };
        let free = self.pool.num_free_blocks();
        let hits = ask.new_computed_blocks;
        if ask.full_sequence_must_fit {
            let full = request.num_tokens().min(m);
            if self.blocks_needed(request, full, hits) + watermark > free {
                return None;
            }
        }
        // min(C + h + n + L, M): lookahead slots never pass the model length.
        let tokens_needing_slots = (total_computed + ask.num_new_tokens + ask.num_lookahead_tokens).min(m);
        if self.blocks_needed(request, tokens_needing_slots, hits) + watermark > free {
            return None;
        }
        if !hits.is_empty() {
            self.pool.touch(hits);
            request.block_ids.extend_from_slice(hits);
        }
        let first_new = request.block_ids.len();
        let missing = cdiv(tokens_needing_slots, self.block_size) - first_new as i64;
        if missing > 0 {
            self.pool.get_new_blocks(missing as usize, &mut request.block_ids);
        }
        Some(first_new)
    }

    /// Releases a request's blocks, tail first, and empties its table.
    pub fn free(&mut self, request: &mut Request) {
        self.pool.free_blocks(request.block_ids.iter().rev().copied());
        request.block_ids.clear();
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        self.pool.check()
    }
}
