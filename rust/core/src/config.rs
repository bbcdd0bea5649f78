//! The validated scheduler configuration: the only home of `max_model_len`.
//!
//! Names and defaults are vLLM 0.33.0's (spec §2). Derived knobs that vLLM
//! computes from other configs (speculative method, runner type) are taken
//! as their derived values: `num_lookahead_tokens` (`L`),
//! `max_num_new_slots_for_drafting` (draft slots) and
//! `num_sampled_tokens_per_step` (`s`).

use crate::error::{CoreError, CoreResult};

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

/// Unvalidated knobs, as a caller gives them. `None` means "derive it".
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigParams {
    pub max_model_len: i64,
    pub max_num_seqs: i64,
    pub max_num_batched_tokens: i64,
    pub max_num_scheduled_tokens: Option<i64>,
    pub max_num_active_seqs: Option<i64>,
    pub block_size: i64,
    pub num_gpu_blocks: i64,
    pub enable_chunked_prefill: bool,
    pub long_prefill_token_threshold: i64,
    pub long_prefill_token_threshold_adaptive: bool,
    pub num_speculative_tokens: i64,
    pub num_lookahead_tokens: i64,
    pub max_num_new_slots_for_drafting: i64,
    pub num_sampled_tokens_per_step: i64,
    pub async_scheduling: bool,
    pub watermark: f64,
    pub scheduler_reserve_full_isl: bool,
    pub enable_prefix_caching: bool,
    pub policy: Policy,
}

impl Default for ConfigParams {
    fn default() -> Self {
        Self {
            max_model_len: 2048,
            max_num_seqs: 128,
            max_num_batched_tokens: 2048,
            max_num_scheduled_tokens: None,
            max_num_active_seqs: None,
            block_size: 16,
            num_gpu_blocks: 10_000,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: 0,
            long_prefill_token_threshold_adaptive: false,
            num_speculative_tokens: 0,
            num_lookahead_tokens: 0,
            max_num_new_slots_for_drafting: 0,
            num_sampled_tokens_per_step: 1,
            async_scheduling: true,
            watermark: 0.0,
            scheduler_reserve_full_isl: true,
            enable_prefix_caching: true,
            policy: Policy::Fcfs,
        }
    }
}

/// A validated configuration. Fields are private so that no invalid
/// combination can exist; read them through the accessors. Two configs are
/// equal when every resolved value is (`None` and its derived value agree).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    params: ConfigParams,
    max_num_scheduled_tokens: u32,
    max_num_active_seqs: u32,
    watermark_blocks: u32,
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

impl SchedulerConfig {
    pub fn new(params: ConfigParams) -> CoreResult<Self> {
        let p = &params;
        positive("max_model_len", p.max_model_len, I32_MAX / 2)?;
        positive("max_num_seqs", p.max_num_seqs, 1 << 24)?;
        positive("max_num_batched_tokens", p.max_num_batched_tokens, I32_MAX / 2)?;
        positive("block_size", p.block_size, 1 << 16)?;
        if p.num_gpu_blocks < 2 {
            return Err(CoreError::config(
                "num_gpu_blocks",
                p.num_gpu_blocks,
                "must be at least 2 (block 0 is the null block, never allocated)",
            ));
        }
        positive("num_gpu_blocks", p.num_gpu_blocks, I32_MAX)?;
        for (field, value) in [
            ("long_prefill_token_threshold", p.long_prefill_token_threshold),
            ("num_speculative_tokens", p.num_speculative_tokens),
            ("num_lookahead_tokens", p.num_lookahead_tokens),
            ("max_num_new_slots_for_drafting", p.max_num_new_slots_for_drafting),
            ("num_sampled_tokens_per_step", p.num_sampled_tokens_per_step),
        ] {
            if value < 0 {
                return Err(CoreError::config(field, value, "must not be negative"));
            }
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
        if p.max_num_batched_tokens < p.max_num_seqs {
            return Err(CoreError::config(
                "max_num_batched_tokens",
                p.max_num_batched_tokens,
                format!("must be at least max_num_seqs={}", p.max_num_seqs),
            ));
        }
        let max_num_scheduled_tokens = p.max_num_scheduled_tokens.unwrap_or(p.max_num_batched_tokens);
        positive("max_num_scheduled_tokens", max_num_scheduled_tokens, I32_MAX / 2)?;
        let max_num_active_seqs = p.max_num_active_seqs.unwrap_or(p.max_num_seqs);
        positive("max_num_active_seqs", max_num_active_seqs, p.max_num_seqs)?;
        if !p.enable_chunked_prefill && p.max_num_batched_tokens < p.max_model_len {
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
        // The most tokens one request can be given in a step: R = min(token budget,
        // input budget - draft slots). Two rules would otherwise wait forever for a step
        // that never comes: a request that cannot be chunked, and a padded decode.
        let largest_request_budget =
            max_num_scheduled_tokens.min(p.max_num_batched_tokens - p.max_num_new_slots_for_drafting);
        if !p.enable_chunked_prefill && largest_request_budget < p.max_model_len - p.num_sampled_tokens_per_step {
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
        if !(p.watermark.is_finite() && (0.0..1.0).contains(&p.watermark)) {
            return Err(CoreError::config("watermark", p.watermark, "must be in [0, 1)"));
        }
        // vLLM: int(watermark * num_blocks).
        let watermark_blocks = (p.watermark * p.num_gpu_blocks as f64) as u32;
        Ok(Self {
            max_num_scheduled_tokens: max_num_scheduled_tokens as u32,
            max_num_active_seqs: max_num_active_seqs as u32,
            watermark_blocks,
            params,
        })
    }

    pub fn params(&self) -> &ConfigParams {
        &self.params
    }
    /// `M`.
    pub fn max_model_len(&self) -> i64 {
        self.params.max_model_len
    }
    pub fn max_num_seqs(&self) -> usize {
        self.params.max_num_seqs as usize
    }
    pub fn max_num_batched_tokens(&self) -> i64 {
        self.params.max_num_batched_tokens
    }
    pub fn max_num_scheduled_tokens(&self) -> i64 {
        self.max_num_scheduled_tokens as i64
    }
    pub fn max_num_active_seqs(&self) -> usize {
        self.max_num_active_seqs as usize
    }
    /// `B`.
    pub fn block_size(&self) -> i64 {
        self.params.block_size
    }
    pub fn num_gpu_blocks(&self) -> usize {
        self.params.num_gpu_blocks as usize
    }
    pub fn enable_chunked_prefill(&self) -> bool {
        self.params.enable_chunked_prefill
    }
    pub fn long_prefill_token_threshold(&self) -> i64 {
        self.params.long_prefill_token_threshold
    }
    pub fn long_prefill_token_threshold_adaptive(&self) -> bool {
        self.params.long_prefill_token_threshold_adaptive
    }
    /// `K`.
    pub fn num_speculative_tokens(&self) -> i64 {
        self.params.num_speculative_tokens
    }
    /// `L`.
    pub fn num_lookahead_tokens(&self) -> i64 {
        self.params.num_lookahead_tokens
    }
    pub fn max_num_new_slots_for_drafting(&self) -> i64 {
        self.params.max_num_new_slots_for_drafting
    }
    /// `s`.
    pub fn num_sampled_tokens_per_step(&self) -> i64 {
        self.params.num_sampled_tokens_per_step
    }
    pub fn async_scheduling(&self) -> bool {
        self.params.async_scheduling
    }
    pub fn watermark(&self) -> f64 {
        self.params.watermark
    }
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks as usize
    }
    pub fn scheduler_reserve_full_isl(&self) -> bool {
        self.params.scheduler_reserve_full_isl
    }
    pub fn enable_prefix_caching(&self) -> bool {
        self.params.enable_prefix_caching
    }
    pub fn policy(&self) -> Policy {
        self.params.policy
    }
}

impl SchedulerConfig {
    /// The parameters with every derived value filled in.
    pub fn resolved(&self) -> ConfigParams {
        ConfigParams {
            max_num_scheduled_tokens: Some(self.max_num_scheduled_tokens as i64),
            max_num_active_seqs: Some(self.max_num_active_seqs as i64),
            ..self.params.clone()
        }
    }
}

impl PartialEq for SchedulerConfig {
    fn eq(&self, other: &Self) -> bool {
        self.resolved() == other.resolved()
    }
}

// Validation refuses a NaN watermark, so equality is an equivalence.
impl Eq for SchedulerConfig {}

/// Hashes what equality compares: the resolved values, with `-0.0` hashed as
/// `0.0` (they compare equal).
impl std::hash::Hash for SchedulerConfig {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let r = self.resolved();
        (r.max_model_len, r.max_num_seqs, r.max_num_batched_tokens).hash(state);
        (r.max_num_scheduled_tokens, r.max_num_active_seqs, r.block_size, r.num_gpu_blocks).hash(state);
        (r.enable_chunked_prefill, r.long_prefill_token_threshold, r.long_prefill_token_threshold_adaptive).hash(state);
        (r.num_speculative_tokens, r.num_lookahead_tokens, r.max_num_new_slots_for_drafting).hash(state);
        (r.num_sampled_tokens_per_step, r.async_scheduling).hash(state);
        // -0.0 + 0.0 is 0.0: one bit pattern for the two zeros.
        (r.watermark + 0.0).to_bits().hash(state);
        (r.scheduler_reserve_full_isl, r.enable_prefix_caching, r.policy).hash(state);
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self::new(ConfigParams::default()).expect("the default configuration is valid")
    }
}
