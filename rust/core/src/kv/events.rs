//! The prefix cache's changes, as they happen (vLLM's KV cache events), for the engine to
//! publish to KV-aware routers. Recorded only when the config asks
//! (`enable_kv_cache_events`): off, nothing is built.

use std::sync::Arc;

/// One change of the prefix cache, in the order the scheduler made it.
///
/// Blocks are named by id and requests by id: the engine, which hashes block contents its
/// own way, turns them into its events (a stored block's hash is the hash of the request's
/// block at that position; a removed block's is the one it was stored under).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// `blocks` entered KV-cache group `group`'s cache holding the request's full blocks
    /// `first_block..` (block `first_block + i` of the group's table is `blocks[i]`, but
    /// an aligned Mamba prefill checkpoint block, at the index after: its state is the
    /// boundary's a block before, under EAGLE's block drop); the null block (0) where a
    /// sliding-window group's block did not enter it (behind the window, or out of any
    /// later hit's reach).
    Stored { request_id: Arc<str>, group: u32, first_block: u32, blocks: Vec<u32> },
    /// An admission lookup found the request's first `num_blocks` blocks cached in `group`
    /// (a sliding-window group: the blocks of the window before the hit's end, nulls
    /// before them), one event per group. Recorded only for requests that ask to be told
    /// (vLLM's `kv_cache_report_mode="full"`), at every lookup with a hit, whether the
    /// request is then admitted or not.
    Reused { request_id: Arc<str>, group: u32, num_blocks: u32 },
    /// The block's content left group `group`'s cache: evicted for reuse, or its KV will
    /// never be computed (an undone step).
    Removed { block: u32, group: u32 },
    /// Every block's content left the cache (`reset_prefix_cache`).
    Cleared,
}

/// Where the pool and the manager record events; a no-op while off.
#[derive(Clone, Debug, Default)]
pub struct EventLog {
    on: bool,
    events: Vec<KvEvent>,
}

impl EventLog {
    pub fn new(on: bool) -> Self {
        Self { on, events: Vec::new() }
    }

    /// Records the event `make` builds, when the log is on (`make` is not called when off).
    #[inline(always)]
    pub fn record(&mut self, make: impl FnOnce() -> KvEvent) {
        if self.on {
            self.events.push(make());
        }
    }

    /// The events recorded since the last call, oldest first.
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}
