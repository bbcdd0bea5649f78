//! `llmsched bench`'s prefill-heavy case in the core alone: 2,000-token prompts prefilled
//! in chunks beside decodes, requests finishing after 32 tokens and replaced. Prints the
//! time per step and per scheduled token. Arguments: steps, and MiB of other memory written
//! before each call (0 by default: warm; `llmsched bench` writes 8). For profilers as `steady_decode` is:
//! `cargo build --release --example prefill_heavy && valgrind --tool=callgrind target/release/examples/prefill_heavy 300`

use std::sync::Arc;

use llmsched_core::{ConfigParams, NewRequest, Scheduler, SchedulerConfig};

#[path = "common/timed.rs"]
mod timed;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let steps = args.next().unwrap_or(300);
    let mut runner = timed::TimedSteps::new(args.next().unwrap_or(0));
    let params = ConfigParams {
        max_model_len: 8192,
        max_num_seqs: 128,
        max_num_batched_tokens: 8192,
        num_gpu_blocks: 128 * 140,
        async_scheduling: false,
        enable_prefix_caching: false,
        ..ConfigParams::default()
    };
    let mut sched = Scheduler::new(Arc::new(SchedulerConfig::new(params).expect("valid config"))).expect("a scheduler");
    let mut next = 0usize;
    let mut add = |sched: &mut Scheduler| {
        let prompt = (0..2000).map(|j| ((next * 131 + j) % 30000) as i64 + 1).collect();
        sched.add_request(NewRequest::new(format!("r{next}"), prompt, 32)).expect("added");
        next += 1;
    };
    for _ in 0..464 {
        add(&mut sched);
    }
    let (mut scheduled_tokens, mut schedule_time, mut update_time) =
        (0i64, std::time::Duration::ZERO, std::time::Duration::ZERO);
    for step_index in 0..(steps + 100) {
        let timed = runner.run(&mut sched);
        if step_index >= 100 {
            schedule_time += timed.schedule;
            update_time += timed.update;
            scheduled_tokens += timed.step.total_num_scheduled_tokens;
        }
        for _ in timed.events.iter().filter(|e| e.status.is_finished()) {
            add(&mut sched);
        }
    }
    let elapsed = schedule_time + update_time;
    let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e6 / steps as f64;
    println!(
        "{steps} steps: schedule {:.1} us, update_from_output {:.1} us per step; {:.2} ns per scheduled token",
        per_step(schedule_time),
        per_step(update_time),
        elapsed.as_nanos() as f64 / scheduled_tokens.max(1) as f64
    );
}
