//! Applying a runner's output to the requests of a step (spec §4).

use crate::encoder::EncoderCache;
use crate::error::{CoreError, CoreResult};
use crate::kv::KvManager;
use crate::prefetch;
use crate::request::{Request, RequestStatus, UPDATE_LINES};
use crate::scheduler::step::{Row, StepRecord};
use crate::scheduler::{AuxOutputs, Scheduler, SchedulerStats};
use crate::slab::Handle;

/// A runner's sampled tokens for one step, as flat arrays.
#[derive(Clone, Copy, Debug)]
pub struct RunnerOutput<'a> {
    /// Every sampled token, request after request in runner row order.
    pub sampled_token_ids: &'a [i32],
    /// Tokens per runner row.
    pub num_sampled: &'a [i32],
    /// For step entry `i`, the runner row holding its tokens; `None` when the
    /// runner kept the step's order.
    pub row_of_entry: Option<&'a [u32]>,
}

/// What the step produced for one request: tokens delivered (a prefix of the
/// runner's row, trimmed at a stop) and the status after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestEvent {
    pub handle: Handle,
    /// The request's position in the step (its row in the step's columns).
    pub entry: u32,
    /// Offset of the delivered tokens in `RunnerOutput::sampled_token_ids`.
    pub token_offset: usize,
    pub num_tokens: usize,
    pub status: RequestStatus,
    pub stop_reason: Option<i32>,
    /// The request's prefix-cached blocks after this output (before a finish freed them).
    pub num_cached_blocks: usize,
}

/// The config values the update reads for every entry.
#[derive(Clone, Copy)]
struct UpdateConsts {
    /// `M`: the longest a request grows (`max_request_len`).
    m: i64,
    s: i64,
    async_scheduling: bool,
    k_spec: i64,
    pools: bool,
    mm_encoder_only: bool,
}

/// Whom an update tells what it does: the caller each request's event, an auxiliary-output
/// connector each request it finishes.
struct Told<'a, F> {
    on_event: F,
    aux: Option<&'a mut dyn AuxOutputs>,
}

/// Where the update is in a step: the next entry, and where its tokens start when the
/// runner kept the step's order (they follow the previous entry's).
#[derive(Clone, Copy)]
struct Cursor {
    entry: usize,
    next_offset: usize,
}

/// What applying an entry's tokens did, for its event.
struct Applied {
    delivered: usize,
    stopped: bool,
    stopped_running: bool,
    status: RequestStatus,
    stop_reason: Option<i32>,
    num_cached_blocks: usize,
}

impl Scheduler {
    fn locate_step(&self, step_id: u64) -> CoreResult<&StepRecord> {
        match self.in_flight.front() {
            Some(front) if front.step_id == step_id => Ok(front),
            Some(front) if self.in_flight.iter().any(|r| r.step_id == step_id) => Err(CoreError::mismatch(format!(
                "step {step_id} is applied out of order: step {} was scheduled before it and is still in flight",
                front.step_id
            ))),
            _ => Err(CoreError::mismatch(format!(
                "step {step_id} is not in flight: its output was already applied, or this scheduler did not schedule it"
            ))),
        }
    }

    /// Checks a runner output against the step it answers without changing anything.
    /// Returns where each runner row's tokens start when the runner reordered the rows
    /// (in step order they follow from the counts).
    fn validate_output(&self, record: &StepRecord, out: &RunnerOutput<'_>) -> CoreResult<Option<Vec<usize>>> {
        let rows = out.num_sampled.len();
        if rows != record.entries.len() {
            return Err(CoreError::mismatch(format!(
                "the runner output has {rows} requests but step {} scheduled {}",
                record.step_id,
                record.entries.len()
            )));
        }
        // One pass the compiler vectorizes (a negative count is looked for again on error;
        // a count over its entry's limit is caught below).
        let mut offset = 0usize;
        let mut any_negative = false;
        let mut most_returned = 0;
        for &count in out.num_sampled {
            any_negative |= count < 0;
            most_returned = most_returned.max(count);
            offset = offset.wrapping_add(count as usize);
        }
        if any_negative {
            let (row, count) = out.num_sampled.iter().enumerate().find(|(_, &c)| c < 0).expect("a negative count");
            return Err(CoreError::mismatch(format!("num_sampled[{row}]={count}: a count cannot be negative")));
        }
        if offset != out.sampled_token_ids.len() {
            return Err(CoreError::mismatch(format!(
                "sampled_token_ids has {} tokens but num_sampled sums to {offset}",
                out.sampled_token_ids.len()
            )));
        }
        // One pass the compiler vectorizes; the position only on error.
        if out.sampled_token_ids.iter().fold(false, |any, &t| any | (t < 0)) {
            let (i, &t) = out.sampled_token_ids.iter().enumerate().find(|(_, &t)| t < 0).expect("a negative token");
            return Err(CoreError::mismatch(format!(
                "sampled_token_ids[{i}]={t}: a sampled token id cannot be negative (-1 is a placeholder, never a sample)"
            )));
        }
        if let Some(map) = out.row_of_entry {
            let mut used = vec![false; rows];
            if map.len() != rows
                || map.iter().any(|&row| (row as usize) >= rows || std::mem::replace(&mut used[row as usize], true))
            {
                return Err(CoreError::mismatch(
                    "the runner's request order is not a permutation of the step's requests",
                ));
            }
        }
        let s = self.config.num_sampled_tokens_per_step();
        // Each entry's limit is at least `s` unless it is a prefill chunk: a step of
        // decodes that returned at most `s` tokens each needs no pass over its entries.
        let within_every_limit = !record.has_prefill_chunk && i64::from(most_returned) <= s;
        if !within_every_limit {
            for (i, entry) in record.entries.iter().enumerate() {
                let row = match out.row_of_entry {
                    Some(map) => map[i] as usize,
                    None => i,
                };
                let count = out.num_sampled[row] as i64;
                let most = entry.max_returned_tokens(s);
                // An output the update drops (a stale one, a failed load's) is not read.
                let dropped = self.requests.get(entry.handle).is_some_and(|r| {
                    (r.drop_stale_output || r.kv_load_failed) && r.num_stale_output_tokens() >= entry.num_new_tokens()
                });
                if count > most && !dropped {
                    let name = self.requests.get(entry.handle).map(|r| r.id.to_string()).unwrap_or_default();
                    return Err(CoreError::mismatch(format!(
                        "request {name:?}: the runner returned {count} tokens but step {} allows at most {most} \
                         ({} draft slots{})",
                        record.step_id,
                        entry.num_spec(),
                        if entry.prefill_chunk { ", a non-final prefill chunk" } else { "" }
                    )));
                }
            }
        }
        Ok(out.row_of_entry.map(|_| {
            out.num_sampled
                .iter()
                .scan(0usize, |offset, &count| {
                    let start = *offset;
                    *offset += count as usize;
                    Some(start)
                })
                .collect()
        }))
    }

    /// Applies the output of the oldest step in flight. On error nothing changes.
    ///
    /// A step that scheduled nothing is never in flight (as in vLLM): an output with no
    /// rows for it, or for any step already applied, is a no-op however often it comes.
    pub fn update_from_output(&mut self, step_id: u64, out: &RunnerOutput<'_>) -> CoreResult<Vec<RequestEvent>> {
        let mut events = Vec::new();
        self.update_from_output_with(step_id, out, |event| events.push(event), None)?;
        Ok(events)
    }

    /// `update_from_output`, handing each event to `on_event` as it happens (in step
    /// order) instead of collecting them, and telling `aux` (an auxiliary-output connector)
    /// of each request the output finishes, before its blocks are freed, with the prefix
    /// cache as it is then (the blocks of requests later in the step not cached yet, as in
    /// vLLM's update). On error nothing changes and no event is handed.
    pub fn update_from_output_with(
        &mut self,
        step_id: u64,
        out: &RunnerOutput<'_>,
        on_event: impl FnMut(RequestEvent),
        aux: Option<&mut dyn AuxOutputs>,
    ) -> CoreResult<()> {
        let scheduled_here = step_id > 0 && step_id < self.next_step_id;
        let in_flight = self.in_flight.iter().any(|r| r.step_id == step_id);
        if scheduled_here && !in_flight {
            if out.num_sampled.is_empty() && out.sampled_token_ids.is_empty() {
                return Ok(());
            }
            return Err(CoreError::mismatch(format!(
                "step {step_id} is not in flight: it scheduled nothing, or its output was already applied; \
                 the runner output has {} requests",
                out.num_sampled.len()
            )));
        }
        let record = self.locate_step(step_id)?;
        let row_offsets = self.validate_output(record, out)?;
        let record = self.in_flight.pop_front().expect("located");
        if self.config.defer_block_free() {
            self.step_applied();
        }
        self.last_finished.clear();
        let consts = UpdateConsts {
            m: self.config.max_request_len(),
            s: self.config.num_sampled_tokens_per_step(),
            async_scheduling: self.config.async_scheduling(),
            k_spec: self.config.num_speculative_tokens(),
            pools: self.config.pools(),
            mm_encoder_only: self.config.mm_encoder_only(),
        };
        let entries = &record.entries[..];
        // Entry `i`'s tokens as (offset, count): in step order they follow the previous
        // entry's (from `next_offset`), else they are the runner's row for the entry.
        let in_order = |i: usize, next_offset: usize| (next_offset, out.num_sampled[i] as usize);
        let tokens_of = |i: usize, next_offset: usize| match (out.row_of_entry, &row_offsets) {
            (Some(map), Some(row_offsets)) => {
                let row = map[i] as usize;
                (row_offsets[row], out.num_sampled[row] as usize)
            }
            _ => in_order(i, next_offset),
        };
        let mut told = Told { on_event, aux };
        let mut stopped_running = false;
        let mut at = Cursor { entry: 0, next_offset: 0 };
        while at.entry < entries.len() {
            // Plain decode entries in a loop of their own, whose state stays in registers
            // (entered only where one may start: a step of drafts has none).
            if entries[at.entry].num_spec() == 0 && !entries[at.entry].prefill_chunk {
                stopped_running |= if row_offsets.is_none() {
                    self.apply_plain_run(entries, &mut at, out, &in_order, &consts, &mut told)
                } else {
                    self.apply_plain_run(entries, &mut at, out, &tokens_of, &consts, &mut told)
                };
                if at.entry == entries.len() {
                    break;
                }
            }
            let i = at.entry;
            let entry = &entries[i];
            let (offset, count) = tokens_of(i, at.next_offset);
            at = Cursor { entry: i + 1, next_offset: offset + count };
            if let Some(request) = self.requests.get_mut(entry.handle) {
                let generated = &out.sampled_token_ids[offset..offset + count];
                let applied = Self::apply_tokens::<false>(
                    (&mut self.kv, &mut self.encoder),
                    &mut self.stats,
                    request,
                    entry,
                    generated,
                    &consts,
                );
                if let Some(applied) = applied {
                    stopped_running |= self.hand_over(i, entry, offset, applied, &mut told);
                }
            }
        }
        if stopped_running {
            self.retain_running();
        }
        Ok(())
    }

    /// Applies the plain decode entries from `at` on, up to the first that is not (where
    /// it leaves `at`): one sampled token, no drafts, a request running with its output
    /// current and no images. `apply_tokens::<true>` is the general case's code
    /// with those facts as constants. Returns whether a running request stopped.
    // Out of line: inside the update, its state would not stay in registers.
    #[inline(never)]
    fn apply_plain_run(
        &mut self,
        entries: &[Row],
        at: &mut Cursor,
        out: &RunnerOutput<'_>,
        tokens_of: &impl Fn(usize, usize) -> (usize, usize),
        consts: &UpdateConsts,
        told: &mut Told<'_, impl FnMut(RequestEvent)>,
    ) -> bool {
        let Cursor { entry: mut i, next_offset: mut next_offset_local } = *at;
        let mut stopped_running = false;
        while i < entries.len() {
            if let Some(ahead) = entries.get(i + prefetch::DISTANCE) {
                self.requests.prefetch(ahead.handle, UPDATE_LINES);
            }
            let entry = &entries[i];
            let (offset, count) = tokens_of(i, next_offset_local);
            if count != 1 || entry.num_spec() != 0 || entry.prefill_chunk {
                break;
            }
            let Some(request) = self.requests.get_mut(entry.handle) else { break };
            // A request with images drops them as its tokens pass them: the general path.
            if request.status != RequestStatus::Running
                || request.num_stale_output_tokens() != 0
                || request.has_mm_inputs
            {
                break;
            }
            next_offset_local = offset + 1;
            let generated = &out.sampled_token_ids[offset..offset + 1];
            let applied = Self::apply_tokens::<true>(
                (&mut self.kv, &mut self.encoder),
                &mut self.stats,
                request,
                entry,
                generated,
                consts,
            );
            if let Some(applied) = applied {
                stopped_running |= self.hand_over(i, entry, offset, applied, told);
            }
            i += 1;
        }
        *at = Cursor { entry: i, next_offset: next_offset_local };
        stopped_running
    }

    /// Applies an entry's returned tokens to its request (spec §4): the in-flight count,
    /// verified drafts, the tokens up to a stop, placeholders, block hashes and caching.
    /// None if its output is stale and dropped: nothing to hand over (a request that
    /// finished meanwhile has no slot: the caller skips it). `PLAIN`: the caller checked that the entry has one token and no
    /// drafts and the request is running with its output current (not stale), so those
    /// branches fold away.
    #[inline(always)]
    fn apply_tokens<const PLAIN: bool>(
        (kv, encoder): (&mut KvManager, &mut EncoderCache),
        stats: &mut SchedulerStats,
        request: &mut Request,
        entry: &Row,
        generated: &[i32],
        consts: &UpdateConsts,
    ) -> Option<Applied> {
        let UpdateConsts { m, s, async_scheduling, k_spec, pools, mm_encoder_only } = *consts;
        let num_spec = if PLAIN { 0 } else { entry.num_spec() };
        request.set_num_in_flight_tokens(request.num_in_flight_tokens() - entry.num_new_tokens());
        let stale = !PLAIN && request.num_stale_output_tokens() > 0;
        if stale {
            request.set_num_stale_output_tokens(request.num_stale_output_tokens() - entry.num_new_tokens());
        }
        // Dropped: stale output of a request preempted since, or output of a step whose
        // synchronous load failed (the request recomputes).
        if !PLAIN && stale && (request.drop_stale_output || request.kv_load_failed) {
            return None;
        }

        if num_spec > 0 && (!generated.is_empty() || s == 0) {
            let accepted = (generated.len() as i64 - s).max(0);
            let rejected = num_spec - accepted;
            if !stale {
                // The rejected draft positions hold no usable KV and no output.
                if request.num_computed_tokens() > 0 {
                    request.set_num_computed_tokens(request.num_computed_tokens() - rejected);
                }
                if request.num_output_placeholders() > 0 {
                    request.set_num_output_placeholders(request.num_output_placeholders() - rejected);
                }
            }
            stats.num_draft_tokens += num_spec as u64;
            stats.num_accepted_tokens += accepted as u64;
        }
        if !PLAIN && request.has_mm_inputs {
            Self::release_passed_inputs(encoder, entry.handle, request);
        }

        let status_before = request.status;
        let had_placeholders = request.num_output_placeholders() > 0;
        let mut delivered = 0;
        let mut stopped = false;
        if !generated.is_empty() {
            for (i, &token) in generated.iter().enumerate() {
                request.push_output(token, m);
                if request.check_stop(token, m) {
                    delivered = i + 1;
                    if !stale {
                        // Keep C = N - 1 after trimming the tokens past the stop.
                        request.set_num_computed_tokens(
                            request.num_computed_tokens() - (generated.len() - delivered) as i64,
                        );
                    }
                    stopped = true;
                    break;
                }
            }
            if !stopped {
                delivered = generated.len();
            }
            if !stale && request.num_output_placeholders() > 0 {
                // Every returned token resolves a placeholder, trimmed ones too.
                request.set_num_output_placeholders(request.num_output_placeholders() - generated.len() as i64);
            }
            kv.update_block_hashes(request);
            if !stale && status_before == RequestStatus::Running && (had_placeholders || k_spec > 0) {
                // Only KV that is computed and processed is cacheable: C - F.
                let upto = request.num_computed_tokens() - request.num_in_flight_tokens();
                kv.cache_blocks(request, upto);
            }
        } else if pools && !entry.prefill_chunk {
            // Pooling: the output of the final prompt chunk finishes the request.
            request.status = RequestStatus::FinishedStopped;
            stopped = true;
        } else if mm_encoder_only && request.num_computed_tokens() >= request.num_prompt_tokens() {
            // An encoder instance samples nothing: its work on a request is done once the
            // whole prompt (every input in it encoded) is computed.
            request.status = RequestStatus::FinishedStopped;
            stopped = true;
        } else if s > 0 && !entry.prefill_chunk && !stale {
            // (A diffusion step that emits nothing leaves its canvas to the next.)
            // The step reached the end of the known tokens but sampled nothing (a
            // runner-side error or a dropped sample). vLLM leaves C ahead of N - 1 and
            // the request can never be scheduled again; undo the step's draft and
            // sampled positions instead, so the next step samples again (K + s).
            let undone = num_spec + s;
            request.set_num_computed_tokens((request.num_computed_tokens() - undone).max(0));
            if async_scheduling {
                request.set_num_output_placeholders((request.num_output_placeholders() - undone).max(0));
            }
        }
        // Read only when they can be set: the stop reason lies in the request's cold
        // lines (and no block is cached without prefix caching).
        Some(Applied {
            delivered,
            stopped,
            stopped_running: stopped && status_before == RequestStatus::Running,
            status: request.status,
            stop_reason: if stopped { stop_reason_of(request) } else { None },
            num_cached_blocks: if kv.enable_caching() { kv.num_cached_blocks(request) } else { 0 },
        })
    }

    /// Frees a request the entry's tokens finished and hands the entry's event over, if it
    /// has one. Returns whether a running request stopped.
    #[inline(always)]
    fn hand_over(
        &mut self,
        i: usize,
        entry: &Row,
        token_offset: usize,
        applied: Applied,
        told: &mut Told<'_, impl FnMut(RequestEvent)>,
    ) -> bool {
        // A streaming-input session's stop ends its input; the request goes on.
        if applied.stopped && !(self.is_session(entry.handle) && self.continue_session(entry.handle)) {
            if let Some(aux) = told.aux.as_deref_mut() {
                aux.request_finished(&self.requests[entry.handle], self.kv.pool());
            }
            self.release_finished(entry.handle);
        }
        if applied.delivered > 0 || applied.stopped {
            (told.on_event)(RequestEvent {
                handle: entry.handle,
                entry: i as u32,
                token_offset,
                num_tokens: applied.delivered,
                status: applied.status,
                stop_reason: applied.stop_reason,
                num_cached_blocks: applied.num_cached_blocks,
            });
        }
        applied.stopped_running
    }
}

impl Scheduler {
    /// Drops the request's references to the encoder outputs its confirmed tokens have
    /// passed (`C - P`: no pending draft rejection can roll back into them), as vLLM's
    /// `_free_encoder_inputs` does once a step has run.
    #[cold]
    fn release_passed_inputs(encoder: &mut EncoderCache, handle: crate::slab::Handle, request: &mut Request) {
        let confirmed = request.num_computed_tokens() - request.num_output_placeholders();
        let Some(mm) = request.mm.as_deref_mut() else { return };
        let passed: Vec<u32> =
            mm.referenced.iter().copied().filter(|&i| mm.inputs[i as usize].end() <= confirmed).collect();
        for i in passed {
            encoder.release_passed(handle, &request.id, mm, i as usize);
        }
    }
}

/// A stopped request's stop reason, read out of line: read inline, the compiler loads it
/// (from a cold line of the request) for every entry, stopped or not.
#[cold]
#[inline(never)]
fn stop_reason_of(request: &Request) -> Option<i32> {
    request.stop_reason
}
