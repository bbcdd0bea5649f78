//! What the KV manager keeps of several KV-cache groups: a request's table in a group after
//! the first, a prefix lookup's result, and the groups' constants. The rules over them are
//! `kv::groups`.

use crate::config::{AttentionKind, SchedulerConfig};

/// A request's block table in one KV-cache group after the first.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    pub(crate) ids: Vec<u32>,
    /// Leading entries whose caching is settled (registered, masked out, or null).
    pub(crate) num_cached: usize,
    /// Where the latest allocation began appending: the step's new blocks start here.
    pub(crate) first_new: usize,
    /// `num_cached` before the latest allocation (restored if its step is undone).
    pub(crate) cached_before: usize,
}

/// A prefix-cache lookup: the hit's blocks, one run of `tokens / B` per group, group
/// after group (one group: its run), and where a prefix only some groups cached ends.
#[derive(Clone, Debug, Default)]
pub struct CacheHit {
    pub blocks: Vec<u32>,
    pub tokens: i64,
    /// vLLM's `shared_prefix_boundary`: the hit plus the prefix that a full-attention
    /// group cached beyond it (0 if none).
    pub shared_prefix_boundary: i64,
}

/// The per-group rules' constants.
#[derive(Clone, Debug)]
pub struct Groups {
    pub(crate) kinds: Vec<AttentionKind>,
    /// Groups of one kind, looked up together (a hit needs every member), full attention
    /// first (vLLM's `attention_groups`).
    pub(crate) lookups: Vec<(AttentionKind, Vec<usize>)>,
    /// Per group: its kind's hits give back their last block (EAGLE's block drop, on the
    /// kinds of the groups that hold the drafter's layers, or on every group if none is
    /// marked, never a Mamba group); one value for all the members of a lookup.
    pub(crate) eagle_drop: Vec<bool>,
    /// 0: a sliding-window group caches only the blocks a resend of the prompt can hit;
    /// else also the window before every multiple of this many tokens.
    pub(crate) retention_interval: i64,
    /// The most blocks each group holds for one request (vLLM's admission cap; None: no
    /// cap, full attention).
    pub(crate) block_caps: Vec<Option<i64>>,
    /// The blocks a request holds in a Mamba group without prefix caching, `1 + K`.
    pub(crate) mamba_state_blocks: i64,
    /// Mamba groups cache their state at block boundaries (prefix caching on, vLLM's
    /// `mamba_cache_mode` "align").
    pub(crate) mamba_aligned: bool,
    /// An aligned Mamba group's blocks past its state's, for the states after each draft
    /// token (vLLM's `MambaSpec.num_speculative_blocks`, `S = K`).
    pub(crate) mamba_speculative_blocks: i64,
    /// Aligned Mamba states are cached a block before the last boundary, where the
    /// attention groups' hits end under EAGLE's block drop (vLLM's
    /// `drop_eagle_checkpoint_block`).
    pub(crate) mamba_checkpoint_eagle_drop: bool,
    /// Aligned Mamba groups hold a prefill checkpoint block whose state lies a multiple of
    /// this many tokens past its step's start (0: none).
    pub(crate) mamba_checkpoint_alignment: i64,
    /// The first group that is not a Mamba group (0 if none).
    pub(crate) first_attention: usize,
}

impl Groups {
    pub fn new(config: &SchedulerConfig) -> Self {
        let kinds: Vec<AttentionKind> = config.kv_cache_groups().iter().collect();
        let mut lookups: Vec<(AttentionKind, Vec<usize>)> = Vec::new();
        for (g, &kind) in kinds.iter().enumerate() {
            match lookups.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, members)) => members.push(g),
                None => lookups.push((kind, vec![g])),
            }
        }
        lookups.sort_by_key(|(kind, _)| *kind != AttentionKind::Full);
        let layout = config.kv_cache_groups();
        let none_marked = !(0..kinds.len()).any(|g| layout.holds_drafter(g));
        let mut eagle_drop = vec![false; kinds.len()];
        for (kind, members) in &lookups {
            // A Mamba group's hit is the state cached at its end: nothing to drop (no
            // drafter has Mamba layers).
            let drop = config.eagle_block_drop()
                && *kind != AttentionKind::Mamba
                && members.iter().any(|&g| none_marked || layout.holds_drafter(g));
            members.iter().for_each(|&g| eagle_drop[g] = drop);
        }
        Self {
            eagle_drop,
            retention_interval: config.prefix_cache_retention_interval(),
            block_caps: kinds.iter().map(|&kind| config.group_block_cap(kind)).collect(),
            mamba_state_blocks: config.mamba_state_blocks(),
            mamba_aligned: config.mamba_aligned(),
            mamba_speculative_blocks: config.num_speculative_tokens(),
            mamba_checkpoint_eagle_drop: config.eagle_block_drop(),
            mamba_checkpoint_alignment: config.mamba_prefill_checkpoint_alignment(),
            first_attention: kinds.iter().position(|&kind| kind != AttentionKind::Mamba).unwrap_or(0),
            kinds,
            lookups,
        }
    }

    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Group `g`'s tokens before the window of the next token once `c` are computed: their
    /// KV is never read again (vLLM's `get_num_skipped_tokens`).
    #[inline]
    pub(crate) fn skipped_tokens(&self, g: usize, c: i64) -> i64 {
        match self.kinds[g] {
            AttentionKind::Full => 0,
            // A Mamba state block is overwritten in place, never skipped; aligned, a step
            // reads only the state after the last computed token.
            AttentionKind::Mamba => {
                if self.mamba_aligned {
                    (c - 1).max(0)
                } else {
                    0
                }
            }
            AttentionKind::SlidingWindow { window } => (c - i64::from(window) + 1).max(0),
            AttentionKind::ChunkedLocal { chunk } => c / i64::from(chunk) * i64::from(chunk),
        }
    }

    /// Group `g` holds a Mamba state aligned to the block grid.
    #[inline]
    pub(crate) fn is_aligned_mamba(&self, g: usize) -> bool {
        self.mamba_aligned && self.kinds[g] == AttentionKind::Mamba
    }
}
