//! Engines without a KV cache (no KV-cache group: an encoder-only model such as BERT, a
//! multimodal encoder instance), and encoder instances (vLLM's `mm_encoder_only`): a
//! prompt split over steps even without chunked prefill, a request finished once its
//! prompt is computed, without sampling.

mod common;

use common::*;
use llmsched_core::{ConfigParams, KvCacheGroups, MmInputSpec, RequestStatus, Scheduler, SchedulerConfig, Step};

/// No KV-cache group, the pool vLLM sizes for it (the null block alone), and chunked
/// prefill off as vLLM's engine turns it off for such a model.
fn without_kv(p: &mut ConfigParams) {
    p.kv_cache_groups = KvCacheGroups::parse("").expect("no groups");
    p.num_gpu_blocks = 1;
    p.enable_prefix_caching = false;
    p.enable_chunked_prefill = false;
}

fn refusal(f: impl FnOnce(&mut ConfigParams)) -> String {
    let mut p = ConfigParams::default();
    f(&mut p);
    SchedulerConfig::new(p).expect_err("refused").to_string()
}

#[test]
fn no_groups_is_the_empty_list_and_needs_only_the_null_block() {
    let groups = KvCacheGroups::parse(" ").expect("no groups");
    assert!(groups.is_empty());
    assert_eq!(groups.to_text(), "");
    assert_eq!(KvCacheGroups::parse(&groups.to_text()).expect("round trip"), groups);
    let cfg = config(without_kv);
    assert_eq!(cfg.max_blocks_per_request(cfg.max_model_len()), 0);
    // With a group, the null block alone is no pool.
    let err = refusal(|p| p.num_gpu_blocks = 1);
    assert!(err.contains("num_gpu_blocks") && err.contains("at least 2"), "{err}");
}

#[test]
fn no_groups_refuses_what_needs_a_kv_cache() {
    for (field, set) in [
        ("enable_prefix_caching", (|p: &mut ConfigParams| p.enable_prefix_caching = true) as fn(&mut ConfigParams)),
        ("kv_connector", |p: &mut ConfigParams| p.kv_connector = true),
    ] {
        let err = refusal(|p| {
            without_kv(p);
            set(p);
        });
        assert!(err.contains(field) && err.contains("without KV-cache groups"), "{err}");
    }
}

/// A pooling model without a KV cache (BERT): as many prompts run at once as the budgets
/// allow, none holds a block, each ends with its step, and the pool's usage stays 0.
#[test]
fn a_pooling_model_without_a_kv_cache_runs_every_prompt_the_budgets_allow() {
    let mut sched = Scheduler::new(config(|p| {
        without_kv(p);
        p.num_sampled_tokens_per_step = 0;
        p.max_model_len = 512;
        p.max_num_batched_tokens = 2048;
        p.max_num_seqs = 8;
    }))
    .expect("a valid scheduler");
    for i in 0..10 {
        sched.add_request(request(&format!("r{i}"), 300, 1)).expect("a valid request");
    }
    let mut finished = Vec::new();
    for _ in 0..10 {
        let step = sched.schedule();
        if step.is_empty() {
            break;
        }
        check_step(&sched, &step);
        assert!(step.block_ids.is_empty() && step.num_block_ids.is_empty(), "blocks without a KV cache");
        // The budget (2048 tokens) holds six prompts of 300, the same whatever the pool.
        assert_eq!(step.len(), if finished.is_empty() { 6 } else { 4 });
        let events = apply(&mut sched, &step, &[], &vec![0; step.len()]);
        finished.extend(events.iter().filter(|e| e.status == RequestStatus::FinishedStopped).map(|e| e.handle));
        assert_eq!(sched.kv_cache_usage(), 0.0);
        sched.check_invariants().expect("invariants after update");
    }
    assert_eq!(finished.len(), 10);
    assert!(!sched.has_unfinished_requests());
}

fn encoder_instance(async_scheduling: bool, f: impl FnOnce(&mut ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        without_kv(p);
        p.mm_encoder_only = true;
        p.async_scheduling = async_scheduling;
        p.max_model_len = 1024;
        p.max_num_batched_tokens = 100;
        p.max_num_seqs = 4;
        p.max_num_encoder_input_tokens = 100;
        p.encoder_cache_size = 100;
        f(p);
    }))
    .expect("a valid scheduler")
}

fn add_image_request(sched: &mut Scheduler) {
    let mut image = request("img", 250, 16);
    image.mm_inputs = vec![MmInputSpec { identifier: "a".into(), offset: 120, length: 60, is_embed: None }];
    sched.add_request(image).expect("a valid request");
}

/// The step's chunk of the one request, and whether it encodes the image.
fn chunk(sched: &Scheduler, step: &Step) -> (i32, bool) {
    check_step(sched, step);
    assert_eq!(step.len(), 1);
    (step.num_scheduled_tokens[0], !step.encoder_input_ids.is_empty())
}

/// Applies the encoder instance's output for `step` (no token for anyone): the status
/// reported for its request, if any.
fn encoded(sched: &mut Scheduler, step: &Step) -> Option<(RequestStatus, usize)> {
    let events = apply(sched, step, &[], &vec![0; step.len()]);
    sched.check_invariants().expect("invariants after update");
    events.first().map(|e| (e.status, e.num_tokens))
}

/// An encoder instance takes a prompt longer than the budget in chunks although chunked
/// prefill is off, and finishes it, with no output token, once its prompt is computed.
#[test]
fn an_encoder_instance_splits_a_prompt_and_finishes_it_once_computed() {
    let mut sched = encoder_instance(false, |_| {});
    add_image_request(&mut sched);
    let first = sched.schedule();
    assert_eq!(chunk(&sched, &first), (100, false));
    assert_eq!(encoded(&mut sched, &first), None);
    let second = sched.schedule();
    assert_eq!(chunk(&sched, &second), (100, true));
    assert_eq!(encoded(&mut sched, &second), None);
    let last = sched.schedule();
    assert_eq!(chunk(&sched, &last), (50, false));
    assert_eq!(encoded(&mut sched, &last), Some((RequestStatus::FinishedStopped, 0)));
    assert!(!sched.has_unfinished_requests());
    assert_eq!(sched.schedule().finished.len(), 1);
}

/// Under async scheduling `C` counts the tokens in flight, and vLLM's rule (`C >= Np` when
/// an output is applied) finishes the request in the first update after its last chunk
/// was scheduled: the previous step's. The last step's output then finds it gone.
#[test]
fn an_async_encoder_instance_finishes_a_request_once_its_last_chunk_is_scheduled() {
    let mut sched = encoder_instance(true, |_| {});
    add_image_request(&mut sched);
    let first = sched.schedule();
    let second = sched.schedule();
    assert_eq!((chunk(&sched, &first), chunk(&sched, &second)), ((100, false), (100, true)));
    assert_eq!(encoded(&mut sched, &first), None);
    let last = sched.schedule();
    assert_eq!(chunk(&sched, &last), (50, false));
    assert_eq!(encoded(&mut sched, &second), Some((RequestStatus::FinishedStopped, 0)));
    assert_eq!(encoded(&mut sched, &last), None);
    assert!(!sched.has_unfinished_requests());
}

/// The same prompt on a scheduler that is not an encoder instance, chunked prefill off:
/// it never fits a step (vLLM's waiting loop stops at it), and the config says so first.
#[test]
fn without_the_encoder_instance_a_prompt_longer_than_the_budget_is_refused() {
    let err = refusal(|p| {
        without_kv(p);
        p.max_model_len = 1024;
        p.max_num_batched_tokens = 100;
        p.max_num_seqs = 4;
    });
    assert!(err.contains("max_num_batched_tokens") && err.contains("enable_chunked_prefill"), "{err}");
}
