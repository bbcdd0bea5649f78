//! The replay's tokens: what a workload's prompts hold, what the simulated model samples,
//! and the drafts it proposes. Every token is a pure function of its inputs (splitmix64
//! hashes), so a replay is reproducible and, token for token, the same as the Python
//! runner's (`llmsched.sim.tokens`, which the tests check it against).

use crate::error::{CoreError, CoreResult};

/// splitmix64's golden-ratio increment.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Mixed into a token's hash to draw whether its draft is accepted.
const SALT_ACCEPT: u64 = 0xACCE_97AC_CE97_ACCE;
/// The tokens of one Mooncake `hash_id` block.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;
/// Mooncake blocks' keys: this in the high half, the block's `hash_id` in the low.
const MOONCAKE_BLOCK_KEY: u64 = 0x4D6F_6F6E << 32;

/// splitmix64's finalizer.
pub fn finalize64(x: u64) -> u64 {
    let z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One splitmix64 step: the increment, then the finalizer.
pub fn mix64(x: u64) -> u64 {
    finalize64(x.wrapping_add(GOLDEN))
}

/// `count` prompt tokens in `[1, vocab_size)` determined by `key`, appended to `out`.
fn key_tokens(key: u64, count: usize, vocab_size: u32, out: &mut Vec<i64>) {
    let base = key.wrapping_mul(GOLDEN);
    let modulus = u64::from(vocab_size) - 1;
    out.extend((0..count as u64).map(|i| (finalize64(i.wrapping_add(base)) % modulus + 1) as i64));
}

/// A workload request's prompt: `prompt_len` tokens of its own `key`, or, with Mooncake
/// `prefix_blocks`, block `i` the tokens of `prefix_blocks[i]` (so requests naming the same
/// blocks share them) and the rest the request's own. `vocab_size` must be at least 2; a
/// prompt too long to allocate is an error.
pub fn prompt_tokens(key: u64, prompt_len: usize, prefix_blocks: &[u64], vocab_size: u32) -> CoreResult<Vec<i64>> {
    let mut tokens = Vec::new();
    tokens
        .try_reserve_exact(prompt_len)
        .map_err(|_| CoreError::request("prompt_len", prompt_len, "too many tokens to allocate"))?;
    for &block in prefix_blocks {
        if tokens.len() >= prompt_len {
            break;
        }
        let take = MOONCAKE_BLOCK_TOKENS.min(prompt_len - tokens.len());
        key_tokens(MOONCAKE_BLOCK_KEY.wrapping_add(block), take, vocab_size, &mut tokens);
    }
    let rest = prompt_len - tokens.len();
    key_tokens(key, rest, vocab_size, &mut tokens);
    Ok(tokens)
}

/// zlib's CRC-32, table-driven: a SIMD one picks its code by the CPU's features on its first
/// call, whose detection (`cpuid`, trapped by a virtual machine) cost a replay about 0.1 ms.
const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The simulated model: `T(r, i)`, the token it samples at index `i` of request `r`, and
/// the draft its drafter proposes there (`T` with probability `acceptance_rate`).
#[derive(Clone, Debug)]
pub struct TokenModel {
    seed_key: u64,
    vocab_size: u64,
    acceptance_rate: f64,
}

impl TokenModel {
    pub fn new(seed: u64, vocab_size: u32, acceptance_rate: f64) -> Self {
        Self { seed_key: mix64(seed), vocab_size: u64::from(vocab_size), acceptance_rate }
    }

    /// The key every token of the request `request_id` hashes.
    pub fn request_key(&self, request_id: &str) -> u64 {
        let crc = u64::from(CRC32.checksum(request_id.as_bytes()));
        mix64(self.seed_key ^ mix64(crc))
    }

    fn hash(key: u64, index: i64) -> u64 {
        mix64(key ^ mix64(index as u64))
    }

    /// `T` at `index` of the request of `key`.
    pub fn target(&self, key: u64, index: i64) -> i32 {
        (Self::hash(key, index) % self.vocab_size) as i32
    }

    /// The draft proposed for `index`: `T`, or with probability `1 - acceptance_rate` the
    /// token after it.
    pub fn proposal(&self, key: u64, index: i64) -> i32 {
        let h = Self::hash(key, index);
        let target = h % self.vocab_size;
        let unit = (mix64(h ^ SALT_ACCEPT) >> 11) as f64 * 2f64.powi(-53);
        if unit < self.acceptance_rate {
            target as i32
        } else {
            ((target + 1) % self.vocab_size) as i32
        }
    }
}
