//! The validated scheduler configuration: the only home of `max_model_len`.
//!
//! Names and defaults are vLLM 0.33.0's (spec §2). Derived knobs that vLLM
//! computes from other configs (speculative method, runner type) are taken
//! as their derived values: `num_lookahead_tokens` (`L`),
//! `max_num_new_slots_for_drafting` (draft slots), `num_hash_lookahead_tokens`
//! and `eagle_block_drop` (EAGLE's prefix-cache rule) and
//! `num_sampled_tokens_per_step` (`s`).

use crate::error::{CoreError, CoreResult};
use crate::limits::{ListLimit, PoolBound};

/// Block ids and token counts cross the API as int32.
const I32_MAX: i64 = i32::MAX as i64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    Fcfs,
    Priority,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fcfs => "fcfs",
            Policy::Priority => "priority",
        }
    }

    pub fn parse(value: &str) -> CoreResult<Self> {
        match value {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            other => Err(CoreError::config("policy", format!("{other:?}"), "must be \"fcfs\" or \"priority\"")),
        }
    }
}

/// A KV-cache group's attention type (vLLM's KV-cache spec kinds the core manages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Every token's KV is kept while the request runs.
    Full,
    /// Only the last `window` tokens are attended: blocks wholly before them go back to
    /// the pool (vLLM's `SlidingWindowSpec.sliding_window`).
    SlidingWindow { window: u32 },
    /// Tokens attend within their own chunk of `chunk` tokens: blocks of earlier chunks go
    /// back to the pool (vLLM's `ChunkedLocalAttentionSpec.attention_chunk_size`).
    ChunkedLocal { chunk: u32 },
    /// A Mamba (or other linear-attention) layer's recurrent state (vLLM's `MambaSpec`).
    /// Without prefix caching (`mamba_cache_mode` "none") a request holds one block for its
    /// state and one per draft token (`1 + K`), from its first step to its end, whatever
    /// its length. With it ("align") its table has a block position per `B` tokens, as
    /// an attention table, but holds only the state its next step continues from and the
    /// one it writes (the null block elsewhere); a state at a block boundary is cached.
    Mamba,
}

/// The most KV-cache groups a layout holds (one bit each in `KvCacheGroups`).
pub const MAX_KV_CACHE_GROUPS: usize = 64;

/// The KV-cache groups one block pool serves, in vLLM's `kv_cache_groups` order: a
/// full-attention model has one; a hybrid model (sliding-window, chunked local or Mamba
/// layers beside full ones) several. Every sliding-window group shares one window, every
/// chunked local group one chunk size. Written and parsed as comma-separated kinds: `full`,
/// `sliding_window:W`, `chunked_local:C`, `mamba`; a `+eagle` suffix marks a group that holds
/// a drafter's layers (vLLM's `is_eagle_group`: EAGLE's block drop applies to those groups'
/// kinds, or to every group when none is marked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheGroups {
    /// Bit `g` set: group `g` is a sliding-window group.
    sliding: u64,
    /// Bit `g` set: group `g` is a chunked local attention group.
    chunked: u64,
    /// Bit `g` set: group `g` is a Mamba state group.
    mamba: u64,
    /// Bit `g` set: group `g` holds a drafter's layers.
    drafter: u64,
    len: u8,
    window: u32,
    chunk: u32,
}

impl KvCacheGroups {
    /// One full-attention group.
    pub const FULL: Self = Self { sliding: 0, chunked: 0, mamba: 0, drafter: 0, len: 1, window: 0, chunk: 0 };

    pub fn new(kinds: &[AttentionKind]) -> CoreResult<Self> {
        let text = || kinds.iter().map(|k| Self::kind_name(*k)).collect::<Vec<_>>().join(",");
        if kinds.len() > MAX_KV_CACHE_GROUPS {
            return Err(CoreError::config(
                "kv_cache_groups",
                format!("{:?}", text()),
                format!("must name at most {MAX_KV_CACHE_GROUPS} groups"),
            ));
        }
        let mut groups = Self { len: kinds.len() as u8, ..Self::FULL };
        for (g, kind) in kinds.iter().enumerate() {
            let (size, bits, seen) = match *kind {
                AttentionKind::Full => continue,
                AttentionKind::Mamba => {
                    groups.mamba |= 1 << g;
                    continue;
                }
                AttentionKind::SlidingWindow { window } => (window, &mut groups.sliding, &mut groups.window),
                AttentionKind::ChunkedLocal { chunk } => (chunk, &mut groups.chunked, &mut groups.chunk),
            };
            if size < 1 || (*seen != 0 && *seen != size) {
                return Err(CoreError::config(
                    "kv_cache_groups",
                    format!("{:?}", text()),
                    "sliding windows and attention chunks must be at least 1 token, and the same \
                     in every group of their kind",
                ));
            }
            *seen = size;
            *bits |= 1 << g;
        }
        Ok(groups)
    }

    pub fn parse(value: &str) -> CoreResult<Self> {
        let refuse = || {
            CoreError::config(
                "kv_cache_groups",
                format!("{value:?}"),
                "must be comma-separated group kinds: \"full\", \"sliding_window:W\" (a window of W \
                 tokens), \"chunked_local:C\" (chunks of C tokens) or \"mamba\" (a recurrent state), \
                 each followed by \"+eagle\" where the group holds a drafter's layers",
            )
        };
        let size = |text: &str| text.trim().parse::<u32>().map_err(|_| refuse());
        if value.trim().is_empty() {
            return Self::new(&[]);
        }
        let items: Vec<(&str, bool)> = value
            .split(',')
            .map(|item| match item.trim().strip_suffix("+eagle") {
                Some(kind) => (kind, true),
                None => (item, false),
            })
            .collect();
        let kinds = items
            .iter()
            .map(|(kind, _)| match kind.trim().split_once(':') {
                None if kind.trim() == "full" => Ok(AttentionKind::Full),
                None if kind.trim() == "mamba" => Ok(AttentionKind::Mamba),
                Some(("sliding_window", w)) => size(w).map(|window| AttentionKind::SlidingWindow { window }),
                Some(("chunked_local", c)) => size(c).map(|chunk| AttentionKind::ChunkedLocal { chunk }),
                _ => Err(refuse()),
            })
            .collect::<CoreResult<Vec<_>>>()?;
        let mut groups = Self::new(&kinds)?;
        for (g, _) in items.iter().enumerate().filter(|(_, (_, drafter))| *drafter) {
            groups.drafter |= 1 << g;
        }
        Ok(groups)
    }

    fn kind_name(kind: AttentionKind) -> String {
        match kind {
            AttentionKind::Full => "full".into(),
            AttentionKind::SlidingWindow { window } => format!("sliding_window:{window}"),
            AttentionKind::ChunkedLocal { chunk } => format!("chunked_local:{chunk}"),
            AttentionKind::Mamba => "mamba".into(),
        }
    }

    /// The form `parse` reads.
    pub fn to_text(self) -> String {
        let name = |(g, kind)| Self::kind_name(kind) + if self.holds_drafter(g) { "+eagle" } else { "" };
        self.iter().enumerate().map(name).collect::<Vec<_>>().join(",")
    }

    /// Whether group `group` holds a drafter's layers (vLLM's `is_eagle_group`).
    pub fn holds_drafter(self, group: usize) -> bool {
        self.drafter >> group & 1 == 1
    }

    pub fn len(self) -> usize {
        self.len as usize
    }

    /// No group: a model without a KV cache (an encoder-only model, a multimodal encoder
    /// instance), whose requests hold no blocks.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    pub fn kind(self, group: usize) -> AttentionKind {
        if self.sliding >> group & 1 == 1 {
            AttentionKind::SlidingWindow { window: self.window }
        } else if self.chunked >> group & 1 == 1 {
            AttentionKind::ChunkedLocal { chunk: self.chunk }
        } else if self.mamba >> group & 1 == 1 {
            AttentionKind::Mamba
        } else {
            AttentionKind::Full
        }
    }

    pub fn iter(self) -> impl Iterator<Item = AttentionKind> {
        (0..self.len()).map(move |g| self.kind(g))
    }

    /// Anything but one full-attention group (a drafter's in it or not): the KV manager's
    /// per-group path.
    pub fn is_hybrid(self) -> bool {
        Self { drafter: 0, ..self } != Self::FULL
    }

    /// Some group is a Mamba state group.
    pub fn has_mamba(self) -> bool {
        self.mamba != 0
    }
}

/// The one declaration of the configuration's fields: name, kind, default and doc.
///
/// `config_fields!(callback)` hands the table to the macro `callback`. The core builds
/// `ConfigParams`, its defaults, the field list and the accessors from it; the Python
/// binding builds the `SchedulerConfig` class's properties and their docstrings. Adding
/// a field is one entry here, its validation in `SchedulerConfig::new` (the `check_*`
/// functions it calls), and its tests.
///
/// Kinds: `Int` (i64), `Bool`, `Float` (f64), `Policy`, `Groups` (`KvCacheGroups`), and `Derived(from)`: an optional
/// i64 that, left `None`, takes the value of the field `from`.
#[macro_export]
macro_rules! config_fields {
    ($callback:ident) => {
        $callback! {
            /// ``M``: the most tokens a request may hold, prompt and output. Every scheduled
            /// request keeps ``C + n + s <= M``.
            max_model_len: Int = 2048;
            /// The most requests running at once.
            max_num_seqs: Int = 128;
            /// The input budget of a step: scheduled tokens plus draft slots.
            max_num_batched_tokens: Int = 2048;
            /// The token budget of a step; None takes ``max_num_batched_tokens``.
            max_num_scheduled_tokens: Derived(max_num_batched_tokens) = None;
            /// The most requests the waiting loop lets run; None takes ``max_num_seqs``.
            max_num_active_seqs: Derived(max_num_seqs) = None;
            /// ``B``: tokens per KV block.
            block_size: Int = 16;
            /// KV blocks in the pool; block 0 is the null block, never allocated.
            num_gpu_blocks: Int = 10_000;
            /// Split a prompt over several steps when it does not fit a step's budget.
            enable_chunked_prefill: Bool = true;
            /// Caps a prefill chunk while more than one request is eligible (0: no cap).
            long_prefill_token_threshold: Int = 0;
            /// Raise that cap to ``max_num_batched_tokens // eligible requests`` when larger.
            long_prefill_token_threshold_adaptive: Bool = false;
            /// ``K``: draft tokens per decode step (0: no speculative decoding); a diffusion
            /// model's canvas (``s`` 0): the positions a step denoises.
            num_speculative_tokens: Int = 0;
            /// ``L``: KV slots reserved ahead of the drafts for the drafter.
            num_lookahead_tokens: Int = 0;
            /// Input-budget slots charged per scheduled request for the drafter's tokens.
            max_num_new_slots_for_drafting: Int = 0;
            /// Tokens after each block that the block's prefix-cache hash also covers
            /// (vLLM's lookahead block hashes: 1 for an EAGLE drafter, whose KV at a
            /// block's last position depends on the next token). A block enters the
            /// cache, and can be hit, only once those tokens exist and match.
            num_hash_lookahead_tokens: Int = 0;
            /// A prefix hit gives back its last block, to be recomputed for the drafter
            /// (vLLM's EAGLE block drop, used where lookahead hashes are off).
            eagle_block_drop: Bool = false;
            /// Pad a one-token admission to the uniform decode shape ``1 + K`` (within the
            /// capacity rule); vLLM does not where ``K`` follows the batch size (dynamic
            /// speculative decoding).
            pad_spec_decode: Bool = true;
            /// ``s``: tokens sampled per step: 1 for generation, 0 for pooling and for a
            /// diffusion LLM (with ``num_speculative_tokens``, its canvas: a step's drafts
            /// are its canvas positions, the tokens it emits accepted drafts).
            num_sampled_tokens_per_step: Int = 1;
            /// Schedule a step before the previous one's output returns (placeholders).
            async_scheduling: Bool = true;
            /// Pipeline stages: steps in flight at once in a synchronous engine (vLLM's
            /// batch queue); with async scheduling, one more than one stage needs.
            pipeline_parallel_size: Int = 1;
            /// Fraction of the KV pool, in [0, 1), kept free when admitting a request
            /// while others run.
            watermark: Float = 0.0;
            /// Admit a request only if the free blocks can hold its whole sequence.
            scheduler_reserve_full_isl: Bool = true;
            /// Reuse the KV blocks of identical prompt prefixes.
            enable_prefix_caching: Bool = true;
            /// Record the prefix cache's changes (blocks stored, reused, removed, all
            /// cleared) for ``take_kv_events``: vLLM's KV cache events.
            enable_kv_cache_events: Bool = false;
            /// The fraction, in [0, 1], of the KV blocks the pool hands out whose residency
            /// is followed until they are evicted (vLLM's ``kv_cache_metrics_sample`` with
            /// ``kv_cache_metrics`` on); ``take_kv_cache_eviction_events`` reports each
            /// (0: off).
            kv_cache_metrics_sample: Float = 0.0;
            /// A KV connector serves this engine (vLLM's ``kv_transfer_config``): a waiting
            /// request asks it, through ``schedule``'s external KV source, for tokens past its
            /// prefix-cache hit, and a finished request keeps its KV blocks until
            /// ``release_kv_blocks`` (the connector may still be sending them).
            kv_connector: Bool = false;
            /// An encoder-cache connector serves this engine (vLLM's
            /// ``ec_transfer_config``): the loops ask it, through ``schedule``'s external
            /// encoder source, which inputs' encoder outputs it loads instead of the encoder
            /// computing them, and pass over a request whose outputs are still in transit;
            /// the inputs a request's computed tokens pass are reported for it
            /// (``take_passed_encoder_inputs``).
            ec_connector: Bool = false;
            /// A request the running loop preempts for KV drops the output of its steps in
            /// flight, to be recomputed (vLLM's ``requires_kv_delivery``, a KV connector that
            /// hands finished requests' KV off: a producer's), instead of delivering it.
            preemption_drops_in_flight_output: Bool = false;
            /// Blocks a freed or preempted request held return to the pool only once every
            /// step scheduled by then has its output applied, since a step in flight may
            /// still write them (vLLM's ``defer_block_free``: on with a KV connector that
            /// loads, a consumer's, and several steps in flight, where a load could fill
            /// such a block again; allowed without one, as vLLM's attribute is).
            defer_block_free: Bool = false;
            /// A KV connector's failed load (reported by the runner) is recomputed: the
            /// request keeps the tokens before the first failed block and computes the rest
            /// (vLLM's ``kv_load_failure_policy`` ``"recompute"``); False fails the request
            /// (``"fail"``).
            recompute_kv_load_failures: Bool = true;
            /// ``"fcfs"``, or ``"priority"`` (lower value first, then arrival).
            policy: Policy = Policy::Fcfs;
            /// The most LoRA adapters the running requests may use together; a waiting
            /// request under another adapter waits (0: LoRA off, requests name none).
            max_loras: Int = 0;
            /// The encoder compute budget: the most embeddings of multimodal inputs one
            /// step encodes (vLLM's ``max_num_encoder_input_tokens`` as its
            /// ``MultiModalBudget`` derives it; 0: multimodal inputs off).
            max_num_encoder_input_tokens: Int = 0;
            /// The encoder cache's size, in embeddings (vLLM's ``encoder_cache_size`` as
            /// its ``MultiModalBudget`` derives it; 0 exactly when the budget is 0).
            encoder_cache_size: Int = 0;
            /// A chunk never ends inside a multimodal input's placeholders that it starts
            /// at or before: it stops before the input instead.
            disable_chunked_mm_input: Bool = false;
            /// A multimodal encoder instance (vLLM's ``mm_encoder_only``, disaggregated
            /// encoding): it runs the encoder and publishes the embeddings instead of
            /// sampling, so a request stops once its whole prompt is computed, and a prompt
            /// longer than a step's budget is split over steps even with
            /// ``enable_chunked_prefill`` off (vLLM turns it off for an engine without a
            /// KV cache, which such an instance is).
            mm_encoder_only: Bool = false;
            /// Prompt tokens past the computed ones a drafter reads (vLLM's
            /// ``num_prefill_lookahead_tokens``: 1 for EAGLE, ``K`` for a multi-module MTP
            /// drafter, 0 without): encoder inputs are scheduled that far ahead of a chunk, a
            /// chunk never ends fewer than that many tokens before the prompt's end, and the
            /// last that many less one computed tokens are not cached (the drafter may
            /// compute them again).
            num_prefill_lookahead_tokens: Int = 0;
            /// The KV-cache groups the pool serves, in vLLM's order, comma-separated:
            /// ``full``, ``sliding_window:W`` (a window of W tokens), ``chunked_local:C``
            /// (attention within chunks of C tokens) or ``mamba`` (a recurrent state: ``1 + K``
            /// blocks per request with prefix caching off; with it on, the state at each
            /// block boundary is cached, vLLM's ``mamba_cache_mode`` "align") each, followed by ``+eagle``
            /// where the group holds a drafter's layers (``eagle_block_drop`` then applies to
            /// the kinds of the groups so marked, to every group if none is). A hybrid model
            /// (sliding-window, chunked local or Mamba layers beside full ones) has several;
            /// a model without a KV cache (an encoder-only model, a multimodal encoder
            /// instance) none, ``""``: its requests hold no block, and its pool is the null
            /// block alone (``num_gpu_blocks`` 1 suffices).
            kv_cache_groups: Groups = KvCacheGroups::FULL;
            /// Which blocks of a sliding-window group, and which aligned Mamba states, enter
            /// the prefix cache (vLLM's ``prefix_cache_retention_interval``): 0 keeps only
            /// those a resend of the prompt (or a shared prefix) can hit; a multiple of
            /// ``block_size`` also keeps the window's blocks, and the state, at every such
            /// interval (``block_size``: every block).
            prefix_cache_retention_interval: Int = 0;
            /// With Mamba groups and prefix caching (their state cached at block
            /// boundaries): 0, a Mamba layer writes its state only where a step ends; A > 0,
            /// each Mamba group also holds a prefill checkpoint block, into which a prompt's
            /// last chunk writes the state at its last block boundary from inside the step
            /// when that boundary lies a multiple of A tokens past the chunk's start, so the
            /// chunk is not split there (vLLM's ``MambaSpec.num_prefill_checkpoint_blocks``
            /// 1 with ``prefill_checkpoint_alignment`` A: Mamba2 and gated DeltaNet layers).
            mamba_prefill_checkpoint_alignment: Int = 0;
            /// Prefill cadence: while a request decodes, prefill (admissions and running
            /// prompt chunks) runs only once this many executed steps have passed since
            /// the last step that carried prefill, unless the waiting requests outgrew
            /// the last prefill step (1: every step).
            prefill_schedule_interval: Int = 1;
        }
    };
}

/// How a field's value is typed (`config_fields!` kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Int,
    Bool,
    Float,
    Policy,
    Groups,
    /// An optional integer derived from another field when `None`.
    Derived,
}

/// One field's value, as `ConfigParams::get` reads it and `set` writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldValue {
    Int(i64),
    Bool(bool),
    Float(f64),
    Policy(Policy),
    Groups(KvCacheGroups),
    Derived(Option<i64>),
}

impl std::hash::Hash for FieldValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match *self {
            Self::Int(v) => v.hash(state),
            Self::Bool(v) => v.hash(state),
            // -0.0 + 0.0 is 0.0: the two zeros, equal, hash alike.
            Self::Float(v) => (v + 0.0).to_bits().hash(state),
            Self::Policy(v) => v.hash(state),
            Self::Groups(v) => v.hash(state),
            Self::Derived(v) => v.hash(state),
        }
    }
}

/// A field's name, kind and documentation.
#[derive(Clone, Copy, Debug)]
pub struct FieldInfo {
    pub name: &'static str,
    pub kind: FieldKind,
    pub doc: &'static str,
}

macro_rules! config_field_type {
    (Int) => { i64 };
    (Bool) => { bool };
    (Float) => { f64 };
    (Policy) => { Policy };
    (Groups) => { KvCacheGroups };
    (Derived) => { Option<i64> };
}

macro_rules! config_accessor {
    ($(#[doc = $doc:literal])+ $name:ident Derived $from:ident) => {
        $(#[doc = $doc])+
        #[inline]
        pub fn $name(&self) -> i64 {
            self.params.$name.unwrap_or(self.params.$from)
        }
    };
    ($(#[doc = $doc:literal])+ $name:ident $kind:ident) => {
        $(#[doc = $doc])+
        #[inline]
        pub fn $name(&self) -> config_field_type!($kind) {
            self.params.$name
        }
    };
}

macro_rules! define_config {
    ($( $(#[doc = $doc:literal])+ $name:ident: $kind:ident $(($from:ident))? = $default:expr; )+) => {
        /// Unvalidated knobs, as a caller gives them (`config_fields!` declares them).
        #[derive(Clone, Debug, PartialEq)]
        pub struct ConfigParams {
            $( $(#[doc = $doc])+ pub $name: config_field_type!($kind), )+
        }

        impl Default for ConfigParams {
            fn default() -> Self {
                Self { $( $name: $default, )+ }
            }
        }

        impl ConfigParams {
            /// Every field, in declaration order.
            pub const FIELDS: &'static [FieldInfo] = &[
                $( FieldInfo { name: stringify!($name), kind: FieldKind::$kind, doc: concat!($($doc, "\n"),+) }, )+
            ];

            /// These parameters with every `Derived` field that is `None` given the value
            /// of the field it derives from.
            pub fn resolved(&self) -> Self {
                let mut resolved = self.clone();
                $( $( resolved.$name = Some(self.$name.unwrap_or(self.$from)); )? )+
                resolved
            }

            /// The value of the field `name`, or None if there is no such field.
            pub fn get(&self, name: &str) -> Option<FieldValue> {
                match name {
                    $( stringify!($name) => Some(FieldValue::$kind(self.$name)), )+
                    _ => None,
                }
            }

            /// Sets the field `name`; an error if there is no such field or `value`
            /// is of another kind. Values are checked by `SchedulerConfig::new`.
            pub fn set(&mut self, name: &str, value: FieldValue) -> CoreResult<()> {
                match (name, value) {
                    $( (stringify!($name), FieldValue::$kind(v)) => self.$name = v, )+
                    (name, value) => {
                        let known = Self::FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
                        return Err(match Self::FIELDS.iter().find(|f| f.name == name) {
                            Some(field) => CoreError::config(field.name, format!("{value:?}"), format!("must be a {:?} value", field.kind)),
                            None => CoreError::config("field", name, format!("not a SchedulerConfig field (fields: {known})")),
                        });
                    }
                }
                Ok(())
            }
        }

        impl SchedulerConfig {
            $( config_accessor!($(#[doc = $doc])+ $name $kind $($from)?); )+
        }
    };
}

config_fields!(define_config);

/// A validated configuration. Fields are private so that no invalid
/// combination can exist; read them through the accessors. Two configs are
/// equal when every resolved value is (`None` and its derived value agree).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    params: ConfigParams,
    watermark_blocks: u32,
    max_request_len: i64,
}

fn positive(field: &'static str, value: i64, max: i64) -> CoreResult<()> {
    if value < 1 {
        return Err(CoreError::config(field, value, "must be at least 1"));
    }
    if value > max {
        return Err(CoreError::config(field, value, format!("must be at most {max}")));
    }
    Ok(())
}

/// Each field in its own range: the sizes positive and within what the API's int32 columns
/// hold, the counts not negative, `s` 0 or 1 (and room for a sampled token).
fn check_field_ranges(p: &ConfigParams) -> CoreResult<()> {
    positive("max_model_len", p.max_model_len, I32_MAX / 2)?;
    positive("max_num_seqs", p.max_num_seqs, 1 << 24)?;
    positive("max_num_batched_tokens", p.max_num_batched_tokens, I32_MAX / 2)?;
    positive("block_size", p.block_size, 1 << 16)?;
    // Block 0 is the null block, never allocated; a model without a KV cache allocates none
    // (vLLM sizes its pool to the null block alone).
    let least_blocks = if p.kv_cache_groups.is_empty() { 1 } else { 2 };
    if p.num_gpu_blocks < least_blocks {
        return Err(CoreError::config(
            "num_gpu_blocks",
            p.num_gpu_blocks,
            format!("must be at least {least_blocks} (block 0 is the null block, never allocated)"),
        ));
    }
    positive("num_gpu_blocks", p.num_gpu_blocks, I32_MAX)?;
    positive("prefill_schedule_interval", p.prefill_schedule_interval, I32_MAX)?;
    positive("pipeline_parallel_size", p.pipeline_parallel_size, 1 << 10)?;
    for (field, value) in [
        ("long_prefill_token_threshold", p.long_prefill_token_threshold),
        ("num_speculative_tokens", p.num_speculative_tokens),
        ("num_lookahead_tokens", p.num_lookahead_tokens),
        ("max_num_new_slots_for_drafting", p.max_num_new_slots_for_drafting),
        ("num_hash_lookahead_tokens", p.num_hash_lookahead_tokens),
        ("num_sampled_tokens_per_step", p.num_sampled_tokens_per_step),
        ("max_loras", p.max_loras),
        ("max_num_encoder_input_tokens", p.max_num_encoder_input_tokens),
        ("encoder_cache_size", p.encoder_cache_size),
        ("num_prefill_lookahead_tokens", p.num_prefill_lookahead_tokens),
    ] {
        if value < 0 {
            return Err(CoreError::config(field, value, "must not be negative"));
        }
    }
    if (p.max_num_encoder_input_tokens == 0) != (p.encoder_cache_size == 0) {
        return Err(CoreError::config(
            "encoder_cache_size",
            p.encoder_cache_size,
            format!(
                "must be 0 exactly when max_num_encoder_input_tokens ({}) is: multimodal inputs need both",
                p.max_num_encoder_input_tokens
            ),
        ));
    }
    if p.num_sampled_tokens_per_step > 1 {
        return Err(CoreError::config(
            "num_sampled_tokens_per_step",
            p.num_sampled_tokens_per_step,
            "must be 0 (pooling) or 1 (generation)",
        ));
    }
    if p.num_sampled_tokens_per_step == 1 && p.max_model_len < 2 {
        return Err(CoreError::config(
            "max_model_len",
            p.max_model_len,
            "must be at least 2 for generation: a prompt needs room for one sampled token",
        ));
    }
    Ok(())
}

/// Whether a prompt longer than what a step gives its request is split over steps: with
/// chunked prefill, and on an encoder instance (vLLM's waiting loop exempts it).
fn splits_prompts(p: &ConfigParams) -> bool {
    p.enable_chunked_prefill || p.mm_encoder_only
}

/// The widest prompt chunk the budgets allow: the token budget, or the long-prefill
/// threshold below it (vLLM's `max_prefill_tokens` in `_mamba_block_aligned_split`).
fn widest_prefill_chunk(max_num_scheduled_tokens: i64, long_prefill_token_threshold: i64) -> i64 {
    match long_prefill_token_threshold {
        0 => max_num_scheduled_tokens,
        threshold => max_num_scheduled_tokens.min(threshold),
    }
}

/// The most tokens one request can be given in a step: `R = min(token budget, input budget -
/// draft slots)`.
fn largest_request_budget(p: &ConfigParams) -> i64 {
    // A resolved derived field is always Some.
    let max_num_scheduled_tokens = p.resolved().max_num_scheduled_tokens.unwrap_or(0);
    max_num_scheduled_tokens.min(p.max_num_batched_tokens - p.max_num_new_slots_for_drafting)
}

/// The step budgets: room for every running request, derived budgets in range, and a step
/// that can hold what must be scheduled whole (a prompt without chunked prefill, a padded
/// decode), else a request would wait forever.
fn check_budgets(p: &ConfigParams) -> CoreResult<()> {
    if p.max_num_batched_tokens < p.max_num_seqs {
        return Err(CoreError::config(
            "max_num_batched_tokens",
            p.max_num_batched_tokens,
            format!("must be at least max_num_seqs={}", p.max_num_seqs),
        ));
    }
    let resolved = p.resolved();
    // A resolved derived field is always Some.
    let max_num_scheduled_tokens = resolved.max_num_scheduled_tokens.unwrap_or(0);
    positive("max_num_scheduled_tokens", max_num_scheduled_tokens, I32_MAX / 2)?;
    let max_num_active_seqs = resolved.max_num_active_seqs.unwrap_or(0);
    positive("max_num_active_seqs", max_num_active_seqs, p.max_num_seqs)?;
    if !splits_prompts(p) && p.max_num_batched_tokens < p.max_model_len {
        return Err(CoreError::config(
            "max_num_batched_tokens",
            p.max_num_batched_tokens,
            format!(
                "must be at least max_model_len={} when enable_chunked_prefill is False, \
                 or a long prompt could never be scheduled",
                p.max_model_len
            ),
        ));
    }
    // Two rules would otherwise wait forever for a step that never comes: a request that
    // cannot be chunked, and a padded decode.
    let largest_request_budget = largest_request_budget(p);
    if !splits_prompts(p) && largest_request_budget < p.max_model_len - p.num_sampled_tokens_per_step {
        return Err(CoreError::config(
            "max_num_scheduled_tokens",
            max_num_scheduled_tokens,
            format!(
                "with enable_chunked_prefill False, a request of up to max_model_len - {} = {} tokens \
                 must fit one step, but min(max_num_scheduled_tokens, max_num_batched_tokens - \
                 max_num_new_slots_for_drafting) = {largest_request_budget}",
                p.num_sampled_tokens_per_step,
                p.max_model_len - p.num_sampled_tokens_per_step
            ),
        ));
    }
    if p.num_speculative_tokens > 0
        && p.num_sampled_tokens_per_step > 0
        && largest_request_budget < 1 + p.num_speculative_tokens
    {
        return Err(CoreError::config(
            "num_speculative_tokens",
            p.num_speculative_tokens,
            format!(
                "a decode padded to 1 + num_speculative_tokens = {} tokens must fit one step, but \
                 min(max_num_scheduled_tokens, max_num_batched_tokens - max_num_new_slots_for_drafting) \
                 = {largest_request_budget}",
                1 + p.num_speculative_tokens
            ),
        ));
    }
    Ok(())
}

/// The long-prefill threshold and the speculative-decoding knobs (`K`, `L`, draft slots)
/// within the bounds the others set.
fn check_speculative_decoding(p: &ConfigParams) -> CoreResult<()> {
    if p.long_prefill_token_threshold > p.max_model_len {
        return Err(CoreError::config(
            "long_prefill_token_threshold",
            p.long_prefill_token_threshold,
            format!("must be at most max_model_len={}", p.max_model_len),
        ));
    }
    if p.num_speculative_tokens > 64 {
        return Err(CoreError::config("num_speculative_tokens", p.num_speculative_tokens, "must be at most 64"));
    }
    if p.num_lookahead_tokens > p.num_speculative_tokens + 1
        || (p.num_speculative_tokens == 0 && p.num_lookahead_tokens > 0)
    {
        return Err(CoreError::config(
            "num_lookahead_tokens",
            p.num_lookahead_tokens,
            format!(
                "must be 0 without speculative decoding and at most num_speculative_tokens + 1 = {} with it",
                p.num_speculative_tokens + 1
            ),
        ));
    }
    if p.max_num_new_slots_for_drafting > p.num_speculative_tokens {
        return Err(CoreError::config(
            "max_num_new_slots_for_drafting",
            p.max_num_new_slots_for_drafting,
            format!("must be at most num_speculative_tokens={}", p.num_speculative_tokens),
        ));
    }
    if p.max_num_new_slots_for_drafting >= p.max_num_batched_tokens {
        return Err(CoreError::config(
            "max_num_new_slots_for_drafting",
            p.max_num_new_slots_for_drafting,
            format!("must be below max_num_batched_tokens={}", p.max_num_batched_tokens),
        ));
    }
    // Lookahead hashes prove the token after a block, which is what the drop guards.
    if p.eagle_block_drop && p.num_hash_lookahead_tokens > 0 {
        return Err(CoreError::config(
            "eagle_block_drop",
            "True",
            format!(
                "must be False with num_hash_lookahead_tokens={} (lookahead hashes replace the drop)",
                p.num_hash_lookahead_tokens
            ),
        ));
    }
    // A drafter with no lookahead slots reads no prompt ahead; one with several modules
    // reads one token more per module, K at most.
    let most_lookahead = if p.num_lookahead_tokens > 0 { p.num_speculative_tokens } else { 0 };
    let l = p.num_prefill_lookahead_tokens;
    if l > most_lookahead {
        return Err(CoreError::config(
            "num_prefill_lookahead_tokens",
            l,
            format!(
                "must be at most num_speculative_tokens={most_lookahead} with a drafter's lookahead slots, 0 without"
            ),
        ));
    }
    if l > 1 && p.max_num_encoder_input_tokens > 0 {
        // A chunk cut back short of an image's end keeps that image's output referenced,
        // and the next image may then have no room in the cache: each waits for the other.
        return Err(CoreError::config(
            "num_prefill_lookahead_tokens",
            l,
            "must be at most 1 with multimodal inputs (a multi-module MTP drafter beside an encoder \
             cache is not built)",
        ));
    }
    if l > 1 {
        // A chunk that would end fewer than L tokens before the prompt's end is cut back,
        // so a step must be able to give a request L tokens, or the prompt never ends.
        let largest = largest_request_budget(p);
        if largest < l {
            return Err(CoreError::config(
                "num_prefill_lookahead_tokens",
                l,
                format!(
                    "must be at most what one step gives a request ({largest} tokens), or a prompt could never end"
                ),
            ));
        }
        if 0 < p.long_prefill_token_threshold && p.long_prefill_token_threshold < l {
            return Err(CoreError::config(
                "long_prefill_token_threshold",
                p.long_prefill_token_threshold,
                format!("must be 0 or at least num_prefill_lookahead_tokens={l}, or a prompt could never end"),
            ));
        }
    }
    if p.num_hash_lookahead_tokens > p.block_size {
        return Err(CoreError::config(
            "num_hash_lookahead_tokens",
            p.num_hash_lookahead_tokens,
            format!("must be at most block_size={}", p.block_size),
        ));
    }
    Ok(())
}

/// The retention interval on the block grid, and what the per-group path does not do yet:
/// EAGLE's prefix-cache rule (lookahead slots) over several groups.
fn check_kv_cache_groups(p: &ConfigParams) -> CoreResult<()> {
    let interval = p.prefix_cache_retention_interval;
    if interval < 0 || interval % p.block_size != 0 {
        return Err(CoreError::config(
            "prefix_cache_retention_interval",
            interval,
            format!("must be 0 or a positive multiple of block_size={}", p.block_size),
        ));
    }
    if p.num_prefill_lookahead_tokens > 1 && p.kv_cache_groups.len() > 1 {
        return Err(CoreError::config(
            "num_prefill_lookahead_tokens",
            p.num_prefill_lookahead_tokens,
            "must be at most 1 with several KV-cache groups (a multi-module MTP drafter beside hybrid \
             layers is not built)",
        ));
    }
    if p.kv_cache_groups.is_empty() {
        // Nothing to cache, send or load.
        for (field, on) in [("enable_prefix_caching", p.enable_prefix_caching), ("kv_connector", p.kv_connector)] {
            if on {
                return Err(CoreError::config(field, "True", "must be False without KV-cache groups (no KV cache)"));
            }
        }
    } else if p.kv_cache_groups.iter().all(|kind| kind == AttentionKind::Mamba) {
        return Err(CoreError::config(
            "kv_cache_groups",
            format!("{:?}", p.kv_cache_groups.to_text()),
            "must hold an attention group beside Mamba groups (models without attention layers \
             are not built)",
        ));
    }
    let alignment = p.mamba_prefill_checkpoint_alignment;
    if alignment < 0 || (alignment > 0 && !(p.kv_cache_groups.has_mamba() && p.enable_prefix_caching)) {
        return Err(CoreError::config(
            "mamba_prefill_checkpoint_alignment",
            alignment,
            "must be 0, or positive with Mamba groups and prefix caching on (their state cached at \
             block boundaries)",
        ));
    }
    if p.kv_cache_groups.has_mamba() && p.enable_prefix_caching {
        if p.disable_chunked_mm_input {
            // A chunk must be able to end on a block boundary inside an image (vLLM asserts
            // the same): whole images would stall any that spans a boundary for good.
            return Err(CoreError::config(
                "disable_chunked_mm_input",
                "True",
                format!(
                    "must be False beside Mamba groups with prefix caching on (kv_cache_groups {:?}): \
                     prompt chunks end on block boundaries, inside an image if need be",
                    p.kv_cache_groups.to_text()
                ),
            ));
        }
        // A prompt chunk ends on a block boundary unless a block is wider than any chunk
        // (vLLM's `_mamba_block_aligned_split`, judged on the token budget); with draft slots
        // a request's share can fall below a block while the budget holds one: no chunk of
        // a longer prompt would ever run (vLLM schedules nothing, step after step).
        let share = largest_request_budget(p);
        let budget = p.resolved().max_num_scheduled_tokens.unwrap_or(p.max_num_batched_tokens);
        if share < p.block_size && p.block_size <= widest_prefill_chunk(budget, p.long_prefill_token_threshold) {
            return Err(CoreError::config(
                "max_num_new_slots_for_drafting",
                p.max_num_new_slots_for_drafting,
                format!(
                    "leaves a request {share} tokens of a step, less than a block ({} tokens), beside \
                     Mamba groups with prefix caching on: a prompt chunk must reach a block boundary \
                     (raise max_num_batched_tokens)",
                    p.block_size
                ),
            ));
        }
        // Mamba state cached at block boundaries (vLLM's mamba_cache_mode "align") is built
        // without a KV connector.
        if p.kv_connector {
            return Err(CoreError::config(
                "kv_connector",
                "True",
                format!(
                    "is not served beside Mamba groups with prefix caching on (kv_cache_groups {:?}: \
                     Mamba state cached at block boundaries, vLLM's mamba_cache_mode \"align\", is \
                     built without KV connectors)",
                    p.kv_cache_groups.to_text()
                ),
            ));
        }
    }
    if p.kv_cache_groups.is_hybrid() {
        let groups = p.kv_cache_groups.to_text();
        // Beside chunked local attention vLLM's lookup asserts against the block drop.
        if p.eagle_block_drop && p.kv_cache_groups.iter().any(|kind| matches!(kind, AttentionKind::ChunkedLocal { .. }))
        {
            return Err(CoreError::config(
                "eagle_block_drop",
                "True",
                format!(
                    "must be False with the KV-cache groups {groups:?} (EAGLE's block drop beside \
                     chunked local attention: vLLM does not serve it)"
                ),
            ));
        }
    }
    Ok(())
}

impl SchedulerConfig {
    /// A pooling model: nothing sampled (`s = 0`) and no drafts; a request ends with the
    /// step that computes its prompt's last token (its pooled output).
    #[inline]
    pub fn pools(&self) -> bool {
        self.num_sampled_tokens_per_step() == 0 && self.num_speculative_tokens() == 0
    }

    /// A diffusion LLM (vLLM's `is_diffusion`): nothing sampled (`s = 0`) but a canvas of
    /// `K` positions each step denoises, scheduled as drafts; the positions a step emits
    /// are accepted drafts, a step that emits none leaves the canvas to the next.
    #[inline]
    pub fn is_diffusion(&self) -> bool {
        self.num_sampled_tokens_per_step() == 0 && self.num_speculative_tokens() > 0
    }

    /// Requests may carry multimodal inputs (an encoder budget is set).
    #[inline]
    pub fn multimodal(&self) -> bool {
        self.params.max_num_encoder_input_tokens > 0
    }

    /// How large one multimodal input may be: its embeddings within the compute budget and
    /// the cache (a larger one could never be encoded), and without chunked inputs, its
    /// placeholders and the drafter's shift within what one step gives a request, the
    /// long-prefill threshold included (while other requests wait, a chunk is capped there,
    /// and requests each waiting to take an input whole would wait for each other forever).
    pub(crate) fn mm_input_limits(&self) -> crate::mm_inputs::InputLimits {
        let p = &self.params;
        let mut request_budget = largest_request_budget(p);
        if p.long_prefill_token_threshold > 0 {
            request_budget = request_budget.min(p.long_prefill_token_threshold);
        }
        crate::mm_inputs::InputLimits {
            embeds: p.max_num_encoder_input_tokens.min(p.encoder_cache_size),
            whole_placeholders: p.disable_chunked_mm_input.then(|| request_budget - p.num_prefill_lookahead_tokens),
        }
    }

    /// `params` validated: each field in its range, then the combinations a scheduler needs
    /// to make progress (budgets, speculative decoding, KV-cache groups); the error names the
    /// first field that breaks a rule.
    pub fn new(params: ConfigParams) -> CoreResult<Self> {
        let p = &params;
        check_field_ranges(p)?;
        check_budgets(p)?;
        check_speculative_decoding(p)?;
        check_kv_cache_groups(p)?;
        if !(0.0..=1.0).contains(&p.kv_cache_metrics_sample) {
            return Err(CoreError::config("kv_cache_metrics_sample", p.kv_cache_metrics_sample, "must be in [0, 1]"));
        }
        if !(p.watermark.is_finite() && (0.0..1.0).contains(&p.watermark)) {
            return Err(CoreError::config("watermark", p.watermark, "must be in [0, 1)"));
        }
        // vLLM: int(watermark * num_blocks).
        let watermark_blocks = (p.watermark * p.num_gpu_blocks as f64) as u32;
        let mut config = Self { watermark_blocks, params, max_request_len: 0 };
        config.max_request_len = config.pool_request_len();
        Ok(config)
    }

    /// `M`, or less when the pool's usable blocks cannot hold a request of `M` tokens (every
    /// group counted): `T - L + s` for the most slots `T` they hold, so that a step's slots,
    /// `min(C + n + L, M)`, fit the whole pool whenever `C + n + s` does not pass it; with a
    /// KV connector and drafts, also no more tokens than a load can take while leaving a
    /// speculative step's `1 + K + L` slots free in every group (vLLM's reservation: a
    /// request whose load cannot have both would wait for it forever).
    fn pool_request_len(&self) -> i64 {
        let m = self.max_model_len();
        let usable_blocks = self.num_gpu_blocks() - 1;
        let mut longest = m;
        if self.max_blocks_per_request(m) > usable_blocks {
            let t = self.most_tokens_within(usable_blocks);
            longest = t - self.num_lookahead_tokens() + self.num_sampled_tokens_per_step();
        }
        let reserve = self.load_spec_reserve();
        if reserve > 0 && self.max_blocks_per_request(longest) + reserve > usable_blocks {
            longest = longest.min(self.most_tokens_within(usable_blocks - reserve));
        }
        longest
    }

    /// The blocks a request's KV load leaves free for a speculative step: a speculative
    /// step's blocks with a KV connector, 0 without one.
    fn load_spec_reserve(&self) -> i64 {
        if self.kv_connector() {
            self.spec_step_blocks()
        } else {
            0
        }
    }

    /// The blocks one speculative step's `1 + K + L` slots take past a sequence, in every
    /// group that holds tokens (vLLM's `_spec_decode_step_blocks`); 0 without drafts.
    pub(crate) fn spec_step_blocks(&self) -> i64 {
        let k = self.num_speculative_tokens();
        if k == 0 {
            return 0;
        }
        let bs = self.block_size();
        let token_groups = self.kv_cache_groups().iter().filter(|&kind| kind != AttentionKind::Mamba).count();
        token_groups as i64 * ((1 + k + self.num_lookahead_tokens() + bs - 1) / bs)
    }

    /// The most tokens `T` in `[-1, M)` whose blocks fit `blocks` (`max_blocks_per_request`
    /// never decreases).
    fn most_tokens_within(&self, blocks: i64) -> i64 {
        let (mut fits, mut too_many) = (-1, self.max_model_len());
        while too_many - fits > 1 {
            let mid = fits + (too_many - fits) / 2;
            if self.max_blocks_per_request(mid) <= blocks {
                fits = mid;
            } else {
                too_many = mid;
            }
        }
        fits
    }

    pub fn params(&self) -> &ConfigParams {
        &self.params
    }
    /// Whether a prompt longer than what a step gives its request is split over steps
    /// (chunked prefill, or an encoder instance).
    pub fn splits_prompts(&self) -> bool {
        splits_prompts(&self.params)
    }
    /// The longest a request grows: `M`, or less when the KV pool cannot hold a request of
    /// `M` tokens (vLLM's engine refuses such a pool at startup; `pool_request_len`). A
    /// request stops there, length-capped, as at `M`, and the capacity rule keeps
    /// `C + n + s` within it, so that a step's slots always fit the whole pool: a request
    /// never has to preempt itself.
    #[inline]
    pub fn max_request_len(&self) -> i64 {
        self.max_request_len
    }
    /// The longest prompt a request may have: `max_request_len - s`, room for the sampled
    /// token.
    pub fn prompt_limit(&self) -> ListLimit {
        let pool = (self.max_request_len < self.max_model_len()).then(|| PoolBound {
            usable_blocks: self.num_gpu_blocks() - 1,
            spec_step_blocks: self.load_spec_reserve(),
        });
        ListLimit::prompt(self.max_request_len, self.num_sampled_tokens_per_step(), pool)
    }
    /// The most multimodal inputs one request may have (`items` "inputs"), or placeholder
    /// flags one input may have ("flags"): `M - s`, the longest prompt's tokens.
    pub fn mm_input_limit(&self, items: &'static str) -> ListLimit {
        ListLimit::prompt_placeholders(self.max_model_len(), self.num_sampled_tokens_per_step(), items)
    }
    /// The most prompt-embedding keys a request may carry: one per block, so no more than
    /// the longest prompt's tokens.
    pub fn prompt_embeds_keys_limit(&self) -> ListLimit {
        ListLimit::prompt_placeholders(self.max_model_len(), self.num_sampled_tokens_per_step(), "keys")
    }
    /// The most drafts one request may be given: `K`.
    pub fn drafts_per_request_limit(&self) -> ListLimit {
        ListLimit::drafts_per_request(self.num_speculative_tokens())
    }
    /// The most drafts `requests` requests may be given together: `K` each.
    pub fn drafts_limit(&self, requests: usize) -> ListLimit {
        ListLimit::drafts(self.num_speculative_tokens(), requests)
    }
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks as usize
    }
    /// The most blocks a group of `kind` holds for one request (vLLM's
    /// `max_admission_blocks_per_request`), None for full attention: a sliding window's
    /// tokens before the next one and the tokens in flight, plus one for a window that
    /// starts mid-block; a chunk and the tokens in flight; a Mamba group's state blocks.
    pub fn group_block_cap(&self, kind: AttentionKind) -> Option<i64> {
        let (tokens, extra) = match kind {
            AttentionKind::Full => return None,
            AttentionKind::Mamba => return Some(self.mamba_state_blocks()),
            AttentionKind::SlidingWindow { window } => (i64::from(window) - 1, 1),
            AttentionKind::ChunkedLocal { chunk } => (i64::from(chunk), 0),
        };
        let tokens = (tokens + self.max_in_flight_tokens()).min(self.max_model_len());
        Some((tokens + self.block_size() - 1) / self.block_size() + extra)
    }

    /// The widest prompt chunk the budgets allow (see `widest_prefill_chunk`).
    pub fn widest_prefill_chunk(&self) -> i64 {
        widest_prefill_chunk(self.max_num_scheduled_tokens(), self.long_prefill_token_threshold())
    }

    /// The most KV blocks a request of up to `tokens` tokens holds at once, every group
    /// counted: a chunked local group's cap, plus one for a chunk that starts mid-block
    /// (vLLM's cap, which the admission gate keeps, counts chunks as if block-aligned); a
    /// Mamba group's state blocks, however short the request.
    pub fn max_blocks_per_request(&self, tokens: i64) -> i64 {
        let bs = self.block_size();
        let blocks = (tokens + bs - 1) / bs;
        // A windowed group's blocks also cover the drafter's lookahead slots past the tokens
        // in flight (the fuzz found a request holding that much more and preempting itself
        // forever).
        let lookahead = (self.num_lookahead_tokens() + bs - 1) / bs;
        let held = |kind: AttentionKind| match kind {
            AttentionKind::Mamba => self.mamba_state_blocks(),
            AttentionKind::ChunkedLocal { chunk } if i64::from(chunk) % bs != 0 => {
                self.group_block_cap(kind).map_or(blocks, |cap| blocks.min(cap + 1 + lookahead))
            }
            _ => self.group_block_cap(kind).map_or(blocks, |cap| blocks.min(cap + lookahead)),
        };
        self.kv_cache_groups().iter().map(held).sum()
    }

    /// The most blocks a request holds at once in a Mamba group. Without prefix caching its
    /// state and one per draft token (vLLM's `MambaSpec.num_speculative_blocks`), `1 + K`,
    /// always. With it ("align"): the state a step continues from, one per draft token,
    /// and for each step that may be in flight the block its state ends in and, if its
    /// layers write them, a prefill checkpoint block (a step frees the blocks behind the
    /// processed tokens).
    pub fn mamba_state_blocks(&self) -> i64 {
        if self.mamba_aligned() {
            let per_step = 1 + i64::from(self.mamba_prefill_checkpoint_alignment() > 0);
            1 + self.num_speculative_tokens() + self.max_concurrent_batches() * per_step
        } else {
            1 + self.num_speculative_tokens()
        }
    }

    /// Mamba groups cache their state at block boundaries (vLLM's `mamba_cache_mode`
    /// "align", which vLLM turns on with prefix caching).
    #[inline]
    pub fn mamba_aligned(&self) -> bool {
        self.kv_cache_groups().has_mamba() && self.enable_prefix_caching()
    }

    /// The most steps an engine keeps in flight (vLLM's `max_concurrent_batches`): one per
    /// pipeline stage, and two for async scheduling without pipeline parallelism.
    pub fn max_concurrent_batches(&self) -> i64 {
        let stages = self.pipeline_parallel_size();
        if self.async_scheduling() && stages == 1 {
            2
        } else {
            stages
        }
    }

    /// The most tokens scheduled but not yet processed: a step's budget per step in flight
    /// (vLLM's `max_in_flight_tokens`).
    pub fn max_in_flight_tokens(&self) -> i64 {
        self.max_concurrent_batches() * self.max_num_batched_tokens()
    }
}

impl SchedulerConfig {
    /// The parameters with every derived value filled in.
    pub fn resolved(&self) -> ConfigParams {
        self.params.resolved()
    }

    /// The field `name` as the scheduler uses it (a derived field holds the value it
    /// derives), or None if there is no such field.
    pub fn resolved_value(&self, name: &str) -> Option<FieldValue> {
        self.params.resolved().get(name)
    }
}

impl PartialEq for SchedulerConfig {
    fn eq(&self, other: &Self) -> bool {
        self.resolved() == other.resolved()
    }
}

// Validation refuses a NaN watermark, so equality is an equivalence.
impl Eq for SchedulerConfig {}

/// Hashes what equality compares: the resolved values (`FieldValue`'s hash takes
/// `-0.0` as `0.0`, which it equals).
impl std::hash::Hash for SchedulerConfig {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for field in ConfigParams::FIELDS {
            self.resolved_value(field.name).hash(state);
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self::new(ConfigParams::default()).expect("the default configuration is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{DefaultHasher, Hash, Hasher};

    fn hash_of(config: &SchedulerConfig) -> u64 {
        let mut hasher = DefaultHasher::new();
        config.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn every_declared_field_reads_and_writes_through_the_table() {
        let defaults = ConfigParams::default();
        for field in ConfigParams::FIELDS {
            let value = defaults.get(field.name).expect("a declared field has a value");
            let mut params = ConfigParams::default();
            params.set(field.name, value).expect("its own kind is accepted");
            assert_eq!(params, defaults);
            assert!(!field.doc.trim().is_empty(), "{} has no documentation", field.name);
        }
        assert!(defaults.get("no_such_field").is_none());
        let mut params = ConfigParams::default();
        assert!(params.set("max_model_len", FieldValue::Bool(true)).is_err());
        assert!(params.set("no_such_field", FieldValue::Int(1)).is_err());
        assert_eq!(params, defaults, "a refused set changes nothing");
    }

    #[test]
    fn derived_fields_resolve_from_their_source() {
        let params = ConfigParams { max_num_batched_tokens: 4096, max_num_seqs: 7, ..ConfigParams::default() };
        let config = SchedulerConfig::new(params).unwrap();
        assert_eq!(config.max_num_scheduled_tokens(), 4096);
        assert_eq!(config.max_num_active_seqs(), 7);
        assert_eq!(config.resolved_value("max_num_scheduled_tokens"), Some(FieldValue::Derived(Some(4096))));
    }

    #[test]
    fn equal_configs_hash_equal() {
        let zero = SchedulerConfig::new(ConfigParams { watermark: 0.0, ..ConfigParams::default() }).unwrap();
        let negative_zero = SchedulerConfig::new(ConfigParams { watermark: -0.0, ..ConfigParams::default() }).unwrap();
        assert_eq!(zero, negative_zero);
        assert_eq!(hash_of(&zero), hash_of(&negative_zero));
        let derived = SchedulerConfig::default();
        let explicit =
            SchedulerConfig::new(ConfigParams { max_num_scheduled_tokens: Some(2048), ..ConfigParams::default() })
                .unwrap();
        assert_eq!(derived, explicit);
        assert_eq!(hash_of(&derived), hash_of(&explicit));
        let other = SchedulerConfig::new(ConfigParams { watermark: 0.5, ..ConfigParams::default() }).unwrap();
        assert_ne!(hash_of(&zero), hash_of(&other));
    }
}
