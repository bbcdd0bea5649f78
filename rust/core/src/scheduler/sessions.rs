//! Streaming-input sessions (vLLM's resumable requests): a stop ends the session's current
//! input, not the request. The request keeps the KV of its kept tokens and waits for its
//! next input in `WaitingForStreamingReq`, holding a model-runner slot, or takes up the
//! next input already added and waits to be admitted again (a new request to the runner,
//! starting from the KV it kept).

use crate::error::{CoreError, CoreResult};
use crate::request::{NewRequest, QueueKind, RequestStatus, SessionInput};
use crate::scheduler::Scheduler;
use crate::slab::Handle;

/// What an input added under a live session's id did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionInputAdded {
    /// The session is still on an input: this one waits its turn.
    Queued,
    /// The session was waiting for it: it is taken up, and the session waits to run.
    TakenUp,
    /// It ended a session that was waiting for input (the session finished, aborted).
    Finished,
}

impl Scheduler {
    /// An input added under the id of the live request `handle` (vLLM's `add_request` of an
    /// existing id): a resumable one is the session's next input, another ends the session.
    /// An error, changing nothing, if the request is not a session or the input is bad.
    pub(super) fn add_session_input(&mut self, handle: Handle, new: NewRequest) -> CoreResult<SessionInputAdded> {
        let request = &self.requests[handle];
        if !request.is_resumable() {
            return Err(CoreError::DuplicateRequest { request_id: new.request_id });
        }
        let input = if new.resumable { Some(SessionInput::of(&new, &self.config)?) } else { None };
        if request.status != RequestStatus::WaitingForStreamingReq {
            let session = self.requests[handle].session.as_mut().expect("resumable");
            session.queued.push_back(input);
            return Ok(SessionInputAdded::Queued);
        }
        let Some(input) = input else {
            self.finish_requests_of(Some(&[super::RequestRef::Handle(handle)]), RequestStatus::FinishedAborted)?;
            return Ok(SessionInputAdded::Finished);
        };
        self.check_session_input(handle, &input)?;
        self.take_up_input(handle, input);
        Ok(SessionInputAdded::TakenUp)
    }

    /// Whether the session `handle` can take up `input`: its tokens then stay within the
    /// prompt limit (`N <= M - s`, `M` the longest request the pool holds).
    fn check_session_input(&self, handle: Handle, input: &SessionInput) -> CoreResult<()> {
        let request = &self.requests[handle];
        let num_tokens = request.num_tokens_after(input);
        self.config.prompt_limit().check("prompt_token_ids", num_tokens as usize).map_err(|error| {
            CoreError::request(
                "prompt_token_ids",
                format!("{} tokens", input.prompt_token_ids.len()),
                format!("the session would hold {num_tokens} tokens, past its limit ({error})"),
            )
        })
    }

    /// Takes up the session's next input: its tokens join the request, which waits to run
    /// (in the queue it is in).
    fn take_up_input(&mut self, handle: Handle, input: SessionInput) {
        let hash_block_size = self.kv.hash_block_size();
        let request = &mut self.requests[handle];
        if request.status == RequestStatus::WaitingForStreamingReq {
            self.num_waiting_for_streaming_input -= 1;
        }
        request.take_session_input(input, hash_block_size);
        request.status = RequestStatus::Waiting;
        self.kv.update_block_hashes(request);
    }

    /// A stopped session goes on (vLLM's `_handle_stopped_request`): the work of its
    /// finished input still in flight is dropped, it keeps the KV of the tokens whose output
    /// is in (`C - P`), and it takes up its next input or waits for one, back in a waiting
    /// queue. False if it finishes instead: the end of the session was its next input, or
    /// that input does not fit (the caller releases it, with its stop's status).
    pub(super) fn continue_session(&mut self, handle: Handle) -> bool {
        let request = &mut self.requests[handle];
        // (Even when the session ends here: its final record shows it, as vLLM's does.)
        let frontier = request.num_computed_tokens() - request.num_output_placeholders();
        debug_assert!(frontier >= 0);
        request.set_num_computed_tokens(frontier);
        request.spec_token_ids.clear();
        request.drop_stale_output = true;
        request.set_num_stale_output_tokens(request.num_in_flight_tokens());
        request.set_num_output_placeholders(0);
        let session = request.session.as_mut().expect("a resumable request");
        let input = match session.queued.pop_front() {
            Some(None) => return false,
            Some(Some(input)) => Some(input),
            None => None,
        };
        if let Some(input) = &input {
            if self.check_session_input(handle, input).is_err() {
                return false;
            }
        }
        self.release_encoder_inputs(handle);
        // Stopped by output it was still owed while preempted: out of its queue first.
        if let Some(kind) = self.requests[handle].queued_in.take() {
            let (queue, slab) = self.queue_with_slab(kind);
            queue.remove(slab, handle);
        }
        match input {
            Some(input) => self.take_up_input(handle, input),
            None => {
                self.requests[handle].status = RequestStatus::WaitingForStreamingReq;
                self.num_waiting_for_streaming_input += 1;
            }
        }
        self.enqueue_waiting(handle);
        true
    }

    /// Puts a request that left the running queue (or its waiting queue) back into the
    /// waiting queue that fits it (vLLM's `_enqueue_waiting_request`): with the requests
    /// holding KV if it does, counted as set aside while its status blocks it.
    fn enqueue_waiting(&mut self, handle: Handle) {
        let request = &mut self.requests[handle];
        let blocked = request.status == RequestStatus::WaitingForStreamingReq;
        if blocked != request.skipped_waiting {
            request.skipped_waiting = blocked;
            if blocked {
                self.num_skipped_waiting += 1;
            } else {
                self.num_skipped_waiting -= 1;
            }
        }
        let kind = if request.holds_kv_blocks() { QueueKind::KvHolding } else { QueueKind::Waiting };
        request.queued_in = Some(kind);
        let (queue, slab) = self.queue_with_slab(kind);
        queue.add(slab, handle);
    }

    /// Whether the live request `handle` is a streaming-input session (read on a stop only).
    #[cold]
    pub(super) fn is_session(&self, handle: Handle) -> bool {
        self.requests.get(handle).is_some_and(|r| r.is_resumable())
    }

    /// A session about to recompute its KV from scratch (preempted) hashes its tokens
    /// anew: with lookahead hashes, a hash it kept may cover the sampled token its last
    /// input discarded (vLLM's waiting loop does the same).
    #[cold]
    pub(super) fn rehash_session(&mut self, handle: Handle) {
        let request = &mut self.requests[handle];
        if request.num_computed_tokens() == 0 && self.kv.hashes_look_ahead() {
            request.block_hashes.clear();
            self.kv.update_block_hashes(request);
        }
    }

    /// Paused sessions waiting for their next input: not running, but each holds a
    /// model-runner slot (vLLM's `num_waiting_for_streaming_input`).
    pub fn num_waiting_for_streaming_input(&self) -> usize {
        self.num_waiting_for_streaming_input
    }
}
