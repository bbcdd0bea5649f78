//! Block hashing for the prefix cache (spec §5.3).
//!
//! Each full block of a request's tokens, prompt and output alike, gets a
//! hash chained on its parent's: `h_i = H(h_{i-1}, tokens of block i, extra_i)`.
//! The extra keys are vLLM's: the LoRA adapter in every block, `cache_salt` in
//! the first only, and each multimodal input a block's tokens overlap (its identifier
//! and where it starts relative to the block: placeholder tokens are alike for every
//! image), and for a prompt given as embeddings, each block's key of them (its
//! placeholder token ids are alike for every prompt), so two requests share cached
//! blocks exactly when they share an adapter, a salt, their inputs, their embeddings and
//! a leading run of full blocks. With lookahead hashes
//! (an EAGLE drafter's), a block's hash also covers the tokens right after it,
//! and the block is hashed only once they exist.
//!
//! `H` is XXH3-128 with a fixed seed: fast (tens of nanoseconds per 16-token
//! block) and reproducible across runs and machines. Its 128-bit width makes a
//! collision negligible: among `n` distinct blocks the chance of any collision
//! is about `n^2 / 2^129`, below 1e-14 for a trillion blocks. A collision
//! would silently reuse the wrong KV, so the width matters more than speed;
//! vLLM's default SHA-256 is wider but an order of magnitude slower.

use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::kv::block_pool::BlockHash;
use crate::mm_inputs::{inputs_in_window, MmInput};

/// Fixed so that the same tokens hash the same in every process.
pub(crate) const SEED: u64 = 0x6c6c_6d73_6368_6564; // "llmsched"

/// The parent of the first block (vLLM's `NONE_HASH`).
pub const NONE_HASH: BlockHash = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;

/// A request's keys besides its tokens (vLLM's block-hash extra keys).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExtraKeys<'a> {
    /// Enters the first block only.
    pub cache_salt: Option<&'a [u8]>,
    /// Enters every block.
    pub lora_id: Option<u32>,
    /// Each enters the blocks its placeholders overlap.
    pub mm_inputs: &'a [MmInput],
    /// Block `i`'s key of the prompt embeddings it covers, for each block the prompt
    /// reaches (empty for a prompt of token ids).
    pub prompt_embeds: &'a [Box<[u8]>],
}

/// One block's keys besides its tokens.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockKeys<'a> {
    pub lora_id: Option<u32>,
    pub salt: Option<&'a [u8]>,
    /// The multimodal inputs the block overlaps, and the block's first token position.
    pub mm_inputs: &'a [MmInput],
    pub block_start: i64,
    /// The key of the prompt embeddings the block covers, if the prompt is embeddings.
    pub prompt_embeds: Option<&'a [u8]>,
}

/// Hashes one full block, its tokens given in pieces (a block can span the end of the
/// prompt), with the extra keys that block takes and the lookahead tokens after it (none
/// without lookahead hashes); `scratch` is reused across calls to avoid allocating.
pub fn hash_block(
    parent: BlockHash,
    pieces: &[&[i32]],
    lookahead: &[&[i32]],
    keys: BlockKeys<'_>,
    scratch: &mut Vec<u8>,
) -> BlockHash {
    let BlockKeys { lora_id, salt, mm_inputs, block_start, prompt_embeds } = keys;
    scratch.clear();
    scratch.extend_from_slice(&parent.to_le_bytes());
    for &token in pieces.iter().copied().flatten() {
        scratch.extend_from_slice(&token.to_le_bytes());
    }
    if lookahead.iter().any(|piece| !piece.is_empty()) {
        scratch.push(0xfd);
        for &token in lookahead.iter().copied().flatten() {
            scratch.extend_from_slice(&token.to_le_bytes());
        }
    }
    // Each key behind its own separator: no (tokens, key) pair collides with another by
    // concatenation, and a block with no extra key hashes its tokens alone.
    if let Some(lora_id) = lora_id {
        scratch.push(0xfe);
        scratch.extend_from_slice(&lora_id.to_le_bytes());
    }
    if let Some(salt) = salt {
        scratch.push(0xff);
        scratch.extend_from_slice(&(salt.len() as u64).to_le_bytes());
        scratch.extend_from_slice(salt);
    }
    for input in mm_inputs {
        scratch.push(0xfc);
        scratch.extend_from_slice(&(input.identifier.len() as u64).to_le_bytes());
        scratch.extend_from_slice(input.identifier.as_bytes());
        scratch.extend_from_slice(&(input.offset - block_start).to_le_bytes());
    }
    if let Some(key) = prompt_embeds {
        scratch.push(0xfb);
        scratch.extend_from_slice(&(key.len() as u64).to_le_bytes());
        scratch.extend_from_slice(key);
    }
    xxh3_128_with_seed(scratch, SEED)
}

/// The tokens `start..end` of `prompt` then `output`, in at most two pieces.
fn tokens_between<'t>(prompt: &'t [i32], output: &'t [i32], start: usize, end: usize) -> [&'t [i32]; 2] {
    let np = prompt.len();
    if end <= np {
        [&prompt[start..end], &[]]
    } else if start >= np {
        [&output[start - np..end - np], &[]]
    } else {
        [&prompt[start..], &output[..end - np]]
    }
}

/// Extends `hashes` to cover every full block of the tokens, `prompt` then `output`,
/// followed by `lookahead` more tokens that each block's hash also covers (incremental:
/// only blocks not hashed yet are hashed).
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    (prompt, output): (&[i32], &[i32]),
    block_size: usize,
    lookahead: usize,
    extra: ExtraKeys<'_>,
    scratch: &mut Vec<u8>,
) {
    let num_tokens = prompt.len() + output.len();
    let mut start = hashes.len() * block_size;
    while start + block_size + lookahead <= num_tokens {
        let end = start + block_size;
        let pieces = tokens_between(prompt, output, start, end);
        let after = tokens_between(prompt, output, end, end + lookahead);
        let parent = hashes.last().copied().unwrap_or(NONE_HASH);
        let first = hashes.is_empty();
        let salt = if first { extra.cache_salt } else { None };
        let (lo, hi) = inputs_in_window(extra.mm_inputs, start as i64, end as i64);
        let keys = BlockKeys {
            lora_id: extra.lora_id,
            salt,
            mm_inputs: &extra.mm_inputs[lo..hi],
            block_start: start as i64,
            prompt_embeds: extra.prompt_embeds.get(hashes.len()).map(|key| &**key),
        };
        hashes.push(hash_block(parent, &pieces, &after, keys, scratch));
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn salted(salt: Option<&[u8]>) -> ExtraKeys<'_> {
        ExtraKeys { cache_salt: salt, ..ExtraKeys::default() }
    }

    fn hashes(tokens: &[i32], block_size: usize, extra: ExtraKeys<'_>) -> Vec<BlockHash> {
        let mut out = Vec::new();
        extend_block_hashes(&mut out, (tokens, &[]), block_size, 0, extra, &mut Vec::new());
        out
    }

    #[test]
    fn only_full_blocks_are_hashed_and_extension_is_incremental() {
        let tokens: Vec<i32> = (0..10).collect();
        assert_eq!(hashes(&tokens, 4, salted(None)).len(), 2);
        let mut incremental = Vec::new();
        let mut scratch = Vec::new();
        for end in 0..=tokens.len() {
            extend_block_hashes(&mut incremental, (&tokens[..end], &[]), 4, 0, salted(None), &mut scratch);
        }
        assert_eq!(incremental, hashes(&tokens, 4, salted(None)));
    }

    #[test]
    fn a_block_hashes_the_same_wherever_the_prompt_ends() {
        let tokens: Vec<i32> = (0..13).collect();
        let extra = ExtraKeys { cache_salt: Some(b"s"), lora_id: Some(3), ..ExtraKeys::default() };
        let whole = hashes(&tokens, 4, extra);
        for np in 0..=tokens.len() {
            let (prompt, output) = tokens.split_at(np);
            let mut incremental = Vec::new();
            let mut scratch = Vec::new();
            for end in 0..=output.len() {
                extend_block_hashes(&mut incremental, (prompt, &output[..end]), 4, 0, extra, &mut scratch);
            }
            assert_eq!(incremental, whole, "prompt of {np} tokens");
        }
    }

    #[test]
    fn hashes_chain_on_the_parent() {
        let a = hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, salted(None));
        let b = hashes(&[9, 2, 3, 4, 5, 6, 7, 8], 4, salted(None));
        assert_ne!(a[0], b[0]);
        // Same second block, different prefix: different hash.
        assert_ne!(a[1], b[1]);
        assert_eq!(a, hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, salted(None)));
    }

    #[test]
    fn salt_enters_the_first_block_only() {
        let tokens: Vec<i32> = (0..8).collect();
        let plain = hashes(&tokens, 4, salted(None));
        let salted_a = hashes(&tokens, 4, salted(Some(b"tenant-a")));
        let other = hashes(&tokens, 4, salted(Some(b"tenant-b")));
        assert_ne!(plain[0], salted_a[0]);
        assert_ne!(salted_a[0], other[0]);
        // The second block's own input has no salt; it differs only through its parent.
        let mut scratch = Vec::new();
        assert_eq!(salted_a[1], hash_block(salted_a[0], &[&tokens[4..8]], &[], BlockKeys::default(), &mut scratch));
    }

    #[test]
    fn the_adapter_enters_every_block() {
        let tokens: Vec<i32> = (0..8).collect();
        let under = |lora_id| hashes(&tokens, 4, ExtraKeys { lora_id, ..ExtraKeys::default() });
        let (plain, first, second) = (under(None), under(Some(1)), under(Some(2)));
        assert_ne!(plain[0], first[0]);
        assert_ne!(first[0], second[0]);
        // The second block takes the adapter itself, not only through its parent.
        let mut scratch = Vec::new();
        assert_ne!(first[1], hash_block(first[0], &[&tokens[4..8]], &[], BlockKeys::default(), &mut scratch));
        assert_eq!(
            first[1],
            hash_block(
                first[0],
                &[&tokens[4..8]],
                &[],
                BlockKeys { lora_id: Some(1), ..BlockKeys::default() },
                &mut scratch
            )
        );
    }

    #[test]
    fn an_input_enters_the_blocks_its_placeholders_overlap() {
        use crate::mm_inputs::{check_mm_inputs, InputLimits, MmInputSpec};
        let tokens = vec![7; 16];
        let image =
            |identifier: &str, offset| MmInputSpec { identifier: identifier.into(), offset, length: 6, is_embed: None };
        let with = |specs: Vec<MmInputSpec>| {
            let inputs = check_mm_inputs(specs, 16, InputLimits { embeds: 100, whole_placeholders: None }).unwrap();
            hashes(&tokens, 4, ExtraKeys { mm_inputs: &inputs, ..ExtraKeys::default() })
        };
        let plain = hashes(&tokens, 4, salted(None));
        // Placeholders [5, 11): blocks 1 and 2.
        let a = with(vec![image("a", 5)]);
        let b = with(vec![image("b", 5)]);
        assert_eq!(a[0], plain[0]);
        assert_ne!(a[1], plain[1]);
        assert_ne!(a[1], b[1]);
        // Block 2 takes the input itself (with its offset), not only through its parent.
        let mut scratch = Vec::new();
        assert_ne!(a[2], hash_block(a[1], &[&tokens[8..12]], &[], BlockKeys::default(), &mut scratch));
        // The same image one token later is another key.
        assert_ne!(a[1], with(vec![image("a", 6)])[1]);
        assert_eq!(a[3], hash_block(a[2], &[&tokens[12..16]], &[], BlockKeys::default(), &mut scratch));
    }

    #[test]
    fn each_block_takes_its_own_key_of_the_prompt_embeddings() {
        // Prompts given as embeddings: their placeholder token ids are alike.
        let tokens = vec![0; 12];
        let keys = |names: &[&[u8]]| names.iter().map(|k| Box::<[u8]>::from(*k)).collect::<Vec<_>>();
        let with =
            |embeds: &[Box<[u8]>]| hashes(&tokens, 4, ExtraKeys { prompt_embeds: embeds, ..ExtraKeys::default() });
        let a = with(&keys(&[b"x", b"y", b"z"]));
        assert_ne!(a, hashes(&tokens, 4, salted(None)));
        // Other embeddings in the last block only: the first two blocks still match.
        let b = with(&keys(&[b"x", b"y", b"w"]));
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Block 1 takes its own key, not only its parent's.
        let mut scratch = Vec::new();
        assert_ne!(a[1], hash_block(a[0], &[&tokens[4..8]], &[], BlockKeys::default(), &mut scratch));
        // Past the keys (the output's blocks), a block has none.
        let short = with(&keys(&[b"x", b"y"]));
        assert_eq!(short[2], hash_block(short[1], &[&tokens[8..12]], &[], BlockKeys::default(), &mut scratch));
    }

    #[test]
    fn a_lookahead_hash_covers_the_next_tokens_and_waits_for_them() {
        let tokens: Vec<i32> = (0..9).collect();
        let with_lookahead = |tokens: &[i32], lookahead| {
            let mut out = Vec::new();
            extend_block_hashes(&mut out, (tokens, &[]), 4, lookahead, salted(None), &mut Vec::new());
            out
        };
        // 9 tokens hold two full blocks; the second's hash needs token 8, the third block
        // is not full.
        assert_eq!(with_lookahead(&tokens, 1).len(), 2);
        assert_eq!(with_lookahead(&tokens[..8], 1).len(), 1);
        // The same block followed by another token hashes differently, and not as the
        // plain hash; the prompt/output split does not matter.
        let mut other = tokens.clone();
        other[4] = 99;
        assert_ne!(with_lookahead(&tokens, 1)[0], with_lookahead(&other, 1)[0]);
        assert_ne!(with_lookahead(&tokens, 1)[0], with_lookahead(&tokens, 0)[0]);
        let mut split = Vec::new();
        let mut scratch = Vec::new();
        for end in 0..=5 {
            extend_block_hashes(&mut split, (&tokens[..4], &tokens[4..4 + end]), 4, 1, salted(None), &mut scratch);
        }
        assert_eq!(split, with_lookahead(&tokens, 1));
    }
}
