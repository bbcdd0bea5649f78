//! The replay's model runner: per request, what a GPU runner knows to be true (tokens,
//! computed positions, the drafts it proposed), and what each step samples. It keeps no
//! token rows or block tables: a replay needs only the counts and the tokens sampled. It
//! checks what a runner can see of the scheduler's contract (the scheduler's computed
//! count against its own, where draft slots sit, room for the sampled tokens); the Python
//! runner (`llmsched.sim.SimulatedModelRunner`) keeps everything and asserts all that
//! vLLM's runner asserts, and the tests hold this one against it.

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

/// The runner's settings, from the scheduler's config.
#[derive(Clone, Copy, Debug)]
pub struct RunnerConfig {
    /// `K`, the draft slots a request may be given.
    pub num_spec: usize,
    /// `s`: tokens sampled per step (0 for a pooling model, which samples none).
    pub num_sampled: i64,
    pub is_async: bool,
    /// `M`.
    pub max_model_len: i64,
}

#[derive(Clone, Debug)]
pub struct Runner {
    tokens: TokenModel,
    config: RunnerConfig,
    rows: FxHashMap<Handle, Row>,
}

/// A request the replay knows: the key its tokens hash, and its id for messages.
pub trait Requests {
    fn key(&self, handle: Handle) -> Option<u64>;
    fn id(&self, handle: Handle) -> &str;
}

fn broken_contract(requests: &impl Requests, handle: Handle, what: String) -> CoreError {
    CoreError::Invariant { reason: format!("the replay's runner, request {:?}: {what}", requests.id(handle)) }
}

impl Runner {
    pub fn new(tokens: TokenModel, config: RunnerConfig) -> Self {
        Self { tokens, config, rows: FxHashMap::default() }
    }

    pub fn tokens(&self) -> &TokenModel {
        &self.tokens
    }

    /// Runs `step`: forgets finished requests, drops preempted ones' drafts, loads new and
    /// resumed ones, then samples for every request whose step reaches the end of its
    /// known tokens: one token and the leading drafts that equal `T`.
    pub fn execute(&mut self, step: &Step, requests: &impl Requests) -> CoreResult<Sampled> {
        let RunnerConfig { num_spec, num_sampled, is_async, max_model_len } = self.config;
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
            let scheduler_computed = i64::from(step.num_computed_tokens[i]);
            let num_all = step.num_all_token_ids.get(i).copied().unwrap_or(0);
            if num_all > 0 {
                let key = requests.key(handle).ok_or_else(|| {
                    broken_contract(requests, handle, "scheduled, but the replay holds no such request".into())
                })?;
                let row = Row {
                    key,
                    num_tokens: i64::from(num_all),
                    num_computed: scheduler_computed,
                    drafts: vec![-1; num_spec],
                };
                self.rows.insert(handle, row);
            }
            let Some(row) = self.rows.get_mut(&handle) else {
                return Err(broken_contract(
                    requests,
                    handle,
                    "scheduled, but neither new nor resumed nor held".into(),
                ));
            };
            let start = row.num_computed;
            // The scheduler's C is optimistic under async scheduling (in-flight drafts count
            // as accepted), never behind the truth; in sync mode the two agree.
            if scheduler_computed < start || (!is_async && scheduler_computed != start) {
                let what = format!("the scheduler's num_computed_tokens {scheduler_computed}, the runner's {start}");
                return Err(broken_contract(requests, handle, what));
            }
            let known_end = start + n - k;
            let samples = known_end >= row.num_tokens && num_sampled > 0;
            if n < 1 || known_end > row.num_tokens || (k > 0 && known_end != row.num_tokens) {
                let what =
                    format!("n={n} with {k} draft slots after {start} computed of {} known tokens", row.num_tokens);
                return Err(broken_contract(requests, handle, what));
            }
            let slots = spec_offset..spec_offset + k as usize;
            spec_offset += k as usize;
            let mut accepted = 0;
            for (offset, slot) in slots.enumerate() {
                let draft = if is_async { row.drafts[offset] } else { step.spec_token_ids[slot] };
                if draft != self.tokens.target(row.key, row.num_tokens + offset as i64) {
                    break;
                }
                accepted += 1;
            }
            let count = if samples { accepted + num_sampled } else { 0 };
            if count > 0 && row.num_tokens + count > max_model_len {
                let what = format!("sampled tokens exceed max_model_len: {} > {max_model_len}", row.num_tokens + count);
                return Err(broken_contract(requests, handle, what));
            }
            out.token_ids
                .extend((row.num_tokens..row.num_tokens + count).map(|index| self.tokens.target(row.key, index)));
            out.counts.push(count as i32);
            row.num_tokens += count;
            row.num_computed = start + n - (k - accepted);
            if samples && num_spec > 0 {
                for (offset, draft) in row.drafts.iter_mut().enumerate() {
                    *draft = self.tokens.proposal(row.key, row.num_tokens + offset as i64);
                }
                if !is_async {
                    out.draft_requests.push(handle);
                    out.draft_token_ids.extend_from_slice(&row.drafts);
                }
            }
        }
        Ok(out)
    }
}
