//! A request's tokens, counters and status (spec §1).
//!
//! Counters are `i64` so that the spec's formulas, which subtract, are
//! written as they are; the invariants keep every one of them in range.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::SchedulerConfig;
use crate::error::{CoreError, CoreResult};
use crate::kv::BlockTable;
use crate::kv::{prefix, BlockHash};
use crate::limits::ListLimit;
use crate::mm_inputs::{check_mm_inputs, MmInput, MmInputSpec, RequestInputs};
use crate::output_tokens::OutputTokens;

/// Declares `RequestStatus` from one table: variant, value, vLLM's name, finish reason.
macro_rules! request_statuses {
    ($( $variant:ident = $value:literal, $name:literal, $reason:expr; )+) => {
        /// vLLM's `RequestStatus`: values and order matter. Every status after
        /// `Preempted` is a finished one.
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum RequestStatus {
            $( $variant = $value, )+
        }

        impl RequestStatus {
            /// Every status, in value order.
            pub const ALL: &'static [RequestStatus] = &[$( Self::$variant, )+];

            /// vLLM's name of the status (`"FINISHED_STOPPED"`).
            pub fn name(self) -> &'static str {
                match self {
                    $( Self::$variant => $name, )+
                }
            }

            /// vLLM's finish reason of the status (`"stop"`, `"length"`...), None for
            /// an unfinished one (and `"stop"` for `WaitingForStreamingReq`, as vLLM has it).
            pub fn finish_reason(self) -> Option<&'static str> {
                match self {
                    $( Self::$variant => $reason, )+
                }
            }
        }
    };
}

request_statuses! {
    Waiting = 1, "WAITING", None;
    WaitingForStructuredOutputGrammar = 2, "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", None;
    WaitingForRemoteKvs = 3, "WAITING_FOR_REMOTE_KVS", None;
    WaitingForStreamingReq = 4, "WAITING_FOR_STREAMING_REQ", Some("stop");
    Running = 5, "RUNNING", None;
    Preempted = 6, "PREEMPTED", None;
    FinishedStopped = 7, "FINISHED_STOPPED", Some("stop");
    FinishedLengthCapped = 8, "FINISHED_LENGTH_CAPPED", Some("length");
    FinishedAborted = 9, "FINISHED_ABORTED", Some("abort");
    FinishedIgnored = 10, "FINISHED_IGNORED", Some("length");
    FinishedError = 11, "FINISHED_ERROR", Some("error");
    FinishedRepetition = 12, "FINISHED_REPETITION", Some("repetition");
}

impl RequestStatus {
    #[inline]
    pub fn is_finished(self) -> bool {
        self > Self::Preempted
    }

    pub fn from_value(value: i64) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| *s as i64 == value)
    }
}

/// Arguments of `add_request`, before validation.
#[derive(Clone, Debug)]
pub struct NewRequest {
    pub request_id: String,
    pub prompt_token_ids: Vec<i64>,
    pub max_tokens: i64,
    pub min_tokens: i64,
    pub eos_token_id: Option<i64>,
    pub stop_token_ids: Vec<i64>,
    pub arrival_time: Option<f64>,
    pub num_computed_tokens: i64,
    pub priority: i64,
    pub cache_salt: Option<String>,
    /// The LoRA adapter the request runs under (vLLM's `lora_int_id`), if any.
    pub lora_id: Option<i64>,
    /// Admit it without reading the prefix cache (vLLM's `skip_reading_prefix_cache`, which
    /// its engine sets for prompt logprobs: every prompt position must be computed). Its
    /// blocks are still cached for others.
    pub skip_reading_prefix_cache: bool,
    /// The request's output follows a grammar (vLLM's structured output): it waits in
    /// `WaitingForStructuredOutputGrammar` until its grammar is resolved
    /// (`Scheduler::resolve_grammar`), and the steps name it among the rows that need the
    /// grammar's bitmask.
    pub structured_output: bool,
    /// Record a `KvEvent::Reused` at each of its prefix lookups with a hit (vLLM's
    /// `kv_cache_report_mode="full"`); only with `enable_kv_cache_events`.
    pub report_reused_blocks: bool,
    /// Its multimodal inputs (encoder inputs), in prompt order; only with an encoder
    /// budget (`max_num_encoder_input_tokens > 0`).
    pub mm_inputs: Vec<MmInputSpec>,
    /// For a prompt given as embeddings (vLLM's `prompt_embeds`, whose token ids are
    /// placeholders), one key per block the prompt reaches, block `i` covering the prompt's
    /// positions `[i * block_size, (i + 1) * block_size)`: what its embeddings there are
    /// (the engine's digest of them). Each enters its block's hash, so requests share a
    /// cached block only with the same embeddings; empty for a prompt of token ids.
    pub prompt_embeds_keys: Vec<Vec<u8>>,
    /// A streaming-input session (vLLM's `resumable`): a stop ends the current input, not
    /// the request, which keeps its KV and goes on with the next input, added under the
    /// same id (see `Scheduler::add_request`).
    pub resumable: bool,
    /// A diffusion request's canvas (vLLM's `diffusion_canvas_length`): the positions each
    /// step gives it, at most `num_speculative_tokens` (None: all of them); only for a
    /// diffusion model.
    pub diffusion_canvas_length: Option<i64>,
    /// A diffusion read's denoising steps (vLLM's `diffusion_read_only` with
    /// `diffusion_max_steps`): under async scheduling it is passed over while every one of
    /// them is in flight (its last emits the canvas and ends it); only for a diffusion
    /// model.
    pub diffusion_read_steps: Option<i64>,
}

impl NewRequest {
    pub fn new(request_id: impl Into<String>, prompt_token_ids: Vec<i64>, max_tokens: i64) -> Self {
        Self {
            request_id: request_id.into(),
            prompt_token_ids,
            max_tokens,
            min_tokens: 0,
            eos_token_id: None,
            stop_token_ids: Vec::new(),
            arrival_time: None,
            num_computed_tokens: 0,
            priority: 0,
            cache_salt: None,
            lora_id: None,
            skip_reading_prefix_cache: false,
            structured_output: false,
            report_reused_blocks: false,
            mm_inputs: Vec::new(),
            prompt_embeds_keys: Vec::new(),
            resumable: false,
            diffusion_canvas_length: None,
            diffusion_read_steps: None,
        }
    }
}

/// Where a structured-output request's grammar stands. The engine compiles grammars; the
/// scheduler only learns the outcome, and acts on it when its waiting loop reaches the
/// request (vLLM's rule: a grammar that failed fails its request at the next update).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grammar {
    /// Not resolved yet: the request is passed over.
    Compiling,
    Compiled,
    /// It did not compile; once a waiting loop has seen it, the request waits to be failed.
    Failed {
        seen: bool,
    },
}

fn is_token_id(value: &i64) -> bool {
    (0..=i32::MAX as i64).contains(value)
}

fn bad_token_id(field: String, value: i64) -> CoreError {
    CoreError::request(field, value, format!("a token id must be in [0, {}]", i32::MAX))
}

fn token_id(field: &str, value: i64) -> CoreResult<i32> {
    if is_token_id(&value) {
        Ok(value as i32)
    } else {
        Err(bad_token_id(field.to_string(), value))
    }
}

/// Token ids as the core stores them, checked: one pass the compiler vectorizes over a
/// valid list (a prompt is thousands of tokens), the index of the first bad one otherwise.
fn token_ids(field: &str, values: &[i64]) -> CoreResult<Vec<i32>> {
    // Every id in [0, 2^31) has no bit set from bit 31 up (a negative one has them all):
    // one OR over the list, without an early exit, which the compiler vectorizes.
    if values.iter().fold(0u64, |bits, &t| bits | (t as u64 >> 31)) != 0 {
        if let Some(i) = values.iter().position(|t| !is_token_id(t)) {
            return Err(bad_token_id(format!("{field}[{i}]"), values[i]));
        }
    }
    Ok(values.iter().map(|&t| t as i32).collect())
}

/// The longest key of a block's prompt embeddings: a SHA-512 digest.
const MAX_EMBEDS_KEY_BYTES: usize = 64;

/// Per block of a prompt given as embeddings, the key of its embeddings.
pub(crate) type PromptEmbedsKeys = Box<[Box<[u8]>]>;

/// A prompt's embedding keys checked: one per block the prompt reaches (vLLM keys every
/// block a prompt of embeddings reaches), none for a streaming-input session, whose later
/// inputs are token ids.
fn prompt_embeds_keys(new: &NewRequest, block_size: i64) -> CoreResult<Option<PromptEmbedsKeys>> {
    if new.prompt_embeds_keys.is_empty() {
        return Ok(None);
    }
    let num_keys = new.prompt_embeds_keys.len();
    if new.resumable {
        return Err(embeds_in_session(num_keys));
    }
    if let Some(i) = new.prompt_embeds_keys.iter().position(|key| key.is_empty() || key.len() > MAX_EMBEDS_KEY_BYTES) {
        return Err(CoreError::request(
            format!("prompt_embeds_keys[{i}]"),
            format!("<{} bytes>", new.prompt_embeds_keys[i].len()),
            format!("a key is 1 to {MAX_EMBEDS_KEY_BYTES} bytes (a digest of the block's embeddings)"),
        ));
    }
    let num_blocks = (new.prompt_token_ids.len() as i64 + block_size - 1) / block_size;
    if num_keys as i64 != num_blocks {
        return Err(CoreError::request(
            "prompt_embeds_keys",
            format!("{num_keys} keys"),
            format!(
                "must hold one key per block the prompt reaches: {num_blocks} for {} tokens in blocks \
                 of {block_size}",
                new.prompt_token_ids.len()
            ),
        ));
    }
    Ok(Some(new.prompt_embeds_keys.iter().map(|key| key.as_slice().into()).collect()))
}

/// A streaming-input session's prompts, its first and its later inputs', are token ids.
fn embeds_in_session(num_keys: usize) -> CoreError {
    CoreError::request(
        "prompt_embeds_keys",
        format!("{num_keys} keys"),
        "a streaming-input session's prompt must be token ids in llmsched",
    )
}

/// A request's LoRA adapter checked: a positive id that fits the int32 columns, and only
/// when the config runs adapters (`max_loras > 0`).
fn lora_id(value: Option<i64>, cfg: &SchedulerConfig) -> CoreResult<Option<u32>> {
    let Some(id) = value else { return Ok(None) };
    if cfg.max_loras() == 0 {
        return Err(CoreError::request("lora_id", id, "LoRA is off in this scheduler (max_loras=0)"));
    }
    if !(1..=i32::MAX as i64).contains(&id) {
        return Err(CoreError::request("lora_id", id, format!("must be in [1, {}]", i32::MAX)));
    }
    Ok(Some(id as u32))
}

/// A token id no token equals: every id is in `[0, 2^31)`.
const NO_TOKEN: i32 = -1;

/// One request. Symbols in comments are the spec's: `C`, `N`, `Np`, `S`, `P`, `F`.
///
/// Laid out for the step loops: the slab keeps each request in a slot aligned to a cache
/// line, 8 bytes in, and every field a step reads or writes (the running loop, the
/// step's columns, the update, the stop check) sits in the slot's first three cache
/// lines: the counters and status (both loops), the block table and drafts (the running
/// loop), then the line the update appends output tokens to (see `OutputTokens`). A
/// decode step touches those lines, nothing else of the request (with prefix caching,
/// also the block hashes; with stop token ids, those). The counters are stored as `i32`
/// (each stays within twice `max_model_len`, which the config keeps below 2^30) and read
/// as `i64` through the accessors, so the spec's formulas subtract in `i64` as written.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Request {
    // The slot's first line.
    /// `C`: tokens whose KV is computed or scheduled to be (optimistic).
    num_computed_tokens: i32,
    /// `P`: async output positions scheduled but not yet returned.
    num_output_placeholders: i32,
    /// `F`: tokens scheduled whose output has not been processed.
    num_in_flight_tokens: i32,
    num_stale_output_tokens: i32,
    /// `Np`.
    num_prompt_tokens: i32,
    /// `N - Np`: how many of `output`'s tokens there are.
    num_output_tokens: i32,
    max_tokens: i32,
    /// `NO_TOKEN` for none: it never equals a sampled token.
    eos_token_id: i32,
    pub(crate) status: RequestStatus,
    /// The last scheduled chunk did not reach the end of the known tokens.
    pub(crate) is_prefill_chunk: bool,
    pub(crate) drop_stale_output: bool,
    /// A waiting loop set it aside (vLLM's `deferred_waiting`) and none has admitted it since.
    pub(crate) skipped_waiting: bool,
    /// Its asynchronous KV load (WAITING_FOR_REMOTE_KVS) has finished: the next waiting loop
    /// promotes it (vLLM's `finished_recving_kv_req_ids`).
    pub(crate) kv_loaded: bool,
    /// Its KV load failed, all or from a block on: an asynchronous one (`C` keeps what
    /// loaded), or, running, a synchronous one (`C` went back to its first failed block;
    /// until it is scheduled again).
    pub(crate) kv_load_failed: bool,
    /// `stop_token_ids` is not empty (the stop check reads it only then).
    has_stop_token_ids: bool,
    /// It has multimodal inputs (`mm`, in a cold line, is read only then).
    pub(crate) has_mm_inputs: bool,
    /// The id of the last step that scheduled the request (0: never). A runner that did not
    /// see the request in the step before this one may hold stale state for it.
    pub(crate) last_scheduled_step: u64,
    // Cold, here because they fill the first line to its end.
    pub(crate) priority: i32,
    pub(crate) num_preemptions: u32,
    // The slot's second line.
    /// The KV block table; append-only while running, emptied on preemption and finish.
    pub(crate) block_ids: Vec<u32>,
    /// `S`: drafts to schedule next (real ids in sync mode, -1 placeholders in async).
    pub(crate) spec_token_ids: Vec<i32>,
    /// Leading blocks of `block_ids` already registered in the prefix cache.
    pub(crate) num_cached_blocks: usize,
    // Cold, here because it fills the second line to its end.
    pub(crate) arrival_time: f64,
    // The slot's third line.
    /// The output tokens, `num_output_tokens` of them. Apart from the prompt, so the first
    /// output token does not copy the prompt into a larger allocation.
    output: OutputTokens,
    // Cold: read with prefix caching, at admission, on stops and by the API.
    /// The prompt (`Np = len`).
    pub(crate) prompt_token_ids: Box<[i32]>,
    /// One hash per full block of the prompt and output tokens (empty when prefix caching
    /// is off).
    pub(crate) block_hashes: Vec<BlockHash>,
    stop_token_ids: Box<[i32]>,
    /// Which waiting queue holds the request, if one does.
    pub(crate) queued_in: Option<QueueKind>,
    /// With `defer_block_free`, the sequence number of the last step with tokens that
    /// scheduled it (vLLM's `last_sched_seq`).
    pub(crate) last_sched_seq: u64,
    pub(crate) id: Arc<str>,
    pub(crate) stop_reason: Option<i32>,
    /// Enters the first block's hash: requests share cached blocks only with the same salt.
    pub(crate) cache_salt: Option<Box<[u8]>>,
    /// The LoRA adapter; enters every block's hash: requests under different adapters
    /// never share cached blocks.
    pub(crate) lora_id: Option<u32>,
    /// Per block of a prompt given as embeddings, the key of its embeddings
    /// (`NewRequest::prompt_embeds_keys`); None for a prompt of token ids.
    pub(crate) prompt_embeds_keys: Option<PromptEmbedsKeys>,
    /// Admitted without a prefix-cache lookup (and without counting one in the stats).
    pub(crate) skip_reading_prefix_cache: bool,
    /// Its grammar, for a structured-output request (None: its output is unconstrained).
    pub(crate) grammar: Option<Grammar>,
    /// Its prefix hits are recorded as events (`NewRequest::report_reused_blocks`).
    pub(crate) report_reused_blocks: bool,
    /// The block tables of KV-cache groups 1 and up (group 0's is `block_ids`); empty
    /// with one group.
    pub(crate) extra_tables: Vec<BlockTable>,
    /// Where a prefix only some groups had cached ends (vLLM's `shared_prefix_boundary`,
    /// set at admission, 0 if none): a sliding-window group keeps the blocks a hit there
    /// needs.
    pub(crate) shared_prefix_boundary: i64,
    /// The first step that may decode it again (recorded with a decode cadence, see
    /// `Scheduler::set_decode_stagger`, or a diffusion read's deferral; read when it binds).
    pub(crate) next_decode_eligible_step: u64,
    /// A diffusion request's canvas: the drafts a step gives it (read only for a diffusion
    /// model).
    pub(crate) canvas_length: u32,
    /// A diffusion read's denoising steps (0: not a read).
    pub(crate) read_steps: u32,
    /// Restarted after a synchronous load of it failed (see `Scheduler::fail_kv_loads`):
    /// its next admission does not ask the KV connector, which could fail the same way.
    pub(crate) restarted_after_kv_load_failure: bool,
    /// Its multimodal inputs and the encoder outputs it references (None without inputs).
    pub(crate) mm: Option<Box<RequestInputs>>,
    /// For a streaming-input session, its inputs still to come (None: not resumable).
    pub(crate) session: Option<Box<Session>>,
}

/// A streaming-input session's inputs added while it was still on one (vLLM's
/// `streaming_queue`), oldest first; None is the end of the session.
#[derive(Clone, Debug, Default)]
pub(crate) struct Session {
    pub(crate) queued: std::collections::VecDeque<Option<SessionInput>>,
    /// Inputs taken up so far (after the first).
    pub(crate) num_inputs_taken: u32,
}

/// The next input of a streaming-input session, checked: its prompt extends the session's
/// tokens, and its sampling limits replace the session's (vLLM's `StreamingUpdate`).
#[derive(Clone, Debug)]
pub(crate) struct SessionInput {
    pub(crate) prompt_token_ids: Vec<i32>,
    pub(crate) limits: StopLimits,
    pub(crate) arrival_time: f64,
}

/// What ends a request's output, checked: `max_tokens`, its EOS token (`NO_TOKEN` for
/// none) and its stop tokens.
#[derive(Clone, Debug)]
pub(crate) struct StopLimits {
    max_tokens: i32,
    eos_token_id: i32,
    stop_token_ids: Box<[i32]>,
}

impl StopLimits {
    /// `new`'s limits, each checked (the error names the field and the value).
    fn of(new: &NewRequest) -> CoreResult<Self> {
        if new.max_tokens < 1 || new.max_tokens > i32::MAX as i64 {
            return Err(CoreError::request("max_tokens", new.max_tokens, format!("must be in [1, {}]", i32::MAX)));
        }
        if new.min_tokens < 0 || new.min_tokens > i32::MAX as i64 {
            return Err(CoreError::request("min_tokens", new.min_tokens, format!("must be in [0, {}]", i32::MAX)));
        }
        if new.min_tokens > new.max_tokens {
            return Err(CoreError::request(
                "min_tokens",
                new.min_tokens,
                format!("must be at most max_tokens = {}", new.max_tokens),
            ));
        }
        let eos_token_id = new.eos_token_id.map(|t| token_id("eos_token_id", t)).transpose()?;
        ListLimit::stop_token_ids().check("stop_token_ids", new.stop_token_ids.len())?;
        let stop_token_ids: Box<[i32]> = token_ids("stop_token_ids", &new.stop_token_ids)?.into();
        Ok(Self { max_tokens: stored(new.max_tokens), eos_token_id: eos_token_id.unwrap_or(NO_TOKEN), stop_token_ids })
    }
}

/// Whether `cfg` serves streaming-input sessions: not for a pooling model (it samples
/// nothing to stop an input; vLLM's front end refuses those too), nor with Mamba groups
/// under async scheduling (a stop rolls `C` back past positions a step in flight may
/// already have folded into the recurrent state, which cannot be rolled back).
fn check_session_config(cfg: &SchedulerConfig) -> CoreResult<()> {
    if cfg.num_sampled_tokens_per_step() == 0 {
        return Err(CoreError::request(
            "resumable",
            true,
            "a pooling or diffusion model's requests cannot be streaming-input sessions",
        ));
    }
    if cfg.async_scheduling() && cfg.kv_cache_groups().has_mamba() {
        return Err(CoreError::request(
            "resumable",
            true,
            "streaming-input sessions are not served with Mamba groups under async scheduling",
        ));
    }
    if cfg.mamba_aligned() && cfg.num_speculative_tokens() > 0 {
        // vLLM's runner takes a later input up from the state at the last computed token's
        // block, while the verify step that stopped the input left it in a speculative block.
        return Err(CoreError::request(
            "resumable",
            true,
            "streaming-input sessions are not served beside drafts and Mamba groups with prefix \
             caching on (a later input would resume from a state the runner does not keep)",
        ));
    }
    Ok(())
}

/// `new`'s diffusion canvas (`K` when it names none) and read steps (0: not a read),
/// checked: only for a diffusion model, a canvas in `[1, K]`, at least one step.
fn diffusion_of(new: &NewRequest, cfg: &SchedulerConfig) -> CoreResult<(u32, u32)> {
    let k = cfg.num_speculative_tokens();
    let checked = |field: &'static str, value: Option<i64>, most: i64| -> CoreResult<Option<u32>> {
        let Some(value) = value else { return Ok(None) };
        if !cfg.is_diffusion() {
            return Err(CoreError::request(field, value, "only a diffusion model's requests have one"));
        }
        if !(1..=most).contains(&value) {
            return Err(CoreError::request(field, value, format!("must be in [1, {most}]")));
        }
        Ok(Some(value as u32))
    };
    let canvas = checked("diffusion_canvas_length", new.diffusion_canvas_length, k)?;
    let read_steps = checked("diffusion_read_steps", new.diffusion_read_steps, i64::from(u32::MAX))?;
    Ok((canvas.unwrap_or(k as u32), read_steps.unwrap_or(0)))
}

/// `new`'s arrival time, checked; now when it has none.
fn arrival_time_of(new: &NewRequest) -> CoreResult<f64> {
    match new.arrival_time {
        Some(t) if t.is_finite() => Ok(t),
        Some(t) => Err(CoreError::request("arrival_time", t, "must be a finite number")),
        None => Ok(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)),
    }
}

/// `new`'s prompt, checked: at least one token, each a token id, within `cfg`'s prompt limit.
fn prompt_of(new: &NewRequest, cfg: &SchedulerConfig) -> CoreResult<Vec<i32>> {
    if new.prompt_token_ids.is_empty() {
        return Err(CoreError::request("prompt_token_ids", "[]", "a prompt needs at least one token"));
    }
    // A generating request needs room for one sampled token: N <= M - s.
    cfg.prompt_limit().check("prompt_token_ids", new.prompt_token_ids.len())?;
    token_ids("prompt_token_ids", &new.prompt_token_ids)
}

impl SessionInput {
    /// The next input of a session, from `add_request`'s arguments under the session's id:
    /// its prompt and sampling limits, checked. What it carries beyond those (adapter,
    /// salt, priority) is the session's, as in vLLM; multimodal inputs and prompt
    /// embeddings are refused.
    pub(crate) fn of(new: &NewRequest, cfg: &SchedulerConfig) -> CoreResult<Self> {
        if !new.mm_inputs.is_empty() {
            return Err(CoreError::request(
                "mm_inputs",
                format!("{} inputs", new.mm_inputs.len()),
                "a streaming-input session's later inputs cannot carry multimodal inputs in llmsched",
            ));
        }
        if !new.prompt_embeds_keys.is_empty() {
            return Err(embeds_in_session(new.prompt_embeds_keys.len()));
        }
        Ok(Self {
            prompt_token_ids: prompt_of(new, cfg)?,
            limits: StopLimits::of(new)?,
            arrival_time: arrival_time_of(new)?,
        })
    }
}

/// The slot lines the running loop reads: the counters and status, the block table and
/// drafts.
pub(crate) const RUNNING_LOOP_LINES: usize = 2;
/// The slot lines the update reads: the counters and status, the second (whether the slot
/// holds a request is read there: `Option<Request>` keeps it in the block table's
/// capacity), the output tokens.
pub(crate) const UPDATE_LINES: usize = 3;

impl Request {
    /// Where the output tokens' line starts; the slab's layout test keeps it on a line.
    #[cfg(test)]
    pub(crate) const OUTPUT_OFFSET: usize = std::mem::offset_of!(Request, output);

    /// `(offset, size)` of each field a step reads or writes (the running loop, the step's
    /// columns, the update and the stop check); the slab's layout test keeps them together.
    #[cfg(test)]
    pub(crate) fn hot_fields() -> Vec<(usize, usize)> {
        fn size_of_field<T>(_: fn(&Request) -> &T) -> usize {
            std::mem::size_of::<T>()
        }
        macro_rules! fields {
            ($($field:ident),+) => {
                vec![$((std::mem::offset_of!(Request, $field), size_of_field(|r| &r.$field))),+]
            };
        }
        fields!(
            num_computed_tokens,
            num_output_placeholders,
            num_in_flight_tokens,
            num_stale_output_tokens,
            num_prompt_tokens,
            num_output_tokens,
            max_tokens,
            eos_token_id,
            status,
            is_prefill_chunk,
            drop_stale_output,
            has_stop_token_ids,
            has_mm_inputs,
            last_scheduled_step,
            block_ids,
            spec_token_ids,
            num_cached_blocks,
            output
        )
    }
}

/// Output tokens a request's first allocations make room for, at most (1 KiB of token
/// ids): short outputs never reallocate, long ones start their doubling there.
const EXPECTED_OUTPUT_TOKENS: i64 = 256;

/// A count the config keeps below 2^31 (a request's counters, a step's token counts),
/// stored as `i32`; checked in debug builds.
#[inline(always)]
pub(crate) fn stored(value: i64) -> i32 {
    debug_assert!(i32::try_from(value).is_ok(), "count {value} out of range");
    value as i32
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    Waiting,
    KvHolding,
}

impl Request {
    /// A request from `add_request`'s arguments, each checked against `cfg`: the
    /// error names the field and the value. Whether the id is already live is the
    /// scheduler's check.
    pub(crate) fn from_new(new: NewRequest, cfg: &SchedulerConfig) -> CoreResult<Self> {
        if new.request_id.is_empty() {
            return Err(CoreError::request("request_id", "''", "must be a non-empty string"));
        }
        let prompt = prompt_of(&new, cfg)?;
        let prompt_len = prompt.len() as i64;
        let limits = StopLimits::of(&new)?;
        if new.num_computed_tokens < 0 || new.num_computed_tokens >= prompt_len {
            return Err(CoreError::request(
                "num_computed_tokens",
                new.num_computed_tokens,
                format!("must be in [0, len(prompt_token_ids)) = [0, {prompt_len}): the last prompt token is always computed"),
            ));
        }
        if new.num_computed_tokens > 0 && cfg.mamba_aligned() {
            return Err(CoreError::request(
                "num_computed_tokens",
                new.num_computed_tokens,
                "must be 0 beside Mamba groups with prefix caching on: no state block holds the \
                 Mamba state after tokens computed elsewhere",
            ));
        }
        if new.resumable {
            check_session_config(cfg)?;
        }
        let lora_id = lora_id(new.lora_id, cfg)?;
        let prompt_embeds_keys = prompt_embeds_keys(&new, cfg.block_size())?;
        let priority = i32::try_from(new.priority)
            .map_err(|_| CoreError::request("priority", new.priority, "must fit in a 32-bit signed integer"))?;
        let arrival_time = arrival_time_of(&new)?;
        let (canvas_length, read_steps) = diffusion_of(&new, cfg)?;
        let mm = if new.mm_inputs.is_empty() {
            None
        } else {
            let inputs = check_mm_inputs(new.mm_inputs, prompt_len, cfg.mm_input_limits())?;
            Some(Box::new(RequestInputs { inputs, referenced: Vec::new() }))
        };

        let num_prompt_tokens = stored(prompt_len);
        Ok(Self {
            output: OutputTokens::default(),
            prompt_token_ids: prompt.into(),
            num_computed_tokens: stored(new.num_computed_tokens),
            num_output_placeholders: 0,
            num_in_flight_tokens: 0,
            num_stale_output_tokens: 0,
            num_prompt_tokens,
            num_output_tokens: 0,
            max_tokens: limits.max_tokens,
            eos_token_id: limits.eos_token_id,
            status: if new.structured_output {
                RequestStatus::WaitingForStructuredOutputGrammar
            } else {
                RequestStatus::Waiting
            },
            is_prefill_chunk: false,
            drop_stale_output: false,
            skipped_waiting: false,
            kv_loaded: false,
            kv_load_failed: false,
            restarted_after_kv_load_failure: false,
            has_stop_token_ids: !limits.stop_token_ids.is_empty(),
            has_mm_inputs: mm.is_some(),
            block_ids: Vec::new(),
            extra_tables: Vec::new(),
            shared_prefix_boundary: 0,
            next_decode_eligible_step: 0,
            canvas_length,
            read_steps,
            mm,
            spec_token_ids: Vec::new(),
            last_scheduled_step: 0,
            num_cached_blocks: 0,
            block_hashes: Vec::new(),
            stop_token_ids: limits.stop_token_ids,
            queued_in: None,
            id: Arc::from(new.request_id),
            priority,
            num_preemptions: 0,
            arrival_time,
            last_sched_seq: 0,
            stop_reason: None,
            cache_salt: new.cache_salt.map(|salt| salt.into_bytes().into_boxed_slice()),
            lora_id,
            prompt_embeds_keys,
            skip_reading_prefix_cache: new.skip_reading_prefix_cache,
            grammar: new.structured_output.then_some(Grammar::Compiling),
            report_reused_blocks: new.report_reused_blocks,
            session: new.resumable.then(Box::default),
        })
    }

    /// Whether it is a streaming-input session (vLLM's `resumable`).
    pub fn is_resumable(&self) -> bool {
        self.session.is_some()
    }

    /// A session's inputs added but not taken up yet (the end of the session counts as
    /// one); 0 for a request that is not a session.
    pub fn num_queued_inputs(&self) -> usize {
        self.session.as_ref().map_or(0, |s| s.queued.len())
    }

    /// A session's inputs taken up after its first.
    pub fn num_inputs_taken(&self) -> u32 {
        self.session.as_ref().map_or(0, |s| s.num_inputs_taken)
    }

    /// Takes up a session's next input (vLLM's `_update_request_as_session`): every output
    /// token but the last sampled one (whose KV was never computed) joins the prompt, then
    /// the input's tokens; its limits replace the request's; the block hashes past the
    /// kept tokens go (a stale hash of a block the kept tokens fill stays, as in vLLM) and
    /// the new tokens' are made by the caller. `C` stays: the caller has set it to the
    /// tokens whose KV is kept.
    pub(crate) fn take_session_input(&mut self, input: SessionInput, hash_block_size: usize) {
        let keep_end = (self.num_tokens() - 1).max(0) as usize;
        debug_assert!(keep_end as i64 >= self.num_computed_tokens());
        let mut prompt = Vec::with_capacity(keep_end + input.prompt_token_ids.len());
        prompt.extend(self.all_token_ids().take(keep_end));
        prompt.extend_from_slice(&input.prompt_token_ids);
        self.num_prompt_tokens = stored(prompt.len() as i64);
        self.prompt_token_ids = prompt.into();
        self.output = OutputTokens::default();
        self.num_output_tokens = 0;
        if let Some(kept_blocks) = keep_end.checked_div(hash_block_size) {
            self.block_hashes.truncate(kept_blocks);
        }
        let StopLimits { max_tokens, eos_token_id, stop_token_ids } = input.limits;
        self.max_tokens = max_tokens;
        self.eos_token_id = eos_token_id;
        self.has_stop_token_ids = !stop_token_ids.is_empty();
        self.stop_token_ids = stop_token_ids;
        self.arrival_time = input.arrival_time;
        if let Some(session) = self.session.as_mut() {
            session.num_inputs_taken += 1;
        }
    }

    /// The session's tokens if it took up `input` now: `N - 1 + len(input)`.
    pub(crate) fn num_tokens_after(&self, input: &SessionInput) -> i64 {
        self.num_tokens() - 1 + input.prompt_token_ids.len() as i64
    }

    /// Whether it holds KV blocks while waiting (vLLM's `_holds_kv_blocks`): computed
    /// tokens, or a KV load in flight. Such a request waits in the queue drained first.
    pub(crate) fn holds_kv_blocks(&self) -> bool {
        self.num_computed_tokens() > 0 || self.status == RequestStatus::WaitingForRemoteKvs
    }

    /// `N`.
    #[inline]
    pub fn num_tokens(&self) -> i64 {
        self.num_prompt_tokens() + self.num_output_tokens()
    }
    #[inline]
    pub fn num_output_tokens(&self) -> i64 {
        self.num_output_tokens.into()
    }
    /// `N + len(S)`.
    #[inline]
    pub fn num_tokens_with_spec(&self) -> i64 {
        self.num_tokens() + self.spec_token_ids.len() as i64
    }
    pub fn status(&self) -> RequestStatus {
        self.status
    }
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }
    /// `C`.
    #[inline]
    pub fn num_computed_tokens(&self) -> i64 {
        self.num_computed_tokens.into()
    }
    /// `Np`.
    #[inline]
    pub fn num_prompt_tokens(&self) -> i64 {
        self.num_prompt_tokens.into()
    }
    pub fn prompt_token_ids(&self) -> &[i32] {
        &self.prompt_token_ids
    }
    /// The output tokens, oldest first.
    pub fn output_token_ids(&self) -> impl Iterator<Item = i32> + '_ {
        self.output.iter(self.num_output_tokens as usize)
    }
    /// The prompt, then the output tokens (`N` of them).
    pub fn all_token_ids(&self) -> impl Iterator<Item = i32> + '_ {
        self.prompt_token_ids.iter().copied().chain(self.output_token_ids())
    }
    /// Appends the prompt, then the output tokens, to `out`.
    pub(crate) fn copy_token_ids_to(&self, out: &mut Vec<i32>) {
        out.extend_from_slice(&self.prompt_token_ids);
        self.output.copy_to(self.num_output_tokens as usize, out);
    }
    pub fn spec_token_ids(&self) -> &[i32] {
        &self.spec_token_ids
    }
    /// `P`.
    #[inline]
    pub fn num_output_placeholders(&self) -> i64 {
        self.num_output_placeholders.into()
    }
    /// `F`.
    #[inline]
    pub fn num_in_flight_tokens(&self) -> i64 {
        self.num_in_flight_tokens.into()
    }
    /// In-flight tokens scheduled before the request's last preemption.
    #[inline]
    pub fn num_stale_output_tokens(&self) -> i64 {
        self.num_stale_output_tokens.into()
    }
    #[inline]
    pub(crate) fn set_num_computed_tokens(&mut self, value: i64) {
        self.num_computed_tokens = stored(value);
    }
    #[inline]
    pub(crate) fn set_num_output_placeholders(&mut self, value: i64) {
        self.num_output_placeholders = stored(value);
    }
    #[inline]
    pub(crate) fn set_num_in_flight_tokens(&mut self, value: i64) {
        self.num_in_flight_tokens = stored(value);
    }
    #[inline]
    pub(crate) fn set_num_stale_output_tokens(&mut self, value: i64) {
        self.num_stale_output_tokens = stored(value);
    }
    /// Whether that stale output is dropped rather than delivered.
    pub fn drop_stale_output(&self) -> bool {
        self.drop_stale_output
    }
    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }
    #[inline]
    pub fn max_tokens(&self) -> i64 {
        self.max_tokens.into()
    }
    /// The length the request is expected to reach: `Np + max_tokens`, counting at most
    /// `EXPECTED_OUTPUT_TOKENS` of output, capped at `M`. Sizes its first output and
    /// block-table allocations; a request that runs longer grows them by doubling.
    pub(crate) fn expected_num_tokens(&self, max_model_len: i64) -> i64 {
        (self.num_prompt_tokens() + self.max_tokens().min(EXPECTED_OUTPUT_TOKENS)).min(max_model_len)
    }
    /// The output tokens the request is expected to reach (see `expected_num_tokens`).
    pub(crate) fn expected_num_output_tokens(&self, max_model_len: i64) -> usize {
        (self.expected_num_tokens(max_model_len) - self.num_prompt_tokens()).max(0) as usize
    }
    /// Appends a sampled token to the output.
    #[inline(always)]
    pub(crate) fn push_output(&mut self, token: i32, max_model_len: i64) {
        let len = self.num_output_tokens as usize;
        if !self.output.try_push(len, token) {
            self.flush_output_then_push(token, max_model_len);
        }
        self.num_output_tokens += 1;
    }
    #[cold]
    #[inline(never)]
    fn flush_output_then_push(&mut self, token: i32, max_model_len: i64) {
        let len = self.num_output_tokens as usize;
        self.output.flush(len, self.expected_num_output_tokens(max_model_len));
        let pushed = self.output.try_push(len, token);
        debug_assert!(pushed, "a flushed output takes a token inline");
    }
    /// Hashes the full blocks of the prompt and output tokens not hashed yet, each once
    /// the `lookahead` tokens after it exist.
    pub(crate) fn extend_block_hashes(
        &mut self,
        (block_size, lookahead): (usize, usize),
        max_model_len: i64,
        scratch: &mut Vec<u8>,
    ) {
        let expected = self.expected_num_output_tokens(max_model_len);
        prefix::extend_block_hashes(
            &mut self.block_hashes,
            (&self.prompt_token_ids, self.output.make_contiguous(self.num_output_tokens as usize, expected)),
            block_size,
            lookahead,
            prefix::ExtraKeys {
                cache_salt: self.cache_salt.as_deref(),
                lora_id: self.lora_id,
                mm_inputs: self.mm.as_deref().map_or(&[], |mm| &mm.inputs),
                prompt_embeds: self.prompt_embeds_keys.as_deref().unwrap_or_default(),
            },
            scratch,
        );
    }
    /// Its multimodal inputs, in prompt order.
    pub fn mm_inputs(&self) -> &[MmInput] {
        self.mm.as_deref().map_or(&[], |mm| &mm.inputs)
    }
    /// The inputs whose encoder outputs it references now, ascending.
    pub fn referenced_mm_inputs(&self) -> &[u32] {
        self.mm.as_deref().map_or(&[], |mm| &mm.referenced)
    }
    /// The last step with tokens that scheduled it (vLLM's `last_sched_seq`: see
    /// `Scheduler::step_seqs`; kept with `defer_block_free` only).
    pub fn last_sched_seq(&self) -> u64 {
        self.last_sched_seq
    }
    /// vLLM's `next_decode_eligible_step`: see `Scheduler::set_decode_stagger` (0 until
    /// a decode cadence or a diffusion read's deferral records one).
    pub fn next_decode_eligible_step(&self) -> u64 {
        self.next_decode_eligible_step
    }
    pub fn eos_token_id(&self) -> Option<i32> {
        (self.eos_token_id != NO_TOKEN).then_some(self.eos_token_id)
    }
    pub fn stop_token_ids(&self) -> &[i32] {
        &self.stop_token_ids
    }
    pub fn priority(&self) -> i32 {
        self.priority
    }
    pub fn arrival_time(&self) -> f64 {
        self.arrival_time
    }
    pub fn is_prefill_chunk(&self) -> bool {
        self.is_prefill_chunk
    }
    pub fn block_ids(&self) -> &[u32] {
        &self.block_ids
    }
    /// KV-cache group `group`'s block table (group 0's is `block_ids`); the null block (0)
    /// where a sliding window let blocks go. Empty for a group the config does not have.
    pub fn group_block_ids(&self, group: usize) -> &[u32] {
        match group {
            0 => &self.block_ids,
            g => self.extra_tables.get(g - 1).map_or(&[], |t| &t.ids),
        }
    }
    /// How many block tables the request has: one per KV-cache group.
    pub fn num_block_tables(&self) -> usize {
        1 + self.extra_tables.len()
    }
    /// Leading blocks of `block_ids` registered in the prefix cache.
    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached_blocks
    }
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }
    pub fn stop_reason(&self) -> Option<i32> {
        self.stop_reason
    }
    /// The LoRA adapter the request runs under, if any.
    pub fn lora_id(&self) -> Option<u32> {
        self.lora_id
    }
    /// Its grammar's state, for a structured-output request.
    pub fn grammar(&self) -> Option<Grammar> {
        self.grammar
    }

    /// vLLM's `check_stop` on the last output token, `last`, just appended; the order of
    /// the checks is vLLM's and matters (spec §4.3). Sets the finished status.
    #[inline]
    pub(crate) fn check_stop(&mut self, last: i32, max_model_len: i64) -> bool {
        if last == self.eos_token_id {
            self.status = RequestStatus::FinishedStopped;
            return true;
        }
        if self.has_stop_token_ids && self.stop_token_ids.contains(&last) {
            self.status = RequestStatus::FinishedStopped;
            self.stop_reason = Some(last);
            return true;
        }
        if self.num_tokens() >= max_model_len || self.num_output_tokens() >= self.max_tokens() {
            self.status = RequestStatus::FinishedLengthCapped;
            return true;
        }
        // Below min_tokens only the repetition check is deferred (not implemented);
        // the sampler masks EOS and stop tokens itself.
        false
    }
}
