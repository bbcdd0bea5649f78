//! An auxiliary-output connector (vLLM's `AuxOutputSchedulerConnector`, routed experts): it
//! caps each waiting request's prefix-cache hit where it stops holding outputs, caps what a
//! KV connector loads past that, and is told of a preemption or a finish before the
//! request's blocks are freed, reading the prefix cache as it is at that point of the step
//! or update.

mod common;

use common::*;
use llmsched_core::{
    AuxOutputs, BlockHash, CachedBlocks, Connectors, ExternalKv, ExternalMatch, NewRequest, Request, RunnerOutput,
    Scheduler, Step,
};

/// Answers `max_hit` for every request (None: the prompt less one token), keeps
/// `keep_external` of a KV connector's tokens, and records what it was asked and what it
/// read of the cache then.
#[derive(Default)]
struct Outputs {
    max_hit: Option<i64>,
    keep_external: Option<i64>,
    /// (request, its computed tokens, how many of its leading blocks are cached).
    asked_max_hit: Vec<(String, i64, usize)>,
    asked_external: Vec<(String, i64, i64)>,
    finished: Vec<Told>,
    /// Hashes whose blocks it reads when told of a finish.
    watched: Vec<BlockHash>,
}

/// A request the connector was told finished (or preempted), as it was then.
struct Told {
    id: String,
    num_computed_tokens: i64,
    block_ids: Vec<u32>,
    /// The block each of its hashes is cached in.
    cached: Vec<Option<u32>>,
    /// Whether each watched hash was cached.
    watched_cached: Vec<bool>,
}

fn leading_cached(request: &Request, cache: &dyn CachedBlocks) -> usize {
    request.block_hashes().iter().take_while(|&&hash| cache.cached_block(hash, 0).is_some()).count()
}

impl AuxOutputs for Outputs {
    fn max_cache_hit(&mut self, request: &Request, cache: &dyn CachedBlocks) -> i64 {
        let cached = leading_cached(request, cache);
        self.asked_max_hit.push((request.id().to_string(), request.num_computed_tokens(), cached));
        self.max_hit.unwrap_or(request.num_tokens() - 1)
    }

    fn cap_external_hit(
        &mut self,
        request: &Request,
        num_local: i64,
        num_external: i64,
        cache: &dyn CachedBlocks,
    ) -> i64 {
        assert_eq!(leading_cached(request, cache), 4, "it reads the cache too");
        self.asked_external.push((request.id().to_string(), num_local, num_external));
        self.keep_external.unwrap_or(num_external)
    }

    fn request_finished(&mut self, request: &Request, cache: &dyn CachedBlocks) {
        self.finished.push(Told {
            id: request.id().to_string(),
            num_computed_tokens: request.num_computed_tokens(),
            block_ids: request.block_ids().to_vec(),
            cached: request.block_hashes().iter().map(|&hash| cache.cached_block(hash, 0)).collect(),
            watched_cached: self.watched.iter().map(|&hash| cache.cached_block(hash, 0).is_some()).collect(),
        });
    }
}

/// Loads every token of every request it is asked about, synchronously.
struct LoadsAll;

impl ExternalKv for LoadsAll {
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<ExternalMatch> {
        Some(ExternalMatch::sync(request.num_tokens() - num_local_computed))
    }
}

fn step_with(sched: &mut Scheduler, outputs: &mut Outputs) -> Step {
    let step = sched.schedule_with(false, Connectors { aux: Some(outputs), ..Connectors::default() });
    check_step(sched, &step);
    step
}

/// A scheduler whose cache holds a finished 16-token request's 4 blocks of 4 (`first`),
/// its pool of `num_gpu_blocks`.
fn with_first_cached(num_gpu_blocks: i64, kv_connector: bool) -> Scheduler {
    let mut sched = Scheduler::new(config(|p| {
        (p.enable_prefix_caching, p.block_size, p.num_gpu_blocks, p.kv_connector) =
            (true, 4, num_gpu_blocks, kv_connector);
    }))
    .unwrap();
    sched.add_request(request("first", 16, 1)).unwrap();
    let step = sched.schedule();
    apply_one_token_each(&mut sched, &step);
    assert!(sched.get_request("first").is_err(), "first finished");
    sched
}

fn scheduled(sched: &Scheduler, step: &Step, id: &str) -> (i64, i64) {
    let i = step.req_handles.iter().position(|&h| &**sched.request(h).unwrap().id() == id).expect("scheduled");
    (i64::from(step.num_computed_tokens[i]), i64::from(step.num_scheduled_tokens[i]))
}

#[test]
fn a_prefix_hit_stops_where_the_connector_holds_outputs() {
    for (max_hit, expected_hit) in
        [(None, 12), (Some(8), 8), (Some(11), 8), (Some(0), 0), (Some(1000), 12), (Some(-5), 0)]
    {
        let mut sched = with_first_cached(20, false);
        sched.add_request(request("second", 16, 1)).unwrap();
        let mut outputs = Outputs { max_hit, ..Outputs::default() };
        let step = step_with(&mut sched, &mut outputs);
        assert_eq!(scheduled(&sched, &step, "second"), (expected_hit, 16 - expected_hit), "max hit {max_hit:?}");
        // Asked once, with no tokens computed, and it read the four cached blocks.
        assert_eq!(outputs.asked_max_hit, [("second".to_string(), 0, 4)], "max hit {max_hit:?}");
        assert!(outputs.asked_external.is_empty(), "no KV connector, no external hit to cap");
    }
}

#[test]
fn a_connector_reads_the_blocks_cached_earlier_in_the_same_step() {
    let mut sched = Scheduler::new(config(|p| (p.enable_prefix_caching, p.block_size) = (true, 4))).unwrap();
    sched.add_request(request("a", 16, 1)).unwrap();
    sched.add_request(request("b", 16, 1)).unwrap();
    let mut outputs = Outputs::default();
    let step = step_with(&mut sched, &mut outputs);
    // `a`'s blocks were cached as it was admitted: `b` finds them, as in vLLM's loop.
    assert_eq!(outputs.asked_max_hit, [("a".to_string(), 0, 0), ("b".to_string(), 0, 4)]);
    assert_eq!(scheduled(&sched, &step, "b"), (12, 4));
}

#[test]
fn only_a_request_with_no_computed_tokens_is_asked() {
    let mut sched = Scheduler::new(config(|p| {
        (p.enable_prefix_caching, p.block_size, p.max_num_batched_tokens, p.max_model_len, p.max_num_seqs) =
            (false, 4, 8, 32, 4);
    }))
    .unwrap();
    sched.add_request(request("long", 20, 1)).unwrap();
    let mut outputs = Outputs::default();
    for _ in 0..3 {
        let step = step_with(&mut sched, &mut outputs);
        apply_one_token_each(&mut sched, &step);
    }
    // Prefix caching off, it is still asked, as vLLM asks; its later chunks are running.
    assert_eq!(outputs.asked_max_hit, [("long".to_string(), 0, 0)]);
}

#[test]
fn a_kv_connectors_tokens_are_capped_past_the_local_hit() {
    for (keep, expected) in [(None, 15), (Some(2), 14), (Some(0), 12), (Some(99), 15), (Some(-1), 12)] {
        let mut sched = with_first_cached(20, true);
        sched.add_request(request("second", 16, 1)).unwrap();
        let mut outputs = Outputs { keep_external: keep, ..Outputs::default() };
        let mut kv = LoadsAll;
        let step = sched
            .schedule_with(false, Connectors { kv: Some(&mut kv), aux: Some(&mut outputs), ..Connectors::default() });
        check_step(&sched, &step);
        assert_eq!(scheduled(&sched, &step, "second"), (expected, 16 - expected), "keep {keep:?}");
        // The connector's tokens past the local hit of 12, one left to compute.
        assert_eq!(outputs.asked_external, [("second".to_string(), 12, 3)], "keep {keep:?}");
    }
}

#[test]
fn a_preempted_request_is_told_before_its_blocks_are_freed() {
    // Two requests of 8 tokens in a pool of 4 usable blocks of 4: the second's decode
    // needs a third block, and preempts the other.
    let mut sched = Scheduler::new(config(|p| {
        (p.enable_prefix_caching, p.block_size, p.num_gpu_blocks) = (true, 4, 5);
    }))
    .unwrap();
    sched.add_request(request("a", 8, 8)).unwrap();
    // (Another prompt: no block shared with `a`.)
    sched.add_request(NewRequest::new("b", (100..108).collect(), 8)).unwrap();
    let mut outputs = Outputs::default();
    let mut preempted_at = None;
    for step_index in 0..12 {
        let step = step_with(&mut sched, &mut outputs);
        if preempted_at.is_none() && !outputs.finished.is_empty() {
            preempted_at = Some(step_index);
        }
        if step.is_empty() {
            break;
        }
        apply_one_token_each(&mut sched, &step);
    }
    assert!(preempted_at.is_some(), "a preemption happened");
    let Told { id, num_computed_tokens, block_ids, cached, .. } = &outputs.finished[0];
    // Its computed tokens as before the step (its decode's token not yet counted), its
    // blocks still its own, each full one cached in the block it holds.
    assert_eq!(*num_computed_tokens, 8, "{id}");
    assert_eq!((block_ids.len(), cached.len()), (2, 2), "{id}: its two full blocks, hashed");
    for (i, block) in cached.iter().enumerate() {
        assert_eq!(*block, Some(block_ids[i]), "{id}: block {i} cached where it holds it");
    }
}

#[test]
fn an_output_tells_each_finish_before_the_blocks_of_later_requests_are_cached() {
    // Async scheduling: a block is cached once the output of the step that computed its
    // last token is in. In the second step `a` (first in the step) finishes with its
    // second token, and `b` computes its first sampled token, the last of its second block.
    let scheduler = || {
        let mut sched = Scheduler::new(config(|p| {
            (p.enable_prefix_caching, p.block_size, p.async_scheduling) = (true, 4, true);
        }))
        .unwrap();
        sched.add_request(request("a", 8, 2)).unwrap();
        let b = sched.add_request(NewRequest::new("b", (100..107).collect(), 4)).unwrap();
        (sched, b)
    };
    let run = |sched: &mut Scheduler, mut outputs: Option<&mut Outputs>| {
        let steps = [sched.schedule(), sched.schedule()];
        for step in &steps {
            let (tokens, counts) = sample(sched, step, false);
            let out = RunnerOutput { sampled_token_ids: &tokens, num_sampled: &counts, row_of_entry: None };
            let aux = outputs.as_deref_mut().map(|o| o as &mut dyn AuxOutputs);
            sched.update_from_output_with(step.step_id, &out, |_| {}, aux).unwrap();
        }
    };
    // b's hashes after those steps, from a twin.
    let (mut twin, twin_b) = scheduler();
    run(&mut twin, None);
    let watched = twin.request(twin_b).unwrap().block_hashes().to_vec();
    assert_eq!(watched.len(), 2);
    assert!(watched.iter().all(|&hash| twin.cached_block(hash, 0).is_some()), "cached by the end");
    let (mut sched, b) = scheduler();
    let mut outputs = Outputs { watched: watched.clone(), ..Outputs::default() };
    run(&mut sched, Some(&mut outputs));
    let [Told { id, num_computed_tokens, cached, watched_cached, .. }] = &outputs.finished[..] else {
        panic!("told once")
    };
    assert_eq!((id.as_str(), *num_computed_tokens), ("a", 9));
    assert_eq!(cached.iter().filter(|block| block.is_some()).count(), 2, "its own blocks cached");
    assert_eq!(*watched_cached, [true, false], "b's second block, later in the step: not yet");
    assert_eq!(sched.request(b).unwrap().block_hashes(), &watched[..]);
}
