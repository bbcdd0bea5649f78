//! Where a request keeps its output tokens, laid out for the update's append.
//!
//! A decode step appends one token to every running request. Appended to a heap
//! allocation of each request's own, after a model step every append missed the CPU
//! caches, and the miss could not start early: its address is read from the request
//! first. It was most of what a cold `update_from_output` cost beyond a warm one (the
//! core's `steady_decode` example with 8 MiB written between calls: 31 against 23 ns per
//! request-step with those lines made warm beforehand, where making the request's own
//! lines warm changed little: they are read in step order, which the CPU's prefetchers
//! follow). So the most recent tokens sit inline, in a cache line of the request's slot,
//! which the update reads anyway; they move to the heap allocation `RECENT` at a time, one
//! write there every `RECENT` tokens.
//!
//! How many tokens there are is the request's count (`N - Np`, in its first line, which
//! the running loop reads without this line); every method takes it as `len`.

/// Tokens kept inline: as many as fill one cache line with the heap list's header.
const RECENT: usize = 10;

/// The output tokens, oldest first: those in `flushed`, then `recent[..len - flushed.len()]`.
#[derive(Clone, Default)]
#[repr(C)]
pub(crate) struct OutputTokens {
    flushed: Vec<i32>,
    recent: [i32; RECENT],
}

impl OutputTokens {
    /// The tokens not yet moved to the heap.
    #[inline]
    fn recent(&self, len: usize) -> &[i32] {
        &self.recent[..len - self.flushed.len()]
    }

    /// Appends `token` (the `len`-th) inline, or returns false when the inline tokens fill
    /// their line (`flush` first).
    #[inline(always)]
    pub(crate) fn try_push(&mut self, len: usize, token: i32) -> bool {
        match self.recent.get_mut(len - self.flushed.len()) {
            Some(slot) => {
                *slot = token;
                true
            }
            None => false,
        }
    }

    /// Moves the inline tokens to the heap. The first time, the allocation is made for
    /// `expected` tokens in all (at least `len`), so that an output of the expected length
    /// never reallocates.
    pub(crate) fn flush(&mut self, len: usize, expected: usize) {
        let num_recent = len - self.flushed.len();
        if num_recent == 0 {
            return;
        }
        if self.flushed.capacity() == 0 {
            self.flushed.reserve_exact(expected.max(len));
        }
        self.flushed.extend_from_slice(&self.recent[..num_recent]);
    }

    /// Every token in one slice, flushing the inline ones (see `flush`).
    pub(crate) fn make_contiguous(&mut self, len: usize, expected: usize) -> &[i32] {
        self.flush(len, expected);
        &self.flushed
    }

    pub(crate) fn iter(&self, len: usize) -> impl Iterator<Item = i32> + '_ {
        self.flushed.iter().chain(self.recent(len)).copied()
    }

    /// Appends every token to `out`.
    pub(crate) fn copy_to(&self, len: usize, out: &mut Vec<i32>) {
        out.extend_from_slice(&self.flushed);
        out.extend_from_slice(self.recent(len));
    }
}

impl std::fmt::Debug for OutputTokens {
    // The count is the request's: the inline tokens are shown whole, valid or not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputTokens").field("flushed", &self.flushed).field("recent", &self.recent).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `tokens`, flushing whenever the inline line is full, as the request does.
    fn pushed(tokens: &[i32], expected: usize) -> OutputTokens {
        let mut output = OutputTokens::default();
        for (len, &t) in tokens.iter().enumerate() {
            if !output.try_push(len, t) {
                output.flush(len, expected);
                assert!(output.try_push(len, t), "a flushed list takes a token inline");
            }
        }
        output
    }

    #[test]
    fn every_token_is_kept_in_order_across_flushes() {
        for n in [0, 1, RECENT - 1, RECENT, RECENT + 1, 2 * RECENT, 5 * RECENT + 3] {
            let tokens: Vec<i32> = (0..n as i32).map(|t| t * 7 + 1).collect();
            let mut output = pushed(&tokens, 4);
            assert_eq!(output.iter(n).collect::<Vec<_>>(), tokens);
            let mut copied = vec![-5];
            output.copy_to(n, &mut copied);
            assert_eq!(copied[1..], tokens[..]);
            assert_eq!(output.make_contiguous(n, 4), &tokens[..]);
            assert_eq!(output.iter(n).collect::<Vec<_>>(), tokens, "making the tokens contiguous keeps them");
        }
    }

    #[test]
    fn the_inline_tokens_fill_one_cache_line() {
        assert_eq!(std::mem::size_of::<OutputTokens>(), 64);
        let tokens: Vec<i32> = (0..RECENT as i32).collect();
        let mut output = pushed(&tokens, 100);
        assert_eq!(output.flushed.capacity(), 0, "inline tokens need no allocation");
        assert!(!output.try_push(RECENT, 99), "the line is full");
        output.flush(RECENT, 100);
        assert!(output.flushed.capacity() >= 100, "the first flush allocates for the expected length");
    }
}
