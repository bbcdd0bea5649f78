//! A tiny deterministic runner for driving the core without Python.
#![allow(dead_code)]

use std::sync::Arc;

use llmsched_core::{ConfigParams, NewRequest, RequestEvent, RunnerOutput, Scheduler, SchedulerConfig, Step};

pub fn config(f: impl FnOnce(&mut ConfigParams)) -> Arc<SchedulerConfig> {
    let mut p = ConfigParams { async_scheduling: false, enable_prefix_caching: false, ..ConfigParams::default() };
    f(&mut p);
    Arc::new(SchedulerConfig::new(p).expect("valid test config"))
}

pub fn request(id: &str, prompt_len: usize, max_tokens: i64) -> NewRequest {
    NewRequest::new(id, (0..prompt_len as i64).map(|t| t % 1000 + 1).collect(), max_tokens)
}

/// Samples one token (value 7) per request that reaches the end of its known
/// tokens, plus every draft slot accepted when `accept_drafts`.
pub fn sample(sched: &Scheduler, step: &Step, accept_drafts: bool) -> (Vec<i32>, Vec<i32>) {
    let mut tokens = Vec::new();
    let mut counts = Vec::new();
    for (i, &h) in step.req_handles.iter().enumerate() {
        let r = sched.request(h).expect("scheduled request is live");
        // The scheduler marked a step that ends before the known tokens as a prefill chunk.
        let k = if r.is_prefill_chunk() {
            0
        } else if accept_drafts {
            1 + step.num_spec_tokens[i]
        } else {
            1
        };
        counts.push(k);
        tokens.extend(std::iter::repeat_n(7, k as usize));
    }
    (tokens, counts)
}

pub fn apply(sched: &mut Scheduler, step: &Step, tokens: &[i32], counts: &[i32]) -> Vec<RequestEvent> {
    let out = RunnerOutput { sampled_token_ids: tokens, num_sampled: counts, row_of_entry: None };
    sched.update_from_output(step.step_id, &out).expect("output matches its step")
}

/// The runner's output for `step` applied (one token per entry that reaches the end of
/// its known tokens), the invariants checked after.
pub fn apply_one_token_each(sched: &mut Scheduler, step: &Step) {
    let (t, c) = sample(sched, step, false);
    if !step.is_empty() {
        apply(sched, step, &t, &c);
    }
    sched.check_invariants().expect("invariants after update");
}

/// Every scheduled entry keeps C + n + s <= M and n >= 1.
pub fn check_step(sched: &Scheduler, step: &Step) {
    let cfg = sched.config();
    let (m, s) = (cfg.max_model_len(), cfg.num_sampled_tokens_per_step());
    for i in 0..step.len() {
        let (c, n) = (step.num_computed_tokens[i] as i64, step.num_scheduled_tokens[i] as i64);
        assert!(n >= 1, "entry {i}: n = {n}");
        assert!(c + n + s <= m, "entry {i}: C + n + s = {c} + {n} + {s} > M = {m}");
    }
    sched.check_invariants().expect("invariants after schedule");
}

/// The seed boundary's setup (vLLM #53962): a request decoding, and `late` waiting with
/// `C = M - offset - K` computed tokens, one left to compute: its admission is a
/// one-token step that padding would grow to `1 + K`.
pub fn at_the_padding_edge(m: i64, k: i64, offset: i64, async_scheduling: bool) -> Scheduler {
    let mut sched = Scheduler::new(config(|p| {
        p.max_model_len = m;
        p.num_speculative_tokens = k;
        p.async_scheduling = async_scheduling;
    }))
    .expect("a valid scheduler");
    sched.add_request(request("decoding", 8, 100)).expect("a valid request");
    let step = sched.schedule();
    let (t, c) = sample(&sched, &step, false);
    apply(&mut sched, &step, &t, &c);
    let c_new = m - offset - k;
    let mut late = request("late", (c_new + 1) as usize, 100);
    late.num_computed_tokens = c_new;
    sched.add_request(late).expect("a valid request");
    sched
}
