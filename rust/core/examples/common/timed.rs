//! The examples' step: `schedule()`, a runner that samples one token for each request whose
//! step reaches its known tokens, `update_from_output()`, each call timed. In the cold mode
//! of `llmsched bench --cold-mib`, every cache line of `cold_mib` MiB of other memory (a model
//! step's host-side work) is written before each call, so it starts with the scheduler's
//! data out of the CPU caches.

// Shared by the examples, which do not each read every field.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use llmsched_core::{RequestEvent, RunnerOutput, Scheduler, Step};

pub struct TimedSteps {
    /// `None` for 0 MiB (warm).
    other_memory: Option<Vec<u8>>,
    tokens: Vec<i32>,
    counts: Vec<i32>,
}

pub struct TimedStep {
    pub step: Step,
    pub events: Vec<RequestEvent>,
    pub schedule: Duration,
    pub update: Duration,
}

impl TimedSteps {
    pub fn new(cold_mib: usize) -> Self {
        Self { other_memory: (cold_mib > 0).then(|| vec![1; cold_mib << 20]), tokens: Vec::new(), counts: Vec::new() }
    }

    fn evict(&mut self) {
        if let Some(memory) = self.other_memory.as_mut() {
            for line in memory.chunks_exact_mut(64) {
                line[0] = line[0].wrapping_add(1);
            }
            std::hint::black_box(memory);
        }
    }

    pub fn run(&mut self, sched: &mut Scheduler) -> TimedStep {
        self.evict();
        let t0 = Instant::now();
        let step = sched.schedule();
        let schedule = t0.elapsed();
        self.counts.clear();
        self.counts
            .extend(step.req_handles.iter().map(|&h| i32::from(!sched.request(h).expect("live").is_prefill_chunk())));
        self.tokens.clear();
        self.tokens.resize(self.counts.iter().sum::<i32>() as usize, 7);
        self.evict();
        let out = RunnerOutput { sampled_token_ids: &self.tokens, num_sampled: &self.counts, row_of_entry: None };
        let t1 = Instant::now();
        let events = sched.update_from_output(step.step_id, &out).expect("applied");
        let update = t1.elapsed();
        TimedStep { step, events, schedule, update }
    }
}
