//! Multimodal inputs in the two loops (vLLM's `_try_schedule_encoder_inputs`): which of a
//! request's encoder inputs a chunk needs encoded in its step, within the step's encoder
//! compute budget and the encoder cache, and where the chunk must stop when an input cannot
//! be encoded now. Their references are dropped once the request's computed tokens pass them.

use std::sync::Arc;

use crate::mm_inputs::inputs_in_window;
use crate::request::RequestStatus;
use crate::scheduler::step::StepBuilder;
use crate::scheduler::{ExternalEncoderCache, RequestRef, Scheduler};
use crate::slab::Handle;

/// `Scheduler::encoder_cache_contents`: each output's identifier, embeddings and
/// referencing requests' ids; the unreferenced identifiers, oldest first.
type EncoderCacheContents = (Vec<(Arc<str>, i64, Vec<Arc<str>>)>, Vec<Arc<str>>);

/// The encoder inputs a chunk of one request needs encoded in its step.
#[derive(Debug, Default)]
pub(super) struct EncoderPlan {
    /// Inputs to encode, ascending (each takes its embeddings of the compute budget).
    inputs: Vec<u32>,
    /// Inputs whose outputs the encoder-cache connector loads, ascending.
    external: Vec<u32>,
    /// Inputs whose identifier an earlier input of the plan encodes or loads (shared
    /// output).
    duplicates: Vec<u32>,
    /// The compute budget the inputs to encode take.
    compute_embeds: i64,
    /// The encoder cache's room the inputs to encode or load take.
    cache_embeds: i64,
}

impl Scheduler {
    /// How many of `n` tokens from `C` the request can be scheduled given its encoder
    /// inputs, and the inputs to encode for them (vLLM's `_try_schedule_encoder_inputs`,
    /// with its effects on the cache: inputs found cached are referenced now, and outputs
    /// evicted for room stay evicted). An input whose cached output holds another count of
    /// embeddings than the request's (an identifier reused for other content) schedules
    /// nothing and queues the request to be failed (`finish_encoder_mismatches`). With an
    /// encoder-cache connector (`ec`), an input it has is loaded rather than encoded.
    pub(super) fn plan_encoder_inputs(
        &mut self,
        handle: Handle,
        c: i64,
        n: i64,
        budget: i64,
        mut ec: Option<&mut (dyn ExternalEncoderCache + '_)>,
    ) -> (i64, EncoderPlan) {
        let mut plan = EncoderPlan::default();
        let shift = self.config.num_prefill_lookahead_tokens();
        let no_chunking = self.config.disable_chunked_mm_input();
        let request = &mut self.requests[handle];
        let Some(mm) = request.mm.as_deref_mut() else { return (n, plan) };
        if n == 0 {
            return (n, plan);
        }
        let mut n = n;
        let window_end = c + n + shift;
        let (lo, hi) = inputs_in_window(&mm.inputs, c, window_end);
        for i in lo..hi {
            let input = &mm.inputs[i];
            let (start, length, num_embeds) = (input.offset, input.length, input.num_embeds());
            if no_chunking && c <= start && c + n < start + length {
                // The chunk would split the input: stop before it (drafter's shift included).
                n = (start - (c + shift)).max(0);
                break;
            }
            // An input of the plan with this identifier, else the cache's output of it.
            let planned = (plan.inputs.iter().chain(&plan.external))
                .map(|&j| &mm.inputs[j as usize])
                .find(|j| j.identifier == input.identifier);
            let known = match planned {
                Some(earlier) => Some((earlier.num_embeds(), true)),
                None => self.encoder.cached_num_embeds(&input.identifier).map(|embeds| (embeds, false)),
            };
            match known {
                Some((embeds, _)) if embeds != num_embeds => {
                    self.encoder_mismatches.push(handle);
                    return (0, EncoderPlan::default());
                }
                Some((_, true)) => {
                    plan.duplicates.push(i as u32);
                    continue;
                }
                _ => {}
            }
            if self.encoder.check_and_reference(handle, mm, i) {
                continue;
            }
            if !self.encoder.can_allocate(num_embeds, budget - plan.compute_embeds, plan.cache_embeds) {
                // Encoded whole or not at all: stop before it; a prefix hit past its start
                // leaves nothing to schedule.
                n = if c < start { n.min(start - c) } else { 0 };
                break;
            }
            let first = (c - start).max(0);
            let last = length.min(window_end - start);
            if mm.inputs[i].embeds_between(first, last) == 0 {
                continue;
            }
            plan.cache_embeds += num_embeds;
            if ec.as_deref_mut().is_some_and(|ec| ec.has_cache_item(&mm.inputs[i].identifier)) {
                plan.external.push(i as u32);
                continue;
            }
            plan.compute_embeds += num_embeds;
            plan.inputs.push(i as u32);
        }
        (n, plan)
    }

    /// Commits a scheduled request's plan: its inputs' outputs reserved in the cache, the
    /// budget taken, the inputs recorded for the step.
    pub(super) fn commit_encoder_plan(&mut self, b: &mut StepBuilder, handle: Handle, plan: EncoderPlan) {
        let Some(mm) = self.requests[handle].mm.as_deref_mut() else { return };
        for &i in plan.inputs.iter().chain(&plan.external) {
            self.encoder.allocate(handle, mm, i as usize);
        }
        for &i in &plan.duplicates {
            self.encoder.check_and_reference(handle, mm, i as usize);
        }
        b.encoder_budget -= plan.compute_embeds;
        if !plan.inputs.is_empty() {
            b.encoder_inputs.push((handle, plan.inputs));
        }
        if !plan.external.is_empty() {
            b.external_encoder_inputs.push((handle, plan.external));
        }
    }

    /// Undoes the step's record of `handle`'s inputs (a priority preemption took it; its
    /// row is already gone; the preemption drops its references). Their outputs stay in the
    /// cache, which other requests of the step may have found them in, but are not computed
    /// yet: the step encodes each for a row that needs it, or forgets it (`settle_orphans`).
    /// Their budget stays taken. (vLLM gives the budget back and leaves the outputs cached
    /// as if computed: a chunk that found one there misses it in the runner.)
    /// The connector's loads for `handle` are undone the same way: the connector is told
    /// of no load for a request the step does not run.
    pub(super) fn uncommit_encoder_inputs(&mut self, b: &mut StepBuilder, handle: Handle) {
        for planned in [&mut b.encoder_inputs, &mut b.external_encoder_inputs] {
            let Some(at) = planned.iter().position(|(h, _)| *h == handle) else { continue };
            let (_, inputs) = planned.remove(at);
            let mm = self.requests[handle].mm.as_deref().expect("a request with encoder inputs has them");
            for i in inputs {
                self.encoder.orphan(mm.inputs[i as usize].identifier.clone());
            }
        }
    }

    /// The outputs whose encoding a preemption undid in this step: each is encoded for the
    /// first row whose chunk overlaps an input of that identifier, or, if no row needs it,
    /// forgotten (requests that referenced it plan it again).
    fn settle_orphans(&mut self, b: &mut StepBuilder) {
        let shift = self.config.num_prefill_lookahead_tokens();
        for identifier in self.encoder.take_orphans() {
            let needs = b.rows.iter().find_map(|row| {
                let mm = self.requests[row.handle].mm.as_deref()?;
                let (c, n) = (i64::from(row.num_computed_tokens), i64::from(row.num_scheduled_tokens));
                let j = mm.inputs.iter().position(|input| {
                    input.identifier == identifier && input.offset < c + n + shift && c < input.end()
                })?;
                Some((row.handle, j as u32))
            });
            match needs {
                Some((h, j)) => match b.encoder_inputs.iter_mut().find(|(other, _)| *other == h) {
                    Some((_, list)) => {
                        if let Err(at) = list.binary_search(&j) {
                            list.insert(at, j);
                        }
                    }
                    None => b.encoder_inputs.push((h, vec![j])),
                },
                None => {
                    for holder in self.encoder.forget_unencoded(&identifier) {
                        if let Some(mm) = self.requests.get_mut(holder).and_then(|r| r.mm.as_deref_mut()) {
                            let inputs = &mm.inputs;
                            mm.referenced.retain(|&j| inputs[j as usize].identifier != identifier);
                        }
                    }
                }
            }
        }
    }

    /// Drops every encoder-output reference of `handle` (preempted, finished, or not
    /// admitted after its plan referenced cached outputs).
    pub(super) fn release_encoder_inputs(&mut self, handle: Handle) {
        if let Some(mm) = self.requests.get_mut(handle).and_then(|r| r.mm.as_deref_mut()) {
            self.encoder.release_all(handle, mm);
        }
    }

    /// The step's inputs to encode as columns: for each, its row and its index among its
    /// request's inputs, rows ascending; and the outputs evicted since the previous step.
    /// Likewise the inputs the encoder-cache connector loads.
    pub(super) fn write_encoder_columns(&mut self, b: &mut StepBuilder) {
        self.settle_orphans(b);
        let step = &mut b.step;
        for (planned, rows, ids) in [
            (&b.encoder_inputs, &mut step.encoder_input_rows, &mut step.encoder_input_ids),
            (&b.external_encoder_inputs, &mut step.external_encoder_input_rows, &mut step.external_encoder_input_ids),
        ] {
            let mut by_row: Vec<(usize, &Vec<u32>)> = planned
                .iter()
                .map(|(h, inputs)| {
                    (b.rows.iter().position(|r| r.handle == *h).expect("a planned request has a row"), inputs)
                })
                .collect();
            by_row.sort_unstable_by_key(|&(row, _)| row);
            for (row, inputs) in by_row {
                for &i in inputs {
                    rows.push(row as i32);
                    ids.push(i as i32);
                }
            }
        }
        step.freed_encoder_outputs = self.encoder.take_freed();
    }

    /// Fails (`FinishedError`) the requests whose encoder input's cached output held another
    /// count of embeddings (their identifier reused for other content), seen by a loop since
    /// the last call, as vLLM's `update_from_output` does; returns their handles and ids.
    /// Their final records are then `take_last_finished`'s.
    pub fn finish_encoder_mismatches(&mut self) -> Vec<(Handle, Arc<str>)> {
        if self.encoder_mismatches.is_empty() {
            return Vec::new();
        }
        let failed: Vec<RequestRef<'_>> =
            std::mem::take(&mut self.encoder_mismatches).into_iter().map(RequestRef::Handle).collect();
        let finished = self.finish_requests_of(Some(&failed), RequestStatus::FinishedError);
        finished.expect("FinishedError is a finished status")
    }

    /// The ids of the requests `finish_encoder_mismatches` will fail (vLLM's
    /// `encoder_cache_mismatch_reqs`), in the order the loops met them (a request met again
    /// before then, again; one finished before then, not).
    pub fn encoder_mismatch_ids(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.encoder_mismatches.iter().filter_map(|&h| self.requests.get(h)).map(|r| &r.id)
    }

    /// Forgets every cached encoder output (vLLM's `reset_encoder_cache`, after a weight
    /// update): running requests' references go too, and the runner is not told of them.
    pub fn reset_encoder_cache(&mut self) {
        self.encoder.reset();
        for request in self.requests.requests_mut() {
            if let Some(mm) = request.mm.as_deref_mut() {
                mm.referenced.clear();
            }
        }
    }

    /// The encoder cache's `(free, freeable)` embedding slots and cached outputs.
    pub fn encoder_cache_state(&self) -> (i64, i64, usize) {
        let (free, freeable) = self.encoder.slots();
        (free, freeable, self.encoder.num_cached())
    }

    /// The encoder cache's outputs, by identifier (ascending): each with its embeddings and
    /// the ids of the requests that reference it; and the unreferenced ones, oldest (first
    /// evicted) first.
    pub fn encoder_cache_contents(&self) -> EncoderCacheContents {
        let mut entries: Vec<_> = self
            .encoder
            .entries()
            .map(|(identifier, num_embeds, holders)| {
                let ids = holders.iter().map(|&h| self.requests[h].id.clone()).collect();
                (identifier.clone(), num_embeds, ids)
            })
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        (entries, self.encoder.freeable().cloned().collect())
    }

    /// With `ec_connector`: the inputs whose encoder outputs a request's computed tokens
    /// passed (its reference dropped) since the last call, as `(request id, input index)`
    /// in that order (vLLM tells its connector each with `update_state_after_free`). Empty
    /// without.
    pub fn take_passed_encoder_inputs(&mut self) -> Vec<(Arc<str>, u32)> {
        self.encoder.take_passed()
    }
}
