//! The waiting loop (spec §3.3): admit waiting requests while budgets, the
//! active-request cap and free KV allow; skip a blocked request, break where
//! vLLM breaks (spec §3.4).

use crate::capacity;
use crate::config::SchedulerConfig;
use crate::kv::{CacheHit, SlotRequest};
use crate::request::{QueueKind, Request, RequestStatus};
use crate::scheduler::step::{Budgets, Entry, EntryKind, KvLoad, StepBuilder};
use crate::scheduler::{external_kv, ExternalKv, ExternalMatch, PauseState, Scheduler};
use crate::slab::Handle;

/// The config values the waiting loop reads for every request it considers.
struct AdmissionRules {
    /// `M`: the longest a request grows (`max_request_len`).
    m: i64,
    s: i64,
    k_spec: i64,
    lookahead: i64,
    splits_prompts: bool,
    reserve_full_isl: bool,
    max_active: usize,
    /// A one-token admission may be padded to `1 + K` (`pad_spec_decode`, unless the
    /// long-prefill threshold would clip the padded step).
    pads: bool,
    /// `L`: a chunk ends this far before the prompt's end, or at it.
    prefill_lookahead: i64,
    /// A prompt chunk ends where an aligned Mamba state can be cached.
    mamba_aligned: bool,
}

impl AdmissionRules {
    fn new(config: &SchedulerConfig, budgets: &Budgets) -> Self {
        let k_spec = config.num_speculative_tokens();
        // #54028: a threshold below 1 + K would clip a padded step after padding.
        let threshold_clips_padding = budgets.cap_long_prefill(1 + k_spec) < 1 + k_spec;
        Self {
            m: config.max_request_len(),
            s: config.num_sampled_tokens_per_step(),
            k_spec,
            lookahead: config.num_lookahead_tokens(),
            splits_prompts: config.splits_prompts(),
            reserve_full_isl: config.scheduler_reserve_full_isl(),
            max_active: config.max_num_active_seqs() as usize,
            pads: config.pad_spec_decode() && !threshold_clips_padding,
            prefill_lookahead: config.num_prefill_lookahead_tokens(),
            mamba_aligned: config.mamba_aligned(),
        }
    }
}

/// The waiting loop's decision for the request at the front of its queue.
enum Admission {
    /// Admit it with `n` tokens, padded to `1 + K` (draft placeholders) when `pad`.
    Tokens { n: i64, pad: bool },
    /// Set it aside for this step; consider the next one.
    Skip,
    /// Admit nothing more in this step.
    Stop,
}

/// What a prefix-cache lookup found for a request: the hit blocks and their tokens, and
/// the request's `C` once admitted. A request that arrived with computed tokens keeps
/// them and does not look up.
struct PrefixHit {
    looked_up: bool,
    /// Every group's hit blocks, group after group.
    blocks: Vec<u32>,
    tokens: i64,
    /// Tokens past the hit a KV connector loads (-1: the request held computed tokens, so
    /// nothing was asked; 0 without a connector).
    external: i64,
    num_computed: i64,
    shared_prefix_boundary: i64,
}

/// The request at the front of a waiting queue, and what the prefix cache holds of it.
struct Candidate {
    kind: QueueKind,
    handle: Handle,
    hit: PrefixHit,
}

/// vLLM's `max_loras` rule: the adapters of every running request, scheduled in this step
/// or not, and of those admitted in it, at most `max_loras` of them. A waiting request
/// under another adapter is set aside once the set is full. The running requests' set is
/// read when the first request under an adapter is considered (never without LoRA).
struct LoraSlots {
    max_loras: usize,
    in_use: Option<Vec<u32>>,
}

impl LoraSlots {
    fn new(config: &SchedulerConfig) -> Self {
        Self { max_loras: config.max_loras() as usize, in_use: None }
    }

    /// Whether a request under `lora_id` may be admitted now.
    fn admits(&mut self, lora_id: u32, running: &[Handle], requests: &crate::slab::Slab) -> bool {
        let in_use = self.in_use.get_or_insert_with(|| super::distinct_adapters(requests, running.iter().copied()));
        in_use.len() < self.max_loras || in_use.contains(&lora_id)
    }

    /// Records an admitted request's adapter (`admits` was asked first).
    fn admitted(&mut self, lora_id: u32) {
        let in_use = self.in_use.as_mut().expect("admits() read the running requests' adapters");
        if !in_use.contains(&lora_id) {
            in_use.push(lora_id);
        }
    }
}

/// Requests set aside in this step, by the queue they return to.
#[derive(Default)]
struct SetAside {
    waiting: Vec<Handle>,
    kv_holding: Vec<Handle>,
}

impl Scheduler {
    pub(super) fn schedule_waiting(
        &mut self,
        b: &mut StepBuilder,
        budgets: &mut Budgets,
        mut external_kv: Option<&mut dyn ExternalKv>,
    ) {
        let rules = AdmissionRules::new(&self.config, budgets);
        let mut set_aside = SetAside::default();
        let mut lora_slots = LoraSlots::new(&self.config);
        while budgets.has_room() {
            let Some((kind, handle)) = self.next_waiting(rules.max_active) else {
                break;
            };
            let status = self.requests[handle].status;
            match status {
                RequestStatus::WaitingForRemoteKvs if !self.requests[handle].kv_loaded => {
                    self.set_aside(kind, &mut set_aside);
                    continue;
                }
                RequestStatus::WaitingForRemoteKvs => self.promote_loaded(handle),
                RequestStatus::WaitingForStructuredOutputGrammar if !self.grammar_gate(handle) => {
                    self.set_aside(kind, &mut set_aside);
                    continue;
                }
                RequestStatus::WaitingForStreamingReq => {
                    self.set_aside(kind, &mut set_aside);
                    continue;
                }
                _ => {}
            }
            let request = &self.requests[handle];
            // Output from before a preemption is still in flight: resuming now
            // would interleave it with the recomputed stream.
            if request.num_stale_output_tokens() > 0 && !request.drop_stale_output {
                self.set_aside(kind, &mut set_aside);
                continue;
            }
            let lora_id = request.lora_id;
            if let Some(id) = lora_id {
                if !lora_slots.admits(id, &self.running, &self.requests) {
                    self.set_aside(kind, &mut set_aside);
                    continue;
                }
            }
            if request.is_resumable() {
                self.rehash_session(handle);
            }
            let request = &self.requests[handle];
            let max_hit = match b.aux_outputs.as_deref_mut() {
                Some(aux) if request.num_computed_tokens() == 0 => Some(aux.max_cache_hit(request, self.kv.pool())),
                _ => None,
            };
            let mut hit = self.look_up_prefix(request, max_hit);
            self.kv.report_reused_blocks(request, &hit.blocks);
            let mut load_async = false;
            if let Some(source) = external_kv.as_deref_mut() {
                if request.num_computed_tokens() == 0 && !request.restarted_after_kv_load_failure {
                    let matched = source.num_new_matched_tokens(request, hit.tokens);
                    let Some(mut external) = external_kv::external_tokens(request, hit.tokens, matched) else {
                        self.set_aside(kind, &mut set_aside);
                        continue;
                    };
                    if let Some(aux) = b.aux_outputs.as_deref_mut() {
                        let kept = aux
                            .cap_external_hit(request, hit.tokens, external.tokens, self.kv.pool())
                            .clamp(0, external.tokens);
                        external = ExternalMatch { tokens: kept, load_async: external.load_async && kept > 0 };
                    }
                    hit.external = external.tokens;
                    hit.num_computed += external.tokens;
                    load_async = external.load_async;
                } else {
                    hit.external = -1;
                }
            }
            // Its encoder outputs are still in transit to the encoder-cache connector.
            if request.has_mm_inputs
                && b.external_encoder
                    .as_deref_mut()
                    .is_some_and(|ec| !ec.ensure_cache_available(request, hit.num_computed))
            {
                self.set_aside(kind, &mut set_aside);
                continue;
            }
            if load_async {
                // Blocks now, tokens once the load is in: it waits in the meantime.
                if !self.start_kv_load(b, &rules, Candidate { kind, handle, hit }) {
                    break;
                }
                self.set_aside(kind, &mut set_aside);
                continue;
            }
            let prompt_left = hit.num_computed < request.num_tokens() - 1;
            if b.defer_prefills && prompt_left {
                break;
            }
            match Self::tokens_to_admit(b, budgets, &rules, request, hit.num_computed) {
                Admission::Tokens { mut n, pad } => {
                    if rules.mamba_aligned {
                        // (A lookup sets the junction; a request admitted without one keeps its own.)
                        let junction =
                            if hit.looked_up { hit.shared_prefix_boundary } else { request.shared_prefix_boundary };
                        n = super::mamba_aligned_split(&self.config, request, hit.num_computed, n, junction);
                        // No aligned chunk fits the budget: admissions stop, as vLLM's. (A
                        // padded decode starts on a block boundary here, sessions being
                        // refused beside drafts: the split leaves its rows whole.)
                        if n == 0 {
                            break;
                        }
                    }
                    // A chunk stops before an input it cannot have encoded in this step.
                    let (n, plan) = if request.has_mm_inputs {
                        let (n, plan) = self.plan_encoder_inputs(
                            handle,
                            hit.num_computed,
                            n,
                            b.encoder_budget,
                            b.external_encoder.as_deref_mut(),
                        );
                        (n, Some(plan))
                    } else {
                        (n, None)
                    };
                    let n = if rules.prefill_lookahead > 1 {
                        let request = &self.requests[handle];
                        super::reserve_prefill_lookahead(request, hit.num_computed, n, rules.prefill_lookahead)
                    } else {
                        n
                    };
                    if n == 0 {
                        self.set_aside(kind, &mut set_aside);
                        continue;
                    }
                    let candidate = Candidate { kind, handle, hit };
                    // Where vLLM would wait forever (deviation 15): nothing runs, and waiting
                    // requests hold the blocks. One behind that can run goes first; else those
                    // set aside give their KV back; else, if it holds every block in use
                    // itself, it gives its own back and waits its turn again.
                    let mut admitted = self.admit(b, budgets, &rules, &candidate, n, pad);
                    if !admitted && self.running.is_empty() {
                        if self.runnable_kv_holder_behind(handle) {
                            self.pass_over(kind, handle, plan.is_some(), &mut set_aside);
                            continue;
                        }
                        admitted = self.release_set_aside_kv(&mut set_aside)
                            && self.admit(b, budgets, &rules, &candidate, n, pad);
                        if !admitted && self.holds_every_used_block(handle) {
                            self.pass_over(kind, handle, plan.is_some(), &mut set_aside);
                            self.release_set_aside_kv(&mut set_aside);
                            continue;
                        }
                    }
                    if !admitted {
                        if plan.is_some() {
                            self.release_encoder_inputs(handle);
                        }
                        break;
                    }
                    if let Some(plan) = plan {
                        self.commit_encoder_plan(b, handle, plan);
                    }
                    b.prefill_admitted |= prompt_left;
                    if let Some(id) = lora_id {
                        lora_slots.admitted(id);
                    }
                }
                Admission::Skip => self.set_aside(kind, &mut set_aside),
                Admission::Stop => break,
            }
        }
        self.put_back(set_aside);
    }

    /// The request the waiting loop considers next and its queue: those holding KV first,
    /// the others only when admissions are not paused. None once the active-request cap
    /// is reached.
    fn next_waiting(&mut self, max_active: usize) -> Option<(QueueKind, Handle)> {
        let kind = if !self.kv_holding_waiting.is_empty() {
            QueueKind::KvHolding
        } else if self.pause_state == PauseState::Unpaused {
            QueueKind::Waiting
        } else {
            return None;
        };
        let (queue, slab) = self.queue_with_slab(kind);
        let handle = queue.peek(slab)?;
        // A session paused for input is not running but holds a model-runner slot.
        if self.running.len() + self.num_waiting_for_streaming_input >= max_active {
            return None;
        }
        Some((kind, handle))
    }

    /// New and preempted requests look up the prefix cache; a request that arrived with
    /// computed tokens keeps them.
    fn look_up_prefix(&self, request: &Request, max_hit: Option<i64>) -> PrefixHit {
        let looked_up = request.num_computed_tokens() == 0 && !request.skip_reading_prefix_cache;
        let hit = match max_hit {
            _ if !looked_up => CacheHit::default(),
            Some(max_length) => self.kv.get_computed_blocks_within(request, max_length),
            None => self.kv.get_computed_blocks(request),
        };
        let num_computed = if looked_up { hit.tokens } else { request.num_computed_tokens() };
        PrefixHit {
            looked_up,
            blocks: hit.blocks,
            tokens: hit.tokens,
            external: 0,
            num_computed,
            shared_prefix_boundary: hit.shared_prefix_boundary,
        }
    }

    /// How many tokens a request with `num_computed` tokens computed is admitted with:
    /// the rest of its known tokens, within the capacity rule, padded to the uniform
    /// decode shape when it has one left (spec §3.3), capped by the long-prefill threshold
    /// and the request budget.
    fn tokens_to_admit(
        b: &StepBuilder,
        budgets: &Budgets,
        rules: &AdmissionRules,
        request: &Request,
        num_computed: i64,
    ) -> Admission {
        let AdmissionRules { m, s, k_spec, .. } = *rules;
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
            && rules.pads
            && capacity::can_pad(num_computed, k_spec, m, s)
        {
            // "Prefer not to schedule than to schedule unpadded": the budget
            // will allow the padded shape in a later step.
            if 1 + k_spec > request_budget {
                return Admission::Stop;
            }
            n = 1 + k_spec;
            pad = true;
        }
        n = budgets.cap_long_prefill(n);
        if !rules.splits_prompts && n > request_budget {
            return Admission::Stop;
        }
        n = n.min(request_budget);
        if n <= 0 {
            return Admission::Skip;
        }
        Admission::Tokens { n, pad }
    }

    /// Allocates the request's KV and commits its admission to the step: out of its queue,
    /// running, with its prefix hit and `n` tokens (and `K` draft placeholders when
    /// padded). False, changing nothing, if the blocks cannot be allocated.
    fn admit(
        &mut self,
        b: &mut StepBuilder,
        budgets: &mut Budgets,
        rules: &AdmissionRules,
        candidate: &Candidate,
        n: i64,
        pad: bool,
    ) -> bool {
        let Candidate { kind, handle, ref hit } = *candidate;
        if self.requests[handle].num_computed_tokens() == 0 {
            // Where a sliding-window group keeps blocks for hits (vLLM sets it at each lookup;
            // read only once admitted).
            self.requests[handle].shared_prefix_boundary = hit.shared_prefix_boundary;
        }
        let ask = SlotRequest {
            num_new_tokens: n,
            num_new_computed_tokens: hit.tokens,
            new_computed_blocks: &hit.blocks,
            num_external_computed_tokens: hit.external.max(0),
            num_lookahead_tokens: rules.lookahead,
            full_sequence_must_fit: rules.reserve_full_isl,
            has_scheduled_reqs: !self.running.is_empty(),
            reserved_blocks: 0,
            delay_caching: false,
        };
        if self.kv.allocate_slots(&mut self.requests[handle], ask).is_none() {
            return false;
        }
        if self.config.kv_connector() && hit.num_computed + n < self.requests[handle].num_tokens() {
            self.inflight_prefills.insert(handle);
        }
        if hit.looked_up {
            self.kv.record_prefix_cache_stats(&self.requests[handle], hit.tokens);
        }

        let (queue, slab) = self.queue_with_slab(kind);
        let popped = queue.pop(slab);
        debug_assert_eq!(popped, Some(handle));
        self.running.push(handle);
        let request = &mut self.requests[handle];
        request.queued_in = None;
        if request.skipped_waiting {
            request.skipped_waiting = false;
            self.num_skipped_waiting -= 1;
        }
        let entry_kind = if request.status == RequestStatus::Preempted { EntryKind::Resumed } else { EntryKind::New };
        request.status = RequestStatus::Running;
        request.set_num_computed_tokens(hit.num_computed);
        request.restarted_after_kv_load_failure = false;
        if self.config.kv_connector() {
            b.step.external_computed_tokens.push(hit.external as i32);
        }
        let num_spec = if pad { rules.k_spec } else { 0 };
        if pad {
            b.step.spec_token_ids.extend(std::iter::repeat_n(-1, rules.k_spec as usize));
        }
        Self::commit::<false>(
            &self.config,
            budgets,
            b,
            request,
            Entry {
                handle,
                num_new_tokens: n,
                num_computed_before: hit.num_computed,
                num_spec,
                kind: entry_kind,
                cached_blocks_before: 0,
            },
        );
        true
    }

    /// Starts a request's asynchronous KV load: blocks for its hit and the loaded tokens,
    /// none for tokens to compute and none for a drafter's lookahead, kept out of the
    /// prefix cache until the load is in, and only if the requests still prefilling keep
    /// room to finish. The request then waits in WAITING_FOR_REMOTE_KVS with `C` set to
    /// what it will hold (vLLM's waiting loop with `load_kv_async`). False, changing
    /// nothing, if the blocks cannot be allocated.
    fn start_kv_load(&mut self, b: &mut StepBuilder, rules: &AdmissionRules, candidate: Candidate) -> bool {
        let Candidate { handle, hit, .. } = candidate;
        let ask = SlotRequest {
            num_new_tokens: 0,
            num_new_computed_tokens: hit.tokens,
            new_computed_blocks: &hit.blocks,
            num_external_computed_tokens: hit.external,
            num_lookahead_tokens: 0,
            full_sequence_must_fit: rules.reserve_full_isl,
            has_scheduled_reqs: !self.running.is_empty(),
            reserved_blocks: self.kv_load_reserved_blocks(),
            delay_caching: true,
        };
        let request = &mut self.requests[handle];
        if self.kv.allocate_slots(request, ask).is_none() {
            return false;
        }
        request.shared_prefix_boundary = hit.shared_prefix_boundary;
        if hit.looked_up {
            self.kv.record_prefix_cache_stats(request, hit.tokens);
        }
        request.status = RequestStatus::WaitingForRemoteKvs;
        request.set_num_computed_tokens(hit.num_computed);
        b.step.kv_loads.push(KvLoad {
            request_id: request.id().clone(),
            num_external_tokens: hit.external as i32,
            num_admitted_before: b.step.external_computed_tokens.len() as u32,
        });
        self.inflight_prefills.insert(handle);
        true
    }

    /// Whether a request queued behind `candidate` (which the blocks cannot be found for)
    /// holds its KV and can run: a session with its next input taken up, or a request whose
    /// load is in. With nothing running, only such a request could free blocks, and vLLM's
    /// loop, stopping at the candidate, never reaches it. (A request whose load brought its
    /// only prompt token holds its blocks with nothing computed: it queues among the
    /// others, as in vLLM, and counts while they are served.)
    #[cold]
    fn runnable_kv_holder_behind(&self, candidate: Handle) -> bool {
        let runnable = |h: Handle| h != candidate && (self.holds_kv_to_run(h) || self.requests[h].kv_loaded);
        let waiting_served = self.pause_state == PauseState::Unpaused;
        self.kv_holding_waiting.live_handles(&self.requests).into_iter().any(runnable)
            || (waiting_served && self.waiting.live_handles(&self.requests).into_iter().any(runnable))
    }

    /// Whether the waiting request `handle` holds KV blocks and can run (its load is in, or
    /// a session's next input is taken up): not a load in flight, nor a session waiting for
    /// input (its client may end it).
    fn holds_kv_to_run(&self, handle: Handle) -> bool {
        let r = &self.requests[handle];
        !r.block_ids.is_empty() && matches!(r.status, RequestStatus::Waiting | RequestStatus::Preempted)
    }

    /// Whether the waiting request `handle` holds KV and could run, and holds every block in
    /// use: nothing else could ever free one. (A session paused with aligned Mamba state
    /// holds the state its last step read, which its next step would free: counted, as
    /// vLLM counts it, when the admission asks room for its whole sequence.)
    #[cold]
    fn holds_every_used_block(&self, handle: Handle) -> bool {
        if !self.holds_kv_to_run(handle) {
            return false;
        }
        let request = &self.requests[handle];
        let mut held: Vec<u32> = (0..request.num_block_tables())
            .flat_map(|g| request.group_block_ids(g).iter().copied())
            .filter(|&block| block != 0)
            .collect();
        held.sort_unstable();
        held.dedup();
        held.len() + self.kv.num_free_blocks() == self.config.num_gpu_blocks() as usize - 1
    }

    /// For a request the blocks cannot be found for while nothing runs and no holder behind
    /// it can run: the requests set aside in this step that hold KV and could run (each needs
    /// more than is free, or they would have run) give it back, as preempted, and compute it
    /// again once admitted; they go back ahead of the other waiting requests. Without this
    /// they would wait for each other forever. Returns whether one did.
    #[cold]
    fn release_set_aside_kv(&mut self, set_aside: &mut SetAside) -> bool {
        let mut holders = Vec::new();
        for list in [&mut set_aside.kv_holding, &mut set_aside.waiting] {
            let (held, kept): (Vec<Handle>, Vec<Handle>) = list.iter().partition(|&&h| self.holds_kv_to_run(h));
            holders.extend(held);
            *list = kept;
        }
        if holders.is_empty() {
            return false;
        }
        for &h in &holders {
            self.free_blocks_of(h);
            self.inflight_prefills.remove(&h);
            let request = &mut self.requests[h];
            request.set_num_computed_tokens(0);
            request.num_preemptions += 1;
            let id = request.id.clone();
            self.preempted_since_last_step.push((h, id));
            self.stats.num_preemptions += 1;
        }
        set_aside.waiting.splice(0..0, holders);
        true
    }

    /// Passes over the candidate `handle` (the front of `kind`'s queue) in this step: the
    /// encoder inputs planned for it (`planned`) go back, and it is set aside.
    fn pass_over(&mut self, kind: QueueKind, handle: Handle, planned: bool, set_aside: &mut SetAside) {
        if planned {
            self.release_encoder_inputs(handle);
        }
        self.set_aside(kind, set_aside);
    }

    /// Takes the front request of `kind`'s queue out for this step.
    fn set_aside(&mut self, kind: QueueKind, set_aside: &mut SetAside) {
        let (queue, slab) = self.queue_with_slab(kind);
        let handle = queue.pop(slab).expect("peeked");
        // Still "waiting" for counts while it is set aside in this step.
        let request = &mut self.requests[handle];
        request.queued_in = None;
        if !request.skipped_waiting {
            request.skipped_waiting = true;
            self.num_skipped_waiting += 1;
        }
        if self.requests[handle].holds_kv_blocks() {
            set_aside.kv_holding.push(handle);
        } else {
            set_aside.waiting.push(handle);
        }
    }

    /// Requests set aside go back to the front of their queues, in their original order.
    fn put_back(&mut self, set_aside: SetAside) {
        self.kv_holding_waiting.prepend_all(&self.requests, &set_aside.kv_holding);
        self.waiting.prepend_all(&self.requests, &set_aside.waiting);
        for &h in set_aside.kv_holding.iter().chain(&set_aside.waiting) {
            let request = &mut self.requests[h];
            request.queued_in = Some(if request.holds_kv_blocks() { QueueKind::KvHolding } else { QueueKind::Waiting });
        }
    }
}
