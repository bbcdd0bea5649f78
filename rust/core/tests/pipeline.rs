//! Pipeline stages: a synchronous engine's steps in flight send each row's tokens from `C`
//! on (the first stage never sees a sampled token), and with async scheduling a decode
//! stagger lets a request decode once per trip through the stages.

mod common;

use common::*;
use llmsched_core::{NewRequest, Scheduler};

#[test]
fn a_synchronous_pipeline_step_sends_the_tokens_from_c_on() {
    let mut sched =
        Scheduler::new(config(|p| (p.pipeline_parallel_size, p.max_num_batched_tokens, p.max_num_seqs) = (2, 8, 4)))
            .unwrap();
    sched.add_request(NewRequest::new("a", (10..22).collect(), 4)).unwrap();
    // A 12-token prompt in chunks of 8: the first chunk's tokens, then (the first step in
    // flight) the rest of the prompt.
    let first = sched.schedule();
    assert_eq!((first.num_new_token_ids.clone(), first.new_token_ids.clone()), (vec![8], (10..18).collect()));
    let second = sched.schedule();
    assert_eq!((second.num_new_token_ids.clone(), second.new_token_ids.clone()), (vec![4], (18..22).collect()));
    // The first step is a prompt chunk (nothing sampled), the second samples 7.
    apply(&mut sched, &first, &[], &[0]);
    apply(&mut sched, &second, &[7], &[1]);
    // A decode: the token sampled last (7).
    let third = sched.schedule();
    assert_eq!((third.num_new_token_ids.clone(), third.new_token_ids.clone()), (vec![1], vec![7]));
    // Without stages nothing is sent.
    let mut single = Scheduler::new(config(|_| {})).unwrap();
    single.add_request(NewRequest::new("a", (10..22).collect(), 4)).unwrap();
    assert!(single.schedule().num_new_token_ids.is_empty());
}

#[test]
fn a_decode_stagger_spaces_a_requests_decodes() {
    let mut sched = Scheduler::new(config(|p| {
        (p.async_scheduling, p.pipeline_parallel_size) = (true, 2);
    }))
    .unwrap();
    assert!(sched.set_decode_stagger(1025).is_err() && sched.set_decode_stagger(-1).is_err());
    sched.set_decode_stagger(2).unwrap();
    sched.add_request(NewRequest::new("a", vec![1, 2, 3], 8)).unwrap();
    // Prefill, then a decode every other step while outputs stay in flight; each decode
    // records the step it may decode again (vLLM's next_decode_eligible_step).
    let (scheduled, bounds) = steps_and_bounds(&mut sched, 6);
    assert_eq!(scheduled, [1, 0, 1, 0, 1, 0]);
    assert_eq!(bounds, [3, 3, 5, 5, 7, 7]);
    // A stagger of 1 (the V2 runner without stages): every step, the bound recorded.
    // None (0, the default): every step, no bound recorded, as vLLM's other runners.
    for (stagger, expected) in [(1, [2, 3, 4, 5]), (0, [0; 4])] {
        let mut every = Scheduler::new(config(|p| (p.async_scheduling, p.pipeline_parallel_size) = (true, 2))).unwrap();
        every.set_decode_stagger(stagger).unwrap();
        every.add_request(NewRequest::new("a", vec![1, 2, 3], 8)).unwrap();
        assert_eq!(steps_and_bounds(&mut every, 4), (vec![1; 4], expected.to_vec()));
    }
}

/// Rows scheduled in each of `steps` steps (none applied), and request "a"'s decode bound
/// after each.
fn steps_and_bounds(sched: &mut Scheduler, steps: usize) -> (Vec<usize>, Vec<u64>) {
    (0..steps)
        .map(|_| {
            let rows = sched.schedule().len();
            (rows, sched.get_request("a").expect("live").next_decode_eligible_step())
        })
        .unzip()
}
