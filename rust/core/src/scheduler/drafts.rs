//! Drafts for the next step under synchronous scheduling (spec §4.7): a runner's drafter
//! hands them in after each step's output, and the next `schedule()` verifies them.

use crate::error::{CoreError, CoreResult};
use crate::request::{Request, RequestStatus};
use crate::scheduler::{RequestRef, Scheduler};
use crate::slab::Handle;

/// The rows of a drafts call once checked: each row's live request (None for an id not
/// live), and the first row whose request could not take its drafts yet.
struct DraftRows {
    handles: Vec<Option<Handle>>,
    ahead_of_step: Option<(usize, Handle)>,
}

impl Scheduler {
    /// Sync drafts for the next step (spec §4.7), flat: `num_draft_tokens[i]` ids of
    /// `draft_token_ids`, in order, are the drafts of `request_ids[i]`. Ids not live
    /// are ignored; drafts of a request still in prefill are dropped, and so are drafts
    /// of a request that is not running (preempted or waiting: vLLM keeps them, and a
    /// resumed request would then schedule drafts made before its preemption). With
    /// synchronous scheduling, drafts for a running request whose step is still in flight
    /// are refused (vLLM accepts them and breaks `C = N - 1`, see
    /// `would_schedule_drafts_ahead`). Nothing changes unless every row is valid.
    pub fn update_draft_token_ids(
        &mut self,
        request_ids: &[&str],
        draft_token_ids: &[i64],
        num_draft_tokens: &[i64],
    ) -> CoreResult<()> {
        let requests: Vec<RequestRef<'_>> = request_ids.iter().map(|&id| RequestRef::Id(id)).collect();
        self.update_draft_token_ids_of(&requests, draft_token_ids, num_draft_tokens)
    }

    /// `update_draft_token_ids` with each request given by handle or by id: a caller that
    /// keeps the handles (the binding, by id object) skips hashing the ids. The drafts are
    /// `i64` (from Python ints) or `i32` (a runner's int32 array, taken as it is).
    pub fn update_draft_token_ids_of<T: Copy + Into<i64>>(
        &mut self,
        request_ids: &[RequestRef<'_>],
        draft_token_ids: &[T],
        num_draft_tokens: &[i64],
    ) -> CoreResult<()> {
        let rows = self.check_draft_rows(request_ids, num_draft_tokens, draft_token_ids.len())?;
        check_draft_ids(draft_token_ids, num_draft_tokens)?;
        if let Some((row, handle)) = rows.ahead_of_step {
            return Err(self.drafts_while_in_flight(row, handle));
        }
        let mut start = 0;
        let diffusion = self.config.is_diffusion();
        for (handle, &count) in rows.handles.into_iter().zip(num_draft_tokens) {
            let drafts = &draft_token_ids[start..start + count as usize];
            start += count as usize;
            let Some(h) = handle else { continue };
            let request = &mut self.requests[h];
            request.spec_token_ids.clear();
            if !request.is_prefill_chunk && request.status == RequestStatus::Running {
                // A diffusion drafter proposes the model's whole canvas: the request's may be
                // narrower (vLLM's DiffusionScheduler trims it).
                let drafts =
                    if diffusion { &drafts[..drafts.len().min(request.canvas_length as usize)] } else { drafts };
                // In range (checked above).
                request.spec_token_ids.extend(drafts.iter().map(|&t| t.into() as i32));
            }
        }
        Ok(())
    }

    /// The rows of a drafts call, checked: one count per id, each id once, each count in
    /// `[0, K]`, the counts adding up to the `num_drafts` given. Returns each row's live
    /// request, and the first row whose request could not take its drafts yet (reported
    /// once the drafts themselves are known to be valid).
    fn check_draft_rows(
        &self,
        request_ids: &[RequestRef<'_>],
        num_draft_tokens: &[i64],
        num_drafts: usize,
    ) -> CoreResult<DraftRows> {
        if request_ids.len() != num_draft_tokens.len() {
            return Err(CoreError::request(
                "draft_token_ids",
                format!("<{} rows>", num_draft_tokens.len()),
                format!(
                    "must have one row of drafts (one num_draft_tokens count) per request id ({} ids)",
                    request_ids.len()
                ),
            ));
        }
        // One lookup per id; duplicates found by slot (and, for ids not live, by name).
        let mut handles = Vec::with_capacity(request_ids.len());
        let mut ahead_of_step = None;
        let mut seen = vec![false; self.requests.num_slots()];
        let mut seen_unknown = rustc_hash::FxHashSet::default();
        let mut total: i64 = 0;
        let per_request = self.config.drafts_per_request_limit();
        // Only a synchronous scheduler with a step in flight can be handed drafts too early
        // (with none in flight, the usual case, no request is asked).
        let may_be_ahead = !self.config.async_scheduling() && !self.in_flight.is_empty();
        for (i, (request, &count)) in request_ids.iter().zip(num_draft_tokens).enumerate() {
            let handle = self.live_handle(request);
            let first = match handle {
                Some(h) => !std::mem::replace(&mut seen[h.index as usize], true),
                None => seen_unknown.insert(self.request_name(request)),
            };
            if !first {
                return Err(CoreError::request(
                    format!("req_ids[{i}]"),
                    format!("{:?}", self.request_name(request)),
                    "appears twice",
                ));
            }
            handles.push(handle);
            if count < 0 {
                return Err(CoreError::request(
                    format!("draft_token_ids[{i}]"),
                    format!("<{count} drafts>"),
                    "a count of drafts cannot be negative",
                ));
            }
            if !per_request.allows(count as usize) {
                return Err(per_request.too_long(format!("draft_token_ids[{i}]"), count as usize));
            }
            if may_be_ahead && count > 0 && ahead_of_step.is_none() {
                ahead_of_step = handle.filter(|&h| self.would_schedule_drafts_ahead(&self.requests[h])).map(|h| (i, h));
            }
            total += count;
        }
        if total != num_drafts as i64 {
            return Err(CoreError::request(
                "num_draft_tokens",
                format!("<sum {total}>"),
                format!("must add up to the {num_drafts} draft ids given"),
            ));
        }
        Ok(DraftRows { handles, ahead_of_step })
    }

    /// Whether drafts given to `request` now would be scheduled by the next step ahead of
    /// the tokens they follow (sync scheduling): the request runs, past its prompt, with a
    /// step in flight. That step's output is the token the drafts continue; a step
    /// scheduled before it arrives would give the drafts the positions after `N`, where
    /// the sampled token belongs, and leave `C != N - 1` once both outputs are applied
    /// (vLLM 0.33 accepts such drafts and ends in that state).
    fn would_schedule_drafts_ahead(&self, request: &Request) -> bool {
        request.status == RequestStatus::Running && !request.is_prefill_chunk && request.num_in_flight_tokens() > 0
    }

    /// The refusal of drafts given, in row `row`, to a request whose step is in flight.
    #[cold]
    fn drafts_while_in_flight(&self, row: usize, handle: Handle) -> CoreError {
        let id = &self.requests[handle].id;
        let step = self.in_flight.iter().rev().find(|r| r.entries.iter().any(|e| e.handle == handle));
        CoreError::request(
            format!("req_ids[{row}]"),
            format!("{id:?}"),
            format!(
                "drafts for a request whose step {} is still in flight: with synchronous scheduling, hand \
                 drafts in after update_from_output has applied that step (the token they follow)",
                step.map_or_else(|| "?".to_string(), |r| r.step_id.to_string())
            ),
        )
    }
}

/// Every draft is a token id or the drafter's -1 padding (kept, and rejected by the sampler
/// like vLLM does); the error names the row and column of the first that is not.
fn check_draft_ids<T: Copy + Into<i64>>(draft_token_ids: &[T], num_draft_tokens: &[i64]) -> CoreResult<()> {
    // t is in [-1, 2^31) exactly when t + 1, as an unsigned number, is at most 2^31: one
    // pass without an early exit, which the compiler vectorizes; the position only on error.
    let out_of_range = |t: T| (t.into() as u64).wrapping_add(1) > 1 << 31;
    if draft_token_ids.iter().fold(false, |any, &t| any | out_of_range(t)) {
        let at = draft_token_ids.iter().position(|&t| out_of_range(t)).expect("a draft out of range");
        let (i, j) = row_and_column(num_draft_tokens, at);
        return Err(CoreError::request(
            format!("draft_token_ids[{i}][{j}]"),
            draft_token_ids[at].into(),
            format!("a draft must be a token id in [0, {}] or the -1 placeholder", i32::MAX),
        ));
    }
    Ok(())
}

/// The (row, column) of flat index `at` in rows of `counts` items each (counts
/// checked non-negative and adding up past `at`).
fn row_and_column(counts: &[i64], mut at: usize) -> (usize, usize) {
    for (row, &count) in counts.iter().enumerate() {
        if at < count as usize {
            return (row, at);
        }
        at -= count as usize;
    }
    unreachable!("the counts add up to the number of drafts")
}
