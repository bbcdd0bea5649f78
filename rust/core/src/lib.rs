//! llmsched's scheduling core: vLLM 0.33.0's v1 scheduler decisions, in Rust,
//! with no Python in it. The `rust/python` crate binds it.
//!
//! One step as data: `Scheduler::schedule` runs the running loop and the
//! waiting loop (both bounded by `capacity::room`) over a paged `kv` pool and
//! returns a `Step` of flat columns; `Scheduler::update_from_output` applies
//! the runner's sampled tokens and returns per-request events.

pub mod capacity;
pub mod config;
mod encoder;
pub mod error;
// The block pool, the KV manager, the queues and the slab mutate the scheduler's
// state: only the scheduler calls them. Callers read through `Scheduler`.
mod kv;
pub mod limits;
pub mod mm_inputs;
mod output_tokens;
pub mod prefetch;
mod queue;
pub mod replay;
pub mod request;
pub mod scheduler;
mod slab;

pub use config::{AttentionKind, ConfigParams, KvCacheGroups, Policy, SchedulerConfig};
pub use error::{CoreError, CoreResult};
pub use kv::{BlockHash, CacheHit, KvEvent, PrefixCacheStats};
pub use limits::ListLimit;
pub use mm_inputs::{MmInput, MmInputSpec};
pub use request::{Grammar, Request, RequestStatus};
pub use scheduler::step::{KvLoad, Step};
pub use scheduler::{
    AuxOutputs, CachedBlocks, Connectors, ExternalEncoderCache, ExternalKv, ExternalMatch, NewRequest, PauseState,
    RequestEvent, RequestRef, RunnerOutput, Scheduler, SchedulerStats, SessionInputAdded,
};
pub use slab::Handle;
