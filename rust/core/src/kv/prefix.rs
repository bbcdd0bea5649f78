//! Block hashing for the prefix cache (spec §5.3).
//!
//! Each full block of a request's tokens, prompt and output alike, gets a
//! hash chained on its parent's: `h_i = H(h_{i-1}, tokens of block i, extra_i)`.
//! The only extra key is `cache_salt`, and only in the first block, so two
//! requests share cached blocks exactly when they share a salt and a leading
//! run of full blocks.
//!
//! `H` is XXH3-128 with a fixed seed: fast (tens of nanoseconds per 16-token
//! block) and reproducible across runs and machines. Its 128-bit width makes a
//! collision negligible: among `n` distinct blocks the chance of any collision
//! is about `n^2 / 2^129`, below 1e-14 for a trillion blocks. A collision
//! would silently reuse the wrong KV, so the width matters more than speed;
//! vLLM's default SHA-256 is wider but an order of magnitude slower.

use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::kv::block_pool::BlockHash;

/// Fixed so that the same tokens hash the same in every process.
pub(crate) const SEED: u64 = 0x6c6c_6d73_6368_6564; // "llmsched"

/// The parent of the first block (vLLM's `NONE_HASH`).
pub const NONE_HASH: BlockHash = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;

/// Hashes one full block, its tokens given in pieces (a block can span the end of the
/// prompt); `scratch` is reused across calls to avoid allocating.
pub fn hash_block(parent: BlockHash, pieces: &[&[i32]], salt: Option<&[u8]>, scratch: &mut Vec<u8>) -> BlockHash {
    scratch.clear();
    scratch.extend_from_slice(&parent.to_le_bytes());
    for &token in pieces.iter().copied().flatten() {
        scratch.extend_from_slice(&token.to_le_bytes());
    }
    if let Some(salt) = salt {
        // A separator keeps (tokens, salt) pairs from colliding by concatenation.
        scratch.push(0xff);
        scratch.extend_from_slice(&(salt.len() as u64).to_le_bytes());
        scratch.extend_from_slice(salt);
    }
    xxh3_128_with_seed(scratch, SEED)
}

/// Extends `hashes` to cover every full block of the tokens, `prompt` then `output`
/// (incremental: only blocks not hashed yet are hashed).
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    prompt: &[i32],
    output: &[i32],
    block_size: usize,
    salt: Option<&[u8]>,
    scratch: &mut Vec<u8>,
) {
    let np = prompt.len();
    let mut start = hashes.len() * block_size;
    while start + block_size <= np + output.len() {
        let end = start + block_size;
        let pieces: [&[i32]; 2] = if end <= np {
            [&prompt[start..end], &[]]
        } else if start >= np {
            [&output[start - np..end - np], &[]]
        } else {
            [&prompt[start..], &output[..end - np]]
        };
        let parent = hashes.last().copied().unwrap_or(NONE_HASH);
        let first = hashes.is_empty();
        hashes.push(hash_block(parent, &pieces, if first { salt } else { None }, scratch));
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(tokens: &[i32], block_size: usize, salt: Option<&[u8]>) -> Vec<BlockHash> {
        let mut out = Vec::new();
        extend_block_hashes(&mut out, tokens, &[], block_size, salt, &mut Vec::new());
        out
    }

    #[test]
    fn only_full_blocks_are_hashed_and_extension_is_incremental() {
        let tokens: Vec<i32> = (0..10).collect();
        assert_eq!(hashes(&tokens, 4, None).len(), 2);
        let mut incremental = Vec::new();
        let mut scratch = Vec::new();
        for end in 0..=tokens.len() {
            extend_block_hashes(&mut incremental, &tokens[..end], &[], 4, None, &mut scratch);
        }
        assert_eq!(incremental, hashes(&tokens, 4, None));
    }

    #[test]
    fn a_block_hashes_the_same_wherever_the_prompt_ends() {
        let tokens: Vec<i32> = (0..13).collect();
        let whole = hashes(&tokens, 4, Some(b"s"));
        for np in 0..=tokens.len() {
            let (prompt, output) = tokens.split_at(np);
            let mut incremental = Vec::new();
            let mut scratch = Vec::new();
            for end in 0..=output.len() {
                extend_block_hashes(&mut incremental, prompt, &output[..end], 4, Some(b"s"), &mut scratch);
            }
            assert_eq!(incremental, whole, "prompt of {np} tokens");
        }
    }

    #[test]
    fn hashes_chain_on_the_parent() {
        let a = hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, None);
        let b = hashes(&[9, 2, 3, 4, 5, 6, 7, 8], 4, None);
        assert_ne!(a[0], b[0]);
        // Same second block, different prefix: different hash.
        assert_ne!(a[1], b[1]);
        assert_eq!(a, hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None));
    }

    #[test]
    fn salt_enters_the_first_block_only() {
        let tokens: Vec<i32> = (0..8).collect();
        let plain = hashes(&tokens, 4, None);
        let salted = hashes(&tokens, 4, Some(b"tenant-a"));
        let other = hashes(&tokens, 4, Some(b"tenant-b"));
        assert_ne!(plain[0], salted[0]);
        assert_ne!(salted[0], other[0]);
        // The second block's own input has no salt; it differs only through its parent.
        let mut scratch = Vec::new();
        assert_eq!(salted[1], hash_block(salted[0], &[&tokens[4..8]], None, &mut scratch));
    }
}
