//! The longest list each call takes, and why no longer one can be valid.
//!
//! A caller reading a list from an iterable it does not control (the binding, from a
//! Python iterable that may never end or whose `len()` lies) reads at most `max` items and
//! reports `ListLimit::exceeded` at the first one past it, instead of collecting until the
//! allocator aborts the process. The core checks the same limits on the lists it is given.

use std::fmt;

use crate::error::{CoreError, CoreResult};

/// Stop token ids a request may have: more than any tokenizer's vocabulary holds (the
/// largest have about 2^18 tokens), so every list without repeats fits.
pub const MAX_STOP_TOKEN_IDS: usize = 1 << 20;

/// Ids `finish_requests` reads beyond the live requests. Ids that are not live, or that
/// repeat, are ignored (as in vLLM): a caller may name requests that already finished or
/// that never reached the scheduler, but not endlessly many.
pub const MAX_IGNORED_FINISH_IDS: usize = 1 << 20;

/// Why a list is at most `ListLimit::max` long; rendered only for an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// A generating request leaves room for its sampled tokens: `Np <= M - s`, with `M` the
    /// length the KV pool holds when that is less than `max_model_len`.
    Prompt {
        s: i64,
        pool: Option<PoolBound>,
    },
    StopTokenIds,
    /// Drafts are kept for running requests only, and a runner names the requests of the
    /// step it ran: the live ones, and at most a step's worth that finished since.
    DraftRequests {
        max_num_seqs: i64,
    },
    /// One entry (a count, a row of drafts) per request id.
    OnePerRequest,
    /// At most `K` drafts per request.
    DraftsPerRequest {
        k: i64,
    },
    /// At most `K` drafts for each of `requests` requests.
    Drafts {
        k: i64,
        requests: usize,
    },
    FinishIds,
    /// A request's multimodal inputs, or one input's placeholder flags: no more than the
    /// longest prompt's tokens, `M - s`.
    PromptPlaceholders {
        s: i64,
    },
    Unlimited,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Why::Prompt { s: 0, pool: None } => write!(f, "max_model_len"),
            Why::Prompt { s, pool: None } => {
                write!(f, "max_model_len - {s}, leaving room for the sampled token")
            }
            Why::Prompt { s, pool: Some(PoolBound { usable_blocks, spec_step_blocks }) } => {
                write!(f, "the longest request the KV pool's {usable_blocks} usable blocks hold (every KV-cache group counted")?;
                if spec_step_blocks > 0 {
                    write!(f, ", {spec_step_blocks} kept for a speculative step beside a KV connector's load")?;
                }
                write!(f, ", less {s} for the sampled token)")
            }
            Why::StopTokenIds => write!(f, "at most {MAX_STOP_TOKEN_IDS} stop token ids, more than any vocabulary"),
            Why::DraftRequests { max_num_seqs } => write!(
                f,
                "drafts name distinct requests: the live ones and at most max_num_seqs={max_num_seqs} that \
                 finished since their step"
            ),
            Why::OnePerRequest => write!(f, "one per request id"),
            Why::DraftsPerRequest { k } => write!(f, "at most num_speculative_tokens={k} drafts per request"),
            Why::Drafts { k, requests } => {
                write!(f, "at most num_speculative_tokens={k} drafts for each of the {requests} requests")
            }
            Why::PromptPlaceholders { s } => {
                write!(f, "at most one per token of the longest prompt, max_model_len - {s}")
            }
            Why::Unlimited => write!(f, "no limit"),
            Why::FinishIds => write!(
                f,
                "ids that are not live or repeat are ignored, at most {MAX_IGNORED_FINISH_IDS} of them beyond \
                 the live requests"
            ),
        }
    }
}

/// The pool a request's length is bounded by when it cannot hold `max_model_len` tokens:
/// its usable blocks, and those kept free for a speculative step beside a KV connector's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolBound {
    pub(crate) usable_blocks: i64,
    pub(crate) spec_step_blocks: i64,
}

/// The most items a list may hold, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListLimit {
    pub max: usize,
    /// What the items are, plural: "tokens", "ids"...
    items: &'static str,
    why: Why,
}

impl ListLimit {
    /// The longest prompt of a request that samples `s` tokens per step: `M - s`, with `M`
    /// the longest request (less than `max_model_len` when `pool` cannot hold it).
    pub(crate) fn prompt(max_request_len: i64, s: i64, pool: Option<PoolBound>) -> Self {
        Self { max: (max_request_len - s).max(0) as usize, items: "tokens", why: Why::Prompt { s, pool } }
    }

    /// A request's multimodal inputs (`items` "inputs"), or one input's placeholder flags
    /// ("flags"): placeholders are prompt tokens, so no more than the longest prompt's, `M - s`.
    pub(crate) fn prompt_placeholders(max_model_len: i64, s: i64, items: &'static str) -> Self {
        Self { max: (max_model_len - s).max(0) as usize, items, why: Why::PromptPlaceholders { s } }
    }

    pub fn stop_token_ids() -> Self {
        Self { max: MAX_STOP_TOKEN_IDS, items: "ids", why: Why::StopTokenIds }
    }

    pub(crate) fn draft_requests(live: usize, max_num_seqs: i64) -> Self {
        Self {
            max: live.saturating_add(max_num_seqs.max(0) as usize),
            items: "requests",
            why: Why::DraftRequests { max_num_seqs },
        }
    }

    /// No limit: for a list whose items are in memory already.
    pub fn unlimited() -> Self {
        Self { max: usize::MAX, items: "items", why: Why::Unlimited }
    }

    /// One entry per request id, `requests` of them.
    pub fn one_per_request(requests: usize, items: &'static str) -> Self {
        Self { max: requests, items, why: Why::OnePerRequest }
    }

    pub(crate) fn drafts_per_request(k: i64) -> Self {
        Self { max: k.max(0) as usize, items: "drafts", why: Why::DraftsPerRequest { k } }
    }

    pub(crate) fn drafts(k: i64, requests: usize) -> Self {
        Self { max: (k.max(0) as usize).saturating_mul(requests), items: "drafts", why: Why::Drafts { k, requests } }
    }

    pub(crate) fn finish_ids(live: usize) -> Self {
        Self { max: live.saturating_add(MAX_IGNORED_FINISH_IDS), items: "ids", why: Why::FinishIds }
    }

    /// Whether a list of `len` items is within the limit.
    #[inline]
    pub fn allows(&self, len: usize) -> bool {
        len <= self.max
    }

    /// An error naming `field` if a list of `len` items is longer than the limit.
    pub fn check(&self, field: &str, len: usize) -> CoreResult<()> {
        if !self.allows(len) {
            return Err(self.too_long(field, len));
        }
        Ok(())
    }

    /// The error for a list of `len` items, more than the limit.
    pub fn too_long(&self, field: impl Into<String>, len: usize) -> CoreError {
        self.error(field, format!("<{len} {}>", self.items))
    }

    /// The error for a list known only to hold more than `max` items (its reader stopped
    /// there).
    pub fn exceeded(&self, field: impl Into<String>) -> CoreError {
        self.error(field, format!("<more than {} {}>", self.max, self.items))
    }

    fn error(&self, field: impl Into<String>, value: String) -> CoreError {
        CoreError::request(field, value, format!("at most {} {}: {}", self.max, self.items, self.why))
    }
}
