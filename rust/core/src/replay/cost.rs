//! What a simulated step costs: the step's shape (what it asks of the model) and the
//! cost model's terms per count of it. `llmsched.sim.cost` documents each term and
//! `llmsched.steps` the shape; `llmsched calibrate` fits the terms to a real engine.

use rustc_hash::FxHashSet;

use crate::scheduler::step::Step;

/// What a step asks of the model, in the counts the cost model charges for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub prefill_requests: i64,
    /// Requests the runner sets up: new or resumed.
    pub new_requests: i64,
    /// Requests the runner lets go: finished since the step before.
    pub finished_requests: i64,
    pub prefill_tokens: i64,
    /// Positions the prefill tokens attend to: a chunk of `n` after `C` computed, `n*C + n*(n+1)/2`.
    pub prefill_attention: i64,
    pub decode_requests: i64,
    /// Decode requests with one output token so far (their first decode).
    pub first_decodes: i64,
    /// Context the decode requests read, `C + n` each.
    pub decode_context: i64,
    /// KV blocks in use as the step runs.
    pub kv_blocks: i64,
}

impl StepShape {
    /// The shape of `step`, with `kv_blocks` in use right after it was decided.
    pub fn of(step: &Step, kv_blocks: usize) -> Self {
        let columns = StepColumns {
            num_scheduled_tokens: &step.num_scheduled_tokens,
            num_computed_tokens: &step.num_computed_tokens,
            num_spec_tokens: &step.num_spec_tokens,
            num_output_tokens: &step.num_output_tokens,
        };
        Self::from_columns(columns, step.new_reqs.len() + step.resumed_reqs.len(), step.finished.len(), kv_blocks)
            .expect("a step's columns are aligned")
    }

    /// The shape of a step given by its columns (one entry per scheduled request), the
    /// requests it sets up (new or resumed) and lets go (finished), and `kv_blocks` in use.
    /// A request decodes when it is scheduled one token beyond its draft slots, and
    /// prefills otherwise. `None` when the columns differ in length.
    pub fn from_columns(
        columns: StepColumns<'_>,
        new_requests: usize,
        finished_requests: usize,
        kv_blocks: usize,
    ) -> Option<Self> {
        let StepColumns { num_scheduled_tokens, num_computed_tokens, num_spec_tokens, num_output_tokens } = columns;
        let len = num_scheduled_tokens.len();
        if [num_computed_tokens.len(), num_spec_tokens.len(), num_output_tokens.len()] != [len; 3] {
            return None;
        }
        let mut shape = Self {
            new_requests: new_requests as i64,
            finished_requests: finished_requests as i64,
            kv_blocks: kv_blocks as i64,
            ..Self::default()
        };
        for i in 0..len {
            let n = i64::from(num_scheduled_tokens[i]);
            let c = i64::from(num_computed_tokens[i]);
            if n - i64::from(num_spec_tokens[i]) == 1 {
                shape.decode_requests += 1;
                shape.first_decodes += i64::from(num_output_tokens[i] == 1);
                shape.decode_context = shape.decode_context.saturating_add(c + n);
            } else {
                shape.prefill_requests += 1;
                shape.prefill_tokens = shape.prefill_tokens.saturating_add(n);
                // Saturating: the columns may come from Python, any int32 at all.
                shape.prefill_attention = shape.prefill_attention.saturating_add(n * c + n * (n + 1) / 2);
            }
        }
        Some(shape)
    }

    /// The counts by name, in the order of [`StepShape`]'s fields.
    pub fn named(&self) -> [(&'static str, i64); 9] {
        let names = [
            "prefill_requests",
            "new_requests",
            "finished_requests",
            "prefill_tokens",
            "prefill_attention",
            "decode_requests",
            "first_decodes",
            "decode_context",
            "kv_blocks",
        ];
        let counts = [
            self.prefill_requests,
            self.new_requests,
            self.finished_requests,
            self.prefill_tokens,
            self.prefill_attention,
            self.decode_requests,
            self.first_decodes,
            self.decode_context,
            self.kv_blocks,
        ];
        std::array::from_fn(|i| (names[i], counts[i]))
    }

    /// The counts in the order of the cost model's terms after `fixed_ms`.
    fn counts(&self) -> [i64; 9] {
        self.named().map(|(_, count)| count)
    }

    /// The requests and tokens the step schedules (a decode: one token): its batch shape.
    pub fn scheduled(&self) -> (i64, i64) {
        (self.prefill_requests + self.decode_requests, self.prefill_tokens + self.decode_requests)
    }
}

/// A step's columns, one entry per scheduled request (as [`Step`] holds them).
#[derive(Clone, Copy, Debug)]
pub struct StepColumns<'a> {
    pub num_scheduled_tokens: &'a [i32],
    pub num_computed_tokens: &'a [i32],
    pub num_spec_tokens: &'a [i32],
    pub num_output_tokens: &'a [i32],
}

/// The cost model's terms, in milliseconds, in the order of [`StepCost::TERMS`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    pub terms: [f64; StepCost::TERMS.len()],
}

impl StepCost {
    /// The terms' names: `fixed_ms`, one per count of [`StepShape`] in its order, the
    /// engine's per-arrival, per-intake, wake-up and new-shape terms, then the scheduler's
    /// own time per step, per request and per token scheduled (`llmsched.sim.cost.TERMS`).
    pub const TERMS: [&'static str; 17] = [
        "fixed_ms",
        "prefill_request_ms",
        "new_request_ms",
        "finished_request_ms",
        "prefill_token_ms",
        "prefill_attention_ms",
        "decode_request_ms",
        "first_decode_ms",
        "decode_context_ms",
        "kv_block_ms",
        "add_request_ms",
        "add_batch_ms",
        "wake_ms",
        "new_shape_ms",
        "scheduler_step_ms",
        "scheduler_request_ms",
        "scheduler_token_ms",
    ];
    const ADD_REQUEST: usize = Self::index("add_request_ms");
    const ADD_BATCH: usize = Self::index("add_batch_ms");
    const WAKE: usize = Self::index("wake_ms");
    const NEW_SHAPE: usize = Self::index("new_shape_ms");
    const SCHEDULER: usize = Self::index("scheduler_step_ms");

    /// Where `name` is in [`Self::TERMS`], found at compile time: a term added or moved
    /// moves the indices with it.
    const fn index(name: &str) -> usize {
        let mut i = 0;
        while i < Self::TERMS.len() {
            if const_str_eq(Self::TERMS[i], name) {
                return i;
            }
            i += 1;
        }
        panic!("not a cost term");
    }

    /// The engine's work to take in one arriving request, in seconds.
    pub fn add_request_seconds(&self) -> f64 {
        self.terms[Self::ADD_REQUEST] / 1000.0
    }

    /// The engine's work, beyond each request's, to take in the requests that arrived
    /// since its last step, in seconds: once per batch of arrivals, whatever its size.
    pub fn add_batch_seconds(&self) -> f64 {
        self.terms[Self::ADD_BATCH] / 1000.0
    }

    /// An idle engine's wake-up for an arrival, in seconds.
    pub fn wake_seconds(&self) -> f64 {
        self.terms[Self::WAKE] / 1000.0
    }

    /// The engine's cost of a step of `shape`, the scheduler's left out, in ms.
    pub fn shape_ms(&self, shape: &StepShape) -> f64 {
        let charged: f64 = shape.counts().iter().zip(&self.terms[1..]).map(|(&count, term)| term * count as f64).sum();
        self.terms[0] + charged
    }

    /// The scheduler's own time in a step of `shape`, in ms.
    pub fn scheduler_ms(&self, shape: &StepShape) -> f64 {
        let (requests, tokens) = shape.scheduled();
        let [step, request, token] = [0, 1, 2].map(|i| self.terms[Self::SCHEDULER + i]);
        step + request * requests as f64 + token * tokens as f64
    }

    /// The duration of a step of `shape` on an engine that has run `shapes_run` (which
    /// then holds this step's shape too), in seconds; an empty step costs nothing.
    pub fn step_seconds(&self, shape: &StepShape, shapes_run: &mut ShapesRun) -> f64 {
        let (requests, _) = shape.scheduled();
        if requests == 0 {
            return 0.0;
        }
        let mut ms = self.shape_ms(shape) + self.scheduler_ms(shape);
        if shapes_run.first_run(shape) {
            ms += self.terms[Self::NEW_SHAPE];
        }
        ms / 1000.0
    }
}

/// `a == b`, in a const context (where `str`'s `==` is not yet callable).
const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The batch shapes an engine has run (requests and tokens scheduled): a step of a shape
/// not run before costs `new_shape_ms` more. The engine is taken as warmed up with every
/// one-request step of 1 to `warm_up_tokens` tokens (what `llmsched calibrate` and
/// `replay-engine` run first: `llmsched.sim.cost.warm_up_token_counts`).
#[derive(Clone, Debug, Default)]
pub struct ShapesRun {
    warm_up_tokens: i64,
    seen: FxHashSet<(i64, i64)>,
}

impl ShapesRun {
    pub fn warmed_up(warm_up_tokens: i64) -> Self {
        Self { warm_up_tokens, seen: FxHashSet::default() }
    }

    /// Whether a step of `shape` is the first of its batch shape; it has run from now on.
    pub fn first_run(&mut self, shape: &StepShape) -> bool {
        let (requests, tokens) = shape.scheduled();
        let warm = requests == 1 && (1..=self.warm_up_tokens).contains(&tokens);
        !warm && self.seen.insert((requests, tokens))
    }
}
