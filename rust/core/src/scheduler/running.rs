//! The running loop (spec §3.1): give each running request the tokens that
//! let `C` catch up with `N + len(S) + P`, preempting when KV runs out.

use crate::capacity;
use crate::config::Policy;
use crate::kv::SlotRequest;
use crate::prefetch;
use crate::queue::priority_order;
use crate::request::{Request, RequestStatus, RUNNING_LOOP_LINES};
use crate::scheduler::step::{Budgets, Entry, EntryKind, StepBuilder};
use crate::scheduler::Scheduler;
use crate::slab::Handle;

impl Scheduler {
    /// vLLM's `DiffusionAsyncScheduler`, before step `step_id`: each running request's
    /// placeholders (the model's canvas) are cut to its own canvas, and a read with every
    /// denoising step in flight (`P >= steps * canvas`) is not decoded in this step (its
    /// last step in flight emits the canvas and ends it: another would be discarded),
    /// renewed at each step while that holds; a later bound (a decode stagger's) stands.
    pub(super) fn prepare_diffusion_step(&mut self, step_id: u64) {
        for &handle in &self.running {
            let request = &mut self.requests[handle];
            request.spec_token_ids.truncate(request.canvas_length as usize);
            let steps = i64::from(request.read_steps);
            if steps > 0 && request.num_output_placeholders() >= steps * i64::from(request.canvas_length) {
                request.next_decode_eligible_step = request.next_decode_eligible_step.max(step_id + 1);
            }
        }
    }

    pub(super) fn schedule_running(&mut self, b: &mut StepBuilder, budgets: &mut Budgets) {
        let simple = !self.config.async_scheduling()
            && !b.undoable
            && !b.defer_prefills
            && budgets.long_prefill_threshold == 0
            && self.config.num_lookahead_tokens() == 0
            && !self.config.kv_cache_groups().is_hybrid()
            && !self.config.multimodal();
        if simple {
            self.schedule_running_with::<true>(b, budgets);
        } else {
            self.schedule_running_with::<false>(b, budgets);
        }
    }

    /// The running loop. `SIMPLE`: synchronous, FCFS (no entry can be undone), no
    /// long-prefill threshold, no lookahead, no prefill held back, one KV-cache group and
    /// no multimodal inputs, so that code folds away.
    // Out of line: its state stays in registers.
    #[inline(never)]
    fn schedule_running_with<const SIMPLE: bool>(&mut self, b: &mut StepBuilder, budgets: &mut Budgets) {
        let m = self.config.max_request_len();
        let s = self.config.num_sampled_tokens_per_step();
        let lookahead = if SIMPLE { 0 } else { self.config.num_lookahead_tokens() };
        let prefill_lookahead = self.config.num_prefill_lookahead_tokens();
        let mamba_aligned = self.config.mamba_aligned();
        let priority_policy = self.config.policy() == Policy::Priority;

        // The budgets stay in a local (registers) through the loop; the preemption path,
        // which can give an entry's budget back, reads and writes them through `budgets`.
        let mut local = *budgets;
        let mut req_index = 0;
        while req_index < self.running.len() && local.has_room() {
            let handle = self.running[req_index];
            if let Some(&ahead) = self.running.get(req_index + prefetch::DISTANCE) {
                self.requests.prefetch(ahead, RUNNING_LOOP_LINES);
            }
            let request = &mut self.requests[handle];
            let (c, p) = (request.num_computed_tokens(), request.num_output_placeholders());
            // Async: the step in flight reaches max_tokens even if every draft
            // in it is rejected, (C + 1) - (P - 1) >= Np + max_tokens.
            if p > 0 && c + 2 - p >= request.num_prompt_tokens() + request.max_tokens() {
                req_index += 1;
                continue;
            }
            // A decode stagger, or a diffusion read deferred: not before its next eligible step.
            if !SIMPLE && (b.decode_stagger > 1 || b.defers_reads) && b.step.step_id < request.next_decode_eligible_step
            {
                req_index += 1;
                continue;
            }
            // A step that carries no prefill passes the prompt chunks over.
            if !SIMPLE && b.defer_prefills && request.is_prefill_chunk {
                req_index += 1;
                continue;
            }
            // Its encoder outputs are still in transit to the encoder-cache connector.
            if !SIMPLE
                && request.has_mm_inputs
                && b.external_encoder.as_deref_mut().is_some_and(|ec| !ec.ensure_cache_available(request, c - p))
            {
                req_index += 1;
                continue;
            }
            // n = N + len(S) + P - C
            let n = request.num_tokens_with_spec() + p - c;
            let n = if SIMPLE { n } else { local.cap_long_prefill(n) };
            let n = n.min(local.request_budget()).min(capacity::room(c, m, s));
            let n = if !SIMPLE && mamba_aligned {
                super::mamba_aligned_split(&self.config, request, c, n, request.shared_prefix_boundary)
            } else {
                n
            };
            // A chunk stops before an input it cannot have encoded in this step.
            let (n, plan, request) = if !SIMPLE && request.has_mm_inputs && n > 0 {
                let (n, plan) =
                    self.plan_encoder_inputs(handle, c, n, b.encoder_budget, b.external_encoder.as_deref_mut());
                (n, Some(plan), &mut self.requests[handle])
            } else {
                (n, None, request)
            };
            // A multi-module drafter's chunks end L or more tokens before the prompt's end.
            let n = if !SIMPLE && prefill_lookahead > 1 {
                super::reserve_prefill_lookahead(request, c, n, prefill_lookahead)
            } else {
                n
            };
            if n <= 0 {
                req_index += 1;
                continue;
            }

            let cached_blocks_before = request.num_cached_blocks;
            // The common decode step needs no new block; any other allocation is made, with
            // preemptions if it takes them, out of line.
            let (request, first_new_block) = match self.kv.allocate_in_held_blocks::<SIMPLE>(request, n, lookahead) {
                Some(first) => (request, first),
                None => {
                    *budgets = local;
                    let first = self.allocate_growing(b, budgets, handle, n, &mut req_index, priority_policy);
                    local = *budgets;
                    match first {
                        Some(first) => (&mut self.requests[handle], first),
                        None => {
                            if priority_policy && self.requests[handle].status == RequestStatus::Preempted {
                                continue;
                            }
                            break;
                        }
                    }
                }
            };
            b.prefill_scheduled |= request.is_prefill_chunk;
            let num_spec = if request.spec_token_ids.is_empty() { 0 } else { Self::take_drafts(b, request, n, c, p) };
            Self::commit::<SIMPLE>(
                &self.config,
                &mut local,
                b,
                request,
                Entry {
                    handle,
                    num_new_tokens: n,
                    num_computed_before: c,
                    num_spec,
                    kind: EntryKind::Running { first_new_block },
                    cached_blocks_before,
                },
            );
            if let Some(plan) = plan {
                self.commit_encoder_plan(b, handle, plan);
            }
            req_index += 1;
        }
        *budgets = local;
    }

    /// Moves the drafts this step verifies into the step and clears the request's; returns
    /// how many. Positions of this step beyond `N + P` are draft positions: `k = n + C - N - P`.
    #[inline]
    fn take_drafts(b: &mut StepBuilder, request: &mut Request, n: i64, c: i64, p: i64) -> i64 {
        let k = n + c - request.num_tokens() - p;
        let mut num_spec = 0;
        if k > 0 {
            let k = (k as usize).min(request.spec_token_ids.len());
            b.step.spec_token_ids.extend_from_slice(&request.spec_token_ids[..k]);
            num_spec = k as i64;
        }
        request.spec_token_ids.clear();
        num_spec
    }

    /// Allocates `num_new_tokens` for `handle` when its table must grow, preempting running
    /// requests (the victim's entry undone if it was already scheduled) until the
    /// allocation fits or `handle` itself is the victim (None), or, with
    /// `defer_block_free`, the victim's blocks would wait for a step in flight (None), or
    /// the KV connector (`b.external_kv`) has transfers pending that will free blocks
    /// (None: vLLM waits for them rather than preempt, its `has_pending_block_frees`).
    /// `req_index` follows the removals.
    #[inline(never)]
    fn allocate_growing(
        &mut self,
        b: &mut StepBuilder,
        budgets: &mut Budgets,
        handle: Handle,
        num_new_tokens: i64,
        req_index: &mut usize,
        priority_policy: bool,
    ) -> Option<usize> {
        let ask = SlotRequest {
            num_new_tokens,
            num_new_computed_tokens: 0,
            new_computed_blocks: &[],
            num_external_computed_tokens: 0,
            num_lookahead_tokens: self.config.num_lookahead_tokens(),
            full_sequence_must_fit: false,
            has_scheduled_reqs: true,
            reserved_blocks: 0,
            delay_caching: false,
        };
        if let Some(first) = self.kv.allocate_beyond_held_blocks(&mut self.requests[handle], ask) {
            return Some(first);
        }
        loop {
            if b.external_kv.as_deref_mut().is_some_and(|connector| connector.has_pending_block_frees()) {
                return None;
            }
            let victim = self.pick_victim(priority_policy);
            // Its blocks would wait for a step in flight: preempting it frees nothing now.
            if self.written_in_flight(self.requests[victim].last_sched_seq) {
                return None;
            }
            let victim_index = self.running.iter().position(|&h| h == victim).expect("victim is running");
            self.running.remove(victim_index);
            if victim_index < *req_index {
                *req_index -= 1;
            }
            // Under FCFS the victim is at or after `req_index`, never already scheduled.
            if let Some(position) = b.position(victim) {
                self.uncommit(b, budgets, position);
            }
            if let Some(aux) = b.aux_outputs.as_deref_mut() {
                aux.request_finished(&self.requests[victim], self.kv.pool());
            }
            self.preempt(victim, self.config.preemption_drops_in_flight_output());
            b.preempted = true;
            if victim == handle {
                return None;
            }
            if let Some(first) = self.kv.allocate_beyond_held_blocks(&mut self.requests[handle], ask) {
                return Some(first);
            }
        }
    }

    /// FCFS: the last running request. Priority: the running request that ranks last
    /// in the waiting queue's order, the largest `(priority, arrival_time, request_id)`.
    ///
    /// vLLM compares `(priority, arrival_time)` only and takes the first maximum in
    /// running order: with tied keys two requests can then preempt each other forever
    /// (each evicting the one that made progress). The request id makes the order total,
    /// so the request that wins a tie always wins it.
    fn pick_victim(&self, priority_policy: bool) -> Handle {
        if !priority_policy {
            return *self.running.last().expect("running is non-empty while a running request allocates");
        }
        // Owned ids (a cold path): borrowed ones changed the codegen of the running loop
        // around this call, +3% instructions per steady decode step (callgrind).
        let key = |h: Handle| {
            let r = &self.requests[h];
            (r.priority, r.arrival_time, r.id.clone())
        };
        let mut best = self.running[0];
        let mut best_key = key(best);
        for &h in &self.running[1..] {
            let k = key(h);
            if priority_order((k.0, k.1, &k.2), (best_key.0, best_key.1, &best_key.2)) == std::cmp::Ordering::Greater {
                best = h;
                best_key = k;
            }
        }
        best
    }
}
