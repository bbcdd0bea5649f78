//! Runs steady-decode steps of the core and prints the time per request-step of each call.
//! Arguments: running requests, steps, and MiB of other memory written before each call
//! (0 by default: warm; `llmsched bench` writes 8);
//! also for profilers (callgrind counts instructions,
//! so its figures are repeatable on a busy machine):
//! `cargo build --release --example steady_decode && valgrind --tool=callgrind target/release/examples/steady_decode 1024 200`

use std::sync::Arc;

use llmsched_core::{ConfigParams, NewRequest, Scheduler, SchedulerConfig};

#[path = "common/timed.rs"]
mod timed;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let running = args.next().unwrap_or(1024);
    let steps = args.next().unwrap_or(200);
    let mut runner = timed::TimedSteps::new(args.next().unwrap_or(0));
    let params = ConfigParams {
        max_model_len: 1 << 16,
        max_num_seqs: running as i64,
        max_num_batched_tokens: (running as i64).max(8192),
        num_gpu_blocks: (running as i64) * 300 + 64,
        async_scheduling: false,
        enable_prefix_caching: false,
        ..ConfigParams::default()
    };
    let mut sched = Scheduler::new(Arc::new(SchedulerConfig::new(params).expect("valid config"))).expect("a scheduler");
    for i in 0..running {
        sched.add_request(NewRequest::new(format!("r{i}"), vec![(i % 1000) as i64 + 1; 16], 4000)).expect("added");
    }
    let mut scheduled = 0;
    let (mut schedule_time, mut update_time) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for _ in 0..steps {
        let timed = runner.run(&mut sched);
        schedule_time += timed.schedule;
        update_time += timed.update;
        scheduled += timed.step.len();
    }
    let per_request = |d: std::time::Duration| d.as_nanos() as f64 / scheduled.max(1) as f64;
    println!(
        "{steps} steps, {scheduled} request-steps: schedule {:.0} ns, update_from_output {:.0} ns per request-step",
        per_request(schedule_time),
        per_request(update_time)
    );
}
