//! An auxiliary-output connector's part in scheduling (vLLM's `AuxOutputSchedulerConnector`,
//! which returns per-token outputs of the model beside its tokens, such as the experts a
//! mixture-of-experts model routed each token to). It keeps those outputs for the KV blocks
//! it retains, so a prefix-cache hit may only reach as far as it holds them: it caps the
//! hit, and it is told when a request's blocks leave it.
//!
//! The connector itself is the caller's (Python, in the plug-in): the loops ask it through
//! [`AuxOutputs`] where vLLM's loops and update ask it, handing it the prefix cache as it
//! is at that point ([`CachedBlocks`]). What it is told between those calls (a request
//! aborted, a reset) the caller tells it.

use crate::kv::{BlockHash, BlockPool};
use crate::request::Request;

/// The prefix cache as a connector reads it while a step is being built. (`Sync`: the
/// caller may read it from another thread while the step waits for the connector.)
pub trait CachedBlocks: Sync {
    /// The block cached under `hash` in KV-cache group `group`, if any (vLLM's
    /// `BlockPool.get_cached_block` for one group; none in a group there is not).
    fn cached_block(&self, hash: BlockHash, group: usize) -> Option<u32>;
}

impl CachedBlocks for BlockPool {
    fn cached_block(&self, hash: BlockHash, group: usize) -> Option<u32> {
        self.cached_in(group).and_then(|cached| cached.get(&hash).copied())
    }
}

/// What the loops ask of an auxiliary-output connector, and tell it.
pub trait AuxOutputs {
    /// vLLM's `max_cache_hit(request)`: the longest prefix-cache hit, in tokens, that the
    /// request may take. Asked of every waiting request with no computed tokens, before its
    /// lookup (with prefix caching off or reading it skipped too, as vLLM asks); the hit is
    /// capped at it, clamped to `[0, N - 1]`.
    fn max_cache_hit(&mut self, request: &Request, cache: &dyn CachedBlocks) -> i64;

    /// vLLM's `cap_external_hit(request, num_local, num_external)`: how many of the tokens
    /// a KV connector would load past a local hit of `num_local` are kept (clamped to
    /// `[0, num_external]`). Asked after the KV connector answers (vLLM's connector asks
    /// itself `max_cache_hit` again there).
    fn cap_external_hit(
        &mut self,
        request: &Request,
        num_local: i64,
        num_external: i64,
        cache: &dyn CachedBlocks,
    ) -> i64;

    /// vLLM's `request_finished(request)`, for a request the running loop preempts (its
    /// computed tokens as they were before the step) or a runner's output finishes
    /// (`Scheduler::update_from_output_with`): told before its blocks are freed. (The
    /// caller tells it of the others: finished between steps, or preempted by a reset.)
    fn request_finished(&mut self, request: &Request, cache: &dyn CachedBlocks);
}
