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
    assert!(sched.set_decode_stagger(0).is_err());
    sched.set_decode_stagger(2).unwrap();
    sched.add_request(NewRequest::new("a", vec![1, 2, 3], 8)).unwrap();
    // Prefill, then a decode every other step while outputs stay in flight.
    let scheduled: Vec<usize> = (0..6).map(|_| sched.schedule().len()).collect();
    assert_eq!(scheduled, [1, 0, 1, 0, 1, 0]);
    // Without the stagger, every step.
    let mut every = Scheduler::new(config(|p| (p.async_scheduling, p.pipeline_parallel_size) = (true, 2))).unwrap();
    every.add_request(NewRequest::new("a", vec![1, 2, 3], 8)).unwrap();
    let scheduled: Vec<usize> = (0..4).map(|_| every.schedule().len()).collect();
    assert_eq!(scheduled, [1, 1, 1, 1]);
}
