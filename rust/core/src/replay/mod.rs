//! A workload replayed in virtual time: the engine loop behind `llmsched simulate`.
//!
//! Requests arrive at their trace times; the scheduler (every decision its own) is driven
//! as vLLM's `EngineCore` drives it, synchronously or with a batch queue of two under
//! async scheduling; a runner without a model samples reproducible tokens
//! ([`tokens::TokenModel`]); and every step advances a virtual clock by what the cost model
//! says it costs ([`cost::StepCost`]). A request's tokens are stamped with the end of the
//! step that produced them.
//!
//! It lives here, not in Python, for speed: a simulated step is a few microseconds of
//! Rust, where the Python engine loop and runner (`llmsched.sim.Engine`,
//! `SimulatedModelRunner`) spend a few hundred, so a replay runs a thousand times faster
//! than the engine it simulates. The Python loop stays as the checker: the tests replay
//! workloads through both and compare every request's times.

pub mod cost;
mod runner;
pub mod tokens;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::config::SchedulerConfig;
use crate::error::{CoreError, CoreResult};
use crate::request::{NewRequest, RequestStatus};
use crate::scheduler::step::Step;
use crate::scheduler::{RequestEvent, RequestRef, RunnerOutput, Scheduler};
use crate::slab::Handle;
use cost::{ShapesRun, StepCost, StepShape};
use runner::{Requests, Runner, RunnerConfig, Sampled};
use tokens::{prompt_tokens, TokenModel};

/// Steps in flight under async scheduling (vLLM's batch queue without pipeline parallelism).
pub const BATCH_QUEUE_SIZE: usize = 2;
/// The replay stops with an error after this many steps in a row that schedule nothing
/// while nothing is in flight: the scheduler's state can no longer change.
pub const MAX_IDLE_STEPS: u32 = 3;

/// One request of a workload.
#[derive(Clone, Debug)]
pub struct ReplayRequest {
    pub request_id: String,
    /// When it arrives, in virtual seconds.
    pub arrival_time: f64,
    pub prompt_len: usize,
    pub output_len: i64,
    /// Seeds the prompt's own tokens ([`tokens::prompt_tokens`]).
    pub key: u64,
    /// Mooncake `hash_ids`: the prompt's shared blocks.
    pub prefix_blocks: Vec<u64>,
}

/// The simulated model's settings.
#[derive(Clone, Copy, Debug)]
pub struct ReplayOptions {
    pub seed: u64,
    pub vocab_size: u32,
    /// The probability that the model accepts a draft token.
    pub acceptance_rate: f64,
    /// Check the scheduler's invariants after every `schedule` and every update.
    pub check_invariants: bool,
    /// The engine is warmed up with a one-request step of every token count up to this
    /// ([`ShapesRun`]).
    pub warm_up_tokens: i64,
}

/// What happened to one request, in virtual seconds (NaN for what has not happened).
#[derive(Clone, Copy, Debug)]
pub struct RequestTimes {
    pub scheduled: f64,
    pub first_token: f64,
    pub finished: f64,
    pub num_output: i64,
    pub preemptions: i64,
    /// The final status once finished.
    pub status: Option<RequestStatus>,
}

/// The scheduler's state at each executed step (empty ones included), as it started.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub time: Vec<f64>,
    pub kv_usage: Vec<f64>,
    pub running: Vec<u32>,
    pub waiting: Vec<u32>,
}

/// A request that has arrived and not finished: where it is in the workload, and the key
/// its tokens hash.
#[derive(Clone, Copy, Debug)]
struct Live {
    index: u32,
    key: u64,
}

/// The live requests, as the runner asks about them.
struct Known<'a> {
    live: &'a FxHashMap<Handle, Live>,
    requests: &'a [ReplayRequest],
}

impl Requests for Known<'_> {
    fn key(&self, handle: Handle) -> Option<u64> {
        self.live.get(&handle).map(|live| live.key)
    }

    fn id(&self, handle: Handle) -> &str {
        self.live.get(&handle).map_or("(not live)", |live| self.requests[live.index as usize].request_id.as_str())
    }
}

/// A step executed and not yet applied, with its sampled tokens and when it ended.
struct InFlight {
    step: Step,
    sampled: Sampled,
    end: f64,
}

pub struct Replay {
    scheduler: Scheduler,
    cost: StepCost,
    shapes_run: ShapesRun,
    runner: Runner,
    options: ReplayOptions,
    requests: Vec<ReplayRequest>,
    times: Vec<RequestTimes>,
    live: FxHashMap<Handle, Live>,
    next_arrival: usize,
    num_finished: usize,
    clock: f64,
    batch_queue: VecDeque<InFlight>,
    num_steps: u64,
    idle_steps: u32,
    scheduler_time: Duration,
    timeline: Timeline,
}

impl Replay {
    /// A replay of `requests` (in arrival order) under `config` and `cost`.
    pub fn new(
        config: Arc<SchedulerConfig>,
        cost: StepCost,
        requests: Vec<ReplayRequest>,
        options: ReplayOptions,
    ) -> CoreResult<Self> {
        if config.is_diffusion() {
            // Its runner samples and drafts; it does not denoise a canvas.
            return Err(CoreError::config(
                "num_sampled_tokens_per_step",
                0,
                format!(
                    "with num_speculative_tokens={} is a diffusion LLM, which the replay's model does not run",
                    config.num_speculative_tokens()
                ),
            ));
        }
        if let Some(i) = requests.windows(2).position(|w| w[1].arrival_time < w[0].arrival_time) {
            let r = &requests[i + 1];
            return Err(CoreError::request(
                "arrival_time",
                r.arrival_time,
                format!(
                    "request {:?} arrives before the one listed before it: requests go in arrival order",
                    r.request_id
                ),
            ));
        }
        if let Some(r) = requests.iter().find(|r| !(r.arrival_time.is_finite() && r.arrival_time >= 0.0)) {
            return Err(CoreError::request(
                "arrival_time",
                r.arrival_time,
                format!("request {:?}: must be finite and >= 0", r.request_id),
            ));
        }
        if let Some(r) = requests.iter().find(|r| r.prompt_len as i64 > config.max_model_len()) {
            return Err(CoreError::request(
                "prompt_len",
                r.prompt_len,
                format!("request {:?}: longer than max_model_len={}", r.request_id, config.max_model_len()),
            ));
        }
        if !(0.0..=1.0).contains(&options.acceptance_rate) {
            return Err(CoreError::request("acceptance_rate", options.acceptance_rate, "must be in [0, 1]"));
        }
        if !(2..=i32::MAX as u32).contains(&options.vocab_size) {
            return Err(CoreError::request("vocab_size", options.vocab_size, "must be in [2, 2**31 - 1]"));
        }
        if options.warm_up_tokens < 0 {
            return Err(CoreError::request("warm_up_tokens", options.warm_up_tokens, "must be >= 0"));
        }
        if let Some((i, _)) = cost.terms.iter().enumerate().find(|(_, t)| !(t.is_finite() && **t >= 0.0)) {
            return Err(CoreError::request(StepCost::TERMS[i], cost.terms[i], "must be finite and >= 0"));
        }
        let scheduler = Scheduler::new(Arc::clone(&config))?;
        let tokens = TokenModel::new(options.seed, options.vocab_size, options.acceptance_rate);
        let runner = Runner::new(
            tokens,
            RunnerConfig {
                num_spec: config.num_speculative_tokens() as usize,
                num_sampled: config.num_sampled_tokens_per_step(),
                is_async: config.async_scheduling(),
                max_model_len: config.max_model_len(),
            },
        );
        let unset = RequestTimes {
            scheduled: f64::NAN,
            first_token: f64::NAN,
            finished: f64::NAN,
            num_output: 0,
            preemptions: 0,
            status: None,
        };
        Ok(Self {
            shapes_run: ShapesRun::warmed_up(options.warm_up_tokens),
            scheduler,
            cost,
            runner,
            options,
            times: vec![unset; requests.len()],
            requests,
            live: FxHashMap::default(),
            next_arrival: 0,
            num_finished: 0,
            clock: 0.0,
            batch_queue: VecDeque::new(),
            num_steps: 0,
            idle_steps: 0,
            scheduler_time: Duration::ZERO,
            timeline: Timeline::default(),
        })
    }

    /// The virtual clock, in seconds.
    pub fn clock(&self) -> f64 {
        self.clock
    }

    /// Requests that have arrived (the first ones of the workload).
    pub fn num_arrived(&self) -> usize {
        self.next_arrival
    }

    pub fn num_finished(&self) -> usize {
        self.num_finished
    }

    /// Steps scheduled (and executed), empty ones included.
    pub fn num_steps(&self) -> u64 {
        self.num_steps
    }

    /// Wall time spent in the scheduler's `schedule` and `update_from_output`.
    pub fn scheduler_time(&self) -> Duration {
        self.scheduler_time
    }

    /// The scheduler, for its counters.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Each request's times, in the workload's order.
    pub fn times(&self) -> &[RequestTimes] {
        &self.times
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Whether every request has arrived and finished, and no step is in flight.
    pub fn is_done(&self) -> bool {
        self.next_arrival == self.requests.len() && !self.scheduler.has_requests() && self.batch_queue.is_empty()
    }

    /// Replays for about `wall` of real time (at least one pass of its loop), or to the end;
    /// returns whether the replay is done. On an error the replay cannot go on.
    pub fn run_for(&mut self, wall: Duration) -> CoreResult<bool> {
        let started = Instant::now();
        while !self.is_done() {
            self.advance()?;
            if started.elapsed() >= wall {
                break;
            }
        }
        Ok(self.is_done())
    }

    /// Takes in the requests that have arrived by now, then runs one engine step (or, with
    /// nothing to do, moves the clock to the next arrival).
    fn advance(&mut self) -> CoreResult<()> {
        let first = self.next_arrival;
        while self.next_arrival < self.requests.len() && self.requests[self.next_arrival].arrival_time <= self.clock {
            if self.is_idle() {
                // An idle engine wakes up for the arrival: its next step starts cold.
                self.clock += self.cost.wake_seconds();
            }
            self.arrive()?;
            // The engine's own work to take the request in delays the next step.
            self.clock += self.cost.add_request_seconds();
        }
        if self.next_arrival > first {
            self.clock += self.cost.add_batch_seconds();
        }
        if self.is_idle() {
            if let Some(next) = self.requests.get(self.next_arrival) {
                self.clock = self.clock.max(next.arrival_time);
            }
            return Ok(());
        }
        if self.scheduler.config().async_scheduling() {
            self.step_async()?;
        } else {
            self.step_sync()?;
        }
        if self.idle_steps >= MAX_IDLE_STEPS {
            let (running, waiting) = self.scheduler.get_request_counts();
            return Err(CoreError::Invariant {
                reason: format!(
                    "the replay made no progress in {} steps with nothing in flight ({running} running, {waiting} \
                     waiting requests)",
                    self.idle_steps
                ),
            });
        }
        Ok(())
    }

    fn is_idle(&self) -> bool {
        !self.scheduler.has_requests() && self.batch_queue.is_empty()
    }

    fn arrive(&mut self) -> CoreResult<()> {
        let index = self.next_arrival;
        let spec = &self.requests[index];
        let prompt = prompt_tokens(spec.key, spec.prompt_len, &spec.prefix_blocks, self.options.vocab_size)?;
        let new = NewRequest {
            arrival_time: Some(spec.arrival_time),
            ..NewRequest::new(spec.request_id.clone(), prompt, spec.output_len)
        };
        let key = self.runner.tokens().request_key(&spec.request_id);
        let handle = self.scheduler.add_request(new)?;
        self.live.insert(handle, Live { index: index as u32, key });
        self.next_arrival += 1;
        Ok(())
    }

    /// `EngineCore.step`: schedule, execute, apply, hand the drafts back.
    fn step_sync(&mut self) -> CoreResult<()> {
        let flight = self.schedule_and_execute()?;
        let had_tokens = flight.step.total_num_scheduled_tokens > 0;
        let delivered = self.apply(&flight)?;
        if !flight.sampled.draft_requests.is_empty() {
            let requests: Vec<RequestRef<'_>> =
                flight.sampled.draft_requests.iter().map(|&h| RequestRef::Handle(h)).collect();
            let k = self.scheduler.config().num_speculative_tokens();
            let counts = vec![k; requests.len()];
            self.scheduler.update_draft_token_ids_of(&requests, &flight.sampled.draft_token_ids, &counts)?;
        }
        self.note_idle(had_tokens || delivered, false);
        Ok(())
    }

    /// `EngineCore.step_with_batch_queue` on a busy GPU: step *t + 1* is scheduled before
    /// step *t*'s output is applied.
    fn step_async(&mut self) -> CoreResult<()> {
        if self.batch_queue.len() < BATCH_QUEUE_SIZE && self.scheduler.has_requests() {
            let in_flight = self.batch_queue.iter().any(|f| f.step.total_num_scheduled_tokens > 0);
            let flight = self.schedule_and_execute()?;
            let had_tokens = flight.step.total_num_scheduled_tokens > 0;
            self.batch_queue.push_back(flight);
            if had_tokens && self.batch_queue.len() < BATCH_QUEUE_SIZE && self.scheduler.has_requests() {
                self.idle_steps = 0;
                return Ok(()); // the GPU is busy: schedule the next step before waiting on this one
            }
            let oldest = self.batch_queue.pop_front().expect("a step was just queued");
            let delivered = self.apply(&oldest)?;
            self.note_idle(had_tokens || delivered, in_flight);
            return Ok(());
        }
        if let Some(oldest) = self.batch_queue.pop_front() {
            self.apply(&oldest)?;
        }
        Ok(())
    }

    fn note_idle(&mut self, progressed: bool, in_flight: bool) {
        if progressed || in_flight {
            self.idle_steps = 0;
        } else {
            self.idle_steps += 1;
        }
    }

    /// Schedules a step and runs it: the clock moves by its cost, and the scheduler's state
    /// as it starts goes on the timeline.
    fn schedule_and_execute(&mut self) -> CoreResult<InFlight> {
        let started = Instant::now();
        let step = self.scheduler.schedule();
        self.scheduler_time += started.elapsed();
        self.num_steps += 1;
        if self.options.check_invariants {
            self.scheduler.check_invariants()?;
        }
        let start = self.clock;
        for handle in &step.new_reqs {
            if let Some(live) = self.live.get(handle) {
                self.times[live.index as usize].scheduled = start;
            }
        }
        for (handle, _) in &step.preempted {
            if let Some(live) = self.live.get(handle) {
                self.times[live.index as usize].preemptions += 1;
            }
        }
        let (running, waiting) = self.scheduler.get_request_counts();
        self.timeline.time.push(start);
        self.timeline.kv_usage.push(self.scheduler.kv_cache_usage());
        self.timeline.running.push(running as u32);
        self.timeline.waiting.push(waiting as u32);
        let shape = StepShape::of(&step, self.scheduler.num_used_blocks());
        self.clock += self.cost.step_seconds(&shape, &mut self.shapes_run);
        let known = Known { live: &self.live, requests: &self.requests };
        let sampled = self.runner.execute(&step, &known)?;
        Ok(InFlight { step, sampled, end: self.clock })
    }

    /// Applies a step's output, its tokens and finishes stamped with the step's end;
    /// returns whether it delivered any.
    fn apply(&mut self, flight: &InFlight) -> CoreResult<bool> {
        let out = RunnerOutput {
            sampled_token_ids: &flight.sampled.token_ids,
            num_sampled: &flight.sampled.counts,
            row_of_entry: None,
        };
        let started = Instant::now();
        let mut delivered = false;
        let times = &mut self.times;
        let live = &mut self.live;
        let end = flight.end;
        let mut num_finished = 0;
        let on_event = |event: RequestEvent| {
            delivered = true;
            let Some(live_request) = live.get(&event.handle) else { return };
            let record = &mut times[live_request.index as usize];
            if event.num_tokens > 0 {
                if record.num_output == 0 {
                    record.first_token = end;
                }
                record.num_output += event.num_tokens as i64;
            }
            if event.status.is_finished() {
                record.finished = end;
                record.status = Some(event.status);
                live.remove(&event.handle);
                num_finished += 1;
            }
        };
        self.scheduler.update_from_output_with(flight.step.step_id, &out, on_event, None)?;
        self.num_finished += num_finished;
        self.scheduler_time += started.elapsed();
        if self.options.check_invariants {
            self.scheduler.check_invariants()?;
        }
        Ok(delivered)
    }
}
