//! Diffusion LLMs (vLLM's `DiffusionScheduler` and `DiffusionAsyncScheduler`): nothing
//! sampled (`s = 0`), a canvas of `K` positions denoised per step and scheduled as drafts,
//! narrowed per request; a step that emits nothing leaves the canvas to the next, the
//! positions it emits are the request's tokens; under async scheduling a read whose every
//! denoising step is in flight waits.

mod common;

use common::*;
use llmsched_core::{NewRequest, RequestRef, RequestStatus, Scheduler, Step};

/// A diffusion model with a canvas of `K = 8`.
fn diffusion(async_scheduling: bool) -> Scheduler {
    Scheduler::new(config(|p| {
        p.num_sampled_tokens_per_step = 0;
        p.num_speculative_tokens = 8;
        p.async_scheduling = async_scheduling;
        p.max_num_batched_tokens = 256;
    }))
    .expect("a valid scheduler")
}

fn diffusion_request(id: &str, canvas: Option<i64>, read_steps: Option<i64>, max_tokens: i64) -> NewRequest {
    NewRequest { diffusion_canvas_length: canvas, diffusion_read_steps: read_steps, ..request(id, 8, max_tokens) }
}

/// `(request id, n, drafts scheduled)` of each row.
fn rows(sched: &Scheduler, step: &Step) -> Vec<(String, i32, i32)> {
    (0..step.len())
        .map(|i| {
            let id = sched.request(step.req_handles[i]).expect("live").id().to_string();
            (id, step.num_scheduled_tokens[i], step.num_spec_tokens[i])
        })
        .collect()
}

fn ids(sched: &Scheduler, step: &Step) -> Vec<String> {
    rows(sched, step).into_iter().map(|(id, _, _)| id).collect()
}

#[test]
fn a_diffusion_model_is_one_that_samples_nothing_but_has_a_canvas() {
    let cfg = diffusion(false).config().clone();
    assert!(cfg.is_diffusion() && !cfg.pools());
    let pooling = config(|p| p.num_sampled_tokens_per_step = 0);
    assert!(pooling.pools() && !pooling.is_diffusion());
    let generation = config(|p| p.num_speculative_tokens = 3);
    assert!(!generation.pools() && !generation.is_diffusion());
}

/// Sync: the drafter proposes the model's whole canvas, a narrower request takes its own;
/// a denoising step that emits nothing rolls its canvas back and the request goes on; the
/// step that emits the canvas commits its tokens (here up to `max_tokens`).
#[test]
fn a_sync_step_commits_only_the_positions_it_emits() {
    let mut sched = diffusion(false);
    sched.add_request(diffusion_request("read", Some(4), None, 4)).expect("a valid request");
    let prefill = sched.schedule();
    check_step(&sched, &prefill);
    assert_eq!(rows(&sched, &prefill), [("read".to_string(), 8, 0)]);
    // A prefill emits nothing, and the request goes on (a pooling model's would end).
    assert!(apply(&mut sched, &prefill, &[], &[0]).is_empty());
    let canvas: Vec<i32> = (10..18).collect();
    sched.update_draft_token_ids_of(&[RequestRef::Id("read")], &canvas, &[8]).expect("drafts");
    let read = sched.get_request("read").expect("live");
    assert_eq!(read.spec_token_ids(), &canvas[..4]);
    for emitted in [&[][..], &[5, 6, 7, 8][..]] {
        let step = sched.schedule();
        check_step(&sched, &step);
        assert_eq!(rows(&sched, &step), [("read".to_string(), 4, 4)]);
        assert_eq!(&step.spec_token_ids, &canvas[..4]);
        let events = apply(&mut sched, &step, emitted, &[emitted.len() as i32]);
        if emitted.is_empty() {
            // Denoising: nothing committed, the canvas goes to the next step.
            assert!(events.is_empty());
            let read = sched.get_request("read").expect("live");
            assert_eq!((read.num_computed_tokens(), read.status()), (8, RequestStatus::Running));
            sched.update_draft_token_ids_of(&[RequestRef::Id("read")], &canvas, &[8]).expect("drafts");
        } else {
            assert_eq!(events.len(), 1);
            assert_eq!((events[0].num_tokens, events[0].status), (4, RequestStatus::FinishedLengthCapped));
        }
        sched.check_invariants().expect("invariants after update");
    }
}

/// Async: each request's placeholders are its canvas; a read of `S` steps is passed over
/// while all `S` are in flight (`P >= S * canvas`), at every step until an output comes
/// back; a generation with a step cap is not.
#[test]
fn an_async_read_waits_while_every_denoising_step_is_in_flight() {
    let mut sched = diffusion(true);
    for (id, canvas, steps) in [("one", None, Some(1)), ("two", Some(4), Some(2)), ("gen", None, None)] {
        sched.add_request(diffusion_request(id, canvas, steps, 64)).expect("a valid request");
    }
    let prefill = sched.schedule();
    check_step(&sched, &prefill);
    let first = sched.schedule();
    check_step(&sched, &first);
    assert_eq!(rows(&sched, &first), [("one".to_string(), 8, 8), ("two".to_string(), 4, 4), ("gen".to_string(), 8, 8)]);
    assert_eq!(first.spec_token_ids, [-1; 20]);
    assert_eq!(sched.get_request("two").expect("live").num_output_placeholders(), 4);
    let second = sched.schedule();
    assert_eq!(ids(&sched, &second), ["two", "gen"]);
    for _ in 0..2 {
        let later = sched.schedule();
        check_step(&sched, &later);
        assert_eq!(ids(&sched, &later), ["gen"]);
    }
    // The first denoising step comes back with nothing emitted: the first read has no step
    // in flight, the second one of its two.
    apply(&mut sched, &prefill, &[], &[0, 0, 0]);
    apply(&mut sched, &first, &[], &[0, 0, 0]);
    assert_eq!(sched.get_request("one").expect("live").num_output_placeholders(), 0);
    assert_eq!(sched.get_request("two").expect("live").num_output_placeholders(), 4);
    let resumed = sched.schedule();
    assert_eq!(ids(&sched, &resumed), ["one", "two", "gen"]);
}

/// Without a canvas of its own a request takes the model's; a canvas wider than the
/// model's, or either field on a model that is not a diffusion one, is refused.
#[test]
fn the_diffusion_fields_are_checked() {
    let mut sched = diffusion(false);
    let err = sched.add_request(diffusion_request("wide", Some(9), None, 4)).unwrap_err().to_string();
    assert!(err.contains("diffusion_canvas_length=9") && err.contains("[1, 8]"), "{err}");
    let err = sched.add_request(diffusion_request("never", None, Some(0), 4)).unwrap_err().to_string();
    assert!(err.contains("diffusion_read_steps=0"), "{err}");
    let mut plain = Scheduler::new(config(|p| p.num_speculative_tokens = 8)).expect("a valid scheduler");
    let err = plain.add_request(diffusion_request("x", Some(4), None, 4)).unwrap_err().to_string();
    assert!(err.contains("only a diffusion model's"), "{err}");
    sched.add_request(diffusion_request("full", None, None, 4)).expect("a valid request");
    let step = sched.schedule();
    apply(&mut sched, &step, &[], &[0]);
    sched.update_draft_token_ids_of(&[RequestRef::Id("full")], &[1; 8], &[8]).expect("drafts");
    assert_eq!(sched.get_request("full").expect("live").spec_token_ids().len(), 8);
}

/// A deferred read keeps a later bound a pipeline's decode stagger set (vLLM's `max`):
/// staggered by 3, a read decoded in step 4 may decode again from step 7 only, even once
/// its output is back before that.
#[test]
fn a_deferred_read_keeps_a_longer_pipeline_wait() {
    let mut sched = diffusion(true);
    sched.set_decode_stagger(3).expect("a valid stagger");
    sched.add_request(diffusion_request("read", None, Some(1), 64)).expect("a valid request");
    let prefill = sched.schedule();
    assert_eq!(ids(&sched, &prefill), ["read"]);
    for _ in 2..4 {
        assert!(sched.schedule().is_empty());
    }
    let decode = sched.schedule();
    assert_eq!((decode.step_id, ids(&sched, &decode)), (4, vec!["read".to_string()]));
    // Step 5: deferred (its one step is in flight), the stagger's bound (7) kept.
    assert!(sched.schedule().is_empty());
    apply(&mut sched, &prefill, &[], &[0]);
    apply(&mut sched, &decode, &[], &[0]);
    assert_eq!(sched.get_request("read").expect("live").num_output_placeholders(), 0);
    assert!(sched.schedule().is_empty());
    let again = sched.schedule();
    assert_eq!((again.step_id, ids(&sched, &again)), (7, vec!["read".to_string()]));
}
