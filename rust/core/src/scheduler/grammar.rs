//! Structured output: the scheduler's side of vLLM's grammar wait. The engine compiles a
//! request's grammar (in the background); the scheduler passes the request over, without
//! blocking the requests behind it, until told the outcome, and acts on it only when its
//! waiting loop reaches the request (vLLM's `_handle_blocked_waiting_request`): a compiled
//! grammar makes the request an ordinary waiting one, a failed one fails the request at
//! the next update. The steps name the rows whose next token the grammar constrains.

use std::sync::Arc;

use crate::error::{CoreError, CoreResult};
use crate::request::{Grammar, RequestStatus};
use crate::scheduler::step::Step;
use crate::scheduler::{RequestRef, Scheduler};
use crate::slab::Handle;

impl Scheduler {
    /// The engine's word on the grammar of a request waiting for it: `compiled`, or it
    /// failed to compile. An error, changing nothing, for a request that is not live, does
    /// not use structured output, or whose grammar was already resolved.
    pub fn resolve_grammar(&mut self, request: RequestRef<'_>, compiled: bool) -> CoreResult<()> {
        let name = self.request_name(&request);
        let handle = self.live_handle(&request).ok_or(CoreError::UnknownRequest { request_id: name.clone() })?;
        let grammar = &mut self.requests[handle].grammar;
        match grammar {
            Some(Grammar::Compiling) => {
                *grammar = Some(if compiled { Grammar::Compiled } else { Grammar::Failed { seen: false } });
                Ok(())
            }
            None => {
                Err(CoreError::request("request_id", format!("{name:?}"), "the request does not use structured output"))
            }
            Some(_) => Err(CoreError::request("request_id", format!("{name:?}"), "its grammar was already resolved")),
        }
    }

    /// The waiting loop's gate for a request in `WaitingForStructuredOutputGrammar`: true
    /// once its grammar compiled (the request is `Waiting` from now on); false, to pass it
    /// over, while it compiles or once it failed (a failure seen here for the first time is
    /// queued for `finish_failed_grammars`).
    pub(super) fn grammar_gate(&mut self, handle: Handle) -> bool {
        let request = &mut self.requests[handle];
        match request.grammar {
            Some(Grammar::Compiled) => {
                request.status = RequestStatus::Waiting;
                true
            }
            Some(Grammar::Failed { seen: false }) => {
                request.grammar = Some(Grammar::Failed { seen: true });
                self.grammar_failures.push(handle);
                false
            }
            _ => false,
        }
    }

    /// Fails (`FinishedError`) the requests whose grammar did not compile and that a waiting
    /// loop reached since the last call, as vLLM's `update_from_output` does; returns their
    /// handles and ids. Requests finished meanwhile are skipped. Their final records are then
    /// `take_last_finished`'s.
    pub fn finish_failed_grammars(&mut self) -> Vec<(Handle, Arc<str>)> {
        if self.grammar_failures.is_empty() {
            return Vec::new();
        }
        let failed: Vec<RequestRef<'_>> =
            std::mem::take(&mut self.grammar_failures).into_iter().map(RequestRef::Handle).collect();
        let finished = self.finish_requests_of(Some(&failed), RequestStatus::FinishedError);
        finished.expect("FinishedError is a finished status")
    }

    /// Names the step's rows whose sampled token the grammar constrains (structured-output
    /// requests whose chunk reaches the end of their tokens), and whether one of them still
    /// awaits the output of an earlier step (async scheduling: its bitmask needs those
    /// tokens). Reads the requests only while some use structured output.
    pub(super) fn mark_structured_rows(&self, step: &mut Step, rows: &[super::step::Row]) {
        if self.num_structured_output == 0 {
            return;
        }
        let cfg = &self.config;
        for (i, row) in rows.iter().enumerate() {
            let request = &self.requests[row.handle];
            if request.grammar.is_none() || row.prefill_chunk {
                continue;
            }
            step.structured_output_rows.push(i as i32);
            // Placeholders before this step's own (commit added s + K of them).
            let own = if cfg.async_scheduling() {
                cfg.num_sampled_tokens_per_step() + i64::from(row.num_spec_tokens)
            } else {
                0
            };
            step.pending_structured_output_tokens |= request.num_output_placeholders() - own > 0;
        }
    }
}
