//! Per-step cost of the core alone (no Python): `schedule()` + `update_from_output()`
//! in steady decode, and the same with a large waiting queue behind it.

use std::sync::Arc;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use llmsched_core::{ConfigParams, NewRequest, RunnerOutput, Scheduler, SchedulerConfig};

fn steady_decode(running: usize, waiting: usize) -> Scheduler {
    // Long enough that no request finishes during a benchmark run (40k+ steps).
    let params = ConfigParams {
        max_model_len: 1 << 17,
        block_size: 256,
        max_num_seqs: running as i64,
        max_num_batched_tokens: (running as i64).max(8192),
        num_gpu_blocks: (running as i64) * 513 + 64,
        async_scheduling: false,
        enable_prefix_caching: false,
        ..ConfigParams::default()
    };
    let mut sched = Scheduler::new(Arc::new(SchedulerConfig::new(params).unwrap())).unwrap();
    for i in 0..running + waiting {
        sched.add_request(NewRequest::new(format!("r{i}"), vec![(i % 1000) as i64 + 1; 16], 120_000)).unwrap();
    }
    // Prefill everything that fits; the rest keeps waiting (blocks are exhausted by design).
    loop {
        let step = sched.schedule();
        let counts: Vec<i32> =
            step.req_handles.iter().map(|&h| i32::from(!sched.request(h).unwrap().is_prefill_chunk())).collect();
        let tokens = vec![7; counts.iter().sum::<i32>() as usize];
        let out = RunnerOutput { sampled_token_ids: &tokens, num_sampled: &counts, row_of_entry: None };
        sched.update_from_output(step.step_id, &out).unwrap();
        if step.len() == running && step.total_num_scheduled_tokens == running as i64 {
            return sched;
        }
    }
}

/// Steps a scheduler can run before its requests reach max_tokens.
const STEPS_PER_SCHEDULER: u64 = 100_000;

fn one_step(sched: &mut Scheduler, tokens: &mut Vec<i32>, counts: &mut Vec<i32>) -> usize {
    let step = sched.schedule();
    counts.clear();
    counts.resize(step.len(), 1);
    tokens.clear();
    tokens.resize(step.len(), 7);
    let out = RunnerOutput { sampled_token_ids: tokens, num_sampled: counts, row_of_entry: None };
    sched.update_from_output(step.step_id, &out).unwrap().len()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_decode");
    for running in [64usize, 256, 1024, 4096] {
        let mut sched = steady_decode(running, 0);
        let mut steps_left = STEPS_PER_SCHEDULER;
        let (mut tokens, mut counts) = (Vec::new(), Vec::new());
        group.throughput(Throughput::Elements(running as u64));
        group.bench_with_input(BenchmarkId::from_parameter(running), &running, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    if steps_left == 0 {
                        // Requests would reach max_tokens: start a fresh steady state, untimed.
                        sched = steady_decode(running, 0);
                        steps_left = STEPS_PER_SCHEDULER;
                    }
                    let n = (iters - done).min(steps_left);
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(one_step(&mut sched, &mut tokens, &mut counts));
                    }
                    total += start.elapsed();
                    done += n;
                    steps_left -= n;
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
