//! Multimodal inputs: the encoder compute budget and encoder cache in both loops (vLLM's
//! `_try_schedule_encoder_inputs` and `EncoderCacheManager`), their hashes in the block
//! hashes, and bad input.

mod common;

use common::*;
use llmsched_core::{
    ConfigParams, Connectors, ExternalEncoderCache, MmInputSpec, NewRequest, Request, RequestStatus, Scheduler, Step,
};

fn mm(budget: i64, cache: i64, f: impl FnOnce(&mut ConfigParams)) -> Scheduler {
    Scheduler::new(config(|p| {
        p.max_num_batched_tokens = 256;
        p.max_num_seqs = 8;
        p.max_num_encoder_input_tokens = budget;
        p.encoder_cache_size = cache;
        f(p);
    }))
    .unwrap()
}

fn image(identifier: &str, offset: i64, length: i64) -> MmInputSpec {
    MmInputSpec { identifier: identifier.into(), offset, length, is_embed: None }
}

fn with_images(id: &str, prompt_len: usize, images: Vec<MmInputSpec>) -> NewRequest {
    let mut r = request(id, prompt_len, 4);
    r.mm_inputs = images;
    r
}

/// The step's encoder inputs as (row, input) pairs.
fn encoded(step: &Step) -> Vec<(i32, i32)> {
    step.encoder_input_rows.iter().copied().zip(step.encoder_input_ids.iter().copied()).collect()
}

fn run_step(sched: &mut Scheduler) -> Step {
    let step = sched.schedule();
    check_step(sched, &step);
    apply_one_token_each(sched, &step);
    step
}

#[test]
fn a_chunk_stops_before_an_image_the_budget_cannot_encode() {
    // Budget 100 embeddings: the first request's image (80) takes it; the second's (40)
    // must wait, so its chunk stops right before the image at 30.
    let mut sched = mm(100, 200, |_| {});
    sched.add_request(with_images("a", 100, vec![image("x", 10, 80)])).unwrap();
    sched.add_request(with_images("b", 100, vec![image("y", 30, 40)])).unwrap();
    let step = run_step(&mut sched);
    assert_eq!(step.num_scheduled_tokens, vec![100, 30]);
    assert_eq!(encoded(&step), vec![(0, 0)]);
    // Next step the budget is whole again: b's image is encoded with its chunk.
    let step = run_step(&mut sched);
    assert_eq!(step.num_scheduled_tokens, vec![1, 70]);
    assert_eq!(encoded(&step), vec![(1, 0)]);
}

#[test]
fn a_shared_output_is_encoded_once_and_takes_no_budget_again() {
    let mut sched = mm(100, 200, |_| {});
    sched.add_request(with_images("a", 100, vec![image("x", 10, 80)])).unwrap();
    sched.add_request(with_images("b", 90, vec![image("x", 5, 80)])).unwrap();
    let step = run_step(&mut sched);
    // Both admitted in one step: b's image is a's output (only a's is encoded).
    assert_eq!(step.num_scheduled_tokens, vec![100, 90]);
    assert_eq!(encoded(&step), vec![(0, 0)]);
}

#[test]
fn unreferenced_outputs_are_evicted_oldest_first_and_reported_once() {
    // Cache of 100 embeddings: x (60) then y (40) fill it; z (50) evicts x, the oldest
    // no request references.
    let mut sched = mm(100, 100, |p| p.max_num_seqs = 1);
    for (id, identifier, length) in [("a", "x", 60), ("b", "y", 40), ("c", "z", 50)] {
        sched.add_request(with_images(id, 80, vec![image(identifier, 10, length)])).unwrap();
    }
    let mut freed = Vec::new();
    for _ in 0..40 {
        let step = run_step(&mut sched);
        freed.extend(step.freed_encoder_outputs.iter().map(|s| s.to_string()));
        if !sched.has_requests() {
            break;
        }
    }
    assert_eq!(freed, vec!["x".to_string()]);
    let (free, freeable, cached) = sched.encoder_cache_state();
    assert_eq!((free, freeable, cached), (10, 100, 2));
}

#[test]
fn without_chunked_inputs_a_chunk_never_splits_an_image() {
    // Token budget 64: an image at [40, 100) would be split; the chunk stops at 40.
    let chunked = |no_split: bool| {
        let mut sched = mm(100, 100, |p| {
            p.max_num_batched_tokens = 64;
            p.disable_chunked_mm_input = no_split;
        });
        sched.add_request(with_images("a", 120, vec![image("x", 40, 60)])).unwrap();
        run_step(&mut sched).num_scheduled_tokens[0]
    };
    assert_eq!(chunked(true), 40);
    assert_eq!(chunked(false), 64);
}

#[test]
fn a_prefix_hit_that_ends_inside_an_image_encodes_it_again() {
    // a's blocks are cached and its image's output evicted (b's took the whole cache): c
    // resends a's prompt and hits 5 blocks, inside the image [8, 90): the rest of the
    // image's placeholders need its output, which is encoded again. A hit past an image
    // needs none.
    let resend = |length: i64| {
        let mut sched = mm(100, 100, |p| {
            p.enable_prefix_caching = true;
            p.max_num_seqs = 1;
        });
        sched.add_request(with_images("a", 96, vec![image("x", 8, length)])).unwrap();
        sched.add_request(with_images("b", 96, vec![image("y", 0, 96)])).unwrap();
        let mut freed = Vec::new();
        while sched.has_requests() {
            freed.extend(run_step(&mut sched).freed_encoder_outputs.iter().map(|s| s.to_string()));
        }
        assert_eq!(freed, vec!["x".to_string()]);
        sched.add_request(with_images("c", 96, vec![image("x", 8, length)])).unwrap();
        let step = run_step(&mut sched);
        (step.num_computed_tokens[0], encoded(&step))
    };
    assert_eq!(resend(82), (80, vec![(0, 0)]));
    assert_eq!(resend(60), (80, vec![]));
}

#[test]
fn the_image_enters_the_block_hashes() {
    // Same tokens, another image: no hit; the same image: a hit.
    let hit = |second: &str| {
        let mut sched = mm(100, 200, |p| p.enable_prefix_caching = true);
        sched.add_request(with_images("a", 96, vec![image("x", 8, 60)])).unwrap();
        while sched.has_requests() {
            run_step(&mut sched);
        }
        sched.add_request(with_images("b", 96, vec![image(second, 8, 60)])).unwrap();
        run_step(&mut sched).num_computed_tokens[0]
    };
    assert_eq!(hit("x"), 80);
    assert_eq!(hit("other"), 0);
}

#[test]
fn a_request_drops_its_references_once_its_tokens_pass_the_image() {
    let mut sched = mm(100, 100, |p| p.max_num_batched_tokens = 40);
    sched.add_request(with_images("a", 100, vec![image("x", 10, 50)])).unwrap();
    let (_, freeable, _) = sched.encoder_cache_state();
    assert_eq!(freeable, 100);
    // Chunks of 40: [0, 40) encodes x, [40, 80) passes its end at 60.
    run_step(&mut sched);
    assert_eq!(sched.get_request("a").unwrap().referenced_mm_inputs(), &[0]);
    assert_eq!(sched.encoder_cache_state(), (50, 50, 1));
    run_step(&mut sched);
    assert!(sched.get_request("a").unwrap().referenced_mm_inputs().is_empty());
    assert_eq!(sched.encoder_cache_state(), (50, 100, 1));
}

#[test]
fn an_identifier_reused_with_another_size_fails_its_request() {
    let mut sched = mm(100, 200, |_| {});
    sched.add_request(with_images("a", 100, vec![image("x", 10, 60)])).unwrap();
    run_step(&mut sched);
    sched.add_request(with_images("b", 100, vec![image("x", 10, 50)])).unwrap();
    let step = run_step(&mut sched);
    assert_eq!(step.len(), 1, "b is not scheduled");
    let failed = sched.finish_encoder_mismatches();
    assert_eq!(failed.len(), 1);
    assert_eq!(&*failed[0].1, "b");
    assert_eq!(sched.take_last_finished()[0].status(), RequestStatus::FinishedError);
    assert!(sched.finish_encoder_mismatches().is_empty());
    sched.check_invariants().unwrap();
}

#[test]
fn a_preempted_request_gives_its_references_back() {
    // A pool of 9 usable blocks: the second request preempts the first.
    let mut sched = mm(100, 100, |p| {
        p.num_gpu_blocks = 10;
        p.max_model_len = 128;
    });
    let mut a = with_images("a", 64, vec![image("x", 0, 60)]);
    a.max_tokens = 64;
    sched.add_request(a).unwrap();
    let mut b = with_images("b", 64, vec![image("y", 0, 40)]);
    b.max_tokens = 64;
    sched.add_request(b).unwrap();
    let mut preempted = false;
    for _ in 0..200 {
        let step = run_step(&mut sched);
        preempted |= !step.preempted.is_empty();
        if !sched.has_requests() {
            break;
        }
    }
    assert!(preempted);
    assert!(!sched.has_requests());
    let (free, freeable, _) = sched.encoder_cache_state();
    assert_eq!(freeable, 100);
    assert!(free <= 100);
}

#[test]
fn bad_inputs_are_refused_naming_the_field() {
    let mut sched = mm(100, 60, |_| {});
    let cases: Vec<(Vec<MmInputSpec>, &str)> = vec![
        (vec![image("x", 90, 20)], "mm_inputs[0].offset"),
        (vec![image("x", 0, 30), image("y", 20, 10)], "mm_inputs[1].offset"),
        (vec![image("x", 0, 0)], "mm_inputs[0].length"),
        (vec![image("", 0, 10)], "mm_inputs[0].identifier"),
        (vec![image("x", 0, 61)], "mm_inputs[0].length"),
        (
            vec![MmInputSpec { identifier: "x".into(), offset: 0, length: 4, is_embed: Some(vec![true]) }],
            "mm_inputs[0].is_embed",
        ),
    ];
    for (images, field) in cases {
        let err = sched.add_request(with_images("r", 100, images)).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    assert_eq!(sched.num_live_requests(), 0);
    // Without chunked inputs, one step must hold an input whole (a 64-token step here).
    let mut whole = mm(100, 100, |p| {
        p.max_num_batched_tokens = 64;
        p.disable_chunked_mm_input = true;
    });
    let err = whole.add_request(with_images("r", 100, vec![image("x", 0, 65)])).unwrap_err().to_string();
    assert!(err.contains("mm_inputs[0].length") && err.contains("disable_chunked_mm_input"), "{err}");
    whole.add_request(with_images("r", 100, vec![image("x", 0, 64)])).unwrap();
    let mut text_only = mm(0, 0, |_| {});
    let err = text_only.add_request(with_images("r", 100, vec![image("x", 0, 10)])).unwrap_err().to_string();
    assert!(err.contains("max_num_encoder_input_tokens=0"), "{err}");
}

#[test]
fn placeholders_without_embeddings_are_not_encoded_for() {
    // Only the last 10 of 30 placeholders carry embeddings: a chunk that ends before them
    // encodes nothing; the image takes 10 of the budget.
    let mut sched = mm(10, 10, |p| p.max_num_batched_tokens = 25);
    let flags = (0..30).map(|i| i >= 20).collect();
    let input = MmInputSpec { identifier: "x".into(), offset: 0, length: 30, is_embed: Some(flags) };
    sched.add_request(with_images("a", 60, vec![input])).unwrap();
    let step = run_step(&mut sched);
    assert_eq!(step.num_scheduled_tokens, vec![25]);
    assert_eq!(encoded(&step), vec![(0, 0)]);
    let mut sched = mm(10, 10, |p| p.max_num_batched_tokens = 15);
    let flags = (0..30).map(|i| i >= 20).collect();
    let input = MmInputSpec { identifier: "x".into(), offset: 0, length: 30, is_embed: Some(flags) };
    sched.add_request(with_images("a", 60, vec![input])).unwrap();
    assert!(encoded(&run_step(&mut sched)).is_empty());
}

/// The runner's encoder outputs across steps: every image a scheduled chunk overlaps must
/// be encoded in its step or an earlier one and not evicted since (what a GPU runner needs
/// to gather embeddings). Returns the images encoded in `step`.
fn check_encoded(sched: &Scheduler, step: &Step, outputs: &mut std::collections::HashSet<String>) -> Vec<String> {
    for freed in &step.freed_encoder_outputs {
        outputs.remove(&**freed);
    }
    let mut encoded = Vec::new();
    for (&row, &input) in step.encoder_input_rows.iter().zip(&step.encoder_input_ids) {
        let r = sched.request(step.req_handles[row as usize]).unwrap();
        let identifier = r.mm_inputs()[input as usize].identifier.to_string();
        outputs.insert(identifier.clone());
        encoded.push(identifier);
    }
    for (i, &h) in step.req_handles.iter().enumerate() {
        let r = sched.request(h).unwrap();
        let (c, n) = (i64::from(step.num_computed_tokens[i]), i64::from(step.num_scheduled_tokens[i]));
        for input in r.mm_inputs() {
            if input.offset < c + n && c < input.end() {
                assert!(
                    outputs.contains(&*input.identifier),
                    "{}: [{c}, {}) needs {:?}",
                    r.id(),
                    c + n,
                    input.identifier
                );
            }
        }
    }
    encoded
}

/// Priority policy: a (the lowest priority) runs first, and in one step its chunk reaches
/// image "x", which it encodes; b reaches "x" in the same step; c (between them or after
/// them in the running order) needs a block there and preempts a. Every chunk must find
/// "x" encoded (vLLM leaves it cached but computed by nobody). `a` is (prompt, offset of
/// "x"), `b` (prompt, offset of "x", priority), `c` (prompt, priority).
fn preempt_the_encoder(budget: i64, blocks: i64, a: (usize, i64), b: (usize, i64, i64), c: (usize, i64)) {
    let mut sched = mm(100, 100, |p| {
        p.policy = llmsched_core::Policy::Priority;
        p.max_num_batched_tokens = budget;
        p.long_prefill_token_threshold = 8;
        p.block_size = 4;
        p.num_gpu_blocks = blocks;
        p.max_num_seqs = 4;
        p.scheduler_reserve_full_isl = false;
    });
    let add = |sched: &mut Scheduler, id: &str, len: usize, priority: i64, images: Vec<MmInputSpec>, t: f64| {
        let mut r = with_images(id, len, images);
        r.priority = priority;
        r.max_tokens = 2;
        r.arrival_time = Some(t);
        sched.add_request(r).unwrap();
    };
    add(&mut sched, "a", a.0, 5, vec![image("x", a.1, 4)], 0.0);
    let mut outputs = std::collections::HashSet::new();
    let mut preempted_while_encoding = false;
    for step_no in 0..40 {
        if step_no == 1 {
            add(&mut sched, "c", c.0, c.1, vec![], 1.0);
            add(&mut sched, "b", b.0, b.2, vec![image("x", b.1, 4)], 2.0);
        }
        let step = sched.schedule();
        check_step(&sched, &step);
        sched.check_invariants().unwrap();
        let encoded = check_encoded(&sched, &step, &mut outputs);
        preempted_while_encoding |=
            step.preempted.iter().any(|(_, id)| &**id == "a") && step.encoder_input_rows.len() == 1 && encoded == ["x"];
        let (t, c) = sample(&sched, &step, false);
        if !step.is_empty() {
            apply(&mut sched, &step, &t, &c);
        }
        if !sched.has_requests() {
            break;
        }
    }
    assert!(!sched.has_requests());
    assert!(preempted_while_encoding, "the case must preempt a in the step it encodes \"x\" in");
}

#[test]
fn an_image_whose_encoding_request_is_preempted_in_its_step_is_encoded_for_the_next() {
    // Step 0: a takes [0, 16). Step 1: a [16, 24) (the threshold), c and b admitted
    // (running a, c, b). Step 2: a reaches "x" at 24 and encodes it, filling the pool; c's
    // decode needs a block and preempts a; b, planned after, finds "x" cached.
    preempt_the_encoder(16, 11, (32, 24), (16, 4, 4), (4, 0));
    // Step 0: a takes [0, 20). Step 1: a [20, 28), b [0, 8), c [0, 4) (running a, b, c).
    // Step 2: a reaches "x" at 28 and encodes it, b's chunk [8, 16) finds it cached, c's
    // decode preempts a: "x" is encoded for b.
    preempt_the_encoder(20, 15, (36, 28), (16, 8, 3), (4, 4));
}

// ---------------------------------------------------------------------------
// An encoder-cache connector (vLLM's ECConnectorBase, scheduler side).
// ---------------------------------------------------------------------------

/// An encoder-cache connector that has the outputs of `has` and the requests of
/// `in_transit` still loading; records every question.
#[derive(Default)]
struct EcStore {
    has: Vec<&'static str>,
    in_transit: Vec<&'static str>,
    asked_items: Vec<String>,
    asked_ready: Vec<(String, i64)>,
}

impl ExternalEncoderCache for EcStore {
    fn has_cache_item(&mut self, identifier: &str) -> bool {
        self.asked_items.push(identifier.to_string());
        self.has.contains(&identifier)
    }

    fn ensure_cache_available(&mut self, request: &Request, num_computed_tokens: i64) -> bool {
        self.asked_ready.push((request.id().to_string(), num_computed_tokens));
        !self.in_transit.contains(&&**request.id())
    }
}

fn ec_step(sched: &mut Scheduler, store: &mut EcStore) -> Step {
    let step = sched.schedule_with(false, Connectors { kv: None, encoder: Some(store), aux: None });
    check_step(sched, &step);
    apply_one_token_each(sched, &step);
    step
}

/// The step's rows by request id.
fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    step.req_handles.iter().map(|&h| sched.request(h).unwrap().id().to_string()).collect()
}

/// The step's loaded inputs as (row, input) pairs.
fn loaded(step: &Step) -> Vec<(i32, i32)> {
    step.external_encoder_input_rows.iter().copied().zip(step.external_encoder_input_ids.iter().copied()).collect()
}

#[test]
fn a_loaded_output_takes_cache_room_but_no_compute_budget() {
    // As a_chunk_stops_before_an_image_the_budget_cannot_encode, but the connector has x:
    // loaded, it leaves the whole budget to b's image.
    let mut sched = mm(100, 200, |p| p.ec_connector = true);
    sched.add_request(with_images("a", 100, vec![image("x", 10, 80)])).unwrap();
    sched.add_request(with_images("b", 100, vec![image("y", 30, 40)])).unwrap();
    let mut store = EcStore { has: vec!["x"], ..EcStore::default() };
    let step = ec_step(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![100, 100]);
    assert_eq!(encoded(&step), vec![(1, 0)]);
    assert_eq!(loaded(&step), vec![(0, 0)]);
    assert_eq!(store.asked_items, ["x", "y"]);
    // Both outputs take their room in the cache (freeable: both prompts passed them).
    assert_eq!(sched.encoder_cache_state(), (80, 200, 2));
}

#[test]
fn a_loaded_output_is_shared_and_asked_about_once_per_step() {
    let mut sched = mm(100, 200, |p| p.ec_connector = true);
    sched.add_request(with_images("a", 100, vec![image("x", 10, 80)])).unwrap();
    sched.add_request(with_images("b", 90, vec![image("x", 5, 80)])).unwrap();
    let mut store = EcStore { has: vec!["x"], ..EcStore::default() };
    let step = ec_step(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![100, 90]);
    assert_eq!((encoded(&step), loaded(&step)), (vec![], vec![(0, 0)]));
    assert_eq!(store.asked_items, ["x"]);
    // Cached now: a later request finds it there, and the connector is not asked.
    sched.add_request(with_images("c", 90, vec![image("x", 0, 80)])).unwrap();
    let step = ec_step(&mut sched, &mut store);
    assert_eq!((encoded(&step), loaded(&step)), (vec![], vec![]));
    assert_eq!(store.asked_items, ["x"]);
}

#[test]
fn a_request_whose_outputs_are_in_transit_is_passed_over_in_both_loops() {
    let mut sched = mm(100, 200, |p| {
        p.ec_connector = true;
        p.max_num_batched_tokens = 40;
    });
    sched.add_request(with_images("a", 100, vec![image("x", 10, 20)])).unwrap();
    let mut store = EcStore::default();
    let step = ec_step(&mut sched, &mut store);
    assert_eq!(step.num_scheduled_tokens, vec![40]);
    assert_eq!(store.asked_ready, [("a".to_string(), 0)]);
    sched.add_request(with_images("c", 20, vec![image("y", 0, 8)])).unwrap();
    sched.add_request(request("d", 10, 4)).unwrap();
    store.in_transit = vec!["a", "c"];
    let step = ec_step(&mut sched, &mut store);
    // a (running, asked with its computed tokens) and c (waiting) are passed over; d, with
    // no image, is never asked about and runs.
    assert_eq!(ids(&sched, &step), ["d"]);
    assert_eq!(store.asked_ready[1..], [("a".to_string(), 40), ("c".to_string(), 0)]);
    assert_eq!(sched.waiting_ids(), [std::sync::Arc::from("c")]);
    store.in_transit.clear();
    let step = ec_step(&mut sched, &mut store);
    assert_eq!(ids(&sched, &step), ["a"]);
}

#[test]
fn without_the_flag_the_connector_is_never_asked() {
    let mut sched = mm(100, 200, |_| {});
    sched.add_request(with_images("a", 100, vec![image("x", 10, 80)])).unwrap();
    let mut store = EcStore { has: vec!["x"], in_transit: vec!["a"], ..EcStore::default() };
    let step = ec_step(&mut sched, &mut store);
    assert_eq!((encoded(&step), loaded(&step)), (vec![(0, 0)], vec![]));
    assert!(store.asked_items.is_empty() && store.asked_ready.is_empty());
}

#[test]
fn the_inputs_a_request_passed_are_reported_once_with_the_flag() {
    for flag in [true, false] {
        let mut sched = mm(100, 100, |p| {
            p.max_num_batched_tokens = 40;
            p.ec_connector = flag;
        });
        sched.add_request(with_images("a", 100, vec![image("x", 10, 50)])).unwrap();
        let mut store = EcStore::default();
        ec_step(&mut sched, &mut store);
        assert!(sched.take_passed_encoder_inputs().is_empty());
        // [40, 80) passes x's end at 60.
        ec_step(&mut sched, &mut store);
        let passed: Vec<(String, u32)> =
            sched.take_passed_encoder_inputs().into_iter().map(|(id, i)| (id.to_string(), i)).collect();
        assert_eq!(passed, if flag { vec![("a".to_string(), 0)] } else { vec![] });
        assert!(sched.take_passed_encoder_inputs().is_empty());
    }
}
