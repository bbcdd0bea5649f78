//! The waiting loop (spec §3.3): admit waiting requests while budgets, the
//! active-request cap and free KV allow; skip a blocked request, break where
//! vLLM breaks (spec §3.4).

use crate::capacity;
use crate::kv::SlotRequest;
use crate::request::{QueueKind, RequestStatus};
use crate::scheduler::step::{Budgets, Entry, EntryKind, StepBuilder};
use crate::scheduler::{PauseState, Scheduler};
use crate::slab::Handle;

impl Scheduler {
    pub(super) fn schedule_waiting(&mut self, b: &mut StepBuilder, budgets: &mut Budgets) {
        let m = self.config.max_model_len();
        let s = self.config.num_sampled_tokens_per_step();
        let k_spec = self.config.num_speculative_tokens();
        let lookahead = self.config.num_lookahead_tokens();
        let chunked_prefill = self.config.enable_chunked_prefill();
        let reserve_full_isl = self.config.scheduler_reserve_full_isl();
        let max_active = self.config.max_num_active_seqs() as usize;
        // #54028: a threshold below 1 + K would clip a padded step after padding.
        let threshold_clips_padding = budgets.cap_long_prefill(1 + k_spec) < 1 + k_spec;

        let mut skipped_waiting: Vec<Handle> = Vec::new();
        let mut skipped_kv_holding: Vec<Handle> = Vec::new();

        while budgets.has_room() {
            let kind = if !self.kv_holding_waiting.is_empty() {
                QueueKind::KvHolding
            } else if self.pause_state == PauseState::Unpaused {
                QueueKind::Waiting
            } else {
                break;
            };
            let (queue, slab) = self.queue_with_slab(kind);
            let Some(handle) = queue.peek(slab) else {
                break;
            };
            if self.running.len() >= max_active {
                break;
            }
            let request = &self.requests[handle];

            // Output from before a preemption is still in flight: resuming now
            // would interleave it with the recomputed stream.
            if request.num_stale_output_tokens() > 0 && !request.drop_stale_output {
                self.skip_waiting(kind, &mut skipped_waiting, &mut skipped_kv_holding);
                continue;
            }

            // New and preempted requests look up the prefix cache; a request that
            // arrived with computed tokens keeps them.
            let looked_up = request.num_computed_tokens() == 0;
            let (hit_blocks, hit_tokens) =
                if looked_up { self.kv.get_computed_blocks(request) } else { (Vec::new(), 0) };
            let num_computed = if looked_up { hit_tokens } else { request.num_computed_tokens() };
            let request_budget = budgets.request_budget();
            // n = N - C_new, capped by the same room as the running loop (a no-op
            // for a live request, whose N <= M - s).
            let mut n = (request.num_tokens() - num_computed).min(capacity::room(num_computed, m, s));

            let mut pad = false;
            if k_spec > 0
                && s > 0
                && n == 1
                && !b.prefill_scheduled
                && (b.num_running_entries > 0 || num_computed > 0)
                && !threshold_clips_padding
                && capacity::can_pad(num_computed, k_spec, m, s)
            {
                // "Prefer not to schedule than to schedule unpadded": the budget
                // will allow the padded shape in a later step.
                if 1 + k_spec > request_budget {
                    break;
                }
                n = 1 + k_spec;
                pad = true;
            }
            n = budgets.cap_long_prefill(n);
            if !chunked_prefill && n > request_budget {
                break;
            }
            n = n.min(request_budget);
            if n <= 0 {
                self.skip_waiting(kind, &mut skipped_waiting, &mut skipped_kv_holding);
                continue;
            }

            let ask = SlotRequest {
                num_new_tokens: n,
                num_new_computed_tokens: hit_tokens,
                new_computed_blocks: &hit_blocks,
                num_lookahead_tokens: lookahead,
                full_sequence_must_fit: reserve_full_isl,
                has_scheduled_reqs: !self.running.is_empty(),
            };
            if self.kv.allocate_slots(&mut self.requests[handle], ask).is_none() {
                break;
            }
            if looked_up {
                self.kv.record_prefix_cache_stats(&self.requests[handle], hit_tokens);
            }

            let (queue, slab) = self.queue_with_slab(kind);
            let popped = queue.pop(slab);
            debug_assert_eq!(popped, Some(handle));
            self.running.push(handle);
            let request = &mut self.requests[handle];
            request.queued_in = None;
            let entry_kind =
                if request.status == RequestStatus::Preempted { EntryKind::Resumed } else { EntryKind::New };
            request.status = RequestStatus::Running;
            request.set_num_computed_tokens(num_computed);
            let num_spec = if pad { k_spec } else { 0 };
            if pad {
                b.step.spec_token_ids.extend(std::iter::repeat_n(-1, k_spec as usize));
            }
            Self::commit::<false>(
                &self.config,
                budgets,
                b,
                request,
                Entry {
                    handle,
                    num_new_tokens: n,
                    num_computed_before: num_computed,
                    num_spec,
                    kind: entry_kind,
                    cached_blocks_before: 0,
                },
            );
        }

        // Skipped requests go back to the front, in their original order.
        self.kv_holding_waiting.prepend_all(&self.requests, &skipped_kv_holding);
        self.waiting.prepend_all(&self.requests, &skipped_waiting);
        for &h in skipped_kv_holding.iter().chain(&skipped_waiting) {
            let request = &mut self.requests[h];
            request.queued_in =
                Some(if request.num_computed_tokens() > 0 { QueueKind::KvHolding } else { QueueKind::Waiting });
        }
    }

    fn skip_waiting(
        &mut self,
        kind: QueueKind,
        skipped_waiting: &mut Vec<Handle>,
        skipped_kv_holding: &mut Vec<Handle>,
    ) {
        let (queue, slab) = self.queue_with_slab(kind);
        let handle = queue.pop(slab).expect("peeked");
        // Still "waiting" for counts while it is set aside in this step.
        self.requests[handle].queued_in = None;
        if self.requests[handle].num_computed_tokens() > 0 {
            skipped_kv_holding.push(handle);
        } else {
            skipped_waiting.push(handle);
        }
    }
}
