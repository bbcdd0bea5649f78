//! The scheduler: request registry, queues, the step loop and the output path.
//!
//! `schedule()` runs the running loop, then (if nothing was preempted) the
//! waiting loop, then turns the decisions into a `Step`. `update_from_output`
//! applies a runner's sampled tokens to the requests of a step in flight.

mod aux_outputs;
mod drafts;
mod encoder_inputs;
mod external_encoder;
mod external_kv;
mod grammar;
mod invariants;
mod running;
mod sessions;
pub mod step;
mod update;
mod waiting;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::config::SchedulerConfig;
use crate::encoder::EncoderCache;
use crate::error::{CoreError, CoreResult};
use crate::kv::{BlockPool, KvManager};
use crate::limits::ListLimit;
use crate::queue::RequestQueue;
pub use crate::request::NewRequest;
use crate::request::{stored, QueueKind, Request, RequestStatus};
use crate::slab::{Handle, Slab};
use step::{Budgets, Entry, EntryKind, Row, Step, StepBuilder, StepRecord, Undo};

pub use aux_outputs::{AuxOutputs, CachedBlocks};
pub use external_encoder::ExternalEncoderCache;
pub use external_kv::{ExternalKv, ExternalMatch};
pub use sessions::SessionInputAdded;
pub use update::{RequestEvent, RunnerOutput};

/// The connectors a step asks, the caller's objects (see each trait); none by default.
#[derive(Default)]
pub struct Connectors<'a> {
    /// A KV connector's view of the waiting requests (asked with `kv_connector`).
    pub kv: Option<&'a mut dyn ExternalKv>,
    /// An encoder-cache connector (asked with `ec_connector`).
    pub encoder: Option<&'a mut dyn ExternalEncoderCache>,
    /// An auxiliary-output connector (asked whenever given).
    pub aux: Option<&'a mut dyn AuxOutputs>,
}

/// A request named in a call: by the handle `add_request` returned, or by its id.
#[derive(Clone, Copy, Debug)]
pub enum RequestRef<'a> {
    Handle(Handle),
    Id(&'a str),
}

/// Counters over the scheduler's life.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_steps: u64,
    pub num_preemptions: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
}

#[derive(Debug)]
pub struct Scheduler {
    config: Arc<SchedulerConfig>,
    requests: Slab,
    ids: FxHashMap<Arc<str>, Handle>,
    waiting: RequestQueue,
    /// Waiting requests that arrived with computed tokens; drained first.
    kv_holding_waiting: RequestQueue,
    running: Vec<Handle>,
    /// Waiting requests a waiting loop set aside and none has admitted since (vLLM's
    /// `deferred_waiting`, reported apart from the other waiting requests).
    num_skipped_waiting: usize,
    /// Paused streaming-input sessions (`WaitingForStreamingReq`): waiting, but each holds
    /// a model-runner slot.
    num_waiting_for_streaming_input: usize,
    /// Live requests that use structured output (while none does, steps skip the grammar
    /// rows' pass).
    num_structured_output: usize,
    /// Requests whose grammar failed, seen by a waiting loop: `finish_failed_grammars` fails them.
    grammar_failures: Vec<Handle>,
    kv: KvManager,
    /// The encoder outputs of multimodal inputs (empty, of size 0, without).
    encoder: EncoderCache,
    /// Requests whose encoder input met a cached output of another size, seen by a loop:
    /// `finish_encoder_mismatches` fails them.
    encoder_mismatches: Vec<Handle>,
    /// Requests finished since the last step, by the handle they had and their id: their
    /// records are freed when they finish, and only this much is kept for the next step to
    /// report (a request's prompt and block hashes can be megabytes).
    finished_since_last_step: Vec<(Handle, Arc<str>)>,
    /// The records of the requests the latest `update_from_output` or `finish_requests`
    /// finished, until the next such call drops them (or `take_last_finished` takes them):
    /// a caller that mirrors requests reads their final state here, and records nobody
    /// takes never pile up.
    last_finished: Vec<Request>,
    /// With a KV connector, the blocks of finished requests it may still be sending.
    held_kv: external_kv::HeldKv,
    /// With a KV connector, the requests still prefilling that the waiting loop admitted
    /// (chunks to come, or a load in flight): what an asynchronous load must leave room
    /// for (vLLM's `_inflight_prefills`).
    inflight_prefills: FxHashSet<Handle>,
    /// With `defer_block_free`: the steps with tokens scheduled and those whose output is
    /// applied (vLLM's `sched_step_seq`, `processed_step_seq`), and the blocks freed while a
    /// step that may write them was in flight, each with the step that must be applied first.
    sched_step_seq: u64,
    processed_step_seq: u64,
    deferred_frees: VecDeque<(u64, Vec<u32>)>,
    /// Requests preempted since the last step (one may finish before the step reports it).
    preempted_since_last_step: Vec<(Handle, Arc<str>)>,
    in_flight: VecDeque<StepRecord>,
    next_step_id: u64,
    stats: SchedulerStats,
    pause_state: PauseState,
    /// With async scheduling, the steps between two decodes of one request (1: every step).
    decode_stagger: u64,
    /// The prefill cadence: executed steps (those that scheduled tokens), the last one that
    /// carried prefill, and whether the last step that could admit left requests waiting
    /// that were not set aside (then prefill is not deferred).
    num_executed_steps: i64,
    last_prefill_step: i64,
    prefill_capacity_bound: bool,
}

/// The distinct LoRA adapters the requests of `handles` run under, sorted.
fn distinct_adapters(requests: &Slab, handles: impl IntoIterator<Item = Handle>) -> Vec<u32> {
    let mut ids: Vec<u32> = handles.into_iter().filter_map(|h| requests[h].lora_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether drafts proposed after scheduling `n` tokens of `request` from `C` computed are
/// sure to go unused (vLLM's `_drafts_unused`): the step is a non-final prefill chunk (it
/// samples nothing), or it samples the request's last output token even if every draft is
/// rejected (with a step in flight, that step's token counts too).
fn drafts_unused(request: &Request, c: i64, n: i64) -> bool {
    if c + n < request.num_tokens() {
        return true;
    }
    let in_flight = i64::from(request.num_output_placeholders() > 0);
    request.num_output_tokens() + 1 + in_flight >= request.max_tokens()
}

/// `n` tokens from `C` cut back so the chunk ends `L` or more tokens before the end of the
/// request's known tokens, or at it (vLLM's `_reserve_prefill_lookahead`): a multi-module
/// MTP drafter reads the `L` tokens after a chunk as draft inputs. A no-op for `L <= 1`.
fn reserve_prefill_lookahead(request: &Request, c: i64, n: i64, l: i64) -> i64 {
    let remaining = request.num_tokens() - c - n;
    if 0 < remaining && remaining < l {
        (n - (l - remaining)).max(0)
    } else {
        n
    }
}

/// `n` tokens from `start` cut back so a prompt chunk ends where an aligned Mamba state can
/// be cached (vLLM's `_mamba_block_aligned_split`): a step writes a Mamba state only where
/// it ends, and a state is cached only at a block boundary. Before the prompt's end a chunk
/// ends on a boundary (unless a block is wider than any chunk), and no chunk runs past the
/// next boundary when it starts mid-block, past the last boundary a hit can resume from,
/// or past `junction`, a shared prefix's end, floored to the block grid. The prompt's last
/// chunk runs whole where the Mamba layers write that last boundary's state into a prefill
/// checkpoint block from inside the step. 0: no aligned chunk fits.
fn mamba_aligned_split(config: &SchedulerConfig, request: &Request, start: i64, n: i64, junction: i64) -> i64 {
    use crate::kv::groups::{mamba_checkpoint_exportable, mamba_checkpoint_position};
    let (b, lookahead, drop) = (config.block_size(), config.num_hash_lookahead_tokens(), config.eagle_block_drop());
    // A resumed request replays its output tokens as prompt.
    let prefill_end = request.num_prompt_tokens().max(request.num_tokens() - 1);
    if start >= prefill_end {
        return n;
    }
    let mut end = start + n;
    let checkpoint = end >= prefill_end
        && mamba_checkpoint_exportable(
            start,
            end,
            mamba_checkpoint_position(prefill_end, b, lookahead, drop),
            b,
            config.mamba_prefill_checkpoint_alignment(),
        );
    let last_cache_position =
        if checkpoint { 0 } else { mamba_checkpoint_position(request.num_tokens(), b, lookahead, drop) };
    if end < prefill_end {
        let aligned_end = end / b * b;
        if aligned_end > start || b <= config.widest_prefill_chunk() {
            end = aligned_end;
        }
    }
    let next_boundary = if start % b != 0 && !checkpoint { (start / b + 1) * b } else { 0 };
    let junction_stop = if start < junction && junction < end { start + (junction - start) / b * b } else { 0 };
    let stop = [next_boundary, last_cache_position, junction_stop].into_iter().filter(|&s| start < s && s < end).min();
    (stop.unwrap_or(end) - start).max(0)
}

/// vLLM's `PauseState`: what `schedule()` may still schedule.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PauseState {
    #[default]
    Unpaused = 0,
    /// No new admissions; running requests (and waiting ones that hold KV) go on.
    PausedNew = 1,
    /// Nothing is scheduled; finished and preempted requests are still reported.
    PausedAll = 2,
}

impl PauseState {
    pub fn from_value(value: i64) -> Option<Self> {
        [Self::Unpaused, Self::PausedNew, Self::PausedAll].into_iter().find(|p| *p as i64 == value)
    }
}

impl Scheduler {
    /// A scheduler over `config`; an error if the KV block table cannot be allocated.
    pub fn new(config: Arc<SchedulerConfig>) -> CoreResult<Self> {
        let policy = config.policy();
        let num_blocks = config.num_gpu_blocks() as usize;
        let kv = KvManager::new(&config).map_err(|e| {
            CoreError::config(
                "num_gpu_blocks",
                num_blocks,
                format!(
                    "cannot allocate the KV block table ({} bytes of per-block state): {e}",
                    BlockPool::table_bytes(num_blocks)
                ),
            )
        })?;
        Ok(Self {
            requests: Slab::default(),
            ids: FxHashMap::default(),
            waiting: RequestQueue::new(QueueKind::Waiting, policy),
            kv_holding_waiting: RequestQueue::new(QueueKind::KvHolding, policy),
            running: Vec::new(),
            num_skipped_waiting: 0,
            num_waiting_for_streaming_input: 0,
            num_structured_output: 0,
            grammar_failures: Vec::new(),
            kv,
            encoder: EncoderCache::new(config.encoder_cache_size(), config.ec_connector()),
            encoder_mismatches: Vec::new(),
            finished_since_last_step: Vec::new(),
            last_finished: Vec::new(),
            held_kv: external_kv::HeldKv::default(),
            inflight_prefills: FxHashSet::default(),
            sched_step_seq: 0,
            processed_step_seq: 0,
            deferred_frees: VecDeque::new(),
            preempted_since_last_step: Vec::new(),
            in_flight: VecDeque::new(),
            next_step_id: 1,
            stats: SchedulerStats::default(),
            pause_state: PauseState::Unpaused,
            decode_stagger: 0,
            num_executed_steps: 0,
            // A whole interval back: the first step is never held.
            last_prefill_step: -config.prefill_schedule_interval(),
            prefill_capacity_bound: false,
            config,
        })
    }

    pub fn config(&self) -> &Arc<SchedulerConfig> {
        &self.config
    }

    /// Takes `config` in place of the one the scheduler was built with, as if built with it
    /// (an engine, or vLLM's tests, may set a scheduler's budgets and flags after building
    /// it). Only before it has taken a request or a `schedule()` call: refused after,
    /// changing nothing, as a config must hold for every step of a request. The decode
    /// stagger and pause state set since building are kept.
    pub fn reconfigure(&mut self, config: Arc<SchedulerConfig>) -> CoreResult<()> {
        let fresh = self.stats.num_steps == 0
            && self.ids.is_empty()
            && self.finished_since_last_step.is_empty()
            && self.held_kv.is_empty();
        if !fresh {
            return Err(CoreError::config(
                "config",
                "a new config",
                "can be set only before the scheduler's first request and step",
            ));
        }
        let mut rebuilt = Scheduler::new(config)?;
        rebuilt.decode_stagger = self.decode_stagger;
        rebuilt.pause_state = self.pause_state;
        *self = rebuilt;
        Ok(())
    }

    pub(crate) fn queue_with_slab(&mut self, kind: QueueKind) -> (&mut RequestQueue, &Slab) {
        match kind {
            QueueKind::Waiting => (&mut self.waiting, &self.requests),
            QueueKind::KvHolding => (&mut self.kv_holding_waiting, &self.requests),
        }
    }

    /// Validates and queues a request; returns its handle. Under the id of a live
    /// streaming-input session (`NewRequest::resumable`), it is the session's next input
    /// instead (see `SessionInputAdded`), and the session's handle is returned.
    pub fn add_request(&mut self, new: NewRequest) -> CoreResult<Handle> {
        self.add_request_or_input(new).map(|(handle, _)| handle)
    }

    /// `add_request`, saying what an input to a live session did (None for a new request).
    pub fn add_request_or_input(&mut self, new: NewRequest) -> CoreResult<(Handle, Option<SessionInputAdded>)> {
        if let Some(&handle) = self.ids.get(new.request_id.as_str()) {
            return self.add_session_input(handle, new).map(|added| (handle, Some(added)));
        }
        if self.held_kv.contains_key(new.request_id.as_str()) {
            return Err(CoreError::request(
                "request_id",
                format!("{:?}", new.request_id),
                "a finished request of this id still holds KV blocks a connector may be sending \
                 (release_kv_blocks first)",
            ));
        }
        let mut request = Request::from_new(new, &self.config)?;
        let id = request.id.clone();
        self.kv.update_block_hashes(&mut request);
        let kind = if request.num_computed_tokens() > 0 { QueueKind::KvHolding } else { QueueKind::Waiting };
        request.queued_in = Some(kind);
        if request.grammar.is_some() {
            self.num_structured_output += 1;
            // Blocked on its grammar from the start: counted as a skipped waiting request
            // (vLLM enqueues it into `deferred_waiting`).
            request.skipped_waiting = true;
            self.num_skipped_waiting += 1;
        }
        let handle = self.requests.insert(request);
        self.ids.insert(id, handle);
        let (queue, slab) = self.queue_with_slab(kind);
        queue.add(slab, handle);
        Ok((handle, None))
    }

    /// One scheduling step (spec §3).
    pub fn schedule(&mut self) -> Step {
        self.schedule_throttled(false)
    }

    /// `schedule()` on a step an engine throttles (vLLM's `throttle_prefills`: data-parallel
    /// prefill balancing): while a request decodes and the waiting requests did not outgrow
    /// the last prefill step, the step carries no prefill.
    pub fn schedule_throttled(&mut self, throttle_prefills: bool) -> Step {
        self.schedule_with(throttle_prefills, Connectors::default())
    }

    /// `schedule_throttled` with the engine's connectors (see [`Connectors`]); a connector
    /// whose config flag is off (`kv_connector`, `ec_connector`) is not asked.
    pub fn schedule_with(&mut self, throttle_prefills: bool, connectors: Connectors<'_>) -> Step {
        let defer_prefills = self.defers_prefills(throttle_prefills);
        let cfg = &self.config;
        let num_eligible = self.running.len() + self.waiting.len() + self.kv_holding_waiting.len();
        let input_budget = cfg.max_num_batched_tokens();
        // The long-prefill threshold exists to protect other requests; alone, a request takes it all.
        let mut long_prefill_threshold = if num_eligible > 1 { cfg.long_prefill_token_threshold() } else { 0 };
        if long_prefill_threshold > 0 && cfg.long_prefill_token_threshold_adaptive() {
            long_prefill_threshold = long_prefill_threshold.max(input_budget / num_eligible as i64);
        }
        let paused_all = self.pause_state == PauseState::PausedAll;
        let capacity = num_eligible.min(cfg.max_num_seqs() as usize);
        let mut budgets = Budgets {
            token_budget: if paused_all { 0 } else { cfg.max_num_scheduled_tokens() },
            input_budget,
            draft_slots: cfg.max_num_new_slots_for_drafting(),
            long_prefill_threshold,
        };
        let mut b = StepBuilder {
            external_kv: connectors.kv.filter(|_| self.config.kv_connector()),
            external_encoder: connectors.encoder.filter(|_| self.config.ec_connector()),
            aux_outputs: connectors.aux,
            step: Step {
                step_id: self.next_step_id,
                // Room for every draft slot and a new block per request: no regrowth in
                // a decode step.
                spec_token_ids: Vec::with_capacity(capacity * cfg.num_speculative_tokens() as usize),
                block_ids: Vec::with_capacity(capacity),
                ..Step::default()
            },
            rows: Vec::with_capacity(capacity),
            undoable: cfg.policy() == crate::config::Policy::Priority,
            undo: Vec::new(),
            num_running_entries: 0,
            prefill_scheduled: false,
            defer_prefills,
            prefill_admitted: false,
            has_prefill_chunk: false,
            tracks_drafts: cfg.num_speculative_tokens() > 0,
            drafts_needed: false,
            decode_stagger: self.decode_stagger,
            defers_reads: cfg.is_diffusion() && cfg.async_scheduling(),
            preempted: false,
            encoder_budget: cfg.max_num_encoder_input_tokens(),
            encoder_inputs: Vec::new(),
            external_encoder_inputs: Vec::new(),
        };
        self.next_step_id += 1;
        if b.defers_reads {
            self.prepare_diffusion_step(b.step.step_id);
        }
        self.kv.new_step_starts();
        self.schedule_running(&mut b, &mut budgets);
        b.num_running_entries = b.rows.len();
        // No admissions in a step that preempted.
        if !b.preempted && !paused_all {
            let external_kv = b.external_kv.take();
            self.schedule_waiting(&mut b, &mut budgets, external_kv);
            if !defer_prefills {
                let (_, num_waiting) = self.get_request_counts();
                self.prefill_capacity_bound = num_waiting > self.num_skipped_waiting;
            }
        }
        self.stats.num_steps += 1;
        let carried_prefill = b.prefill_scheduled || b.prefill_admitted;
        let step = self.finish_step(b);
        if step.total_num_scheduled_tokens > 0 {
            self.num_executed_steps += 1;
        }
        if carried_prefill && self.config.prefill_schedule_interval() > 1 {
            self.last_prefill_step = self.num_executed_steps;
        }
        step
    }

    /// Whether this step holds prefill back: throttled, or within the prefill cadence's
    /// interval (counted as if this step executes), and only while a running request
    /// decodes and the waiting requests did not outgrow the last prefill step.
    fn defers_prefills(&self, throttle_prefills: bool) -> bool {
        let interval = self.config.prefill_schedule_interval();
        let held =
            throttle_prefills || (interval > 1 && self.num_executed_steps + 1 - self.last_prefill_step < interval);
        held && !self.prefill_capacity_bound && self.running.iter().any(|&h| !self.requests[h].is_prefill_chunk)
    }

    /// Commits a loop's decision: takes its budget, writes its row of the step (and its
    /// new blocks), then advances `C` optimistically (vLLM's `_update_after_schedule`):
    /// the row holds the values before the advance. `SYNC_FCFS`: the caller checked that
    /// scheduling is synchronous and no entry can be undone (FCFS), so those branches fold away.
    // Inlined: called once per scheduled request, mostly from the running loop.
    #[inline(always)]
    fn commit<const SYNC_FCFS: bool>(
        config: &SchedulerConfig,
        budgets: &mut Budgets,
        b: &mut StepBuilder,
        request: &mut Request,
        e: Entry,
    ) {
        budgets.take(e.num_new_tokens);
        if b.tracks_drafts && !b.drafts_needed {
            b.drafts_needed = !drafts_unused(request, e.num_computed_before, e.num_new_tokens);
        }
        let step = &mut b.step;
        let num_output_tokens = request.num_output_tokens() + request.num_output_placeholders();
        let previous_step = request.last_scheduled_step;
        request.last_scheduled_step = step.step_id;
        // A running request's new blocks; an admitted one's whole table and token count
        // (its tokens are copied once the step is built, into one exact allocation).
        let (blocks, num_tokens): (&[u32], usize) = match e.kind {
            EntryKind::Running { first_new_block } => {
                if !SYNC_FCFS && b.undoable {
                    b.undo.push(Undo {
                        cached_blocks_before: e.cached_blocks_before,
                        is_prefill_chunk: request.is_prefill_chunk,
                        next_decode_eligible_step: request.next_decode_eligible_step,
                    });
                }
                if previous_step + 1 != step.step_id {
                    step.rescheduled_reqs.push(e.handle);
                }
                (&request.block_ids[first_new_block..], 0)
            }
            EntryKind::New => {
                step.new_reqs.push(e.handle);
                (&request.block_ids, request.num_tokens() as usize)
            }
            EntryKind::Resumed => {
                step.resumed_reqs.push(e.handle);
                (&request.block_ids, request.num_tokens() as usize)
            }
        };
        let num_blocks = blocks.len();
        // Most decode steps add no block and no token: skip the reserve calls.
        if !blocks.is_empty() {
            step.block_ids.extend(blocks.iter().map(|&id| id as i32));
        }

        request.set_num_computed_tokens(request.num_computed_tokens() + e.num_new_tokens);
        request.set_num_in_flight_tokens(request.num_in_flight_tokens() + e.num_new_tokens);
        request.is_prefill_chunk =
            request.num_computed_tokens() < request.num_tokens() + request.num_output_placeholders();
        // A running request recomputing a synchronous load's failed blocks is scheduled.
        request.kv_load_failed = false;
        b.has_prefill_chunk |= request.is_prefill_chunk;
        if !SYNC_FCFS && config.async_scheduling() && !request.is_prefill_chunk {
            // The step's outputs (sampled tokens and drafts) are placeholders until it returns.
            let s = config.num_sampled_tokens_per_step();
            request.set_num_output_placeholders(request.num_output_placeholders() + s + e.num_spec);
            request.spec_token_ids.clear();
            request.spec_token_ids.resize(config.num_speculative_tokens() as usize, -1);
            if b.decode_stagger > 0 {
                request.next_decode_eligible_step = step.step_id + b.decode_stagger;
            }
        }
        b.rows.push(Row {
            handle: e.handle,
            num_scheduled_tokens: stored(e.num_new_tokens),
            num_computed_tokens: stored(e.num_computed_before),
            num_spec_tokens: stored(e.num_spec),
            num_output_tokens: stored(num_output_tokens),
            num_block_ids: stored(num_blocks as i64),
            num_all_token_ids: stored(num_tokens as i64),
            prefill_chunk: request.is_prefill_chunk,
        });
    }

    /// Appends the step's blocks of the KV-cache groups after the first, group after
    /// group: a running request's new blocks, an admitted one's (its row carries its
    /// tokens) whole tables. Written once the step is built: a row's tables do not change
    /// after its allocation.
    #[cold]
    fn write_group_blocks(&self, step: &mut Step, rows: &[Row]) {
        for g in 1..self.config.kv_cache_groups().len() {
            for row in rows {
                let table = &self.requests[row.handle].extra_tables[g - 1];
                let admitted = row.num_all_token_ids > 0;
                let blocks = if admitted { &table.ids[..] } else { &table.ids[table.first_new..] };
                step.num_block_ids.push(stored(blocks.len() as i64));
                step.block_ids.extend(blocks.iter().map(|&id| id as i32));
            }
        }
    }

    /// Each row's tokens from `C` on, `n` less its draft slots of them: what the first
    /// pipeline stage computes but never saw sampled. Synchronous pipeline stages only.
    #[cold]
    fn write_new_token_ids(&self, step: &mut Step, rows: &[Row]) {
        for row in rows {
            let count = row.num_scheduled_tokens - row.num_spec_tokens;
            let tokens = self.requests[row.handle].all_token_ids().skip(row.num_computed_tokens as usize);
            step.new_token_ids.extend(tokens.take(count as usize));
            step.num_new_token_ids.push(count);
        }
    }

    /// Undoes the committed running entry at `position` (a priority preemption took its
    /// request): its budget, its columns, its drafts and its advance. The caller preempts it.
    fn uncommit(&mut self, b: &mut StepBuilder, budgets: &mut Budgets, position: usize) {
        let step = &mut b.step;
        let row = b.rows.remove(position);
        let (handle, n) = (row.handle, i64::from(row.num_scheduled_tokens));
        // The drafts and blocks of the entries before it locate its own (token ids are only
        // copied once the step is built).
        let before = &b.rows[..position];
        let drafts_before: usize = before.iter().map(|r| r.num_spec_tokens as usize).sum();
        step.spec_token_ids.drain(drafts_before..drafts_before + row.num_spec_tokens as usize);
        let blocks_before: usize = before.iter().map(|r| r.num_block_ids as usize).sum();
        step.block_ids.drain(blocks_before..blocks_before + row.num_block_ids as usize);
        step.rescheduled_reqs.retain(|&h| h != handle);
        let undo = b.undo.remove(position);
        budgets.give_back(n);
        if self.config.multimodal() {
            self.uncommit_encoder_inputs(b, handle);
        }

        let request = &mut self.requests[handle];
        request.is_prefill_chunk = undo.is_prefill_chunk;
        request.set_num_computed_tokens(request.num_computed_tokens() - n);
        request.set_num_in_flight_tokens(request.num_in_flight_tokens() - n);
        if self.config.async_scheduling() && !row.prefill_chunk {
            let s = self.config.num_sampled_tokens_per_step();
            request.set_num_output_placeholders(request.num_output_placeholders() - s - i64::from(row.num_spec_tokens));
        }
        request.next_decode_eligible_step = undo.next_decode_eligible_step;
        // Its step will not run: the blocks its allocation registered in the prefix cache
        // will never hold their KV. (vLLM leaves them cached, so a later hit would read KV
        // that was never computed.)
        self.kv.uncache_from(request, undo.cached_blocks_before);
    }

    /// Hands the built step over (with the admitted requests' tokens, copied now) and keeps
    /// its record until its output is applied.
    fn finish_step(&mut self, mut b: StepBuilder) -> Step {
        if self.config.multimodal() {
            self.write_encoder_columns(&mut b);
        }
        let StepBuilder { mut step, rows, has_prefill_chunk, drafts_needed, .. } = b;
        step.drafts_unused = !drafts_needed;
        step.req_handles = rows.iter().map(|r| r.handle).collect();
        step.num_scheduled_tokens = rows.iter().map(|r| r.num_scheduled_tokens).collect();
        step.total_num_scheduled_tokens = step.num_scheduled_tokens.iter().map(|&n| i64::from(n)).sum();
        step.num_computed_tokens = rows.iter().map(|r| r.num_computed_tokens).collect();
        step.num_spec_tokens = rows.iter().map(|r| r.num_spec_tokens).collect();
        step.num_output_tokens = rows.iter().map(|r| r.num_output_tokens).collect();
        // One run of counts per group: none without a KV cache.
        if !self.config.kv_cache_groups().is_empty() {
            step.num_block_ids = rows.iter().map(|r| r.num_block_ids).collect();
        }
        if self.config.kv_cache_groups().len() > 1 {
            self.write_group_blocks(&mut step, &rows);
        }
        step.num_all_token_ids = rows.iter().map(|r| r.num_all_token_ids).collect();
        let num_tokens: usize = rows.iter().map(|r| r.num_all_token_ids as usize).sum();
        if num_tokens > 0 {
            step.all_token_ids.reserve_exact(num_tokens);
            for row in rows.iter().filter(|r| r.num_all_token_ids > 0) {
                let request = &self.requests[row.handle];
                request.copy_token_ids_to(&mut step.all_token_ids);
            }
        }
        if self.config.max_loras() > 0 {
            let loras = distinct_adapters(&self.requests, rows.iter().map(|r| r.handle));
            step.lora_ids = loras.into_iter().map(|id| id as i32).collect();
        }
        self.mark_structured_rows(&mut step, &rows);
        if let Some(blocks) = self.kv.take_blocks_to_zero() {
            step.new_block_ids_to_zero = blocks;
        }
        if self.config.pipeline_parallel_size() > 1 && !self.config.async_scheduling() {
            self.write_new_token_ids(&mut step, &rows);
        }
        if self.config.defer_block_free() && !rows.is_empty() {
            self.sched_step_seq += 1;
            for row in &rows {
                self.requests[row.handle].last_sched_seq = self.sched_step_seq;
            }
        }
        if !self.inflight_prefills.is_empty() {
            // A request leaves the set once a step schedules the rest of its prefill.
            for row in rows.iter().filter(|r| !r.prefill_chunk) {
                self.inflight_prefills.remove(&row.handle);
            }
        }
        if !rows.is_empty() {
            self.in_flight.push_back(StepRecord { step_id: step.step_id, entries: rows, has_prefill_chunk });
        }
        step.preempted = std::mem::take(&mut self.preempted_since_last_step);
        step.finished = std::mem::take(&mut self.finished_since_last_step);
        step
    }

    /// Preempts a running request the caller has taken out of `running` (spec §3.2).
    pub(super) fn preempt(&mut self, handle: Handle, drop_stale_output: bool) {
        self.release_encoder_inputs(handle);
        self.inflight_prefills.remove(&handle);
        debug_assert_eq!(self.requests[handle].status, RequestStatus::Running);
        self.free_blocks_of(handle);
        let request = &mut self.requests[handle];
        request.status = RequestStatus::Preempted;
        request.set_num_computed_tokens(0);
        request.kv_load_failed = false;
        request.spec_token_ids.clear();
        request.drop_stale_output =
            drop_stale_output || (request.drop_stale_output && request.num_stale_output_tokens() > 0);
        // Output of steps in flight now belongs to the request's previous life.
        request.set_num_stale_output_tokens(request.num_in_flight_tokens());
        request.set_num_output_placeholders(0);
        request.num_preemptions += 1;
        request.queued_in = Some(QueueKind::Waiting);
        let id = request.id.clone();
        self.waiting.prepend(&self.requests, handle);
        self.preempted_since_last_step.push((handle, id));
        self.stats.num_preemptions += 1;
    }

    /// Gives a live request's KV blocks back: now, or, with a step in flight that may write
    /// them (`defer_block_free`), once that step is applied.
    fn free_blocks_of(&mut self, handle: Handle) {
        if self.written_in_flight(self.requests[handle].last_sched_seq) {
            let tables = self.kv.take_tables(&mut self.requests[handle]);
            self.defer_free(tables);
        } else {
            self.kv.free(&mut self.requests[handle]);
        }
    }

    /// Frees a request whose status is already a finished one: its KV blocks, its place in
    /// a waiting queue and its record (prompt, output, block hashes). Only its handle and id
    /// are kept, for the next step to report; a step in flight that scheduled it finds its
    /// handle stale and skips it. The caller takes it out of `running` if it was there.
    fn release_finished(&mut self, handle: Handle) {
        self.release_encoder_inputs(handle);
        let Some(mut request) = self.requests.remove(handle) else {
            debug_assert!(false, "a finished request is released once");
            return;
        };
        debug_assert!(request.status.is_finished());
        // Its queue entry is dead now that the slot is empty: the queue forgets it lazily.
        if let Some(kind) = request.queued_in.take() {
            match kind {
                QueueKind::Waiting => self.waiting.forget_one(&self.requests),
                QueueKind::KvHolding => self.kv_holding_waiting.forget_one(&self.requests),
            }
        }
        if request.skipped_waiting {
            self.num_skipped_waiting -= 1;
        }
        if request.grammar.is_some() {
            self.num_structured_output -= 1;
        }
        if self.config.kv_connector() {
            self.inflight_prefills.remove(&handle);
            self.hold_kv_blocks(&mut request);
        } else if self.written_in_flight(request.last_sched_seq) {
            let tables = self.kv.take_tables(&mut request);
            self.defer_free(tables);
        } else {
            self.kv.free(&mut request);
        }
        self.ids.remove(&*request.id);
        self.finished_since_last_step.push((handle, request.id.clone()));
        self.last_finished.push(request);
    }

    /// The final records of the requests the latest `update_from_output` or
    /// `finish_requests` call finished, in the order they finished (a request's status,
    /// counters and tokens as they were when it finished; its blocks are freed, or held
    /// with a KV connector, see `held_kv_blocks`); taking
    /// them leaves none.
    pub fn take_last_finished(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.last_finished)
    }

    /// Those records, left in place.
    pub fn last_finished(&self) -> &[Request] {
        &self.last_finished
    }

    /// Finishes live requests from outside (aborts); ids not live are ignored,
    /// as in vLLM. `None` finishes every live request. Returns the ids finished.
    pub fn finish_requests(
        &mut self,
        request_ids: Option<&[&str]>,
        status: RequestStatus,
    ) -> CoreResult<Vec<Arc<str>>> {
        let requests: Option<Vec<RequestRef<'_>>> =
            request_ids.map(|ids| ids.iter().map(|&id| RequestRef::Id(id)).collect());
        let finished = self.finish_requests_of(requests.as_deref(), status)?;
        Ok(finished.into_iter().map(|(_, id)| id).collect())
    }

    /// `finish_requests` with each request given by handle or by id; returns the handle and
    /// the id of each request finished, in the order given (handle order for `None`).
    pub fn finish_requests_of(
        &mut self,
        requests: Option<&[RequestRef<'_>]>,
        status: RequestStatus,
    ) -> CoreResult<Vec<(Handle, Arc<str>)>> {
        if !status.is_finished() {
            return Err(CoreError::request("status", format!("{status:?}"), "must be a finished status"));
        }
        let handles: Vec<Handle> = match requests {
            Some(requests) => {
                let mut seen = rustc_hash::FxHashSet::default();
                requests.iter().filter_map(|r| self.live_handle(r)).filter(|h| seen.insert(*h)).collect()
            }
            None => self.live_handles(),
        };
        self.last_finished.clear();
        let mut was_running = false;
        let mut finished = Vec::with_capacity(handles.len());
        for &h in &handles {
            let request = &mut self.requests[h];
            was_running |= request.status == RequestStatus::Running;
            let load_in_flight = request.status == RequestStatus::WaitingForRemoteKvs && !request.kv_loaded;
            if request.status == RequestStatus::WaitingForStreamingReq {
                self.num_waiting_for_streaming_input -= 1;
            }
            request.status = status;
            let id = request.id.clone();
            self.release_finished(h);
            if load_in_flight {
                self.hold_until_loaded(&id);
            }
            finished.push((h, id));
        }
        if was_running {
            self.retain_running();
        }
        Ok(finished)
    }

    /// Drops from `running` the requests that left it (finished, their slots freed).
    fn retain_running(&mut self) {
        let requests = &self.requests;
        self.running.retain(|&h| requests.get(h).is_some_and(|r| r.status == RequestStatus::Running));
    }

    /// The handle of the live request `request` names, if there is one (a finished request's
    /// handle is stale: its slot is freed).
    pub fn live_handle(&self, request: &RequestRef<'_>) -> Option<Handle> {
        match *request {
            RequestRef::Id(id) => self.ids.get(id).copied(),
            RequestRef::Handle(h) => self.requests.get(h).map(|_| h),
        }
    }

    /// The live requests' handles, in handle order (what `finish_requests(None)` finishes).
    pub fn live_handles(&self) -> Vec<Handle> {
        let mut all: Vec<Handle> = self.ids.values().copied().collect();
        all.sort_unstable();
        all
    }

    /// The requests finished since the last step, in the order they finished, by the handle
    /// they had and their id: what the next step reports.
    pub fn finished_since_last_step(&self) -> &[(Handle, Arc<str>)] {
        &self.finished_since_last_step
    }

    /// Live (unfinished) requests.
    pub fn num_live_requests(&self) -> usize {
        self.ids.len()
    }

    /// The most request ids `finish_requests` reads (see `limits::MAX_IGNORED_FINISH_IDS`).
    pub fn finish_ids_limit(&self) -> ListLimit {
        ListLimit::finish_ids(self.num_live_requests())
    }

    /// The most requests one `update_draft_token_ids` call names: the live ones, and a
    /// step's worth that finished since the step the drafts were made in.
    pub fn draft_requests_limit(&self) -> ListLimit {
        ListLimit::draft_requests(self.num_live_requests(), self.config.max_num_seqs())
    }

    /// The id of a request named by `request` (a handle whose slot is gone names itself).
    fn request_name(&self, request: &RequestRef<'_>) -> String {
        match *request {
            RequestRef::Id(id) => id.to_string(),
            RequestRef::Handle(h) => self.requests.get(h).map_or_else(|| format!("{h:?}"), |r| r.id.to_string()),
        }
    }

    pub fn get_request(&self, request_id: &str) -> CoreResult<&Request> {
        self.ids
            .get(request_id)
            .map(|&h| &self.requests[h])
            .ok_or_else(|| CoreError::UnknownRequest { request_id: request_id.to_string() })
    }

    /// The live request `handle` names; None once it finished (its record is freed then).
    pub fn request(&self, handle: Handle) -> Option<&Request> {
        self.requests.get(handle)
    }

    /// How many of the waiting requests a waiting loop set aside (a LoRA adapter past
    /// `max_loras`, stale output in flight, no token it could schedule) and none has admitted
    /// since: vLLM's `num_skipped_waiting_reqs`.
    pub fn num_skipped_waiting(&self) -> usize {
        self.num_skipped_waiting
    }

    /// `(running, waiting)`.
    pub fn get_request_counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len() + self.kv_holding_waiting.len())
    }

    /// Requests still to be served: what `schedule()` may schedule under the pause state
    /// (a session paused for input is not).
    pub fn get_num_unfinished_requests(&self) -> usize {
        let (running, waiting) = self.get_request_counts();
        let paused_sessions = self.num_waiting_for_streaming_input;
        match self.pause_state {
            PauseState::Unpaused => running + waiting - paused_sessions,
            PauseState::PausedNew => running + self.kv_holding_waiting.len() - paused_sessions,
            PauseState::PausedAll => 0,
        }
    }

    pub fn pause_state(&self) -> PauseState {
        self.pause_state
    }

    pub fn set_pause_state(&mut self, pause_state: PauseState) {
        self.pause_state = pause_state;
    }

    /// With async scheduling, a request decoded in step `t` is not decoded again before
    /// step `t + steps` (vLLM's V2 model runner: with pipeline parallelism, one decode per
    /// request per trip through the pipeline's stages), and that step is its
    /// `next_decode_eligible_step`; with 1 it decodes every step. 0, the default: no such
    /// cadence (the bound is not recorded, as vLLM's other runners leave it). Takes effect
    /// from the next step.
    pub fn set_decode_stagger(&mut self, steps: i64) -> CoreResult<()> {
        const MAX_STAGGER: i64 = 1 << 10;
        if !(0..=MAX_STAGGER).contains(&steps) {
            return Err(CoreError::config("decode_stagger", steps, format!("must be in [0, {MAX_STAGGER}]")));
        }
        self.decode_stagger = steps as u64;
        Ok(())
    }

    pub fn decode_stagger(&self) -> u64 {
        self.decode_stagger
    }

    /// `schedule()` calls so far (vLLM's `current_step`).
    pub fn current_step(&self) -> u64 {
        self.next_step_id - 1
    }

    /// The prefill cadence's counters: steps that scheduled tokens, and the count of them
    /// at the last one that carried prefill (vLLM's `num_executed_steps`,
    /// `last_prefill_step`; a whole interval back before any).
    pub fn prefill_cadence(&self) -> (i64, i64) {
        (self.num_executed_steps, self.last_prefill_step)
    }

    /// The last step that could admit left requests waiting that were not set aside: the
    /// waiting requests outgrew it, and prefill is not held back (vLLM's
    /// `prefill_capacity_bound`).
    pub fn prefill_capacity_bound(&self) -> bool {
        self.prefill_capacity_bound
    }

    pub fn has_unfinished_requests(&self) -> bool {
        self.get_num_unfinished_requests() > 0
    }

    /// Unfinished requests, or finished ones a `schedule()` has yet to report.
    pub fn has_requests(&self) -> bool {
        self.has_unfinished_requests() || self.has_finished_requests()
    }

    /// Finished requests a `schedule()` has yet to report (vLLM's `has_finished_requests`).
    pub fn has_finished_requests(&self) -> bool {
        !self.finished_since_last_step.is_empty()
    }

    /// Forgets the prefix cache; with `reset_running_requests`, first preempts
    /// every running request (their in-flight output is dropped: the resumed
    /// request resamples those positions). Fails (false) while blocks are in use.
    pub fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> bool {
        if reset_running_requests {
            // Popping from the tail and prepending puts them back in their original order.
            while let Some(handle) = self.running.pop() {
                self.preempt(handle, true);
            }
        }
        self.kv.reset_prefix_cache()
    }

    /// The prefix cache's changes since the last call, oldest first: what `schedule` (its
    /// allocations, evictions and lookups) and `reset_prefix_cache` did to it. Always empty
    /// unless the config enables `enable_kv_cache_events`.
    pub fn take_kv_events(&mut self) -> Vec<crate::kv::KvEvent> {
        self.kv.take_events()
    }

    /// The KV blocks evicted since the last call among those the config samples
    /// (`kv_cache_metrics_sample`), in eviction order: each one's lifetime, idle time and
    /// gaps between its last reads (vLLM's `KVCacheEvictionEvent`). Always empty when it
    /// samples none.
    pub fn take_kv_cache_eviction_events(&mut self) -> Vec<crate::kv::EvictionEvent> {
        self.kv.take_eviction_events()
    }

    pub fn prefix_cache_stats(&self) -> &crate::kv::PrefixCacheStats {
        self.kv.prefix_cache_stats()
    }

    /// The prefix-cache hit a request like `new` would find now, were it added (vLLM's
    /// `KVCacheManager.get_computed_blocks`): its blocks, one run per group, and the tokens
    /// they hold; none with `skip_reading_prefix_cache`. `new` is validated as
    /// `add_request` validates it, and is not added: nothing changes, and no stats or
    /// events are recorded.
    pub fn probe_prefix_cache(&mut self, new: NewRequest) -> CoreResult<crate::kv::CacheHit> {
        let mut request = Request::from_new(new, &self.config)?;
        if request.skip_reading_prefix_cache {
            return Ok(crate::kv::CacheHit::default());
        }
        self.kv.update_block_hashes(&mut request);
        Ok(self.kv.get_computed_blocks(&request))
    }

    pub fn kv_cache_usage(&self) -> f64 {
        self.kv.usage()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    /// KV blocks held by requests (the null block and the free queue left out): the KV
    /// memory a step started now reads.
    pub fn num_used_blocks(&self) -> usize {
        self.kv.num_used_blocks()
    }

    pub fn num_steps_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// The free-block queue, head first (blocks are reused from the head).
    pub fn free_block_queue(&self) -> Vec<u32> {
        self.kv.pool().free_queue()
    }

    /// How many hold `block` (requests, and finished requests whose blocks are held);
    /// None if the pool has no such block.
    pub fn block_ref_count(&self, block: u32) -> Option<u32> {
        let pool = self.kv.pool();
        ((block as usize) < pool.num_blocks()).then(|| pool.ref_cnt(block))
    }

    /// Blocks registered in the prefix cache.
    pub fn num_cached_blocks(&self) -> usize {
        self.kv.pool().num_cached_blocks()
    }

    /// The hash `block` is registered under in the prefix cache, if any.
    pub fn cached_block_hash(&self, block: u32) -> Option<crate::kv::BlockHash> {
        if (block as usize) < self.kv.pool().num_blocks() {
            self.kv.pool().block_hash(block)
        } else {
            None
        }
    }

    /// The block cached under `hash` in KV-cache group `group` now, if any (none in a
    /// group there is not).
    pub fn cached_block(&self, hash: crate::kv::BlockHash, group: usize) -> Option<u32> {
        CachedBlocks::cached_block(self.kv.pool(), hash, group)
    }

    /// The tokens of `request` a prefix-cache lookup would find computed now.
    pub fn prefix_cache_hit_tokens(&self, request: &Request) -> i64 {
        self.kv.get_computed_blocks(request).tokens
    }

    /// Running requests in running order.
    pub fn running_ids(&self) -> Vec<Arc<str>> {
        self.running.iter().map(|&h| self.requests[h].id.clone()).collect()
    }

    /// How many of `waiting_ids` (the first ones) hold KV blocks: a load's, or computed
    /// tokens (vLLM's `kv_holding_waiting`).
    pub fn num_kv_holding_waiting(&self) -> usize {
        self.kv_holding_waiting.len()
    }

    /// The requests waiting for an asynchronous KV load that the runner reported received
    /// (vLLM's `finished_recving_kv_req_ids`), and those whose load failed and is to be
    /// recomputed (`failed_recving_kv_req_ids`), in waiting order: the next waiting loop
    /// promotes them.
    pub fn kv_loads_reported(&self) -> (Vec<Arc<str>>, Vec<Arc<str>>) {
        let mut received = Vec::new();
        let mut failed = Vec::new();
        for h in self.kv_holding_waiting.live_handles(&self.requests) {
            let request = &self.requests[h];
            if request.status != RequestStatus::WaitingForRemoteKvs {
                continue;
            }
            if request.kv_loaded {
                received.push(request.id.clone());
            }
            if request.kv_load_failed {
                failed.push(request.id.clone());
            }
        }
        (received, failed)
    }

    /// Waiting requests in the order they would be considered.
    pub fn waiting_ids(&self) -> Vec<Arc<str>> {
        let kv = self.kv_holding_waiting.live_handles(&self.requests);
        let waiting = self.waiting.live_handles(&self.requests);
        kv.into_iter().chain(waiting).map(|h| self.requests[h].id.clone()).collect()
    }

    /// The waiting requests a waiting loop set aside and none has admitted since (vLLM's
    /// `deferred_waiting`; `num_skipped_waiting` of them), in waiting order.
    pub fn skipped_waiting_ids(&self) -> Vec<Arc<str>> {
        let kv = self.kv_holding_waiting.live_handles(&self.requests);
        let waiting = self.waiting.live_handles(&self.requests);
        kv.into_iter()
            .chain(waiting)
            .filter(|&h| self.requests[h].skipped_waiting)
            .map(|h| self.requests[h].id.clone())
            .collect()
    }
}
