//! A KV connector's part in scheduling (vLLM's `KVConnectorBase_V1`, its scheduler side):
//! a waiting request's tokens past its prefix-cache hit that the connector loads, and the
//! blocks of finished requests it may still be sending.
//!
//! The connector itself is the caller's (Python, in the plug-in): the waiting loop asks it
//! through [`ExternalKv`] at the point vLLM's loop asks, and the core keeps what follows
//! from the answer (the request's `C`, its blocks, what is held after it finishes).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::error::{CoreError, CoreResult};
use crate::request::Request;
use crate::scheduler::Scheduler;

/// What a KV connector holds of waiting requests, asked once per admission attempt of a
/// request with no computed tokens (new, or preempted), after its prefix-cache lookup.
pub trait ExternalKv {
    /// vLLM's `get_num_new_matched_tokens(request, num_computed_tokens)`: how many tokens
    /// past the first `num_local_computed` (the prefix-cache hit, whole blocks) the
    /// connector loads before the step runs. None when it cannot tell yet: the request is
    /// set aside for this step, as vLLM does.
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<i64>;
}

/// A finished request's KV blocks, kept from the pool until the caller releases them.
#[derive(Debug)]
pub(super) struct HeldBlocks {
    /// The request's whole block table, in table order.
    blocks: Vec<u32>,
    /// The leading blocks that hold computed tokens (`cdiv(C, block_size)`): the ones a
    /// connector sends.
    num_computed_blocks: usize,
}

/// The finished requests whose blocks are held, by id.
pub(super) type HeldKv = FxHashMap<Arc<str>, HeldBlocks>;

/// The tokens a waiting request starts with past its local hit of `num_local` tokens, from
/// the connector's answer `matched`; None if the request waits (the connector cannot tell
/// yet). A request that skips reading cached KV (prompt logprobs) loads none and never
/// waits, though the connector was asked, as in vLLM. An answer is clamped to
/// `[0, N - 1 - num_local]`: at least one token is left to compute, the one that samples.
/// (vLLM takes a negative answer as it is and asserts on one that leaves no token; see
/// docs/parity.md.)
pub(super) fn external_tokens(request: &Request, num_local: i64, matched: Option<i64>) -> Option<i64> {
    if request.skip_reading_prefix_cache {
        return Some(0);
    }
    Some(matched?.clamp(0, (request.num_tokens() - 1 - num_local).max(0)))
}

impl Scheduler {
    /// Keeps a finished request's blocks from the pool (called instead of freeing them
    /// when a connector serves the engine).
    pub(super) fn hold_kv_blocks(&mut self, request: &mut Request) {
        let block_size = self.config.block_size();
        let num_computed = request.num_computed_tokens();
        let blocks = std::mem::take(&mut request.block_ids);
        request.num_cached_blocks = 0;
        let num_computed_blocks = (((num_computed + block_size - 1) / block_size) as usize).min(blocks.len());
        self.held_kv.insert(request.id.clone(), HeldBlocks { blocks, num_computed_blocks });
    }

    /// The blocks holding the computed tokens of finished request `request_id`, whose blocks
    /// are held (what vLLM hands its connector's `request_finished`); None if none are.
    pub fn held_kv_blocks(&self, request_id: &str) -> Option<&[u32]> {
        self.held_kv.get(request_id).map(|held| &held.blocks[..held.num_computed_blocks])
    }

    /// Returns the held blocks of finished requests to the pool, tail first, each table in
    /// the order given (vLLM frees them once the connector has sent them). Fails, changing
    /// nothing, if an id holds none.
    pub fn release_kv_blocks(&mut self, request_ids: &[&str]) -> CoreResult<()> {
        let mut seen = rustc_hash::FxHashSet::default();
        for (i, &id) in request_ids.iter().enumerate() {
            if !self.held_kv.contains_key(id) || !seen.insert(id) {
                return Err(CoreError::request(
                    format!("request_ids[{i}]"),
                    format!("{id:?}"),
                    "holds no KV blocks: not a finished request whose blocks are held, or named twice",
                ));
            }
        }
        for &id in request_ids {
            let held = self.held_kv.remove(id).expect("checked above");
            self.kv.free_blocks(held.blocks);
        }
        Ok(())
    }

    /// How many finished requests hold their blocks.
    pub fn num_held_kv_requests(&self) -> usize {
        self.held_kv.len()
    }

    /// Every held block once per table that holds it (for the invariant checker).
    pub(super) fn held_kv_tables(&self) -> impl Iterator<Item = &[u32]> {
        self.held_kv.values().map(|held| &held.blocks[..])
    }
}
