//! An encoder-cache connector's part in scheduling (vLLM's `ECConnectorBase`, its scheduler
//! side, as used in encoder disaggregation): encoder outputs that another instance computed
//! are loaded instead of encoded, and a request whose outputs are still in transit is
//! passed over.
//!
//! The connector itself is the caller's (Python, in the plug-in): the loops ask it through
//! [`ExternalEncoderCache`] where vLLM's loops ask it, and the core keeps what follows from
//! the answers (the encoder cache's room, the step's loads and encodings).

use crate::request::Request;

/// What an encoder-cache connector can supply (vLLM's `has_cache_item` and
/// `ensure_cache_available`). Asked only of requests with multimodal inputs.
pub trait ExternalEncoderCache {
    /// vLLM's `has_cache_item(identifier)`: whether the connector can load the encoder
    /// output of `identifier`. Asked for an input a chunk needs that is not in the local
    /// cache, once the cache has room for it and the step's encoder budget could encode it
    /// (vLLM checks both first): a loaded output then takes its room in the cache but none
    /// of that budget.
    fn has_cache_item(&mut self, identifier: &str) -> bool;

    /// vLLM's `ensure_cache_available(request, num_computed_tokens)`: whether the outputs
    /// the request needs from `num_computed_tokens` on are ready (the connector may start
    /// loading them now). False: some are in transit, and the loop passes the request over
    /// in this step. Asked before a request's tokens are counted: in the running loop with
    /// its confirmed tokens (`C - P`), in the waiting loop with `C` after its prefix-cache
    /// lookup and a KV connector's answer.
    fn ensure_cache_available(&mut self, request: &Request, num_computed_tokens: i64) -> bool;
}
