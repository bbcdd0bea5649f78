//! The one rule for how many tokens a request may take in a step under
//! `max_model_len`, used by both the running and the waiting loop.
//!
//! The last token sampled in a step lands at index `C + n + s - 1` of a token
//! row of width `M`, so every scheduled request must keep `C + n + s <= M`
//! (spec §6.5). vLLM once had two rules, one per loop, and they disagreed by
//! one token at the boundary (PR #53962); here there is one.

/// How many tokens a request with `C` computed tokens may still be scheduled:
/// `M - C - s`. Never negative while the invariant holds.
#[inline]
pub fn room(num_computed_tokens: i64, max_model_len: i64, num_sampled_per_step: i64) -> i64 {
    // M - C - s
    max_model_len - num_computed_tokens - num_sampled_per_step
}

/// Whether a one-token step may be padded to the uniform decode shape `1 + K`:
/// only if the padded step still fits, `C + (1 + K) + s <= M` (#53962).
// Written as the spec writes it: the padded count against the room.
#[allow(clippy::int_plus_one)]
#[inline]
pub fn can_pad(num_computed_tokens: i64, num_spec_tokens: i64, max_model_len: i64, num_sampled_per_step: i64) -> bool {
    1 + num_spec_tokens <= room(num_computed_tokens, max_model_len, num_sampled_per_step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_leaves_a_slot_for_the_sampled_token() {
        assert_eq!(room(2047, 2048, 1), 0);
        assert_eq!(room(2046, 2048, 1), 1);
        assert_eq!(room(2048, 2048, 0), 0);
    }

    #[test]
    fn padding_fits_only_with_room_for_the_sampled_token() {
        let (m, s) = (2048, 1);
        for k in [1, 3] {
            // C = M - 1 - K: padded end is M, the sampled token would be written at M.
            assert!(!can_pad(m - 1 - k, k, m, s), "K={k}");
            // C = M - 2 - K: padded step ends at M - 1, the sampled token at M - 1.
            assert!(can_pad(m - 2 - k, k, m, s), "K={k}");
        }
        // vLLM's own case: M = 32, K = 1, C = 30.
        assert!(!can_pad(30, 1, 32, 1));
    }
}
