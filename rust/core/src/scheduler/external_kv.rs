//! A KV connector's part in scheduling (vLLM's `KVConnectorBase_V1`, its scheduler side):
//! a waiting request's tokens past its prefix-cache hit that the connector loads, and the
//! blocks of finished requests it may still be sending.
//!
//! The connector itself is the caller's (Python, in the plug-in): the waiting loop asks it
//! through [`ExternalKv`] at the point vLLM's loop asks, and the core keeps what follows
//! from the answer (the request's `C`, its blocks, what is held after it finishes).

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{CoreError, CoreResult};
use crate::kv::manager::cdiv;
use crate::request::{Request, RequestStatus};
use crate::scheduler::Scheduler;
use crate::slab::Handle;

/// A KV connector's answer for a waiting request (vLLM's `get_num_new_matched_tokens`
/// returns the pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExternalMatch {
    /// Tokens past the local hit the connector loads.
    pub tokens: i64,
    /// The load runs across steps: the request waits in WAITING_FOR_REMOTE_KVS, holding its
    /// blocks, until the runner reports it received (`finish_kv_transfers`).
    pub load_async: bool,
}

impl ExternalMatch {
    /// A load that is done before the step runs.
    pub fn sync(tokens: i64) -> Self {
        Self { tokens, load_async: false }
    }
}

/// What a KV connector holds of waiting requests, asked once per admission attempt of a
/// request with no computed tokens (new, or preempted), after its prefix-cache lookup.
pub trait ExternalKv {
    /// vLLM's `get_num_new_matched_tokens(request, num_computed_tokens)`: how many tokens
    /// past the first `num_local_computed` (the prefix-cache hit, whole blocks) the
    /// connector loads, and whether across steps. None when it cannot tell yet: the request
    /// is set aside for this step, as vLLM does.
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<ExternalMatch>;

    /// vLLM's `has_pending_block_frees()`: whether transfers in flight will give blocks
    /// back. Asked where the running loop would preempt a request for blocks: while it
    /// answers true, the loop preempts none and stops there, as vLLM's. No by default (vLLM's
    /// connectors but HiSparse's).
    fn has_pending_block_frees(&mut self) -> bool {
        false
    }
}

/// A finished request's KV blocks, kept from the pool until the caller releases them.
#[derive(Debug)]
pub(super) struct HeldBlocks {
    /// The request's whole block tables, one per KV-cache group (group 0's first), each in
    /// table order (a sliding window's blocks it left behind are null).
    tables: Vec<Vec<u32>>,
    /// The leading blocks of each table that hold computed tokens (`cdiv(C, block_size)`):
    /// the ones a connector sends.
    num_computed_blocks: usize,
    /// It finished while its asynchronous load was in flight: the connector may still write
    /// its blocks, which stay held until the load is reported (as vLLM delays their free).
    load_in_flight: bool,
    /// The request's `last_sched_seq` (see `defer_block_free`).
    last_sched_seq: u64,
}

/// The finished requests whose blocks are held, by id.
pub(super) type HeldKv = FxHashMap<Arc<str>, HeldBlocks>;

/// A running request a synchronous load's failure affects (see `fail_kv_loads`).
struct SyncLoadFailure {
    handle: Handle,
    /// `C` from now on: the tokens before its first failed block, or, if another request
    /// recomputes each of its failed blocks, those before the step.
    num_computed_tokens: i64,
    /// Its tokens in the step whose output is dropped.
    num_scheduled_tokens: i64,
    /// The index of the first failed block it recomputes, if any.
    first_failed_block: Option<usize>,
    /// The index of its first failed block (recomputed by it or by another request).
    first_invalid_block: usize,
    /// A later step in flight scheduled it too (its output builds on the failed KV).
    later_step_in_flight: bool,
}

/// The tokens a waiting request starts with past its local hit of `num_local` tokens, from
/// the connector's answer `matched`; None if the request waits (the connector cannot tell
/// yet). A request that skips reading cached KV (prompt logprobs) loads none and never
/// waits, though the connector was asked, as in vLLM. A synchronous answer is clamped to
/// `[0, N - 1 - num_local]`: at least one token is left to compute, the one that samples
/// (vLLM takes a negative answer as it is and asserts on one that leaves no token; see
/// docs/parity.md). An asynchronous one may cover every token, as in vLLM (the last is
/// computed again once the load is in, see `promote_loaded`); one of no token is no load.
pub(super) fn external_tokens(
    request: &Request,
    num_local: i64,
    matched: Option<ExternalMatch>,
) -> Option<ExternalMatch> {
    if request.skip_reading_prefix_cache {
        return Some(ExternalMatch::sync(0));
    }
    let matched = matched?;
    let last = if matched.load_async { request.num_tokens() } else { request.num_tokens() - 1 };
    let tokens = matched.tokens.clamp(0, (last - num_local).max(0));
    Some(ExternalMatch { tokens, load_async: matched.load_async && tokens > 0 })
}

impl Scheduler {
    /// Keeps a finished request's blocks from the pool (called instead of freeing them
    /// when a connector serves the engine).
    pub(super) fn hold_kv_blocks(&mut self, request: &mut Request) {
        // Blocks a window left behind go back first: the connector is not handed them.
        let processed = (request.num_computed_tokens() - request.num_in_flight_tokens()).max(0);
        self.kv.remove_skipped_blocks_in_groups(request, processed);
        let num_computed_blocks = cdiv(request.num_computed_tokens(), self.config.block_size()) as usize;
        let tables = self.kv.take_tables(request);
        self.held_kv.insert(
            request.id.clone(),
            HeldBlocks { tables, num_computed_blocks, load_in_flight: false, last_sched_seq: request.last_sched_seq },
        );
    }

    /// The blocks of KV-cache group `group` holding the computed tokens of finished request
    /// `request_id`, whose blocks are held (what vLLM hands its connector's
    /// `request_finished`, a list per group); None if none are held, or there is no such
    /// group.
    pub fn held_kv_blocks(&self, request_id: &str, group: usize) -> Option<&[u32]> {
        let held = self.held_kv.get(request_id)?;
        let table = held.tables.get(group)?;
        Some(&table[..held.num_computed_blocks.min(table.len())])
    }

    /// Returns the held blocks of finished requests to the pool, tail first, each table in
    /// the order given (vLLM frees them once the connector has sent them). Fails, changing
    /// nothing, if an id holds none or its load is in flight (`kv_load_in_flight`).
    pub fn release_kv_blocks(&mut self, request_ids: &[&str]) -> CoreResult<()> {
        let mut seen = rustc_hash::FxHashSet::default();
        for (i, &id) in request_ids.iter().enumerate() {
            let Some(held) = self.held_kv.get(id).filter(|_| seen.insert(id)) else {
                return Err(CoreError::request(
                    format!("request_ids[{i}]"),
                    format!("{id:?}"),
                    "holds no KV blocks: not a finished request whose blocks are held, or named twice",
                ));
            };
            if held.load_in_flight {
                return Err(CoreError::request(
                    format!("request_ids[{i}]"),
                    format!("{id:?}"),
                    "finished while its KV load was in flight: its blocks go back once the load \
                     is reported (finish_kv_transfers)",
                ));
            }
        }
        for &id in request_ids {
            let held = self.held_kv.remove(id).expect("checked above");
            self.free_held(held);
        }
        Ok(())
    }

    /// How many finished requests hold their blocks.
    pub fn num_held_kv_requests(&self) -> usize {
        self.held_kv.len()
    }

    /// Ids of the finished requests that hold their blocks, sorted.
    pub fn held_kv_request_ids(&self) -> Vec<Arc<str>> {
        let mut ids: Vec<Arc<str>> = self.held_kv.keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// Returns the blocks of a finished request to the pool: now, or, with
    /// `defer_block_free`, once the steps in flight that may still write them are applied
    /// (vLLM's `_free_request_blocks`).
    fn free_held(&mut self, held: HeldBlocks) {
        if self.written_in_flight(held.last_sched_seq) {
            self.defer_free(held.tables);
        } else {
            self.kv.free_tables(held.tables);
        }
    }

    /// Keeps a request's block `tables` from the pool until every step scheduled so far is
    /// applied; then they go back in one run, the last group's tail first (vLLM's
    /// `pop_blocks_for_free`, then `free_blocks(reversed(blocks))`).
    pub(super) fn defer_free(&mut self, tables: Vec<Vec<u32>>) {
        self.deferred_frees.push_back((self.sched_step_seq, tables.concat()));
    }

    /// With `defer_block_free`, whether a step still in flight may write the blocks of a
    /// request the step numbered `last_sched_seq` last scheduled.
    pub(super) fn written_in_flight(&self, last_sched_seq: u64) -> bool {
        self.config.defer_block_free() && last_sched_seq > self.processed_step_seq
    }

    /// A step with tokens has its output applied: the blocks whose frees waited for it go
    /// back to the pool, oldest first, each request's in one run, tail first (vLLM's
    /// `_drain_deferred_frees`).
    pub(super) fn step_applied(&mut self) {
        self.processed_step_seq += 1;
        while let Some((fence, _)) = self.deferred_frees.front() {
            if *fence > self.processed_step_seq {
                break;
            }
            let (_, blocks) = self.deferred_frees.pop_front().expect("peeked");
            self.kv.free_blocks(blocks);
        }
    }

    /// The frees that wait for steps in flight (vLLM's `deferred_frees`), oldest first:
    /// each request's blocks, in the order they will go back, with the step they wait for
    /// (see `step_seqs`).
    pub fn deferred_frees(&self) -> impl Iterator<Item = (u64, &[u32])> {
        self.deferred_frees.iter().map(|(fence, blocks)| (*fence, &blocks[..]))
    }

    /// With `defer_block_free`: the steps with tokens scheduled so far and those whose
    /// output is applied (vLLM's `sched_step_seq`, `processed_step_seq`); 0 without.
    pub fn step_seqs(&self) -> (u64, u64) {
        (self.sched_step_seq, self.processed_step_seq)
    }

    /// Whether request `request_id` waits for an asynchronous KV load the runner has not
    /// reported yet: live in WAITING_FOR_REMOTE_KVS, or finished while it was (its blocks
    /// are then held until `finish_kv_transfers` reports the load, whatever the
    /// connector says when it finishes).
    pub fn kv_load_in_flight(&self, request_id: &str) -> bool {
        match self.ids.get(request_id) {
            Some(&h) => {
                let request = &self.requests[h];
                request.status == RequestStatus::WaitingForRemoteKvs && !request.kv_loaded
            }
            None => self.held_kv.get(request_id).is_some_and(|held| held.load_in_flight),
        }
    }

    /// The runner's report of finished KV transfers (vLLM's `_update_from_kv_xfer_finished`):
    /// a request in WAITING_FOR_REMOTE_KVS whose load is `received` is promoted by the next
    /// waiting loop; a finished request's held blocks, received or `sent`, go back to the
    /// pool (received ones first, each list in its order). An id that names neither is
    /// ignored (vLLM asserts).
    pub fn finish_kv_transfers(&mut self, received: &[&str], sent: &[&str]) {
        for &id in received {
            if let Some(&h) = self.ids.get(id) {
                let request = &mut self.requests[h];
                if request.status == RequestStatus::WaitingForRemoteKvs {
                    request.kv_loaded = true;
                }
            } else if let Some(held) = self.held_kv.remove(id) {
                self.free_held(held);
            }
        }
        for &id in sent {
            if let Some(held) = self.held_kv.remove(id) {
                self.free_held(held);
            }
        }
    }

    /// The runner's report of failed KV loads (vLLM's `failed_recving` and
    /// `invalid_block_ids`), taken before the output of the oldest step in flight is
    /// applied, as vLLM takes it:
    /// - a request waiting for its load whose load failed keeps the tokens before its first
    ///   failed block (none if it failed whole) and, once the load is reported done
    ///   (`finish_kv_transfers`), computes the rest;
    /// - a running request whose computed tokens (before that step) lie in a failed block
    ///   (a synchronous load's failure) keeps the tokens before its first failed block, and
    ///   the step's output for it is dropped: its next step computes the rest. A failed
    ///   block two requests share is recomputed by the first only; the other keeps its
    ///   tokens before the step (vLLM's rule).
    ///
    /// With `recompute_kv_load_failures` off, returns the ids of the affected requests
    /// instead (their failed blocks, and those after them, leave the prefix cache): the
    /// caller finishes them with FINISHED_ERROR once the step's output is applied (vLLM's
    /// policy "fail"). Ids that name no request waiting for a load are ignored. Fails,
    /// changing nothing, for any failed block with several KV-cache groups (a block id
    /// cannot be traced to requests there; loads fail by request, as in vLLM).
    ///
    /// A running request a later step in flight scheduled too (async scheduling, pipeline
    /// stages) computed on the failed KV there: under "recompute" it is preempted, its
    /// outputs in flight dropped, its blocks from its first failed one out of the prefix
    /// cache, and its next admission asks the connector nothing (a load that fails for
    /// good would restart it forever); under "fail" it fails as above (its later output
    /// finds it gone).
    pub fn fail_kv_loads(&mut self, failed: &[&str], invalid_blocks: &[u32]) -> CoreResult<Vec<Arc<str>>> {
        if let (Some(&block), true) = (invalid_blocks.first(), self.config.kv_cache_groups().len() > 1) {
            // A block id is a block of one group's table: with several, it cannot be traced
            // back to the requests whose load failed (vLLM refuses it too).
            return Err(CoreError::request(
                "invalid_block_ids",
                block,
                "cannot be traced to requests with several KV-cache groups: a connector reports \
                 failed loads by request (failed_recving) then",
            ));
        }
        let block_size = self.config.block_size();
        let invalid: FxHashSet<u32> = invalid_blocks.iter().copied().collect();
        let sync_failures = if invalid.is_empty() { Vec::new() } else { self.sync_load_failures(&invalid)? };
        let mut affected: Vec<Handle> = Vec::new();
        for &id in failed {
            if let Some(&h) = self.ids.get(id) {
                if self.requests[h].status == RequestStatus::WaitingForRemoteKvs && !affected.contains(&h) {
                    if self.config.recompute_kv_load_failures() {
                        self.requests[h].set_num_computed_tokens(0);
                    }
                    affected.push(h);
                }
            }
        }
        if !invalid.is_empty() {
            let loading: Vec<Handle> = self
                .kv_holding_waiting
                .live_handles(&self.requests)
                .into_iter()
                .filter(|&h| self.requests[h].status == RequestStatus::WaitingForRemoteKvs)
                .collect();
            // A failed block two loads share is recomputed by the first only (vLLM's rule):
            // the other keeps its tokens but is affected still.
            let mut marked: FxHashSet<u32> = FxHashSet::default();
            for h in loading {
                let request = &mut self.requests[h];
                let num_computed_blocks = cdiv(request.num_computed_tokens(), block_size) as usize;
                let mut is_affected = false;
                let mut truncated = false;
                for index in 0..num_computed_blocks.min(request.block_ids.len()) {
                    let block = request.block_ids[index];
                    if !invalid.contains(&block) {
                        continue;
                    }
                    is_affected = true;
                    if !marked.insert(block) || truncated {
                        continue;
                    }
                    truncated = true;
                    request.set_num_computed_tokens(index as i64 * block_size);
                }
                if is_affected && !affected.contains(&h) {
                    affected.push(h);
                }
            }
        }
        let recompute = self.config.recompute_kv_load_failures();
        if recompute {
            for &h in &affected {
                self.requests[h].kv_load_failed = true;
            }
        }
        for failure in sync_failures {
            if recompute && failure.later_step_in_flight {
                // A later step in flight computed on the failed KV, and its output is on
                // its way: the request starts over (preempted, every output in flight
                // dropped), after its blocks from the first failed one leave the prefix
                // cache, so that it finds only the KV it can trust there; the connector
                // is not asked again (its load could fail the same way, for good). (vLLM
                // rewinds it in place, and applies the later step's output to it.)
                let request = &mut self.requests[failure.handle];
                self.kv.uncache_from(request, failure.first_invalid_block);
                request.restarted_after_kv_load_failure = true;
                self.running.retain(|&h| h != failure.handle);
                self.preempt(failure.handle, true);
                continue;
            }
            let request = &mut self.requests[failure.handle];
            request.set_num_computed_tokens(failure.num_computed_tokens);
            // The step's output for it is dropped, as a stale one is (`kv_load_failed` says
            // so; vLLM's `drop_stale_output` is left as it is).
            request.set_num_stale_output_tokens(failure.num_scheduled_tokens);
            request.kv_load_failed = true;
            if let Some(first) = failure.first_failed_block.filter(|_| !recompute) {
                self.kv.uncache_from(request, first);
            }
            if !affected.contains(&failure.handle) {
                affected.push(failure.handle);
            }
        }
        if recompute {
            return Ok(Vec::new());
        }
        Ok(affected.iter().map(|&h| self.requests[h].id.clone()).collect())
    }

    /// The running requests whose computed tokens before the oldest step in flight lie in
    /// a failed block, in running order, and what each keeps (vLLM's
    /// `_update_requests_with_invalid_blocks` over its running requests). Changes nothing.
    fn sync_load_failures(&self, invalid: &FxHashSet<u32>) -> CoreResult<Vec<SyncLoadFailure>> {
        let block_size = self.config.block_size();
        let scheduled: FxHashMap<Handle, i64> = self
            .in_flight
            .front()
            .map(|step| step.entries.iter().map(|e| (e.handle, e.num_new_tokens())).collect())
            .unwrap_or_default();
        let mut marked: FxHashSet<u32> = FxHashSet::default();
        let mut failures = Vec::new();
        for &h in &self.running {
            let request = &self.requests[h];
            let n = scheduled.get(&h).copied().unwrap_or(0);
            let computed_before = request.num_computed_tokens() - n;
            let num_computed_blocks = (cdiv(computed_before, block_size) as usize).min(request.block_ids.len());
            let mut first_failed_block = None;
            let mut is_affected = false;
            for (index, block) in request.block_ids[..num_computed_blocks].iter().enumerate() {
                if !invalid.contains(block) {
                    continue;
                }
                is_affected = true;
                if marked.insert(*block) && first_failed_block.is_none() {
                    first_failed_block = Some(index);
                }
            }
            if !is_affected {
                continue;
            }
            let first_invalid_block = request.block_ids[..num_computed_blocks]
                .iter()
                .position(|b| invalid.contains(b))
                .expect("an affected request has a failed block");
            failures.push(SyncLoadFailure {
                handle: h,
                num_computed_tokens: first_failed_block.map_or(computed_before, |i| i as i64 * block_size),
                num_scheduled_tokens: n,
                first_failed_block,
                first_invalid_block,
                later_step_in_flight: request.num_in_flight_tokens() > n || request.num_stale_output_tokens() != 0,
            });
        }
        Ok(failures)
    }

    /// A request finished while its load was in flight (see `kv_load_in_flight`).
    pub(super) fn hold_until_loaded(&mut self, request_id: &str) {
        if let Some(held) = self.held_kv.get_mut(request_id) {
            held.load_in_flight = true;
        }
    }

    /// A request whose asynchronous load is in: its loaded blocks enter the prefix cache,
    /// and it waits as it did before the load (`C = N - 1` if the load covered every token:
    /// the last one is computed again, to sample), vLLM's `_update_waiting_for_remote_kv`.
    pub(super) fn promote_loaded(&mut self, handle: Handle) {
        let request = &mut self.requests[handle];
        let c = request.num_computed_tokens();
        if request.kv_load_failed && c == 0 {
            // Nothing loaded: its blocks go back (a new lookup may find a prefix again).
            self.kv.free(request);
        } else {
            self.kv.cache_blocks(request, c);
        }
        if c == request.num_tokens() {
            request.set_num_computed_tokens(c - 1);
        }
        request.kv_loaded = false;
        request.kv_load_failed = false;
        request.status = if request.num_preemptions > 0 { RequestStatus::Preempted } else { RequestStatus::Waiting };
    }

    /// The blocks the requests still prefilling (chunks in progress, loads in flight) need
    /// to hold their whole sequence, plus one speculative step's: an asynchronous load must
    /// leave them free, so it never deadlocks the requests admitted before it (vLLM's
    /// `_inflight_prefill_reserved_blocks() + _spec_decode_step_blocks`).
    pub(super) fn kv_load_reserved_blocks(&self) -> usize {
        let block_size = self.config.block_size();
        let k = self.config.num_speculative_tokens();
        // 1 + K + L slots a speculative step takes past the sequence.
        let spec_step = if k > 0 { 1 + k + self.config.num_lookahead_tokens() } else { 0 };
        let several_groups = self.config.kv_cache_groups().len() > 1;
        let remaining = |h: &Handle| {
            let request = &self.requests[*h];
            let tokens = request.num_tokens().min(self.config.max_model_len()) + spec_step;
            if several_groups {
                return self.kv.remaining_blocks_in_groups(request, tokens);
            }
            (cdiv(tokens, block_size) - request.block_ids.len() as i64).max(0) as usize
        };
        self.inflight_prefills.iter().map(remaining).sum::<usize>() + self.config.spec_step_blocks() as usize
    }

    /// Every held block once per table that holds it (for the invariant checker).
    pub(super) fn held_kv_tables(&self) -> impl Iterator<Item = &[u32]> {
        self.held_kv.values().flat_map(|held| held.tables.iter().map(|t| &t[..]))
    }
}
