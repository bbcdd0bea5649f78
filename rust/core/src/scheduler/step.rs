//! One step's decisions: the builder the loops fill, the columns handed to
//! the runner, and the record kept until the step's output is applied.

use std::sync::Arc;

use crate::slab::Handle;

/// How a request entered this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// Scheduled by the running loop; `first_new_block` indexes its table.
    Running { first_new_block: usize },
    /// Admitted for the first time.
    New,
    /// Admitted again after a preemption.
    Resumed,
}

/// A loop's decision for one request, committed to the step at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub handle: Handle,
    /// `n`.
    pub num_new_tokens: i64,
    /// `C` before this step.
    pub num_computed_before: i64,
    /// Draft slots scheduled; their ids are already in the step's `spec_token_ids`.
    pub num_spec: i64,
    pub kind: EntryKind,
    /// The request's cached blocks before this step's allocation registered more.
    pub cached_blocks_before: usize,
}

/// What undoing a committed running entry restores (kept under the priority policy
/// only, the one whose preemption can take a request already scheduled in the step).
/// Its last scheduled step is not restored: the preempted request is admitted again as
/// a resumed one, which sets it, and nothing reads it before.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Undo {
    pub cached_blocks_before: usize,
    pub is_prefill_chunk: bool,
    /// The bound its decode in the step replaced (vLLM writes it only for the requests a
    /// step ends up running).
    pub next_decode_eligible_step: u64,
}

/// One scheduled request's share of the step's per-request columns, written in one piece
/// when its decision is made (one bounds check, not one per column), split into the
/// columns once the step is built, and kept as the step's record until its output is
/// applied.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    pub handle: Handle,
    pub num_scheduled_tokens: i32,
    pub num_computed_tokens: i32,
    pub num_spec_tokens: i32,
    pub num_output_tokens: i32,
    pub num_block_ids: i32,
    pub num_all_token_ids: i32,
    /// The step does not reach the end of the request's known tokens.
    pub prefill_chunk: bool,
}

impl Row {
    /// `n`.
    #[inline]
    pub fn num_new_tokens(&self) -> i64 {
        self.num_scheduled_tokens.into()
    }

    /// Draft slots scheduled.
    #[inline]
    pub fn num_spec(&self) -> i64 {
        self.num_spec_tokens.into()
    }

    /// The most tokens the runner may return for the entry: none for a chunk that ends
    /// before the request's known tokens, else one per draft slot (an accepted draft, or a
    /// diffusion canvas position emitted) and `s` sampled after them.
    #[inline]
    pub fn max_returned_tokens(&self, s: i64) -> i64 {
        if self.prefill_chunk {
            0
        } else {
            self.num_spec() + s
        }
    }
}

/// A step's token budgets and the long-prefill threshold that caps one request's share.
/// Apart from the builder, so the running loop can keep them in registers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budgets {
    pub token_budget: i64,
    pub input_budget: i64,
    /// Input slots each scheduled request reserves for drafting.
    pub draft_slots: i64,
    /// Effective long-prefill threshold (0 = off).
    pub long_prefill_threshold: i64,
}

impl Budgets {
    /// The tokens one more request may take: the token budget, and the input budget
    /// left once its draft slots are reserved.
    #[inline(always)]
    pub fn request_budget(&self) -> i64 {
        self.token_budget.min(self.input_budget - self.draft_slots)
    }

    /// `n` capped by the long-prefill threshold, when one is set.
    #[inline(always)]
    pub fn cap_long_prefill(&self, n: i64) -> i64 {
        if 0 < self.long_prefill_threshold && self.long_prefill_threshold < n {
            self.long_prefill_threshold
        } else {
            n
        }
    }

    /// Whether one more request can be scheduled at all.
    #[inline(always)]
    pub fn has_room(&self) -> bool {
        self.token_budget > 0 && self.input_budget > self.draft_slots
    }

    /// A scheduled entry's `n` tokens, and its draft slots of the input budget.
    #[inline(always)]
    pub fn take(&mut self, n: i64) {
        self.token_budget -= n;
        self.input_budget -= n + self.draft_slots;
    }

    /// Undoes `take(n)`.
    pub fn give_back(&mut self, n: i64) {
        self.token_budget += n;
        self.input_budget += n + self.draft_slots;
    }
}

/// The step the running and waiting loops build: each decision is written into the step
/// (its row, its drafts and new blocks), and applied to its request, when it is made, so
/// `schedule()` reads each scheduled request once.
pub(crate) struct StepBuilder<'k> {
    /// With a KV connector, its view (taken by the waiting loop once the running loop is
    /// done); here so that the running loop carries no argument for a rare question.
    pub external_kv: Option<&'k mut (dyn crate::scheduler::ExternalKv + 'k)>,
    /// With an encoder-cache connector, its view (asked by both loops).
    pub external_encoder: Option<&'k mut (dyn crate::scheduler::ExternalEncoderCache + 'k)>,
    /// With an auxiliary-output connector, its view (asked by both loops).
    pub aux_outputs: Option<&'k mut (dyn crate::scheduler::AuxOutputs + 'k)>,
    /// The step being built; its per-request columns stay empty until it is finished.
    pub step: Step,
    pub rows: Vec<Row>,
    /// Whether a committed running entry can be undone: then `undo` holds one `Undo`
    /// per running entry, in step order.
    pub undoable: bool,
    pub undo: Vec<Undo>,
    /// Entries the running loop scheduled (set once it is done).
    pub num_running_entries: usize,
    /// A running-loop request scheduled in this step was mid-prefill.
    pub prefill_scheduled: bool,
    /// The step carries no prefill: running prompt chunks are passed over and the waiting
    /// loop stops at the first request with prompt left (the prefill cadence, or a
    /// throttled step).
    pub defer_prefills: bool,
    /// A waiting request was admitted with prompt left to compute.
    pub prefill_admitted: bool,
    /// Some row written is a non-final prefill chunk (it stays set if the row is undone).
    pub has_prefill_chunk: bool,
    /// Speculative decoding is on: rows are checked for `drafts_needed`.
    pub tracks_drafts: bool,
    /// Some row written can use drafts proposed after this step (it stays set if the row
    /// is undone, as vLLM's does).
    pub drafts_needed: bool,
    /// `Scheduler::set_decode_stagger`'s steps (0: no cadence).
    pub decode_stagger: u64,
    /// A diffusion model under async scheduling: placeholders are cut to each request's
    /// canvas, and a read with every denoising step in flight waits
    /// (`Scheduler::prepare_diffusion_step`).
    pub defers_reads: bool,
    pub preempted: bool,
    /// The encoder compute budget left, in embeddings.
    pub encoder_budget: i64,
    /// The scheduled requests' inputs to encode, by request.
    pub encoder_inputs: Vec<(Handle, Vec<u32>)>,
    /// The scheduled requests' inputs whose outputs the encoder-cache connector loads, by
    /// request.
    pub external_encoder_inputs: Vec<(Handle, Vec<u32>)>,
}

impl StepBuilder<'_> {
    /// The step position of `handle`'s entry, if it has one.
    pub fn position(&self, handle: Handle) -> Option<usize> {
        self.rows.iter().position(|row| row.handle == handle)
    }
}

/// An asynchronous KV load a waiting loop started (see `Step::kv_loads`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLoad {
    pub request_id: Arc<str>,
    /// The tokens past its prefix-cache hit the connector loads.
    pub num_external_tokens: i32,
    /// How many requests the loop admitted before it (where it falls among the step's
    /// `external_computed_tokens`).
    pub num_admitted_before: u32,
}

/// The columns of one step, aligned by request: running requests first, then
/// admissions. Built here, moved into numpy by the binding.
#[derive(Clone, Debug, Default)]
pub struct Step {
    pub step_id: u64,
    pub req_handles: Vec<Handle>,
    pub num_scheduled_tokens: Vec<i32>,
    pub num_computed_tokens: Vec<i32>,
    pub num_spec_tokens: Vec<i32>,
    pub spec_token_ids: Vec<i32>,
    /// Output tokens per request before this step, placeholders included (`N - Np + P`).
    pub num_output_tokens: Vec<i32>,
    /// Each row's count of blocks in `block_ids`: a running request's new blocks, an
    /// admitted one's whole table. With several KV-cache groups, one run of counts per
    /// group, group after group (`num_groups * len()` counts).
    pub num_block_ids: Vec<i32>,
    /// The rows' blocks, row after row (with several groups: group after group, then row
    /// after row); a sliding-window table holds the null block (0) where blocks left the window.
    pub block_ids: Vec<i32>,
    pub num_all_token_ids: Vec<i32>,
    pub all_token_ids: Vec<i32>,
    pub total_num_scheduled_tokens: i64,
    /// The LoRA adapters of the scheduled requests, ascending, each once (empty without
    /// LoRA): at most `max_loras` of them.
    pub lora_ids: Vec<i32>,
    /// The rows whose sampled token a grammar constrains (structured-output requests whose
    /// chunk reaches the end of their tokens), ascending: the rows of the step's bitmask.
    pub structured_output_rows: Vec<i32>,
    /// Async scheduling: one of those rows awaits an earlier step's output, so its bitmask
    /// can be built only once that output is applied (vLLM's `pending_structured_output_tokens`).
    pub pending_structured_output_tokens: bool,
    /// No request of the step can use drafts proposed after it (each is a non-final prefill
    /// chunk or samples its last output token even if every draft is rejected): a drafter
    /// may skip proposing (vLLM's `skip_drafts`). True for an empty step and without
    /// speculative decoding.
    pub drafts_unused: bool,
    /// With Mamba groups, the attention groups' blocks allocated since the previous step,
    /// group after group, which the runner zeroes before use (vLLM's
    /// `new_block_ids_to_zero`); empty without.
    pub new_block_ids_to_zero: Vec<i32>,
    /// With pipeline stages and synchronous scheduling, each row's count of tokens in
    /// `new_token_ids` (`n` less its draft slots; empty otherwise): the first stage sees
    /// no sampled token, so the step sends them (vLLM's `CachedRequestData.new_token_ids`).
    pub num_new_token_ids: Vec<i32>,
    /// The rows' tokens from `C` on, row after row (see `num_new_token_ids`).
    pub new_token_ids: Vec<i32>,
    /// The multimodal inputs the step encodes, one entry per input in each column: its
    /// row, and its index among its request's inputs (vLLM's `scheduled_encoder_inputs`);
    /// rows ascending. Empty without multimodal inputs.
    pub encoder_input_rows: Vec<i32>,
    pub encoder_input_ids: Vec<i32>,
    /// With an encoder-cache connector, the inputs whose outputs it loads for the step
    /// instead of the encoder computing them, in the same layout; empty without.
    pub external_encoder_input_rows: Vec<i32>,
    pub external_encoder_input_ids: Vec<i32>,
    /// The identifiers of the encoder outputs evicted since the previous step: the runner
    /// frees them (vLLM's `free_encoder_mm_hashes`).
    pub freed_encoder_outputs: Vec<Arc<str>>,
    /// With a KV connector, one entry per request the waiting loop admitted, in admission
    /// order (the step's last rows): the tokens past its prefix-cache hit the connector
    /// loads, or -1 for a request that held computed tokens and looked nothing up.
    pub external_computed_tokens: Vec<i32>,
    /// With a KV connector, the asynchronous loads the step's waiting loop started, in its
    /// order (none is a row of the step: each request waits for its load).
    pub kv_loads: Vec<KvLoad>,
    pub new_reqs: Vec<Handle>,
    pub resumed_reqs: Vec<Handle>,
    /// Running requests scheduled in this step that the previous step did not schedule.
    pub rescheduled_reqs: Vec<Handle>,
    /// Requests preempted since the previous step, this one included.
    pub preempted: Vec<(Handle, Arc<str>)>,
    /// Requests finished since the previous step. Their slots were released when they
    /// finished: the handles are for id lookups only (a newer request may hold the slot).
    pub finished: Vec<(Handle, Arc<str>)>,
}

impl Step {
    pub fn len(&self) -> usize {
        self.req_handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.req_handles.is_empty()
    }
}

/// What the scheduler keeps of a step until its output is applied: the rows the loops
/// wrote (the update reads each once: its handle, `n`, draft slots and chunk flag).
#[derive(Clone, Debug)]
pub(crate) struct StepRecord {
    pub step_id: u64,
    pub entries: Vec<Row>,
    /// False only if no entry is a non-final prefill chunk: then every entry may return
    /// `s` tokens (`Row::max_returned_tokens` is at least `s`).
    pub has_prefill_chunk: bool,
}
