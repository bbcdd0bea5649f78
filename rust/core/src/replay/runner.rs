//! The replay's model runner: per request, what a GPU runner knows to be true (tokens,
//! computed positions, the drafts it proposed), and what each step samples. It keeps no
//! token rows or block tables: a replay needs only the counts and the tokens sampled.
//! The Python runner (`llmsched.sim.SimulatedModelRunner`) keeps all of it and asserts
//! what vLLM's runner asserts; the tests check this one against it.

use rustc_hash::FxHashMap;

use crate::error::{CoreError, CoreResult};
use crate::replay::tokens::TokenModel;
use crate::scheduler::step::Step;
use crate::slab::Handle;

#[derive(Clone, Debug)]
struct Row {
    key: u64,
    /// Tokens known to be true: prompt and sampled outputs.
    num_tokens: i64,
    /// Positions whose KV is computed.
    num_computed: i64,
    /// The drafts proposed at the last sample, for the indices from `num_tokens` on (async
    /// scheduling keeps them here); `-1`s when there are none.
    drafts: Vec<i32>,
}

/// What one step sampled, as the scheduler's update reads it.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    pub token_ids: Vec<i32>,
    pub counts: Vec<i32>,
    /// Synchronous spec decode: the requests that sampled and their `K` drafts each.
    pub draft_requests: Vec<Handle>,
    pub draft_token_ids: Vec<i32>,
}

#[derive(Clone, Debug)]
pub struct Runner {
    tokens: TokenModel,
    rows: FxHashMap<Handle, Row>,
    num_spec: usize,
    is_async: bool,
    max_model_len: i64,
}

fn broken(reason: String) -> CoreError {
    CoreError::mismatch(format!("the replay's runner: {reason}"))
}

impl Runner {
    pub fn new(tokens: TokenModel, num_spec: usize, is_async: bool, max_model_len: i64) -> Self {
        Self { tokens, rows: FxHashMap::default(), num_spec, is_async, max_model_len }
    }

    /// Runs `step`: forgets finished requests, drops preempted ones' drafts, loads new and
    /// resumed ones, then samples for every request whose step reaches the end of its
    /// known tokens: one token and the leading drafts that equal `T`.
    pub fn execute(&mut self, step: &Step, request_id: impl Fn(Handle) -> Option<u64>) -> CoreResult<Sampled> {
        for (handle, _) in &step.finished {
            self.rows.remove(handle);
        }
        for (handle, _) in &step.preempted {
            if let Some(row) = self.rows.get_mut(handle) {
                row.drafts.fill(-1);
            }
        }
        let mut out = Sampled { counts: Vec::with_capacity(step.len()), ..Sampled::default() };
        let mut spec_offset = 0;
        for (i, &handle) in step.req_handles.iter().enumerate() {
            let (n, k) = (i64::from(step.num_scheduled_tokens[i]), i64::from(step.num_spec_tokens[i]));
            let num_all = step.num_all_token_ids.get(i).copied().unwrap_or(0);
            if num_all > 0 {
                let key = request_id(handle).ok_or_else(|| broken(format!("row {i} is not a live request")))?;
                let row = Row {
                    key,
                    num_tokens: i64::from(num_all),
                    num_computed: i64::from(step.num_computed_tokens[i]),
                    drafts: vec![-1; self.num_spec],
                };
                self.rows.insert(handle, row);
            }
            let row = self
                .rows
                .get_mut(&handle)
                .ok_or_else(|| broken(format!("row {i} is scheduled but neither new nor resumed nor held")))?;
            let start = row.num_computed;
            let known_end = start + n - k;
            if known_end > row.num_tokens || n < 1 {
                return Err(broken(format!(
                    "row {i}: n={n} with {k} draft slots after {start} computed of {} tokens",
                    row.num_tokens
                )));
            }
            let slots = spec_offset..spec_offset + k as usize;
            spec_offset += k as usize;
            let mut accepted = 0;
            for (offset, slot) in slots.enumerate() {
                let index = row.num_tokens + offset as i64;
                let draft = if self.is_async { row.drafts[offset] } else { step.spec_token_ids[slot] };
                if draft != self.tokens.target(row.key, index) {
                    break;
                }
                accepted += 1;
            }
            let samples = known_end >= row.num_tokens;
            let count = if samples { accepted + 1 } else { 0 };
            if row.num_tokens + count > self.max_model_len && count > 0 {
                return Err(broken(format!(
                    "row {i}: sampled tokens exceed max_model_len ({} > {})",
                    row.num_tokens + count,
                    self.max_model_len
                )));
            }
            out.token_ids
                .extend((row.num_tokens..row.num_tokens + count).map(|index| self.tokens.target(row.key, index)));
            out.counts.push(count as i32);
            row.num_tokens += count;
            row.num_computed = start + n - (k - accepted);
            if samples && self.num_spec > 0 {
                for (offset, draft) in row.drafts.iter_mut().enumerate() {
                    *draft = self.tokens.proposal(row.key, row.num_tokens + offset as i64);
                }
                if !self.is_async {
                    out.draft_requests.push(handle);
                    out.draft_token_ids.extend_from_slice(&row.drafts);
                }
            }
        }
        Ok(out)
    }
}
