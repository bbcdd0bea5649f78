//! The invariant checker on its own: scenarios at the rules' edges, checked only by
//! `check_invariants` (no step check, no runner assertion). The checker restates each
//! rule from the spec instead of calling the code that applies it, so breaking that
//! code (`capacity::room`, `capacity::can_pad`, `prefix::hash_block`) turns these red.
mod common;

use common::*;
use llmsched_core::{NewRequest, Scheduler};

fn checked(sched: &Scheduler, when: &str) {
    if let Err(e) = sched.check_invariants() {
        panic!("{when}: {e}");
    }
}

/// Requests run to `max_model_len`, drafts accepted, the last steps at `C + n + s = M`.
#[test]
fn requests_that_run_into_max_model_len() {
    for async_scheduling in [false, true] {
        let m = 40;
        let mut sched = Scheduler::new(config(|p| {
            p.max_model_len = m;
            p.block_size = 4;
            p.num_speculative_tokens = 2;
            p.async_scheduling = async_scheduling;
        }))
        .unwrap();
        for (i, len) in [30usize, 33, 37, 38].into_iter().enumerate() {
            sched.add_request(request(&i.to_string(), len, 100)).unwrap();
        }
        for step_index in 0..200 {
            if !sched.has_requests() {
                break;
            }
            let step = sched.schedule();
            checked(&sched, &format!("after schedule {step_index}"));
            let (t, c) = sample(&sched, &step, true);
            apply(&mut sched, &step, &t, &c);
            checked(&sched, &format!("after update {step_index}"));
        }
        assert!(!sched.has_requests());
    }
}

/// A one-token admission with `C > 0` at the padding edge: `C = M - 1 - K` must not be
/// padded to `1 + K` (its sampled token would land at `M`), `C = M - 2 - K` is.
#[test]
fn one_token_admissions_at_the_padding_edge() {
    for k in [1i64, 3] {
        for offset in [1, 2] {
            let mut sched = at_the_padding_edge(64, k, offset, false);
            sched.schedule();
            checked(&sched, &format!("K={k}, C=M-{offset}-K"));
        }
    }
}

/// Block hashes of prompts and outputs, salted and not, recomputed by the checker.
#[test]
fn block_hashes_with_and_without_salt() {
    let mut sched = Scheduler::new(config(|p| {
        p.block_size = 4;
        p.enable_prefix_caching = true;
    }))
    .unwrap();
    for (id, salt) in [("plain", None), ("salted", Some("tenant")), ("again", None)] {
        let mut r = NewRequest::new(id, (1..=10).collect(), 9);
        r.cache_salt = salt.map(str::to_string);
        sched.add_request(r).unwrap();
        checked(&sched, &format!("after adding {id}"));
    }
    while sched.has_requests() {
        let step = sched.schedule();
        let (t, c) = sample(&sched, &step, false);
        apply(&mut sched, &step, &t, &c);
        checked(&sched, "after a step");
    }
}
