//! The running loop (spec §3.1): give each running request the tokens that
//! let `C` catch up with `N + len(S) + P`, preempting when KV runs out.

use crate::capacity;
use crate::config::Policy;
use crate::kv::SlotRequest;
use crate::queue::priority_order;
use crate::request::RequestStatus;
use crate::scheduler::step::{Entry, EntryKind, StepBuilder};
use crate::scheduler::Scheduler;
use crate::slab::Handle;

impl Scheduler {
    pub(super) fn schedule_running(&mut self, b: &mut StepBuilder) {
        let m = self.config.max_model_len();
        let s = self.config.num_sampled_tokens_per_step();
        let lookahead = self.config.num_lookahead_tokens();
        let priority_policy = self.config.policy() == Policy::Priority;

        let mut req_index = 0;
        while req_index < self.running.len() && b.token_budget > 0 {
            if b.input_budget <= b.draft_slots {
                break;
            }
            let handle = self.running[req_index];
            let request = &mut self.requests[handle];
            let (c, p) = (request.num_computed_tokens(), request.num_output_placeholders());
            // Async: the step in flight reaches max_tokens even if every draft
            // in it is rejected, (C + 1) - (P - 1) >= Np + max_tokens.
            if p > 0 && c + 2 - p >= request.num_prompt_tokens() + request.max_tokens() {
                req_index += 1;
                continue;
            }
            // n = N + len(S) + P - C
            let mut n = request.num_tokens_with_spec() + p - c;
            if 0 < b.long_prefill_threshold && b.long_prefill_threshold < n {
                n = b.long_prefill_threshold;
            }
            n = n.min(b.token_budget).min(b.input_budget - b.draft_slots);
            n = n.min(capacity::room(c, m, s));
            if n <= 0 {
                req_index += 1;
                continue;
            }

            let cached_blocks_before = request.num_cached_blocks;
            let ask = SlotRequest {
                num_new_tokens: n,
                num_new_computed_tokens: 0,
                new_computed_blocks: &[],
                num_lookahead_tokens: lookahead,
                full_sequence_must_fit: false,
                has_scheduled_reqs: true,
            };
            let first_new_block = match self.kv.allocate_slots(request, ask) {
                Some(first) => first,
                None => match self.allocate_preempting(b, handle, ask, &mut req_index, priority_policy) {
                    Some(first) => first,
                    None => {
                        if priority_policy && self.requests[handle].status == RequestStatus::Preempted {
                            continue;
                        }
                        break;
                    }
                },
            };

            let request = &mut self.requests[handle];
            b.prefill_scheduled |= request.is_prefill_chunk;
            let mut num_spec = 0;
            if !request.spec_token_ids.is_empty() {
                // Positions of this step beyond N + P are draft positions: k = n + C - N - P.
                let k = n + c - request.num_tokens() - p;
                if k > 0 {
                    let k = (k as usize).min(request.spec_token_ids.len());
                    b.step.spec_token_ids.extend_from_slice(&request.spec_token_ids[..k]);
                    num_spec = k as i64;
                }
                request.spec_token_ids.clear();
            }
            Self::commit(
                &self.config,
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
            req_index += 1;
        }
    }

    /// Allocates for `handle` after its first attempt failed, preempting running requests
    /// (the victim's entry undone if it was already scheduled) until the allocation fits
    /// or `handle` itself is the victim (None). `req_index` follows the removals.
    #[cold]
    fn allocate_preempting(
        &mut self,
        b: &mut StepBuilder,
        handle: Handle,
        ask: SlotRequest<'_>,
        req_index: &mut usize,
        priority_policy: bool,
    ) -> Option<usize> {
        loop {
            let victim = self.pick_victim(priority_policy);
            let victim_index = self.running.iter().position(|&h| h == victim).expect("victim is running");
            self.running.remove(victim_index);
            if victim_index < *req_index {
                *req_index -= 1;
            }
            // Under FCFS the victim is at or after `req_index`, never already scheduled.
            if let Some(position) = b.position(victim) {
                self.uncommit(b, position);
            }
            self.preempt(victim, false);
            b.preempted = true;
            if victim == handle {
                return None;
            }
            if let Some(first) = self.kv.allocate_slots(&mut self.requests[handle], ask) {
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
