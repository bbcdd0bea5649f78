//! Property-based, stateful fuzzing of the scheduler core, without Python.
//!
//! A case is a random valid configuration (`M` down to a few blocks, block
//! sizes 1..16, `K` 0..4 with its lookahead and draft slots (padded or, as dynamic
//! speculative decoding, not), tight or loose
//! budgets, `max_num_seqs` 1..64, few or many KV blocks, chunked prefill on or
//! off, long-prefill threshold, sync or async, FCFS or priority, prefix caching,
//! watermark, `scheduler_reserve_full_isl`, KV cache residency sampled, pooling `s = 0`
//! now and then, LoRA
//! off or `max_loras` 1..=2, a prefill cadence of 1 to 4 steps, multimodal inputs under
//! an encoder budget and cache of a few embeddings, chunked or not) plus a random
//! sequence of operations (add a request —
//! prompts of 1 token, of `M - s` tokens, one token too long, sharing prefixes,
//! arriving with computed tokens, with EOS and stop tokens, priorities, cache
//! salts, LoRA adapters 1..=3, skipping the prefix cache, up to two images of a pool
//! of four, now and then one reused at another size, prompts given as embeddings
//! (placeholder ids and a key per block) —, add a duplicate
//! id, abort, abort all, schedule (now and then throttled), apply the oldest step in
//! flight, sync drafts, reset the prefix cache, add an input to a live streaming-input
//! session), played against the core by a small
//! deterministic
//! runner; then a drain to completion with no new arrivals.
//!
//! Streaming-input sessions: about one added request in five is resumable. An input op
//! adds, under a live session's id, its next input (a short prompt, new `max_tokens`,
//! EOS and stop tokens), the end of the session (not resumable), or a bad input (empty,
//! too long alone or for the session, `max_tokens` 0, `min_tokens > max_tokens`, an
//! image): refused with the state unchanged, exactly when the documented rules say. The
//! test keeps each session's inputs still queued and whether it waits for input; at a
//! stop it predicts what the session does (waits for input, takes up the next input when
//! it fits, or finishes) and checks it: the stop is not a finish, the session keeps the
//! KV of its confirmed tokens (`C = N - s`, or `C - P` of stale output) and no draft or
//! placeholder, its tokens become all but the last sampled one plus the input's prompt,
//! it is admitted again from that `C`; a paused session holds a runner slot (an admitting
//! step leaves `running + paused <= max_num_active_seqs`) and is not unfinished work
//! (`get_num_unfinished_requests`). The drain ends every session (the end-of-session
//! input, or an abort) first.
//!
//! The runner samples, for each entry of a step whose request is not a prefill
//! chunk right after `schedule()`, `s * (1 + a)` tokens, `a` a random number of
//! accepted drafts in `0..=num_spec` (like `tests/common.rs::sample`, with
//! random tokens so that EOS and stop tokens fire), and sometimes reorders its
//! rows (`row_of_entry`). Up to `depth` (1..=3) steps are in flight, applied in
//! order; `depth > 1` with sync scheduling is the pipeline-parallel shape. Sync
//! drafts are given, as vLLM's engine does, only to running requests and only
//! when no step is in flight.
//!
//! Properties, after every `schedule()` and every `update_from_output()`:
//! * `check_invariants()` is Ok;
//! * every entry has `n >= 1`, `C + n + s <= M`, `num_spec <= min(n, K)`, and
//!   `C` after the step is `C + n`; one entry per request;
//! * `sum(n) = total <= max_num_scheduled_tokens`,
//!   `sum(n + draft_slots) <= max_num_batched_tokens`, `len <= max_num_seqs`;
//! * the step's LoRA set is its rows' adapters, at most `max_loras` of them;
//! * every image a row's tokens overlap is among the runner's encoder outputs (encoded in
//!   this step or an earlier one, not evicted since); a request failed for an image's size
//!   shares that image's identifier with a request that has it at another size;
//! * drafts: an admission has drafts only when padded (`n = 1 + K`, all -1);
//!   async drafts are -1 placeholders; sync drafts are a prefix of the ones
//!   given; a prefix hit is whole blocks and at most `N - 1` tokens;
//! * the step's block columns, applied to a runner-side copy of each block
//!   table (replace for new and resumed requests, append otherwise), give the
//!   request's block table;
//! * KV content: the runner records, per block slot, the token whose KV each
//!   step computes (positions whose token is not known yet are resolved when
//!   the step returns; rejected drafts leave garbage). Every block a running
//!   request holds under its own hash (a prefix-cache block) must hold the KV
//!   of its tokens. Checked where the position model is exact (not async with
//!   drafts);
//! * every token the runner returns is delivered once and only once (or dropped
//!   with a reset's stale output): the tokens delivered to a request are its
//!   output tokens; outputs never pass `max_tokens`, tokens never pass `M`;
//! * events: at most one per request, none after its finish, the status is the
//!   request's, a stop is the one `check_stop` gives on the last token.
//!
//! Operations check their own contracts: a request is refused exactly when it
//! breaks a documented rule (and a refusal changes nothing), a duplicate live id
//! is refused, an abort finishes exactly the live ids given, a prefix-cache
//! reset succeeds exactly when no block is in use.
//!
//! At the end, with no new arrivals, the drain finishes within the bound derived
//! at `Harness::liveness_bound`, every added request finished exactly once (a
//! finished event or an abort, then reported once in a step's `finished`), every
//! block is free and `has_requests()` is false. `drain_after_a_burst_is_live`
//! is the liveness property alone: up to 31 arrivals, then only the drain.
//!
//! Findings are kept at the end as `regression_*` tests; they are fixed in the
//! core (two as configuration rules, which the generator respects).
//!
//! Environment: `PROPTEST_CASES` overrides the default case counts (kept small
//! so that `cargo test -p llmsched-core` stays fast); `PROPTEST_TRACE=1` prints
//! every step and output (for replaying a minimized case);
//! `cargo test --test proptest_scheduler coverage -- --ignored --nocapture`
//! prints what the generators exercise.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use llmsched_core::{
    AttentionKind, AuxOutputs, BlockHash, CachedBlocks, ConfigParams, Connectors, CoreError, ExternalEncoderCache,
    ExternalKv, ExternalMatch, Grammar, Handle, KvCacheGroups, KvEvent, MmInputSpec, NewRequest, Policy, Request,
    RequestEvent, RequestRef, RequestStatus, RunnerOutput, Scheduler, SchedulerConfig, SessionInputAdded, Step,
};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError};

/// Token ids the runner samples are in `0..VOCAB`; EOS and stop tokens are drawn
/// from the same range, so a stop fires about once every `VOCAB` tokens.
const VOCAB: u64 = 40;

/// `PROPTEST_TRACE=1` prints every step and output (for minimized cases).
fn tracing() -> bool {
    std::env::var_os("PROPTEST_TRACE").is_some()
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn proptest_config(default_cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default_cases),
        // Minimal cases become #[test] regressions in this file, not files on disk.
        failure_persistence: None,
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    }
}

/// SplitMix64: the runner's randomness, seeded by the operations.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

// ---------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------

/// Raw knobs; `derive_config` maps them to a valid configuration. Kept raw so
/// that shrinking works on independent numbers.
#[derive(Clone, Debug)]
struct RawConfig {
    block_size_log2: u32,
    model_blocks: i64,
    model_extra: i64,
    big_model: bool,
    pooling: bool,
    k: i64,
    lookahead_sel: u8,
    draft_slots_sel: u8,
    max_num_seqs: i64,
    budget_sel: u8,
    budget_small: i64,
    scheduled_sel: u8,
    active_sel: u8,
    blocks_sel: u8,
    blocks_extra: i64,
    chunked: bool,
    long_prefill: i64,
    adaptive: bool,
    async_scheduling: bool,
    priority: bool,
    caching: bool,
    watermark_sel: u8,
    reserve_full_isl: bool,
    depth: usize,
    max_loras: i64,
    prefill_schedule_interval: i64,
    /// 0: one full-attention group; else a hybrid layout (`hybrid_groups`).
    groups_sel: u8,
    window: u32,
    retention_sel: u8,
    /// 0, 1: text only; else multimodal inputs under an encoder budget (`derive_config`).
    mm_sel: u8,
    /// A KV connector (one KV-cache group only): external loads, finished requests' blocks
    /// held until the harness releases them.
    kv_connector: bool,
    /// With multimodal inputs, an encoder-cache connector: encoder outputs loaded instead
    /// of encoded, requests passed over while theirs are in transit.
    ec_connector: bool,
}

/// Up to two images for a prompt of `len` tokens, from `bits`: identifiers from a pool of
/// four, each of a fixed length (`1 + 2 * id` placeholders: some longer than the smaller
/// budgets, which refuses the request), except now and then one reused with a length one
/// longer (another image under a client's id: the request is failed if the scheduler meets
/// both); gaps between them of 0 to 4 tokens.
fn images(bits: u64, len: i64) -> Vec<MmInputSpec> {
    let mut out = Vec::new();
    let mut offset = (bits % 7) as i64;
    for i in 0..(bits >> 3) % 3 {
        let b = bits >> (5 + 8 * i);
        let id = (b % 4) as i64;
        let length = 1 + 2 * id + i64::from(b >> 2 & 31 == 0);
        if offset + length > len {
            break;
        }
        out.push(MmInputSpec { identifier: format!("img{id}"), offset, length, is_embed: None });
        offset += length + ((b >> 7) % 5) as i64;
    }
    out
}

/// The KV-cache groups of `groups_sel`: sliding-window, chunked local or Mamba groups
/// beside full ones, in the orders vLLM produces (full first, or last) and with several of
/// a kind; the last layout's Mamba state is aligned (see `derive_config`).
fn hybrid_groups(sel: u8, window: u32) -> KvCacheGroups {
    let (full, sliding) = (AttentionKind::Full, AttentionKind::SlidingWindow { window });
    let chunked = AttentionKind::ChunkedLocal { chunk: window };
    let mamba = AttentionKind::Mamba;
    let kinds: &[AttentionKind] = match sel {
        0 => &[full],
        1 => &[full, sliding],
        2 => &[sliding, sliding, full],
        3 => &[sliding, full, sliding],
        4 => &[chunked, chunked, full],
        5 => &[full, chunked, sliding],
        6 => &[mamba, full, mamba],
        _ => &[full, mamba],
    };
    KvCacheGroups::new(kinds).expect("a valid layout")
}

fn raw_config() -> impl Strategy<Value = RawConfig> {
    let a = (
        0u32..=4,
        1i64..=12,
        0i64..16,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.05),
        0i64..=4,
        0u8..3,
        0u8..4,
        prop_oneof![1i64..=4, 1i64..=64],
        0u8..4,
        1i64..=8,
        0u8..6,
    );
    let b = (
        0u8..6,
        0u8..4,
        0i64..4,
        prop::bool::weighted(0.8),
        prop_oneof![Just(0i64), 1i64..=4096],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..4,
        prop::bool::weighted(0.85),
        1usize..=3,
    );
    // Mostly LoRA off; else one or two adapters at a time.
    let c = prop_oneof![3 => Just(0i64), 1 => 1i64..=2];
    // Mostly every step may prefill; else a cadence of 2 to 4 executed steps.
    let d = prop_oneof![3 => Just(1i64), 1 => 2i64..=4];
    // Mostly one group; else a hybrid layout with a window of a few blocks.
    let e = (
        prop_oneof![2 => Just(0u8), 1 => 1u8..=7],
        prop_oneof![1u32..=8, 1u32..=64],
        0u8..3,
        0u8..5,
        prop::bool::weighted(0.25),
        any::<bool>(),
    );
    (a, b, c, d, e).prop_map(|(a, b, max_loras, prefill_schedule_interval, e)| RawConfig {
        block_size_log2: a.0,
        model_blocks: a.1,
        model_extra: a.2,
        big_model: a.3,
        pooling: a.4,
        k: a.5,
        lookahead_sel: a.6,
        draft_slots_sel: a.7,
        max_num_seqs: a.8,
        budget_sel: a.9,
        budget_small: a.10,
        scheduled_sel: a.11,
        active_sel: b.0,
        blocks_sel: b.1,
        blocks_extra: b.2,
        chunked: b.3,
        long_prefill: b.4,
        adaptive: b.5,
        async_scheduling: b.6,
        priority: b.7,
        caching: b.8,
        watermark_sel: b.9,
        reserve_full_isl: b.10,
        depth: b.11,
        max_loras,
        prefill_schedule_interval,
        groups_sel: e.0,
        window: e.1,
        retention_sel: e.2,
        mm_sel: e.3,
        kv_connector: e.4,
        ec_connector: e.5,
    })
}

fn derive_config(r: &RawConfig) -> ConfigParams {
    // Layout 7 holds its Mamba state at block boundaries: prefix caching on, no KV
    // connector (refused beside it), so that the fuzz reaches it often. Drafts without
    // pipeline stages: the runner's model of the states a verify step writes into the
    // speculative blocks follows its acceptances step by step.
    // Drafts fewer than a block's tokens: a step's accepted tokens then pass at most one
    // boundary, which vLLM's runner copies the state of (with more, a boundary passed
    // could keep a stale state; vLLM's Mamba blocks are far larger than any draft count).
    // (With async scheduling the runner's KV model is off beside drafts: the tables and the
    // pool are checked, not the states. Pipeline stages keep out: the model follows one step.)
    let pipeline = !r.async_scheduling && r.depth > 1;
    let drafts = if pipeline { 0 } else { r.k.min((1 << r.block_size_log2) - 1) };
    let aligned_mamba = RawConfig { k: drafts, kv_connector: false, caching: true, ..r.clone() };
    let r = if r.groups_sel == 7 { &aligned_mamba } else { r };
    let bs = 1i64 << r.block_size_log2;
    let s = if r.pooling { 0 } else { 1 };
    let m = if r.big_model { 256 + r.model_extra * 37 } else { bs * r.model_blocks + r.model_extra % bs };
    let m = m.max(2);
    // A pooling model has no drafts (s = 0 with a canvas is a diffusion model, not fuzzed
    // here: `tests/diffusion.rs`).
    let k = if r.pooling { 0 } else { r.k };
    let lookahead = match (k, r.lookahead_sel) {
        (0, _) | (_, 0) => 0,
        (_, 1) => k,
        _ => k + 1,
    };
    let max_num_seqs = r.max_num_seqs;
    let mut mnbt = match r.budget_sel {
        0 => r.budget_small,
        1 => m / 2,
        2 => m,
        _ => 4 * m,
    }
    .max(max_num_seqs);
    if !r.chunked {
        mnbt = mnbt.max(m);
    }
    // vLLM: 0 for most drafters, 1 for a plain draft model, K - 1 (P-EAGLE) or K (PARD).
    let draft_slots = match r.draft_slots_sel {
        0 => 0,
        1 => k.min(1),
        2 => (k - 1).max(0),
        _ => k,
    }
    .min(mnbt - 1);
    let max_num_scheduled_tokens = match r.scheduled_sel {
        4 => Some((mnbt / 2).max(1)),
        5 => Some(r.budget_small.min(mnbt)),
        _ => None,
    };
    let max_num_active_seqs = match r.active_sel {
        5 => Some((max_num_seqs / 2).max(1)),
        _ => None,
    };
    let full_blocks = (m + bs - 1) / bs;
    let num_gpu_blocks = match r.blocks_sel {
        // Very few: many requests are refused as "could never finish".
        0 => 2 + r.blocks_extra,
        // Few: one longest request fits, with a little to spare; or about two.
        1 => full_blocks + 1 + r.blocks_extra,
        2 => 2 * full_blocks + 1 + r.blocks_extra,
        _ => 4 * full_blocks + 64,
    };
    let long_prefill_token_threshold = if r.long_prefill == 0 { 0 } else { (r.long_prefill - 1) % m + 1 };
    let mut p = ConfigParams {
        max_model_len: m,
        max_num_seqs,
        max_num_batched_tokens: mnbt,
        max_num_scheduled_tokens,
        max_num_active_seqs,
        block_size: bs,
        num_gpu_blocks,
        enable_chunked_prefill: r.chunked,
        long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive: r.adaptive,
        num_speculative_tokens: k,
        num_lookahead_tokens: lookahead,
        max_num_new_slots_for_drafting: draft_slots,
        num_sampled_tokens_per_step: s,
        async_scheduling: r.async_scheduling,
        watermark: [0.0, 0.0, 0.1, 0.3][r.watermark_sel as usize],
        scheduler_reserve_full_isl: r.reserve_full_isl,
        enable_prefix_caching: r.caching,
        enable_kv_cache_events: r.caching,
        policy: if r.priority { Policy::Priority } else { Policy::Fcfs },
        max_loras: r.max_loras,
        prefill_schedule_interval: r.prefill_schedule_interval,
        kv_cache_groups: hybrid_groups(r.groups_sel, r.window),
        // The steps the test keeps in flight: as many pipeline stages (async: beyond two).
        pipeline_parallel_size: if r.async_scheduling && r.depth <= 2 { 1 } else { r.depth as i64 },
        prefix_cache_retention_interval: [0, bs, 4 * bs][r.retention_sel as usize],
        // With a drafter's lookahead slots, EAGLE's prefix-cache rule: none, the block
        // drop or lookahead hashes (drawn from a field the rest reads only modulo bs).
        eagle_block_drop: lookahead > 0 && r.model_extra % 3 == 1,
        num_hash_lookahead_tokens: if lookahead > 0 && r.model_extra % 3 == 2 { 1 } else { 0 },
        // Dynamic speculative decoding now and then (from a field read modulo 3 above).
        pad_spec_decode: r.model_extra % 5 != 4,
        // KV cache residency sampled now and then (its clock is not checked).
        kv_cache_metrics_sample: if r.caching && r.model_extra % 7 == 3 { 0.5 } else { 0.0 },
        ..ConfigParams::default()
    };
    if r.mm_sel >= 2 {
        // Budgets of a few embeddings, down to one image's (inputs are 1 to 8 embeddings):
        // chunks stop before images, outputs are evicted and encoded again.
        let (budget, cache) = [(6, 6), (8, 16), (24, 12)][usize::from(r.mm_sel - 2)];
        p.max_num_encoder_input_tokens = budget;
        p.encoder_cache_size = cache;
        p.disable_chunked_mm_input = r.adaptive;
        p.ec_connector = r.ec_connector;
    }
    if lookahead > 0 {
        // A drafter with lookahead slots reads the prompt ahead: one token (EAGLE-like) or,
        // with one KV-cache group now and then, K (a multi-module MTP drafter).
        p.num_prefill_lookahead_tokens = match r.model_extra % 4 {
            0 => 0,
            3 if r.groups_sel == 0 && r.mm_sel < 2 => k,
            _ => 1,
        };
    }
    if p.kv_cache_groups.iter().any(|kind| matches!(kind, AttentionKind::ChunkedLocal { .. })) {
        // EAGLE's block drop beside chunked local attention is refused (as vLLM asserts).
        p.eagle_block_drop = false;
    } else if p.eagle_block_drop && r.groups_sel > 0 && r.model_extra % 2 == 0 {
        // The drafter's layers in the full-attention group: only its kind drops.
        let marked = p.kv_cache_groups.to_text().replace("full", "full+eagle");
        p.kv_cache_groups = KvCacheGroups::parse(&marked).expect("a valid layout");
    }
    if r.kv_connector {
        p.kv_connector = true;
        // A producer's connector: a request preempted for KV drops its output in flight.
        p.preemption_drops_in_flight_output = r.adaptive;
        // A consumer's with steps in flight: freed blocks wait for those steps.
        p.defer_block_free = !r.adaptive || p.async_scheduling;
    } else {
        // The flag without a connector (vLLM's attribute set by hand), with steps in flight.
        p.defer_block_free = r.adaptive && r.depth >= 2;
    }
    if p.kv_cache_groups.has_mamba() && ((p.num_speculative_tokens > 0 && r.groups_sel != 7) || p.kv_connector) {
        // Beside connectors Mamba groups run without prefix caching (vLLM's
        // mamba_cache_mode "none"), and beside drafts but in layout 7.
        (p.enable_prefix_caching, p.enable_kv_cache_events) = (false, false);
    }
    if p.kv_cache_groups.has_mamba() && p.enable_prefix_caching {
        // Aligned Mamba state, its layers writing prefill checkpoints or not; chunks end on
        // block boundaries inside images.
        p.mamba_prefill_checkpoint_alignment = [0, 1, 2][r.model_extra.rem_euclid(3) as usize];
        p.disable_chunked_mm_input = false;
    }
    fit_budget_rules(&mut p);
    // A multi-module lookahead needs steps that can give a request L tokens.
    let largest = p
        .max_num_scheduled_tokens
        .unwrap_or(p.max_num_batched_tokens)
        .min(p.max_num_batched_tokens - p.max_num_new_slots_for_drafting);
    let threshold = p.long_prefill_token_threshold;
    if p.num_prefill_lookahead_tokens > 1
        && (largest < p.num_prefill_lookahead_tokens || (0 < threshold && threshold < p.num_prefill_lookahead_tokens))
    {
        p.num_prefill_lookahead_tokens = 1;
    }
    p
}

/// Raises the budget to what `SchedulerConfig` requires (rules added after this
/// fuzz found requests that blocked the waiting queue forever, see the
/// `regression_*_does_not_livelock` tests): the per-request budget
/// `R = min(max_num_scheduled_tokens, max_num_batched_tokens - draft_slots)`
/// must fit a padded decode, `1 + K`, and, with chunked prefill off, the
/// longest request, `M - s`.
fn fit_budget_rules(p: &mut ConfigParams) {
    let s = p.num_sampled_tokens_per_step;
    let mut need = 1;
    if p.num_speculative_tokens > 0 && s > 0 {
        need = need.max(1 + p.num_speculative_tokens);
    }
    if !p.enable_chunked_prefill {
        need = need.max(p.max_model_len - s);
    }
    if p.kv_cache_groups.has_mamba() && p.enable_prefix_caching && p.max_num_new_slots_for_drafting > 0 {
        // Beside aligned Mamba a request's share of a step reaches a block (a prompt chunk
        // must reach a boundary).
        need = need.max(p.block_size);
    }
    p.max_num_batched_tokens = p.max_num_batched_tokens.max(need + p.max_num_new_slots_for_drafting);
    p.max_num_scheduled_tokens = p.max_num_scheduled_tokens.map(|v| v.max(need));
}

/// A request to add, in raw form; `Harness::make_request` resolves it against `M`.
#[derive(Clone, Debug)]
struct AddOp {
    /// 0: 1 token, 1: M - s (the longest legal), 2: M - s + 1 (refused),
    /// 3: random, 4: short, 5: a multiple of B, or one more.
    len_kind: u8,
    len_raw: u16,
    /// 0: random tokens; 1..=3: a shared prefix of `prefix_len` tokens first.
    prefix: u8,
    prefix_len: u16,
    /// 0: 1, 1: small, 2: M, 3: random up to M.
    max_tokens_kind: u8,
    max_tokens_raw: u16,
    /// Arrives with `num_computed_tokens > 0` (a KV-holding arrival) when set.
    computed: Option<u16>,
    eos: Option<u8>,
    stops: [Option<u8>; 2],
    min_tokens: u8,
    priority: i8,
    /// 0: same arrival time as the previous request (a tie), else later.
    arrival_delta: u8,
    salt: Option<u8>,
    /// Admitted without reading the prefix cache (vLLM's prompt-logprobs requests).
    skip_prefix_cache: bool,
    /// The LoRA adapter, 1..=3 (refused when the config has LoRA off).
    lora: Option<u8>,
    /// Structured output: whether its grammar will compile.
    grammar: Option<bool>,
    /// A streaming-input session (`NewRequest::resumable`).
    session: bool,
    token_seed: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Add(AddOp),
    /// Schedules a step (first applying the oldest step when `depth` are in flight).
    Schedule {
        seed: u64,
    },
    /// Applies the oldest step in flight, if any.
    Apply,
    /// Aborts up to three requests picked among all ever added (finished ones
    /// are ignored by the core), plus an unknown id when `ghost`.
    Abort {
        picks: [u16; 3],
        num: u8,
        ghost: bool,
    },
    AbortAll,
    /// Sync drafts for some live requests (sync scheduling, nothing in flight).
    Drafts {
        seed: u64,
    },
    ResetPrefixCache {
        reset_running: bool,
    },
    /// `add_request` with the id of a live request: refused, nothing changes.
    Duplicate {
        pick: u16,
    },
    /// The engine reports some grammars compiled or failed, then fails the requests whose
    /// failed grammar a waiting loop saw.
    Grammars {
        seed: u64,
    },
    /// `add_request` of an input under a live session's id (now and then a live request's
    /// that is not a session: a duplicate). `kind` (`input_of`): 0..=9 the next input, 10
    /// and 11 the end of the session, 12..=15 a bad input.
    Input {
        pick: u16,
        kind: u8,
        len_raw: u16,
        max_tokens_raw: u16,
        seed: u64,
    },
}

fn add_op() -> impl Strategy<Value = AddOp> {
    (
        (0u8..6, any::<u16>(), 0u8..4, any::<u16>(), 0u8..4, any::<u16>()),
        (
            prop::option::weighted(0.15, any::<u16>()),
            prop::option::weighted(0.5, 0u8..VOCAB as u8),
            [prop::option::of(0u8..VOCAB as u8), prop::option::of(0u8..VOCAB as u8)],
            0u8..4,
            -2i8..=2,
            0u8..3,
            prop::option::weighted(0.2, 0u8..2),
            any::<u64>(),
            prop::option::weighted(0.4, 1u8..=3),
            prop::bool::weighted(0.15),
            prop::option::weighted(0.2, prop::bool::weighted(0.8)),
            prop::bool::weighted(0.2),
        ),
    )
        .prop_map(|(a, b)| AddOp {
            len_kind: a.0,
            len_raw: a.1,
            prefix: a.2,
            prefix_len: a.3,
            max_tokens_kind: a.4,
            max_tokens_raw: a.5,
            computed: b.0,
            eos: b.1,
            stops: b.2,
            min_tokens: b.3,
            priority: b.4,
            arrival_delta: b.5,
            salt: b.6,
            token_seed: b.7,
            lora: b.8,
            skip_prefix_cache: b.9,
            grammar: b.10,
            session: b.11,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => add_op().prop_map(Op::Add),
        35 => any::<u64>().prop_map(|seed| Op::Schedule { seed }),
        15 => Just(Op::Apply),
        6 => (any::<[u16; 3]>(), 1u8..=3, prop::bool::weighted(0.2))
            .prop_map(|(picks, num, ghost)| Op::Abort { picks, num, ghost }),
        1 => Just(Op::AbortAll),
        6 => any::<u64>().prop_map(|seed| Op::Drafts { seed }),
        3 => any::<bool>().prop_map(|reset_running| Op::ResetPrefixCache { reset_running }),
        2 => any::<u16>().prop_map(|pick| Op::Duplicate { pick }),
        4 => any::<u64>().prop_map(|seed| Op::Grammars { seed }),
        10 => (any::<u16>(), 0u8..16, any::<u16>(), any::<u16>(), any::<u64>()).prop_map(
            |(pick, kind, len_raw, max_tokens_raw, seed)| Op::Input { pick, kind, len_raw, max_tokens_raw, seed }
        ),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    config: ConfigParams,
    /// Steps in flight at most (1..=3).
    depth: usize,
    ops: Vec<Op>,
    drain_seed: u64,
}

fn case(max_ops: usize) -> impl Strategy<Value = Case> {
    (raw_config(), prop::collection::vec(op(), 0..max_ops), any::<u64>()).prop_map(|(raw, ops, drain_seed)| Case {
        config: derive_config(&raw),
        depth: raw.depth,
        ops,
        drain_seed,
    })
}

/// The liveness case: a burst of arrivals up front, then only the drain.
fn burst_case() -> impl Strategy<Value = Case> {
    (raw_config(), prop::collection::vec(add_op(), 1..32), any::<u64>()).prop_map(|(raw, adds, drain_seed)| Case {
        config: derive_config(&raw),
        depth: raw.depth,
        ops: adds.into_iter().map(Op::Add).collect(),
        drain_seed,
    })
}

// ---------------------------------------------------------------------------
// The harness: the core, a runner, and what the test knows about each request
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Tracked {
    id: String,
    handle: Handle,
    prompt_len: i64,
    max_tokens: i64,
    eos: Option<i32>,
    stops: Vec<i32>,
    lora: Option<i32>,
    skip_prefix_cache: bool,
    /// Structured output: whether its grammar compiles, and whether the core was told.
    grammar: Option<(bool, bool)>,
    /// Output tokens delivered through events.
    delivered: i64,
    /// Prompt and delivered tokens: the request's tokens, kept after it is gone.
    tokens: Vec<i32>,
    /// `num_computed_tokens` at arrival (KV loaded from elsewhere).
    arrived_computed: i64,
    /// Finished: a finished event, or an abort that returned its id.
    finished: bool,
    /// Reported in a step's `finished` list.
    reported: bool,
    /// Its images, `(identifier, length)`.
    images: Vec<(String, i64)>,
    /// A KV load across steps started for it, not yet admitted since: the tokens loaded.
    loading: Option<i64>,
    /// Admitted by this step after a load of every token: it computes the last one again,
    /// whose block a window or chunk the loaded tokens moved past has already given back
    /// (vLLM's behaviour: the null block takes that position's KV).
    recomputes_after_whole_load: bool,
    /// A streaming-input session: what the test knows of it.
    session: Option<SessionModel>,
    /// The stop reason it carries: set by a stop on a stop id and, as vLLM's, kept through a
    /// session's later inputs (a later stop on EOS or the length reports it again).
    stop_reason: Option<i32>,
    /// The tokens a session kept at each stop it went on from (its epochs: a step scheduled
    /// in an earlier epoch computed KV for tokens past the kept ones that are gone).
    epoch_kept: Vec<i64>,
    /// The `C` a session kept when it took up its latest input, until it is admitted again.
    resume_from: Option<i64>,
}

/// A streaming-input session as the test knows it.
#[derive(Debug, Default)]
struct SessionModel {
    /// Inputs added and not taken up yet, oldest first; None is the end of the session.
    queued: VecDeque<Option<InputModel>>,
    /// Waiting for its next input (`WaitingForStreamingReq`).
    paused: bool,
}

/// A session's next input: its prompt and the limits that replace the session's.
#[derive(Clone, Debug)]
struct InputModel {
    prompt: Vec<i32>,
    max_tokens: i64,
    eos: Option<i32>,
    stops: Vec<i32>,
}

/// What a session does at a stop, by the test's record of it.
enum AtStop {
    Finishes,
    Pauses,
    TakesUp(InputModel),
}

/// The runner's model of one KV slot (a token position in a block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kv {
    Empty,
    /// KV computed for this token.
    Token(i32),
    /// Computed by step `step_id` for position `pos`, whose token was not known
    /// when the step was scheduled (the sampled token of a step in flight, or a
    /// draft): resolved when the step's output is applied.
    Pending {
        step_id: u64,
        pos: i64,
    },
    /// Computed for a rejected draft, or for a token that was never appended.
    Garbage,
    /// An aligned Mamba group's block (its first slot): the state after the first `len`
    /// tokens, written by step `step_id` (the steps after it read it).
    MambaState {
        len: i64,
        step_id: u64,
    },
}

/// A step in flight with the runner's output, decided right after `schedule()`.
struct Pending {
    /// KV slots written with `Kv::Pending`: `(entry, block, pos)`.
    pending_kv: Vec<(usize, u32, i64)>,
    step: Step,
    /// Runner rows: tokens and counts in row order.
    tokens: Vec<i32>,
    counts: Vec<i32>,
    /// `row_of_entry`, when the runner reordered its rows.
    rows: Option<Vec<u32>>,
    /// The blocks each entry's request writes in the step (its positions `C..C + n`).
    writes: Vec<(Handle, Vec<u32>)>,
    /// Each entry's request's epoch (`Tracked::epoch_kept`) when the step was scheduled.
    epochs: Vec<usize>,
}

/// What a run exercised (printed by the ignored `coverage` test).
#[derive(Clone, Debug, Default)]
struct Coverage {
    cases: u64,
    accepted: u64,
    refused: u64,
    kv_holding_arrivals: u64,
    steps: u64,
    entries: u64,
    padded: u64,
    draft_slots: u64,
    preemptions: u64,
    prefix_hit_tokens: u64,
    finished_stop: u64,
    finished_length: u64,
    aborted: u64,
    resets_ok: u64,
    resets_refused: u64,
    max_in_flight: u64,
    reordered_rows: u64,
    at_model_len_edge: u64,
    /// Requests length-capped at the longest request the pool holds, short of max_model_len.
    pool_capped: u64,
    drain_iterations: u64,
    /// Requests the waiting loop passed over for the full LoRA set.
    lora_set_aside: u64,
    /// Requests the waiting loop passed over while their grammar compiled or after it failed.
    grammar_set_aside: u64,
    /// Requests failed for a grammar that did not compile.
    grammar_failed: u64,
    /// Multimodal inputs of accepted and refused requests; requests failed for an identifier
    /// reused with another size; inputs scheduled for encoding; encoder outputs evicted.
    images: u64,
    image_mismatches: u64,
    encoder_set_aside: u64,
    /// Requests a multi-module drafter's prefill lookahead left nothing in a step.
    lookahead_set_aside: u64,
    /// With a KV connector: requests set aside as it could not tell, tokens it loaded,
    /// finished requests' blocks held and released.
    connector_set_aside: u64,
    external_tokens: u64,
    held_released: u64,
    /// Asynchronous loads started, and reported in (live or finished requests).
    loads_started: u64,
    loads_reported: u64,
    loads_failed: u64,
    encoded: u64,
    evicted: u64,
    /// With an encoder-cache connector: outputs loaded, requests passed over while theirs
    /// were in transit.
    ec_loaded: u64,
    ec_in_transit: u64,
    /// KV cache events: blocks stored, lookups reported, blocks removed, caches cleared.
    blocks_stored: u64,
    hits_reported: u64,
    blocks_removed: u64,
    caches_cleared: u64,
    /// Hybrid layouts: prefix-hit tokens, and table entries a sliding window nulled.
    hybrid_hit_tokens: u64,
    window_nulls: u64,
    /// Streaming-input sessions: added; stops they went on from (waiting for input, or
    /// taking up one queued); inputs queued, taken up when added, refused; sessions ended
    /// at a stop (their end, or an input that did not fit), or while waiting; sessions
    /// the waiting loop passed over while they waited for input; requests passed over for a
    /// request behind them that held its KV and could run, nothing running (deviation 15).
    sessions: u64,
    session_pauses: u64,
    inputs_taken_at_stop: u64,
    inputs_queued: u64,
    inputs_taken_when_added: u64,
    inputs_refused: u64,
    sessions_ended_at_stop: u64,
    sessions_ended_while_paused: u64,
    paused_set_aside: u64,
    wedged_passed_over: u64,
    max_drain_ratio: f64,
}

/// What may explain deviation 15's passing over a waiting request in a step: nothing ran,
/// and a request behind it held its KV and could run.
struct Wedged {
    nothing_ran: bool,
    runnable_holders: Vec<Arc<str>>,
}

impl Wedged {
    fn explains(&self, waiting_before: &[Arc<str>], id: &str) -> bool {
        let mut behind = waiting_before.iter().skip_while(|w| &***w != id).skip(1);
        self.nothing_ran && behind.any(|w| self.runnable_holders.contains(w))
    }
}

struct Harness {
    cov: Coverage,
    /// The runner's encoder outputs, by identifier.
    encoder_outputs: std::collections::HashSet<String>,
    sched: Scheduler,
    cfg: Arc<SchedulerConfig>,
    /// `M`: `max_model_len`, or the longest request whose every step fits the pool.
    longest_request: i64,
    depth: usize,
    tracked: Vec<Tracked>,
    by_handle: HashMap<Handle, usize>,
    queue: VecDeque<Pending>,
    /// The runner's copy of each request's block table.
    /// The runner's block tables, one per KV-cache group.
    tables: HashMap<Handle, Vec<Vec<i32>>>,
    /// Sync drafts given and not scheduled yet.
    drafts_given: HashMap<Handle, Vec<i32>>,
    /// Beside drafts, where an aligned Mamba group's running state is (vLLM's runner):
    /// the table index the last step's state block had, and how many blocks past it the
    /// state after the accepted tokens lies. None: read at the last computed token's block.
    mamba_cursor: HashMap<Handle, (usize, usize)>,
    /// What each KV slot holds, `[block][slot]`, when `kv_exact`.
    kv: Vec<Vec<Kv>>,
    /// The position model of `kv` is exact: not async with drafts (there a
    /// rejection in one step shifts the real positions of the steps after it,
    /// which the scheduler's bookkeeping leaves to the runner).
    kv_exact: bool,
    clock: f64,
    next_id: u64,
    /// The prefix cache as the KV cache events tell it: block -> the hash it holds.
    cached_by_events: HashMap<u32, (BlockHash, u32)>,
    /// The requests that asked for their prefix hits to be reported.
    reporting_hits: HashSet<String>,
    /// With a KV connector: its answers, and the finished requests whose blocks it holds.
    connector: FuzzConnector,
    held: Vec<Arc<str>>,
    /// With an encoder-cache connector: its answers.
    ec: FuzzEncoderConnector,
    /// An auxiliary-output connector, in a third of the cases.
    aux: Option<FuzzAuxOutputs>,
}

/// An encoder-cache connector's answers, at random: it has half of the outputs asked for,
/// and a fifth of the requests asked about have outputs in transit (none once the drain
/// starts: every transfer ends).
struct FuzzEncoderConnector {
    rng: Rng,
    draining: bool,
    /// The requests it said were in transit in the current step.
    in_transit: Vec<String>,
    /// The identifiers it said it has in the current step.
    has: Vec<String>,
}

impl ExternalEncoderCache for FuzzEncoderConnector {
    fn has_cache_item(&mut self, identifier: &str) -> bool {
        let has = self.rng.below(2) == 0;
        if has {
            self.has.push(identifier.to_string());
        }
        has
    }

    fn ensure_cache_available(&mut self, request: &Request, _num_computed_tokens: i64) -> bool {
        let ready = self.draining || self.rng.below(5) != 0;
        if !ready {
            self.in_transit.push(request.id().to_string());
        }
        ready
    }
}

/// An auxiliary-output connector's answers, at random (in a third of the cases): a hit
/// cap that is none, within the prompt, past it, or negative, and a KV connector's tokens
/// kept whole, dropped, cut or negative; it records its caps and the requests it is told of.
struct FuzzAuxOutputs {
    rng: Rng,
    /// The cap each request asked about in the current step got (the last one).
    caps: HashMap<String, i64>,
    /// The requests told finished or preempted since the last check, with their status.
    told: Vec<(String, RequestStatus)>,
}

impl AuxOutputs for FuzzAuxOutputs {
    fn max_cache_hit(&mut self, request: &Request, _cache: &dyn CachedBlocks) -> i64 {
        let n = request.num_tokens();
        let cap = match self.rng.below(6) {
            0 => -1 - self.rng.below(3) as i64,
            1 => n + self.rng.below(3) as i64,
            2 | 3 => n - 1,
            _ => self.rng.below(n as u64) as i64,
        };
        self.caps.insert(request.id().to_string(), cap);
        cap
    }

    fn cap_external_hit(&mut self, _request: &Request, _local: i64, external: i64, _cache: &dyn CachedBlocks) -> i64 {
        match self.rng.below(5) {
            0 => 0,
            1 => -1,
            2 => self.rng.below(external.max(0) as u64 + 1) as i64,
            _ => external,
        }
    }

    fn request_finished(&mut self, request: &Request, _cache: &dyn CachedBlocks) {
        self.told.push((request.id().to_string(), request.status()));
    }
}

/// A KV connector's answers, at random: now and then it cannot tell (None), says more
/// tokens than the request has, or fewer than none; usually some tokens past the hit, a
/// third of them loaded across steps.
struct FuzzConnector {
    rng: Rng,
    /// The requests it could not answer for in the current step.
    unknown: Vec<String>,
    /// Loads across steps it answered in the current step (one may not fit the pool beside
    /// the prefills in flight now and fit next time, when the answer differs).
    answered_async: usize,
}

impl ExternalKv for FuzzConnector {
    fn num_new_matched_tokens(&mut self, request: &Request, num_local_computed: i64) -> Option<ExternalMatch> {
        let n = request.num_tokens();
        let tokens = match self.rng.below(10) {
            0 => None,
            1 => Some(-1 - self.rng.below(4) as i64),
            2 => Some(n + self.rng.below(3) as i64),
            3 | 4 => Some(0),
            _ => Some(self.rng.below((n - num_local_computed).max(0) as u64 + 1) as i64),
        };
        if tokens.is_none() {
            self.unknown.push(request.id().to_string());
        }
        let load_async = self.rng.below(3) == 0;
        self.answered_async += usize::from(load_async && tokens.is_some());
        tokens.map(|tokens| ExternalMatch { tokens, load_async })
    }
}

/// The tokens a KV connector loaded for row `i` (its admissions are the step's last rows),
/// -1 for a request that asked none, 0 for a row the waiting loop did not admit.
fn external_tokens_of_row(step: &Step, i: usize) -> i64 {
    let first_admitted = step.len() - step.external_computed_tokens.len();
    if i >= first_admitted {
        i64::from(step.external_computed_tokens[i - first_admitted])
    } else {
        0
    }
}

macro_rules! invariants {
    ($h:expr, $when:expr) => {
        if let Err(e) = $h.sched.check_invariants() {
            return Err(TestCaseError::fail(format!("{}: {e}\n{}", $when, $h.sched.debug_snapshot())));
        }
    };
}

fn shared_token(prefix: u8, i: usize) -> i64 {
    ((prefix as usize * 7 + i * 3 + i / 5) % VOCAB as usize) as i64
}

impl Harness {
    fn new(config: ConfigParams, depth: usize) -> Self {
        let cfg = Arc::new(SchedulerConfig::new(config).expect("the generator makes valid configs"));
        let config_kv = (
            cfg.block_size() as usize,
            cfg.num_gpu_blocks() as usize,
            !cfg.async_scheduling() || cfg.num_speculative_tokens() == 0,
        );
        let mut harness = Self {
            cov: Coverage { cases: 1, ..Coverage::default() },
            encoder_outputs: std::collections::HashSet::new(),
            sched: Scheduler::new(cfg.clone()).expect("a valid scheduler"),
            cfg,
            longest_request: 0,
            depth,
            tracked: Vec::new(),
            by_handle: HashMap::new(),
            queue: VecDeque::new(),
            tables: HashMap::new(),
            drafts_given: HashMap::new(),
            mamba_cursor: HashMap::new(),
            kv: vec![vec![Kv::Empty; config_kv.0]; config_kv.1],
            kv_exact: config_kv.2,
            clock: 0.0,
            next_id: 0,
            cached_by_events: HashMap::new(),
            reporting_hits: HashSet::new(),
            connector: FuzzConnector { rng: Rng(config_kv.1 as u64), unknown: Vec::new(), answered_async: 0 },
            held: Vec::new(),
            ec: FuzzEncoderConnector {
                rng: Rng(config_kv.0 as u64 + 7),
                draining: false,
                in_transit: Vec::new(),
                has: Vec::new(),
            },
            aux: ((config_kv.0 + config_kv.1) % 3 == 0).then(|| FuzzAuxOutputs {
                rng: Rng(config_kv.1 as u64 + 11),
                caps: HashMap::new(),
                told: Vec::new(),
            }),
        };
        harness.longest_request = harness.pool_request_len();
        harness
    }

    /// The longest request: one whose step of `C + n + s <= M` tokens needs at most `T`
    /// slots (`min(C + n + L, max_model_len)`), `T` the most slots the pool's usable blocks
    /// hold, so that a request alone always fits (a longer one would preempt itself
    /// forever). `max_model_len` when the pool holds a request that long. With a connector
    /// and drafts, also no longer than an asynchronous load of all its tokens can be while
    /// leaving a speculative step's slots, `1 + K + L`, free in every group.
    fn pool_request_len(&self) -> i64 {
        let max_model_len = self.cfg.max_model_len();
        let usable_blocks = self.cfg.num_gpu_blocks() - 1;
        let most_within = |blocks: i64| (0..=max_model_len).rev().find(|&t| self.blocks_over_groups(t) <= blocks);
        let mut longest = match most_within(usable_blocks) {
            Some(t) if t == max_model_len => max_model_len,
            Some(t) => t - self.cfg.num_lookahead_tokens() + self.s(),
            None => self.s() - self.cfg.num_lookahead_tokens() - 1,
        };
        let (k, bs) = (self.k(), self.cfg.block_size());
        if self.cfg.kv_connector() && k > 0 {
            // Every group that holds tokens (a Mamba group's state blocks are counted apart).
            let groups = self.cfg.kv_cache_groups().iter().filter(|&kind| kind != AttentionKind::Mamba).count() as i64;
            let spec_step_blocks = groups * ((1 + k + self.cfg.num_lookahead_tokens() + bs - 1) / bs);
            longest = longest.min(most_within(usable_blocks - spec_step_blocks).unwrap_or(-1));
        }
        longest
    }

    fn m(&self) -> i64 {
        self.longest_request
    }
    fn s(&self) -> i64 {
        self.cfg.num_sampled_tokens_per_step()
    }
    fn k(&self) -> i64 {
        self.cfg.num_speculative_tokens()
    }

    fn live(&self) -> impl Iterator<Item = &Tracked> {
        self.tracked.iter().filter(|t| !t.finished)
    }

    fn make_request(&mut self, op: &AddOp) -> NewRequest {
        let (m, s, bs) = (self.m(), self.s(), self.cfg.block_size());
        let longest = m - s;
        let raw = op.len_raw as i64;
        let len = match op.len_kind {
            0 => 1,
            1 => longest,
            2 => longest + 1,
            3 => raw % longest.max(1) + 1,
            4 => raw % (2 * bs) + 1,
            _ => (raw % (longest.max(0) / bs + 1)) * bs + (raw / 7) % 2,
        }
        .max(1);
        let mut rng = Rng(op.token_seed);
        let shared = if op.prefix == 0 { 0 } else { (op.prefix_len as i64 % (len + 1)) as usize };
        let prompt: Vec<i64> = (0..len as usize)
            .map(|i| if i < shared { shared_token(op.prefix, i) } else { rng.below(VOCAB) as i64 })
            .collect();
        // Up to `max_model_len`: past the longest request the pool holds, too.
        let max_model_len = self.cfg.max_model_len();
        let max_tokens = match op.max_tokens_kind {
            0 => 1,
            1 => op.max_tokens_raw as i64 % 8 + 1,
            2 => max_model_len,
            _ => op.max_tokens_raw as i64 % max_model_len + 1,
        };
        self.next_id += 1;
        // Tied (priority, arrival_time) keys are generated on purpose: they once let two
        // requests preempt each other forever (`regression_priority_victim_ties_do_not_ping_pong`).
        if op.arrival_delta > 0 {
            self.clock += 1.0;
        }
        let num_computed_tokens = match op.computed {
            Some(c) if len > 1 => c as i64 % (len - 1) + 1,
            _ => 0,
        };
        // Not beside aligned Mamba and drafts (refused: vLLM's runner would take a later
        // input up from a state it does not keep).
        let resumable = op.session && !(self.cfg.mamba_aligned() && self.k() > 0);
        // A few bits of the token seed: about one request in six (not a session) gives its
        // prompt as embeddings: placeholder ids (0), and a key per block made from the
        // tokens it stands for, so shared prefixes still share their keys.
        let (prompt, prompt_embeds_keys) = if !resumable && (op.token_seed >> 16) % 6 == 0 {
            let keys = prompt
                .chunks(bs as usize)
                .map(|block| {
                    block.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3))
                })
                .map(|h| h.to_le_bytes().to_vec())
                .collect();
            (vec![0; prompt.len()], keys)
        } else {
            (prompt, Vec::new())
        };
        NewRequest {
            request_id: format!("r{}", self.next_id),
            prompt_token_ids: prompt,
            max_tokens,
            min_tokens: (op.min_tokens as i64).min(max_tokens),
            eos_token_id: op.eos.map(|t| t as i64),
            stop_token_ids: op.stops.iter().flatten().map(|&t| t as i64).collect(),
            arrival_time: Some(self.clock),
            num_computed_tokens,
            priority: op.priority as i64,
            cache_salt: op.salt.map(|s| format!("salt{s}")),
            lora_id: op.lora.map(i64::from),
            skip_reading_prefix_cache: op.skip_prefix_cache,
            structured_output: op.grammar.is_some(),
            // One bit of the token seed: about half the requests ask for their hits.
            report_reused_blocks: op.token_seed & 1 == 1,
            mm_inputs: if self.cfg.multimodal() { images(op.token_seed >> 8, len) } else { Vec::new() },
            prompt_embeds_keys,
            resumable,
            diffusion_canvas_length: None,
            diffusion_read_steps: None,
        }
    }

    /// Whether `add_request` must accept `r`, by the rules it documents.
    fn acceptable(&self, r: &NewRequest) -> bool {
        let cfg = &self.cfg;
        let mut request_budget =
            cfg.max_num_scheduled_tokens().min(cfg.max_num_batched_tokens() - cfg.max_num_new_slots_for_drafting());
        if cfg.long_prefill_token_threshold() > 0 {
            request_budget = request_budget.min(cfg.long_prefill_token_threshold());
        }
        let images_fit = r.mm_inputs.iter().all(|input| {
            input.length <= cfg.max_num_encoder_input_tokens().min(cfg.encoder_cache_size())
                && (!cfg.disable_chunked_mm_input()
                    || input.length + cfg.num_prefill_lookahead_tokens() <= request_budget)
        });
        if !images_fit {
            return false;
        }
        let (m, s) = (self.m(), self.s());
        let len = r.prompt_token_ids.len() as i64;
        // Sessions: not for a pooling model, nor with Mamba groups under async scheduling.
        let mamba = self.cfg.kv_cache_groups().has_mamba();
        let session_served = !r.resumable || (s > 0 && !(mamba && self.cfg.async_scheduling()));
        len >= 1
            && len <= m - s
            && session_served
            && r.max_tokens >= 1
            && (0..len).contains(&r.num_computed_tokens)
            // No state block holds an aligned Mamba state computed elsewhere.
            && (r.num_computed_tokens == 0 || !self.cfg.mamba_aligned())
            && (r.lora_id.is_none() || self.cfg.max_loras() > 0)
    }

    /// The most blocks a request of `tokens` tokens holds over every group at once.
    fn blocks_over_groups(&self, tokens: i64) -> i64 {
        let (m, bs) = (self.cfg.max_model_len(), self.cfg.block_size());
        let whole = (tokens + bs - 1) / bs;
        // A sliding-window group holds at most the window before the next token and the
        // tokens in flight (one step's budget per step in flight), plus a block for a
        // window starting mid-block.
        let stages = self.cfg.pipeline_parallel_size();
        let steps_in_flight = if self.cfg.async_scheduling() && stages == 1 { 2 } else { stages };
        let lookahead_blocks = (self.cfg.num_lookahead_tokens() + bs - 1) / bs;
        self.cfg
            .kv_cache_groups()
            .iter()
            .map(|kind| match kind {
                AttentionKind::Full => whole,
                // Aligned, a Mamba group holds the state a step reads, a block per draft
                // token and, per step in flight, the state it writes and a prefill checkpoint
                // block; else its state and a block per draft token, whatever the length.
                AttentionKind::Mamba if self.cfg.mamba_aligned() => {
                    1 + self.k() + steps_in_flight * (1 + i64::from(self.cfg.mamba_prefill_checkpoint_alignment() > 0))
                }
                AttentionKind::Mamba => 1 + self.k(),
                // Plus the blocks of the drafter's lookahead slots.
                AttentionKind::SlidingWindow { window } => {
                    let held = (i64::from(window) - 1 + steps_in_flight * self.cfg.max_num_batched_tokens()).min(m);
                    whole.min((held + bs - 1) / bs + 1 + lookahead_blocks)
                }
                // A chunked local group holds at most a chunk and the tokens in flight, plus
                // a block for a chunk starting mid-block.
                AttentionKind::ChunkedLocal { chunk } => {
                    let held = (i64::from(chunk) + steps_in_flight * self.cfg.max_num_batched_tokens()).min(m);
                    whole.min((held + bs - 1) / bs + i64::from(i64::from(chunk) % bs != 0) + lookahead_blocks)
                }
            })
            .sum()
    }

    fn add(&mut self, op: &AddOp) -> Result<(), TestCaseError> {
        let request = self.make_request(op);
        self.cov.kv_holding_arrivals += (request.num_computed_tokens > 0) as u64;
        let acceptable = self.acceptable(&request);
        let before = self.sched.debug_snapshot();
        let (id, prompt_len, max_tokens) =
            (request.request_id.clone(), request.prompt_token_ids.len() as i64, request.max_tokens);
        let prompt: Vec<i32> = request.prompt_token_ids.iter().map(|&t| t as i32).collect();
        let arrived_computed = request.num_computed_tokens;
        let eos = request.eos_token_id.map(|t| t as i32);
        let stops: Vec<i32> = request.stop_token_ids.iter().map(|&t| t as i32).collect();
        let lora = request.lora_id.map(|id| id as i32);
        let skip_prefix_cache = request.skip_reading_prefix_cache;
        let grammar = op.grammar.map(|compiles| (compiles, false));
        let reports_hits = request.report_reused_blocks;
        let session = request.resumable.then(SessionModel::default);
        let images: Vec<(String, i64)> =
            request.mm_inputs.iter().map(|input| (input.identifier.clone(), input.length)).collect();
        self.cov.images += request.mm_inputs.len() as u64;
        match self.sched.add_request(request) {
            Ok(handle) => {
                if reports_hits {
                    self.reporting_hits.insert(id.clone());
                }
                self.cov.accepted += 1;
                self.cov.sessions += u64::from(session.is_some());
                prop_assert!(acceptable, "add_request accepted {id}, which breaks a documented rule");
                prop_assert!(!self.by_handle.contains_key(&handle), "handle {handle:?} given twice");
                self.by_handle.insert(handle, self.tracked.len());
                self.tracked.push(Tracked {
                    id,
                    handle,
                    prompt_len,
                    max_tokens,
                    eos,
                    stops,
                    lora,
                    skip_prefix_cache,
                    grammar,
                    delivered: 0,
                    tokens: prompt,
                    arrived_computed,
                    finished: false,
                    reported: false,
                    images,
                    loading: None,
                    recomputes_after_whole_load: false,
                    session,
                    epoch_kept: Vec::new(),
                    stop_reason: None,
                    resume_from: None,
                });
            }
            Err(e) => {
                self.cov.refused += 1;
                prop_assert!(!acceptable, "add_request refused {id}: {e}");
                prop_assert_eq!(self.sched.debug_snapshot(), before, "a refused request changed the state");
            }
        }
        invariants!(self, "after add_request");
        Ok(())
    }

    /// A request under a live request's id that is not a session: refused, whether it is
    /// resumable or not (under a session's id it is an input, see `input`).
    fn duplicate(&mut self, pick: u16) -> Result<(), TestCaseError> {
        let live: Vec<&Tracked> = self.live().filter(|t| t.session.is_none()).collect();
        if live.is_empty() {
            return Ok(());
        }
        let id = live[pick as usize % live.len()].id.clone();
        let before = self.sched.debug_snapshot();
        let resumable = pick >> 15 == 1;
        let err = self.sched.add_request(NewRequest { resumable, ..NewRequest::new(id.clone(), vec![1, 2, 3], 1) });
        prop_assert!(matches!(err, Err(CoreError::DuplicateRequest { .. })), "duplicate {id}: {err:?}");
        prop_assert_eq!(self.sched.debug_snapshot(), before, "a refused duplicate changed the state");
        Ok(())
    }

    /// The `Op::Input` of `kind` under `id`, for a request of `num_tokens` tokens now.
    fn input_of(
        &mut self,
        id: &str,
        (kind, len_raw, max_tokens_raw, seed): (u8, u16, u16, u64),
        num_tokens: i64,
    ) -> NewRequest {
        let (m, s, bs) = (self.m(), self.s(), self.cfg.block_size());
        let mut rng = Rng(seed);
        let len = match kind {
            12 => 0,
            14 => m - s + 1,
            // Fits alone, but not after the session's tokens now (nor at a later stop).
            15 => (m - num_tokens + 1 + i64::from(len_raw % 2)).max(1),
            _ if len_raw % 8 == 0 => i64::from(len_raw / 8) % (m - s).max(1) + 1,
            _ => i64::from(len_raw) % (2 * bs) + 1,
        };
        let prompt: Vec<i64> = (0..len).map(|_| rng.below(VOCAB) as i64).collect();
        let max_model_len = self.cfg.max_model_len();
        let mut max_tokens = if max_tokens_raw % 4 == 0 {
            i64::from(max_tokens_raw) % max_model_len + 1
        } else {
            i64::from(max_tokens_raw) % 8 + 1
        };
        let mut min_tokens = (rng.below(2) as i64).min(max_tokens);
        let mut mm_inputs = Vec::new();
        if kind == 13 {
            match rng.below(3) {
                0 => max_tokens = 0,
                1 => min_tokens = max_tokens + 1,
                _ => mm_inputs.push(MmInputSpec { identifier: "img0".into(), offset: 0, length: 1, is_embed: None }),
            }
        }
        let eos_token_id = (rng.below(2) == 0).then(|| rng.below(VOCAB) as i64);
        let stop_token_ids = (0..rng.below(3)).map(|_| rng.below(VOCAB) as i64).collect();
        if rng.below(2) == 0 {
            self.clock += 1.0;
        }
        NewRequest {
            min_tokens,
            eos_token_id,
            stop_token_ids,
            arrival_time: Some(self.clock),
            mm_inputs,
            resumable: !matches!(kind, 10 | 11),
            ..NewRequest::new(id, prompt, max_tokens)
        }
    }

    /// `Op::Input`: an input under the id of a live session (now and then of a live request
    /// that is not one: a duplicate).
    fn input(&mut self, pick: u16, input: (u8, u16, u16, u64)) -> Result<(), TestCaseError> {
        let live: Vec<usize> = (0..self.tracked.len()).filter(|&i| !self.tracked[i].finished).collect();
        let sessions: Vec<usize> = live.iter().copied().filter(|&i| self.tracked[i].session.is_some()).collect();
        let pool = if sessions.is_empty() || input.3 % 16 == 0 { &live } else { &sessions };
        if pool.is_empty() {
            return Ok(());
        }
        self.input_to(pool[pick as usize % pool.len()], input)
    }

    /// Adds the input `(kind, len_raw, max_tokens_raw, seed)` (see `Op::Input`) under the id
    /// of the live request `idx`, and checks what it does by the rules: refused, changing
    /// nothing, when the request is not a session, the input is bad, or it is taken up at
    /// once and would not fit; else queued, taken up at once by a session waiting for input
    /// (its end finishes that session, aborted).
    fn input_to(&mut self, idx: usize, input: (u8, u16, u16, u64)) -> Result<(), TestCaseError> {
        let (m, s) = (self.m(), self.s());
        let (id, handle) = (self.tracked[idx].id.clone(), self.tracked[idx].handle);
        let num_tokens = self.tracked[idx].tokens.len() as i64;
        let new = self.input_of(&id, input, num_tokens);
        let model = InputModel {
            prompt: new.prompt_token_ids.iter().map(|&t| t as i32).collect(),
            max_tokens: new.max_tokens,
            eos: new.eos_token_id.map(|t| t as i32),
            stops: new.stop_token_ids.iter().map(|&t| t as i32).collect(),
        };
        let len = model.prompt.len() as i64;
        let valid_alone = (1..=m - s).contains(&len)
            && new.max_tokens >= 1
            && new.min_tokens <= new.max_tokens
            && new.mm_inputs.is_empty();
        let resumable = new.resumable;
        let before = self.sched.debug_snapshot();
        let waiting_for_input = self.sched.num_waiting_for_streaming_input();
        let result = self.sched.add_request_or_input(new);
        if tracing() {
            eprintln!("input {id} kind {} ({len} tokens, resumable {resumable}): {result:?}", input.0);
        }
        let Some(session) = &self.tracked[idx].session else {
            prop_assert!(
                matches!(result, Err(CoreError::DuplicateRequest { .. })),
                "an input to {}, not a session: {:?}",
                id,
                result
            );
            prop_assert_eq!(self.sched.debug_snapshot(), before, "a refused duplicate changed the state");
            return Ok(());
        };
        let paused = session.paused;
        // Taken up: all its tokens but the last sampled one, then the input's.
        let tokens_after = num_tokens - s + len;
        let expected = if !resumable {
            Some(if paused { SessionInputAdded::Finished } else { SessionInputAdded::Queued })
        } else if !valid_alone {
            None
        } else if !paused {
            Some(SessionInputAdded::Queued)
        } else if tokens_after <= m - s {
            Some(SessionInputAdded::TakenUp)
        } else {
            None
        };
        match (expected, result) {
            (None, Err(_)) => {
                self.cov.inputs_refused += 1;
                prop_assert_eq!(self.sched.debug_snapshot(), before, "a refused input changed the state");
            }
            (Some(expected), Ok((h, Some(added)))) if expected == added => {
                prop_assert_eq!(h, handle, "{}: an input returned another handle", id);
                match added {
                    SessionInputAdded::Queued => {
                        self.cov.inputs_queued += 1;
                        let session = self.tracked[idx].session.as_mut().expect("a session");
                        session.queued.push_back(resumable.then_some(model));
                    }
                    SessionInputAdded::TakenUp => {
                        self.cov.inputs_taken_when_added += 1;
                        prop_assert_eq!(self.sched.num_waiting_for_streaming_input(), waiting_for_input - 1);
                        self.take_up(idx, model)?;
                    }
                    SessionInputAdded::Finished => {
                        self.cov.sessions_ended_while_paused += 1;
                        self.tracked[idx].finished = true;
                        prop_assert!(self.sched.get_request(&id).is_err(), "{} ended, but is still live", id);
                        let last = self.sched.last_finished().iter().find(|r| **r.id() == *id).map(|r| r.status());
                        prop_assert_eq!(last, Some(RequestStatus::FinishedAborted), "{}: how its end finished it", id);
                    }
                }
            }
            (expected, result) => prop_assert!(
                false,
                "{}: input kind {} ({} tokens, {} now, paused {}): expected {:?}, got {:?}",
                id,
                input.0,
                len,
                num_tokens,
                paused,
                expected,
                result
            ),
        }
        invariants!(self, "after an input");
        Ok(())
    }

    /// The session `idx` takes up its next input (when added, or at a stop): its tokens but
    /// the last sampled one, then the input's; the input's limits; the `C` it kept, from
    /// which it is admitted again. Checked against the core's record.
    fn take_up(&mut self, idx: usize, input: InputModel) -> Result<(), TestCaseError> {
        let s = self.s() as usize;
        let t = &mut self.tracked[idx];
        let kept = t.tokens.len() - s;
        t.tokens.truncate(kept);
        t.tokens.extend_from_slice(&input.prompt);
        t.prompt_len = t.tokens.len() as i64;
        t.delivered = 0;
        t.max_tokens = input.max_tokens;
        t.eos = input.eos;
        t.stops = input.stops;
        t.arrived_computed = 0;
        t.session.as_mut().expect("a session").paused = false;
        let req = self
            .sched
            .request(t.handle)
            .ok_or_else(|| TestCaseError::fail(format!("{}: took up an input, but is gone", t.id)))?;
        prop_assert!(
            req.all_token_ids().eq(t.tokens.iter().copied()),
            "{}: tokens after taking up an input {:?}, expected {:?}",
            t.id,
            req.all_token_ids().collect::<Vec<_>>(),
            t.tokens
        );
        prop_assert_eq!(req.num_prompt_tokens(), t.prompt_len, "{}: prompt after taking up an input", t.id);
        prop_assert_eq!(req.num_output_tokens(), 0, "{}: outputs after taking up an input", t.id);
        prop_assert_eq!(req.max_tokens(), t.max_tokens, "{}: max_tokens after taking up an input", t.id);
        prop_assert_eq!(req.status(), RequestStatus::Waiting, "{}: status after taking up an input", t.id);
        let c = req.num_computed_tokens();
        prop_assert!(c < req.num_tokens(), "{}: C = {} after taking up an input", t.id, c);
        t.resume_from = (c > 0).then_some(c);
        Ok(())
    }

    /// What the request `idx` does at a stop, by the test's record: one that is not a
    /// session finishes; a session takes up its next input if it fits (else finishes), or
    /// finishes at its end, or waits for an input.
    fn at_stop(&mut self, idx: usize) -> AtStop {
        let (m, s) = (self.m(), self.s());
        let kept = self.tracked[idx].tokens.len() as i64 - s;
        let Some(session) = self.tracked[idx].session.as_mut() else { return AtStop::Finishes };
        match session.queued.pop_front() {
            None => AtStop::Pauses,
            Some(None) => AtStop::Finishes,
            Some(Some(input)) => {
                let tokens_after = kept + input.prompt.len() as i64;
                if tokens_after <= m - s {
                    AtStop::TakesUp(input)
                } else {
                    AtStop::Finishes
                }
            }
        }
    }

    /// A stop the session `idx` goes on from (`next`: it waits for input, or takes up the
    /// next one). `before`: its `(C, P, stale output tokens)` before the output. It keeps
    /// the KV of its tokens whose output is in: all but the last sampled one, or, when the
    /// stop is in output from before a preemption, `C - P` (what it recomputed since); no
    /// draft, placeholder or slot of the input it finished.
    fn session_goes_on(
        &mut self,
        idx: usize,
        e: &RequestEvent,
        next: AtStop,
        before: (i64, i64, i64),
    ) -> Result<(), TestCaseError> {
        self.check_stop(idx, e)?;
        let s = self.s();
        let t = &self.tracked[idx];
        let id = t.id.clone();
        let req = self
            .sched
            .request(e.handle)
            .ok_or_else(|| TestCaseError::fail(format!("{id}: a session stopped and was released, not going on")))?;
        let kept = t.tokens.len() as i64 - s;
        let (c_before, p_before, stale_before) = before;
        let kept_kv = if stale_before > 0 { c_before - p_before } else { kept };
        prop_assert_eq!(req.num_computed_tokens(), kept_kv, "{}: C after a stop the session goes on from", id);
        prop_assert_eq!(req.num_output_placeholders(), 0, "{}: placeholders after a stop", id);
        prop_assert!(req.spec_token_ids().is_empty(), "{}: drafts after a stop", id);
        let (status, tokens_kept) = (req.status(), req.all_token_ids().eq(t.tokens.iter().copied()));
        self.drafts_given.remove(&e.handle);
        self.tracked[idx].epoch_kept.push(kept);
        match next {
            AtStop::Pauses => {
                prop_assert_eq!(status, RequestStatus::WaitingForStreamingReq, "{}: status after a stop", id);
                prop_assert!(tokens_kept, "{}: tokens after a stop", id);
                self.tracked[idx].session.as_mut().expect("a session").paused = true;
                self.cov.session_pauses += 1;
            }
            AtStop::TakesUp(input) => {
                self.cov.inputs_taken_at_stop += 1;
                self.take_up(idx, input)?;
            }
            AtStop::Finishes => unreachable!("a session that finishes does not go on"),
        }
        Ok(())
    }

    /// What the test knows of the sessions against the core: which wait for input, their
    /// inputs queued, and the requests still to be served (those waiting for input are not).
    fn check_sessions(&self, when: impl std::fmt::Debug) -> Result<(), TestCaseError> {
        let (mut live, mut paused) = (0usize, 0usize);
        for t in self.live() {
            live += 1;
            let Some(session) = &t.session else { continue };
            let req = self
                .sched
                .request(t.handle)
                .ok_or_else(|| TestCaseError::fail(format!("{when:?}: the live session {} has no slot", t.id)))?;
            prop_assert_eq!(
                req.status() == RequestStatus::WaitingForStreamingReq,
                session.paused,
                "{:?}: {} waits for input as {:?}",
                when,
                t.id,
                req.status()
            );
            prop_assert_eq!(req.num_queued_inputs(), session.queued.len(), "{:?}: {}'s inputs queued", when, t.id);
            paused += usize::from(session.paused);
        }
        prop_assert_eq!(self.sched.num_waiting_for_streaming_input(), paused, "{:?}: sessions waiting for input", when);
        prop_assert_eq!(self.sched.get_num_unfinished_requests(), live - paused, "{:?}: unfinished requests", when);
        Ok(())
    }

    /// Sessions waiting for input, by the test's record.
    fn num_paused(&self) -> usize {
        self.live().filter(|t| t.session.as_ref().is_some_and(|s| s.paused)).count()
    }

    /// Before the drain: ends every live session whose end is not queued yet, with up to two
    /// more inputs and then the end of the session (an input that is not resumable) or, now
    /// and then, an abort.
    fn end_sessions(&mut self, rng: &mut Rng) -> Result<(), TestCaseError> {
        for idx in 0..self.tracked.len() {
            let t = &self.tracked[idx];
            let Some(session) = &t.session else { continue };
            if t.finished || session.queued.iter().any(Option::is_none) {
                continue;
            }
            if rng.below(4) == 0 {
                let id = t.id.clone();
                self.abort(&[id])?;
                continue;
            }
            for _ in 0..rng.below(3) {
                if !self.tracked[idx].finished {
                    self.input_to(idx, (rng.below(10) as u8, rng.next() as u16, rng.next() as u16, rng.next()))?;
                }
            }
            if !self.tracked[idx].finished {
                self.input_to(idx, (10, rng.next() as u16, 0, rng.next()))?;
            }
        }
        Ok(())
    }

    /// The runner's encoder: frees the evicted outputs, encodes the step's inputs (each
    /// an input of its row's request, once), then finds every input a row's tokens
    /// `[C, C + n)` overlap among its outputs, as a GPU runner must to gather embeddings.
    fn check_encoder_inputs(&mut self, step: &Step) -> Result<(), TestCaseError> {
        for identifier in &step.freed_encoder_outputs {
            prop_assert!(self.encoder_outputs.remove(&**identifier), "evicted {identifier:?}, never encoded");
        }
        let mut encoded_rows: Vec<(i32, i32)> = Vec::new();
        let mut compute = 0;
        for (&row, &input) in step.encoder_input_rows.iter().zip(&step.encoder_input_ids) {
            prop_assert!(!encoded_rows.contains(&(row, input)), "input {input} of row {row} encoded twice");
            encoded_rows.push((row, input));
            let r = self.sched.request(step.req_handles[row as usize]).expect("live");
            let input = &r.mm_inputs()[input as usize];
            compute += input.num_embeds();
            self.encoder_outputs.insert(input.identifier.to_string());
            self.cov.encoded += 1;
        }
        // Loaded by the encoder-cache connector: outputs it said it has, never encoded too.
        for (&row, &input) in step.external_encoder_input_rows.iter().zip(&step.external_encoder_input_ids) {
            prop_assert!(!encoded_rows.contains(&(row, input)), "input {input} of row {row} encoded and loaded");
            encoded_rows.push((row, input));
            let r = self.sched.request(step.req_handles[row as usize]).expect("live");
            let identifier = &r.mm_inputs()[input as usize].identifier;
            prop_assert!(self.ec.has.iter().any(|has| **has == **identifier), "{identifier:?} loaded, not offered");
            self.encoder_outputs.insert(identifier.to_string());
            self.cov.ec_loaded += 1;
        }
        // The connector's loads take none of the compute budget.
        let budget = self.cfg.max_num_encoder_input_tokens();
        prop_assert!(compute <= budget, "{compute} embeddings encoded in a step, budget {budget}");
        // A request whose outputs are in transit is not scheduled.
        for (i, &h) in step.req_handles.iter().enumerate() {
            let id = self.sched.request(h).expect("live").id();
            prop_assert!(
                !self.ec.in_transit.iter().any(|t| **t == **id),
                "{id} scheduled for {} tokens with its encoder outputs in transit",
                step.num_scheduled_tokens[i]
            );
        }
        self.cov.evicted += step.freed_encoder_outputs.len() as u64;
        for (i, &h) in step.req_handles.iter().enumerate() {
            let r = self.sched.request(h).expect("live");
            let (c, n) = (i64::from(step.num_computed_tokens[i]), i64::from(step.num_scheduled_tokens[i]));
            for input in r.mm_inputs() {
                if input.offset < c + n && c < input.end() {
                    prop_assert!(
                        self.encoder_outputs.contains(&*input.identifier),
                        "{}: tokens [{c}, {}) need {:?}, not encoded",
                        r.id(),
                        c + n,
                        input.identifier
                    );
                }
            }
        }
        Ok(())
    }

    fn schedule(&mut self, rng: &mut Rng) -> Result<usize, TestCaseError> {
        let waiting_before = self.sched.waiting_ids();
        // Now and then a step the engine throttles (data-parallel prefill balancing).
        let throttle = rng.below(8) == 0;
        self.connector.unknown.clear();
        self.connector.answered_async = 0;
        self.ec.in_transit.clear();
        self.ec.has.clear();
        let with_encoder = self.cfg.ec_connector();
        let runnable_holders;
        let step = if self.cfg.kv_connector() {
            self.release_some_held(rng);
            self.report_some_loads(rng);
            runnable_holders = self.runnable_kv_holders(&waiting_before);
            let encoder = with_encoder.then_some(&mut self.ec as &mut dyn ExternalEncoderCache);
            let aux = self.aux.as_mut().map(|aux| aux as &mut dyn AuxOutputs);
            let step = self.sched.schedule_with(throttle, Connectors { kv: Some(&mut self.connector), encoder, aux });
            for load in &step.kv_loads {
                let r = self.sched.get_request(&load.request_id).expect("a load's request is live");
                let loading = Some(r.num_computed_tokens());
                if let Some(t) = self.tracked.iter_mut().find(|t| *t.id == *load.request_id) {
                    t.loading = loading;
                }
            }
            step
        } else {
            runnable_holders = self.runnable_kv_holders(&waiting_before);
            let encoder = with_encoder.then_some(&mut self.ec as &mut dyn ExternalEncoderCache);
            let aux = self.aux.as_mut().map(|aux| aux as &mut dyn AuxOutputs);
            self.sched.schedule_with(throttle, Connectors { kv: None, encoder, aux })
        };
        self.check_aux_outputs_in_step(&step)?;
        // Wedged (deviation 15): nothing ran, and a request behind that held its KV could
        // run (the requests the blocks could not be found for were passed over), or the
        // waiting requests that held KV gave it back (preempted while waiting).
        let nothing_ran = step.req_handles.iter().all(|h| step.new_reqs.contains(h) || step.resumed_reqs.contains(h));
        let wedged = Wedged { nothing_ran, runnable_holders };
        for (h, _) in &step.preempted {
            // It computes its tokens again: not from a load, nor from a session's kept KV
            // (unless this step started a load for it after the preemption).
            let loading_now = self.sched.request(*h).is_some_and(|r| r.status() == RequestStatus::WaitingForRemoteKvs);
            if let Some(&t) = self.by_handle.get(h).filter(|_| !loading_now) {
                self.tracked[t].resume_from = None;
                self.tracked[t].loading = None;
            }
        }
        // Before any request the step finishes leaves (a stored event names its request).
        self.check_kv_events("schedule")?;
        self.check_admission_order(&waiting_before, &step, wedged)?;
        if self.cfg.multimodal() {
            self.check_encoder_inputs(&step)?;
        }
        if tracing() {
            let names: Vec<String> = step
                .req_handles
                .iter()
                .enumerate()
                .map(|(i, &h)| {
                    let r = self.sched.request(h).expect("live");
                    format!(
                        "{}(C={} n={} spec={} -> C={} N={} P={} chunk={} blocks={:?})",
                        r.id(),
                        step.num_computed_tokens[i],
                        step.num_scheduled_tokens[i],
                        step.num_spec_tokens[i],
                        r.num_computed_tokens(),
                        r.num_tokens(),
                        r.num_output_placeholders(),
                        r.is_prefill_chunk(),
                        r.block_ids()
                    )
                })
                .collect();
            eprintln!(
                "schedule step {}: {names:?} preempted={:?} finished={:?}",
                step.step_id,
                step.preempted.iter().map(|p| p.1.to_string()).collect::<Vec<_>>(),
                step.finished.iter().map(|p| p.1.to_string()).collect::<Vec<_>>()
            );
        }
        let pending_kv = self.check_step(&step)?;
        // A session waiting for input holds a runner slot: a step that admits a request
        // leaves room for every one.
        if !step.new_reqs.is_empty() || !step.resumed_reqs.is_empty() {
            let (running, paused) = (self.sched.get_request_counts().0, self.num_paused());
            prop_assert!(
                (running + paused) as i64 <= self.cfg.max_num_active_seqs(),
                "step {}: {} running and {} sessions waiting for input > max_num_active_seqs = {}",
                step.step_id,
                running,
                paused,
                self.cfg.max_num_active_seqs()
            );
        }
        let n = step.len();
        if step.is_empty() {
            return Ok(0);
        }
        // The runner: tokens for entries that reach the end of their known tokens.
        let s = self.s();
        let mut entry_tokens: Vec<Vec<i32>> = Vec::with_capacity(step.len());
        for (i, &h) in step.req_handles.iter().enumerate() {
            let r = self.sched.request(h).expect("scheduled request is live");
            let spec = step.num_spec_tokens[i] as u64;
            let count = if r.is_prefill_chunk() || s == 0 {
                0
            } else {
                let accepted = match rng.below(4) {
                    0 => 0,
                    1 => spec,
                    _ => rng.below(spec + 1),
                };
                1 + accepted
            };
            entry_tokens.push((0..count).map(|_| rng.below(VOCAB) as i32).collect());
        }
        // Sometimes the runner reorders its rows.
        self.cov.steps += 1;
        self.cov.entries += step.len() as u64;
        for (i, &h) in step.req_handles.iter().enumerate() {
            let spec = step.num_spec_tokens[i] as u64;
            self.cov.draft_slots += spec;
            if spec > 0 && (step.new_reqs.contains(&h) || step.resumed_reqs.contains(&h)) {
                self.cov.padded += 1;
            }
            let end = (step.num_computed_tokens[i] + step.num_scheduled_tokens[i]) as i64 + s;
            self.cov.at_model_len_edge += (end == self.m()) as u64;
        }
        let rows: Option<Vec<u32>> = if step.len() > 1 && rng.below(4) == 0 {
            let mut order: Vec<u32> = (0..step.len() as u32).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            Some(order)
        } else {
            None
        };
        // row_of_entry[i] = row of entry i; rows are filled in row order.
        let mut by_row: Vec<&Vec<i32>> = vec![&entry_tokens[0]; step.len()];
        for (i, t) in entry_tokens.iter().enumerate() {
            let row = rows.as_ref().map_or(i, |r| r[i] as usize);
            by_row[row] = t;
        }
        let counts = by_row.iter().map(|t| t.len() as i32).collect();
        let tokens = by_row.iter().flat_map(|t| t.iter().copied()).collect();
        self.cov.reordered_rows += rows.is_some() as u64;
        let writes = self.blocks_written(&step)?;
        let epochs = step
            .req_handles
            .iter()
            .map(|h| self.by_handle.get(h).map_or(0, |&t| self.tracked[t].epoch_kept.len()))
            .collect();
        self.queue.push_back(Pending { pending_kv, step, tokens, counts, rows, writes, epochs });
        self.cov.max_in_flight = self.cov.max_in_flight.max(self.queue.len() as u64);
        Ok(n)
    }

    /// The waiting requests (of `waiting`) that hold their KV and could run, what deviation
    /// 15 lets run first: a session with its next input taken up, a request whose load is in
    /// (waiting to be promoted, or promoted).
    fn runnable_kv_holders(&self, waiting: &[Arc<str>]) -> Vec<Arc<str>> {
        waiting
            .iter()
            .filter(|id| {
                self.sched.get_request(id).is_ok_and(|r| {
                    !r.block_ids().is_empty()
                        && match r.status() {
                            RequestStatus::WaitingForRemoteKvs => !self.sched.kv_load_in_flight(id),
                            RequestStatus::Waiting | RequestStatus::Preempted => true,
                            _ => false,
                        }
                })
            })
            .cloned()
            .collect()
    }

    /// The waiting loop admits in waiting order and stops at the first request it cannot
    /// admit (a failed allocation ends admission): the admissions are a prefix of the
    /// waiting order, except that the loop passes over a preempted request whose output
    /// from before the preemption is still in flight (spec §3.3), and a request under an
    /// adapter the full LoRA set lacks (vLLM's `max_loras` rule: the set, once full, is the
    /// running requests' adapters after the step), and, `wedged`, requests the blocks could
    /// not be found for while nothing ran and a waiting request held them (deviation 15).
    /// With one step in flight at a time (vLLM's sync loop) and LoRA off there is none, and
    /// the admissions are a prefix.
    fn check_admission_order(
        &mut self,
        waiting_before: &[Arc<str>],
        step: &Step,
        wedged: Wedged,
    ) -> Result<(), TestCaseError> {
        let admitted: Vec<&str> = step
            .req_handles
            .iter()
            .filter(|h| step.new_reqs.contains(h) || step.resumed_reqs.contains(h))
            .map(|&h| self.sched.request(h).map(|r| &**r.id()).ok_or_else(|| TestCaseError::fail("admitted, no slot")))
            .collect::<Result<_, _>>()?;
        let Some(last) = admitted.last() else { return Ok(()) };
        let end = waiting_before
            .iter()
            .position(|id| &**id == *last)
            .ok_or_else(|| TestCaseError::fail(format!("{last} admitted, but it was not waiting")))?;
        let passed = &waiting_before[..=end];
        let in_waiting_order: Vec<&str> = passed.iter().map(|id| &**id).filter(|id| admitted.contains(id)).collect();
        prop_assert_eq!(&in_waiting_order, &admitted, "admissions out of waiting order");
        let mut running_loras: Vec<u32> = self
            .sched
            .running_ids()
            .iter()
            .filter_map(|id| self.sched.get_request(id).ok().and_then(|r| r.lora_id()))
            .collect();
        running_loras.sort_unstable();
        running_loras.dedup();
        let lora_set_full = running_loras.len() as i64 == self.cfg.max_loras();
        for id in passed.iter().filter(|id| !admitted.contains(&&***id)) {
            let r = self.sched.get_request(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if let Some(lora) = r.lora_id().filter(|_| lora_set_full) {
                if !running_loras.contains(&lora) {
                    self.cov.lora_set_aside += 1;
                    continue;
                }
            }
            if self.connector.unknown.iter().any(|unknown| unknown.as_str() == &**id) {
                self.cov.connector_set_aside += 1;
                continue;
            }
            if self.ec.in_transit.iter().any(|t| t.as_str() == &**id) {
                self.cov.ec_in_transit += 1;
                continue;
            }
            let gave_back = step.preempted.iter().any(|(_, p)| **p == **id) && r.num_computed_tokens() == 0;
            if wedged.explains(waiting_before, id) || (wedged.nothing_ran && gave_back) {
                self.cov.wedged_passed_over += 1;
                continue;
            }
            // A session waiting for its next input.
            if r.status() == RequestStatus::WaitingForStreamingReq {
                self.cov.paused_set_aside += 1;
                continue;
            }
            // Its KV load started in this step, or is still in flight.
            if step.kv_loads.iter().any(|load| *load.request_id == **id) {
                prop_assert_eq!(r.status(), RequestStatus::WaitingForRemoteKvs);
                self.cov.loads_started += 1;
                continue;
            }
            if r.status() == RequestStatus::WaitingForRemoteKvs {
                prop_assert!(self.sched.kv_load_in_flight(id), "{} passed over with its load in", id);
                continue;
            }
            if r.status() == RequestStatus::WaitingForStructuredOutputGrammar {
                prop_assert!(
                    !matches!(r.grammar(), Some(Grammar::Compiled)),
                    "{id} passed over with its grammar compiled"
                );
                self.cov.grammar_set_aside += 1;
                continue;
            }
            // Its next chunk starts at or in an image it cannot have encoded in this step, or
            // would split one (without chunked inputs), or meets an image of another size.
            if r.mm_inputs().iter().any(|input| input.end() > r.num_computed_tokens()) {
                self.cov.encoder_set_aside += 1;
                continue;
            }
            // A chunk ending fewer than L tokens before the prompt's end is cut back, to no
            // token when the step's budget left is that small (a multi-module drafter).
            if self.cfg.num_prefill_lookahead_tokens() > 1 && r.num_tokens() - r.num_computed_tokens() > 1 {
                self.cov.lookahead_set_aside += 1;
                continue;
            }
            prop_assert!(
                r.status() == RequestStatus::Preempted && r.num_stale_output_tokens() > 0 && !r.drop_stale_output(),
                "{} passed over by the waiting loop as {:?} with {} tokens from before a preemption in flight \
                 (admitted {:?}, preempted {:?}, waiting before {:?}, runnable KV holders {:?})",
                id,
                r.status(),
                r.num_stale_output_tokens(),
                admitted,
                step.preempted.iter().map(|p| p.1.to_string()).collect::<Vec<_>>(),
                waiting_before,
                wedged.runnable_holders
            );
        }
        Ok(())
    }

    /// Checks a step against the spec and the test's own records, and plays the runner's
    /// part: its block tables and, with `kv_exact`, the KV it writes. Returns the KV slots
    /// written for positions whose tokens are not known yet.
    fn check_step(&mut self, step: &Step) -> Result<Vec<(usize, u32, i64)>, TestCaseError> {
        self.check_step_reports(step)?;
        self.check_step_totals(step)?;
        let mut seen = HashSet::new();
        let mut block_offset = 0usize;
        let mut pending_kv = Vec::new();
        let mut spec_offset = 0usize;
        // One run of per-row block counts per KV-cache group, and the groups' blocks likewise.
        let (num_groups, rows) = (self.cfg.kv_cache_groups().len(), step.len());
        prop_assert_eq!(step.num_block_ids.len(), num_groups * rows);
        let mut group_offsets: Vec<usize> =
            (0..num_groups).map(|g| step.num_block_ids[..g * rows].iter().map(|&n| n as usize).sum()).collect();
        for i in 0..step.len() {
            prop_assert!(seen.insert(step.req_handles[i]), "a request is scheduled twice in one step");
            let mut blocks = Vec::with_capacity(num_groups);
            for (g, offset) in group_offsets.iter_mut().enumerate() {
                let count = step.num_block_ids[g * rows + i] as usize;
                blocks.push(step.block_ids[*offset..*offset + count].to_vec());
                *offset += count;
                block_offset += count;
            }
            let drafts = &step.spec_token_ids[spec_offset..spec_offset + step.num_spec_tokens[i] as usize];
            spec_offset += drafts.len();
            self.check_entry(step, i, drafts)?;
            self.runner_takes_entry(step, i, blocks, &mut pending_kv)?;
        }
        self.check_structured_rows(step)?;
        prop_assert_eq!(block_offset, step.block_ids.len());
        prop_assert_eq!(spec_offset, step.spec_token_ids.len());
        for h in step.new_reqs.iter().chain(&step.resumed_reqs) {
            prop_assert!(seen.contains(h), "an admission is not among the step's entries");
        }
        invariants!(self, format!("after schedule (step {})", step.step_id));
        self.check_cached_kv(&format!("after schedule (step {})", step.step_id))?;
        Ok(pending_kv)
    }

    /// The requests the step reports finished (each once, after it finished, its slot
    /// freed) and preempted (the runner forgets their tables, the drafts are dropped).
    fn check_step_reports(&mut self, step: &Step) -> Result<(), TestCaseError> {
        for (h, id) in &step.finished {
            let idx = *self.by_handle.get(h).ok_or_else(|| TestCaseError::fail(format!("unknown finished {id}")))?;
            let t = &mut self.tracked[idx];
            prop_assert_eq!(&*t.id, &**id);
            prop_assert!(t.finished, "{} reported finished, but it never finished", t.id);
            prop_assert!(!t.reported, "{} reported finished twice", t.id);
            t.reported = true;
            prop_assert!(self.sched.request(*h).is_none(), "{id} is reported finished but still has its slot");
            if self.sched.held_kv_blocks(id, 0).is_some() {
                self.held.push(id.clone());
            }
            self.tables.remove(h);
        }
        for (h, _) in &step.preempted {
            self.tables.remove(h);
            self.drafts_given.remove(h); // a preemption drops the drafts
        }
        Ok(())
    }

    /// The step names as structured-output rows exactly the structured-output requests whose
    /// chunk reaches the end of their tokens, and schedules none whose grammar did not compile.
    fn check_structured_rows(&self, step: &Step) -> Result<(), TestCaseError> {
        let mut expected = Vec::new();
        for (i, h) in step.req_handles.iter().enumerate() {
            let t = &self.tracked[self.by_handle[h]];
            if t.grammar.is_none() {
                continue;
            }
            let r = self.sched.request(*h).ok_or_else(|| TestCaseError::fail("scheduled, no slot"))?;
            prop_assert_eq!(r.grammar(), Some(Grammar::Compiled), "{} scheduled before its grammar compiled", t.id);
            // `N + P` before the step: the prompt and the outputs the row counts.
            let end = t.prompt_len + i64::from(step.num_output_tokens[i]);
            let reached = i64::from(step.num_computed_tokens[i]) + i64::from(step.num_scheduled_tokens[i]);
            if reached >= end {
                expected.push(i as i32);
            }
        }
        prop_assert_eq!(&step.structured_output_rows, &expected, "the step's structured-output rows");
        Ok(())
    }

    /// The step's columns agree in length and stay within the budgets, and a new or
    /// resumed request's row carries all its tokens: the prompt and those delivered so far.
    fn check_step_totals(&self, step: &Step) -> Result<(), TestCaseError> {
        let cfg = &self.cfg;
        let r = step.len();
        prop_assert!(r as i64 <= cfg.max_num_seqs(), "{r} entries > max_num_seqs");
        prop_assert!([step.num_scheduled_tokens.len(), step.num_computed_tokens.len(), step.num_spec_tokens.len()]
            .iter()
            .all(|&l| l == r));
        let total: i64 = step.num_scheduled_tokens.iter().map(|&n| n as i64).sum();
        prop_assert_eq!(total, step.total_num_scheduled_tokens);
        prop_assert!(total <= cfg.max_num_scheduled_tokens(), "sum(n) = {total} > max_num_scheduled_tokens");
        let inputs = total + r as i64 * cfg.max_num_new_slots_for_drafting();
        prop_assert!(inputs <= cfg.max_num_batched_tokens(), "sum(n + draft slots) = {inputs} > input budget");
        let num_spec: i64 = step.num_spec_tokens.iter().map(|&x| x as i64).sum();
        prop_assert_eq!(num_spec, step.spec_token_ids.len() as i64);
        prop_assert_eq!(step.num_all_token_ids.len(), r);
        let mut token_offset = 0usize;
        for (h, &num) in step.req_handles.iter().zip(&step.num_all_token_ids) {
            let num = num as usize;
            let t = &self.tracked[*self.by_handle.get(h).ok_or_else(|| TestCaseError::fail("an unknown row"))?];
            let sent = step.all_token_ids.get(token_offset..token_offset + num);
            prop_assert!(num == 0 || sent == Some(&t.tokens[..]), "{}: the row's tokens are not the request's", t.id);
            token_offset += num;
        }
        prop_assert_eq!(token_offset, step.all_token_ids.len());
        // The step's adapters: those of its rows, each once, ascending, within max_loras.
        let mut loras: Vec<i32> =
            step.req_handles.iter().filter_map(|h| self.by_handle.get(h).and_then(|&i| self.tracked[i].lora)).collect();
        loras.sort_unstable();
        loras.dedup();
        prop_assert_eq!(&step.lora_ids, &loras, "the step's LoRA set is not its rows' adapters");
        prop_assert!(loras.len() as i64 <= cfg.max_loras(), "{} adapters > max_loras", loras.len());
        Ok(())
    }

    /// Entry `i` of the step: the capacity rule, `C` advanced by `n`, its drafts (a
    /// padded admission's placeholders, async placeholders, or a prefix of those given),
    /// a prefix hit of whole blocks, no request both preempted and running.
    fn check_entry(&mut self, step: &Step, i: usize, drafts: &[i32]) -> Result<(), TestCaseError> {
        let cfg = self.cfg.clone();
        let (m, s, k) = (self.m(), self.s(), self.k());
        let h = step.req_handles[i];
        let (c, n, spec) =
            (step.num_computed_tokens[i] as i64, step.num_scheduled_tokens[i] as i64, step.num_spec_tokens[i] as i64);
        let req = self.sched.request(h).ok_or_else(|| TestCaseError::fail("scheduled request has no slot"))?;
        let id = req.id().clone();
        prop_assert!(n >= 1, "{id}: n = {n}");
        prop_assert!(c + n + s <= m, "{id}: C + n + s = {c} + {n} + {s} > M = {m}");
        prop_assert!(spec <= k && spec <= n, "{id}: {spec} drafts, n = {n}, K = {k}");
        prop_assert_eq!(req.status(), RequestStatus::Running);
        prop_assert_eq!(req.num_computed_tokens(), c + n, "{}: C after the step", id);
        let fresh = step.new_reqs.contains(&h) || step.resumed_reqs.contains(&h);
        if fresh && spec > 0 {
            // Appendix A.4: only a padded admission has drafts, n = 1 + K placeholders.
            prop_assert!(
                n == 1 + k && drafts.iter().all(|&d| d == -1),
                "{id}: admitted with drafts {drafts:?} (C = {c}, n = {n}, K = {k}, N = {})",
                req.num_tokens()
            );
        }
        if cfg.async_scheduling() {
            prop_assert!(drafts.iter().all(|&d| d == -1), "{id}: async drafts {drafts:?}");
        } else if !fresh {
            // §3.1 step 11: a prefix of the drafts given, as many as the budget allowed.
            let given = self.drafts_given.remove(&h).unwrap_or_default();
            prop_assert!(
                drafts.len() <= given.len() && drafts == &given[..drafts.len()],
                "{id}: scheduled drafts {drafts:?}, given {given:?}"
            );
        }
        if fresh {
            // Appendix A.8: a prefix hit is whole blocks, at most N - 1 tokens
            // (a request that arrived holding KV keeps its count instead).
            let tracked = self.by_handle.get(&h).map(|&t| &self.tracked[t]);
            let arrived = tracked.map_or(0, |t| t.arrived_computed);
            if let Some(kept) = tracked.and_then(|t| t.resume_from) {
                // A session that took up an input is admitted again from the KV it kept.
                prop_assert_eq!(c, kept, "{}: admitted again after taking up an input", id);
                let t = self.by_handle[&h];
                self.tracked[t].resume_from = None;
            } else if let Some(loaded) = tracked.and_then(|t| t.loading) {
                // Its load across steps is in: it starts from what was loaded (all but the
                // last token when the load covered every one).
                prop_assert_eq!(c, loaded.min(req.num_tokens() - 1), "{}: admitted after its load", id);
                // Unless that leaves it no computed token (a one-token prompt): then it is
                // new again, and looks up and asks again.
                let asked = external_tokens_of_row(step, i) >= 0;
                prop_assert_eq!(asked, c == 0, "{}: asked again after its load", id);
                let t = self.by_handle[&h];
                self.tracked[t].loading = None;
                self.tracked[t].recomputes_after_whole_load = loaded >= req.num_tokens();
            } else if arrived == 0 || req.num_preemptions() > 0 {
                // A request that skips reading the prefix cache has no hit, and loads nothing
                // from a connector; what a connector loads leaves a token to compute.
                let skips = tracked.is_some_and(|t| t.skip_prefix_cache);
                prop_assert!(!(skips && c > 0), "{id} skips reading the prefix cache but hit {c} tokens");
                let external = external_tokens_of_row(step, i).max(0);
                prop_assert!(c < req.num_tokens(), "{id}: admitted with C = {c} = N");
                let (hit, bs) = (c - external, cfg.block_size());
                prop_assert!(
                    hit == 0 || (cfg.enable_prefix_caching() && hit % bs == 0),
                    "{id}: admitted with a hit of {hit} tokens (B = {bs}, N = {}, {external} loaded)",
                    req.num_tokens()
                );
            }
        }
        if step.preempted.iter().any(|(p, _)| *p == h) {
            prop_assert!(step.resumed_reqs.contains(&h), "{id} preempted, then scheduled as running");
        }
        Ok(())
    }

    /// The runner's part for entry `i`: its block table (replaced for an admission,
    /// extended otherwise) must be the request's, and with `kv_exact` it writes the KV of
    /// positions C..C+n (and, for a request that arrived holding KV, its external
    /// positions 0..C); positions past `N` are pending until the output is applied.
    fn runner_takes_entry(
        &mut self,
        step: &Step,
        i: usize,
        blocks: Vec<Vec<i32>>,
        pending_kv: &mut Vec<(usize, u32, i64)>,
    ) -> Result<(), TestCaseError> {
        let h = step.req_handles[i];
        let (c, n) = (step.num_computed_tokens[i] as i64, step.num_scheduled_tokens[i] as i64);
        let req = self.sched.request(h).ok_or_else(|| TestCaseError::fail("scheduled request has no slot"))?;
        let id = req.id().clone();
        if step.new_reqs.contains(&h) || step.resumed_reqs.contains(&h) {
            self.tables.insert(h, blocks);
            self.mamba_cursor.remove(&h);
        } else {
            let tables = self
                .tables
                .get_mut(&h)
                .ok_or_else(|| TestCaseError::fail(format!("{id} scheduled as running, unknown to the runner")))?;
            for (table, new) in tables.iter_mut().zip(blocks) {
                table.extend_from_slice(&new);
            }
        }
        let groups = self.cfg.kv_cache_groups();
        let bs = self.cfg.block_size();
        for (g, table) in self.tables[&h].iter().enumerate() {
            let expected = req.group_block_ids(g);
            prop_assert_eq!(table.len(), expected.len(), "{}: the runner's block table of group {}", id, g);
            self.cov.window_nulls += expected.iter().filter(|&&b| b == 0).count() as u64;
            for (j, (&runner, &held)) in table.iter().zip(expected).enumerate() {
                // The scheduler's table says null where a sliding window let the block go
                // (the runner is not told: it skips blocks behind the window itself), or
                // where an admission's hit began after the window's start.
                let behind_window = match groups.kind(g) {
                    AttentionKind::SlidingWindow { window } => (j as i64 + 1) * bs <= c - i64::from(window) + 1,
                    AttentionKind::ChunkedLocal { chunk } => {
                        (j as i64 + 1) * bs <= c / i64::from(chunk) * i64::from(chunk)
                    }
                    // Aligned, a Mamba group's states lie among nulls (the state checks below).
                    AttentionKind::Mamba => self.cfg.mamba_aligned(),
                    AttentionKind::Full => false,
                };
                prop_assert!(
                    runner == held as i32 || (held == 0 && behind_window),
                    "{}: group {}'s table index {} is {} in the runner, {} in the scheduler (C = {})",
                    id,
                    g,
                    j,
                    runner,
                    held,
                    c
                );
            }
        }
        if !self.kv_exact {
            return Ok(());
        }
        let arrived = self.by_handle.get(&h).map_or(0, |&t| self.tracked[t].arrived_computed);
        let recomputes_after_whole_load =
            self.by_handle.get(&h).is_some_and(|&t| std::mem::take(&mut self.tracked[t].recomputes_after_whole_load));
        // Tokens a connector loaded past the hit hold their KV from the step on.
        let external = external_tokens_of_row(step, i);
        self.cov.external_tokens += external.max(0) as u64;
        let from = if step.new_reqs.contains(&h) && arrived > 0 && req.num_preemptions() == 0 {
            0
        } else {
            c - external.max(0)
        };
        for (g, table) in self.tables[&h].iter().enumerate() {
            let window_start = match groups.kind(g) {
                AttentionKind::SlidingWindow { window } => c - i64::from(window) + 1,
                AttentionKind::ChunkedLocal { chunk } => c / i64::from(chunk) * i64::from(chunk),
                AttentionKind::Full => 0,
                // Aligned, a step continues from the state after C tokens, which its table
                // holds where it ends (a hit's cached state), and writes the state after
                // C + n where that ends.
                AttentionKind::Mamba if self.cfg.mamba_aligned() => {
                    // Beside drafts the state block is the one before the speculative
                    // blocks, and a verify step writes the state after each of its last
                    // `1 + d` tokens into it and the `d` blocks after it (vLLM's runner).
                    let d = i64::from(step.num_spec_tokens[i]);
                    let curr = ((c + n + bs - 1) / bs - 1) as usize;
                    let read =
                        self.mamba_cursor.get(&h).map_or(((c - 1).max(0) / bs) as usize, |&(at, ahead)| at + ahead);
                    if c > 0 {
                        let block = table[read];
                        prop_assert!(block != 0, "{id}: group {g} holds no state after C = {c}: {table:?}");
                        let held = self.kv[block as usize][0];
                        prop_assert!(
                            matches!(held, Kv::MambaState { len, step_id } if len == c && step_id < step.step_id),
                            "{id}: group {g}'s state block {block} holds {held:?}, not an earlier step's \
                             state after C = {c}"
                        );
                    }
                    // A step from a block boundary that passes another writes the state at
                    // the last boundary before its last token into the block before, if its
                    // table holds one there: a prefill checkpoint (the runner's rule, on the
                    // layers' alignment), before the states at the step's end (a block the
                    // runner's table keeps there after the scheduler moved it on holds those).
                    let alignment = self.cfg.mamba_prefill_checkpoint_alignment();
                    // (Under EAGLE's block drop, the boundary a block before the last.)
                    let position =
                        if self.cfg.eagle_block_drop() { (c + n) / bs * bs - bs } else { (c + n - 1) / bs * bs };
                    let index = (c + n - 1) / bs - 1;
                    let exportable = alignment > 0
                        && c % bs == 0
                        && index > (c - 1).div_euclid(bs)
                        && c + bs <= position
                        && (position - c) % alignment == 0;
                    if exportable && table[index as usize] != 0 {
                        self.kv[table[index as usize] as usize][0] =
                            Kv::MambaState { len: position, step_id: step.step_id };
                    }
                    for j in 0..=d {
                        let block = table[curr + j as usize];
                        let len = c + n - d + j;
                        prop_assert!(block != 0, "{id}: group {g} has no block for the state after {len}");
                        self.kv[block as usize][0] = Kv::MambaState { len, step_id: step.step_id };
                    }
                    // A verify step whose known tokens end on a boundary (the block the
                    // scheduler caches now) has that state copied there after it, whatever
                    // it accepts (fewer drafts than a block's tokens pass no other boundary).
                    let running = c + n - d;
                    if d > 0 && running % bs == 0 && table[(running / bs - 1) as usize] != 0 {
                        let block = table[(running / bs - 1) as usize];
                        self.kv[block as usize][0] = Kv::MambaState { len: running, step_id: step.step_id };
                    }
                    if self.k() > 0 {
                        self.mamba_cursor.insert(h, (curr, 0));
                    }
                    continue;
                }
                // A Mamba group's state blocks are rewritten in place: the whole table, from
                // the request's first step on, and no position maps to a block.
                AttentionKind::Mamba => {
                    prop_assert_eq!(table.len() as i64, 1 + self.k(), "{}: Mamba group {}'s table", id, g);
                    continue;
                }
            };
            prop_assert!((table.len() as i64) * bs >= c + n, "{id}: group {g}'s table does not cover C + n");
            for pos in from..c + n {
                let (block, slot) = (table[(pos / bs) as usize] as u32, (pos % bs) as usize);
                if block == 0 {
                    // An arrival's computed tokens behind the window are never loaded; the
                    // last token recomputed after a load of every token may fall behind it.
                    let block_end = (pos / bs + 1) * bs;
                    prop_assert!(
                        (block_end <= window_start && pos < c) || (recomputes_after_whole_load && pos == c),
                        "{id}: group {g} writes position {pos} into the null block"
                    );
                    continue;
                }
                self.kv[block as usize][slot] = if pos < req.num_tokens() {
                    Kv::Token(req.all_token_ids().nth(pos as usize).expect("pos < N"))
                } else {
                    pending_kv.push((i, block, pos));
                    Kv::Pending { step_id: step.step_id, pos }
                };
            }
        }
        Ok(())
    }

    /// The request `id`, live or finished by the latest update (a step's output may cache
    /// a request's blocks and finish it).
    fn live_or_just_finished(&self, id: &str, when: &impl std::fmt::Debug) -> Result<&Request, TestCaseError> {
        match self.sched.get_request(id) {
            Ok(req) => Ok(req),
            Err(e) => self
                .sched
                .last_finished()
                .iter()
                .find(|r| &**r.id() == id)
                .ok_or_else(|| TestCaseError::fail(format!("{when:?}: {e}"))),
        }
    }

    /// Replays the KV cache events recorded since the last check on the test's own model
    /// of the prefix cache, checking each against it, then compares the model with the
    /// pool: the blocks the pool holds under a hash are exactly those the events stored
    /// (under the hash of the request's block at that position) and did not remove since.
    fn check_kv_events(&mut self, when: impl std::fmt::Debug) -> Result<(), TestCaseError> {
        let events = self.sched.take_kv_events();
        if !self.cfg.enable_kv_cache_events() {
            prop_assert!(events.is_empty(), "{:?}: events recorded while off: {:?}", when, events);
            return Ok(());
        }
        let bs = self.cfg.block_size();
        for event in events {
            match event {
                KvEvent::Stored { request_id, group, first_block, blocks } => {
                    let req = self.live_or_just_finished(&request_id, &when)?;
                    let hashes = req.block_hashes().to_vec();
                    let table = req.group_block_ids(group as usize).to_vec();
                    let sliding = self.cfg.kv_cache_groups().kind(group as usize) != AttentionKind::Full;
                    for (i, &block) in blocks.iter().enumerate() {
                        let index = first_block as usize + i;
                        // Only a sliding window's blocks may stay out of the cache.
                        prop_assert!(block != 0 || sliding, "{:?}: the null block stored", when);
                        if block == 0 {
                            continue;
                        }
                        prop_assert!(
                            index < hashes.len(),
                            "{:?}: {} stored block {} past its full blocks",
                            when,
                            request_id,
                            index
                        );
                        // An aligned Mamba checkpoint block may hold the state of the boundary
                        // a block before its own index (EAGLE's block drop).
                        let checkpoint = self.cfg.mamba_aligned()
                            && self.cfg.kv_cache_groups().kind(group as usize) == AttentionKind::Mamba
                            && table.get(index) == Some(&0)
                            && table.get(index + 1) == Some(&block);
                        if let (Some(&held), false) = (table.get(index), checkpoint) {
                            prop_assert_eq!(
                                held,
                                block,
                                "{:?}: {} block {} stored as another block",
                                when,
                                &request_id,
                                index
                            );
                        }
                        let before = self.cached_by_events.insert(block, (hashes[index], group));
                        prop_assert!(before.is_none(), "{:?}: block {} stored twice", when, block);
                        self.cov.blocks_stored += 1;
                    }
                }
                KvEvent::Reused { request_id, group, num_blocks } => {
                    prop_assert!(
                        self.reporting_hits.contains(&*request_id),
                        "{:?}: hits of {} reported unasked",
                        when,
                        request_id
                    );
                    let req = self.live_or_just_finished(&request_id, &when)?;
                    prop_assert!(num_blocks > 0 && i64::from(num_blocks) * bs < req.num_tokens());
                    // Every hit block of a full-attention group is cached there; a sliding
                    // window's hit ends with a cached block (nulls may come before it); a
                    // chunked local group's may be nulls alone (earlier chunks), and so may a
                    // one-token window's (it reads no earlier token).
                    let hit = &req.block_hashes()[..num_blocks as usize];
                    let checked = match self.cfg.kv_cache_groups().kind(group as usize) {
                        AttentionKind::Full => hit,
                        AttentionKind::SlidingWindow { window: 1 } | AttentionKind::ChunkedLocal { .. } => &[],
                        AttentionKind::SlidingWindow { .. } | AttentionKind::Mamba => &hit[hit.len() - 1..],
                    };
                    for hash in checked {
                        prop_assert!(
                            self.cached_by_events.values().any(|&(h, g)| h == *hash && g == group),
                            "{:?}: {} reported a hit on a block not cached in group {}",
                            when,
                            request_id,
                            group
                        );
                    }
                    self.cov.hits_reported += 1;
                }
                KvEvent::Removed { block, group } => {
                    let stored = self.cached_by_events.remove(&block);
                    prop_assert!(
                        stored.is_some_and(|(_, g)| g == group),
                        "{:?}: block {} removed from group {} while not cached there ({:?})",
                        when,
                        block,
                        group,
                        stored
                    );
                    self.cov.blocks_removed += 1;
                }
                KvEvent::Cleared => {
                    self.cached_by_events.clear();
                    self.cov.caches_cleared += 1;
                }
            }
        }
        for block in 1..self.cfg.num_gpu_blocks() as u32 {
            prop_assert_eq!(
                self.sched.cached_block_hash(block),
                self.cached_by_events.get(&block).map(|&(hash, _)| hash),
                "{:?}: block {}: the pool's hash against the events'",
                when,
                block
            );
        }
        Ok(())
    }

    /// Every block a running request holds under its own hash (a prefix-cache
    /// block: hit, or registered for others to hit) holds the KV of its tokens,
    /// or KV a step in flight computes.
    fn check_cached_kv(&self, when: &str) -> Result<(), TestCaseError> {
        if !self.kv_exact || !self.cfg.enable_prefix_caching() {
            return Ok(());
        }
        let bs = self.cfg.block_size() as usize;
        for t in self.tracked.iter().filter(|t| !t.finished) {
            let Some(req) = self.sched.request(t.handle) else { continue };
            if req.status() != RequestStatus::Running {
                continue;
            }
            let (hashes, tokens) = (req.block_hashes(), req.all_token_ids().collect::<Vec<_>>());
            let groups = self.cfg.kv_cache_groups();
            let tables = (0..groups.len()).flat_map(|g| req.group_block_ids(g).iter().enumerate().map(move |e| (g, e)));
            for (g, (i, &block)) in tables {
                if i >= hashes.len() || block == 0 || self.sched.cached_block_hash(block) != Some(hashes[i]) {
                    continue;
                }
                if groups.kind(g) == AttentionKind::Mamba {
                    // An aligned Mamba state is cached only where a step ended on its block's end.
                    let held = self.kv[block as usize][0];
                    prop_assert!(
                        matches!(held, Kv::MambaState { len, .. } if len == (i as i64 + 1) * bs as i64),
                        "{when}: {}: cached state block {block} (table index {i}) in group {g} holds {held:?}",
                        &t.id
                    );
                    continue;
                }
                for j in 0..bs {
                    let held = self.kv[block as usize][j];
                    let want = tokens[i * bs + j];
                    prop_assert!(
                        held == Kv::Token(want)
                            || matches!(held, Kv::Pending { pos, .. } if pos == (i * bs + j) as i64),
                        "{when}: {}: cached block {block} (table index {i}) slot {j} holds {held:?}, \
                         but its token is {want}\n{}",
                        t.id,
                        self.sched.debug_snapshot()
                    );
                }
            }
        }
        Ok(())
    }

    /// Applies the oldest step in flight with the runner's output, checking each event
    /// against the test's own records, then resolves the KV the step left pending.
    fn apply(&mut self) -> Result<bool, TestCaseError> {
        let Some(p) = self.queue.pop_front() else { return Ok(false) };
        // Each live request's `(C, P, stale output tokens)` before the output: what a session
        // that stops keeps.
        let before: HashMap<Handle, (i64, i64, i64)> = p
            .step
            .req_handles
            .iter()
            .filter_map(|&h| {
                let r = self.sched.request(h)?;
                Some((h, (r.num_computed_tokens(), r.num_output_placeholders(), r.num_stale_output_tokens())))
            })
            .collect();
        let out =
            RunnerOutput { sampled_token_ids: &p.tokens, num_sampled: &p.counts, row_of_entry: p.rows.as_deref() };
        let mut events = Vec::new();
        let aux = self.aux.as_mut().map(|aux| aux as &mut dyn AuxOutputs);
        if let Err(e) = self.sched.update_from_output_with(p.step.step_id, &out, |e| events.push(e), aux) {
            return Err(TestCaseError::fail(format!("update_from_output refused the runner: {e}")));
        }
        self.check_aux_outputs_in_update(&events)?;
        if tracing() {
            self.trace_apply(&p, &events);
        }
        self.runner_keeps_mamba_boundary_states(&p)?;
        let mut row_offsets = Vec::with_capacity(p.counts.len());
        let mut offset = 0usize;
        for &c in &p.counts {
            row_offsets.push(offset);
            offset += c as usize;
        }
        self.check_kv_events("update_from_output")?;
        let mut seen = HashSet::new();
        for e in &events {
            self.check_event(&p, e, &row_offsets, &mut seen, &before)?;
        }
        self.resolve_pending_kv(&p);
        // Requests without an event got no tokens.
        for t in self.tracked.iter().filter(|t| !t.finished) {
            if let Some(req) = self.sched.request(t.handle) {
                prop_assert_eq!(t.delivered, req.num_output_tokens(), "{}: tokens without an event", t.id);
                prop_assert_eq!(t.prompt_len, req.num_prompt_tokens());
            }
        }
        invariants!(self, format!("after update_from_output (step {})", p.step.step_id));
        self.check_cached_kv(&format!("after update_from_output (step {})", p.step.step_id))?;
        Ok(true)
    }

    /// With an auxiliary-output connector, after a step: every admission that looked its
    /// prefix up took a hit within the cap it was given (its block-aligned part, in
    /// `[0, N - 1]`), and the only requests it was told of are ones the running loop
    /// preempted, told while still running.
    fn check_aux_outputs_in_step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let Some(aux) = self.aux.as_mut() else { return Ok(()) };
        let caps = std::mem::take(&mut aux.caps);
        let told = std::mem::take(&mut aux.told);
        let block_size = self.cfg.block_size();
        let first_admitted = step.len() - step.new_reqs.len() - step.resumed_reqs.len();
        for i in first_admitted..step.len() {
            let r = self.sched.request(step.req_handles[i]).expect("an admitted request is live");
            let Some(&cap) = caps.get(&**r.id()) else { continue };
            let external = external_tokens_of_row(step, i).max(0);
            let hit = i64::from(step.num_computed_tokens[i]) - external;
            let most = cap.clamp(0, r.num_tokens() - 1) / block_size * block_size;
            prop_assert!(hit <= most, "{}: a hit of {} past its cap {} ({} tokens)", r.id(), hit, cap, most);
        }
        let preempted: HashSet<&str> = step.preempted.iter().map(|(_, id)| &**id).collect();
        for (id, status) in &told {
            prop_assert!(preempted.contains(id.as_str()), "{}: told of, not preempted", id);
            prop_assert_eq!(*status, RequestStatus::Running, "{}: told of a preemption", id);
        }
        Ok(())
    }

    /// With an auxiliary-output connector, after an update: it was told of exactly the
    /// requests the output finished, each once, finished.
    fn check_aux_outputs_in_update(&mut self, events: &[RequestEvent]) -> Result<(), TestCaseError> {
        let Some(aux) = self.aux.as_mut() else { return Ok(()) };
        let told = std::mem::take(&mut aux.told);
        let finished: Vec<&str> = self.sched.last_finished().iter().map(|r| &**r.id()).collect();
        let told_ids: Vec<&str> = told.iter().map(|(id, _)| id.as_str()).collect();
        prop_assert_eq!(&told_ids, &finished, "told of exactly the finished requests, in order");
        for (id, status) in &told {
            prop_assert!(status.is_finished(), "{}: told as {:?}", id, status);
        }
        prop_assert!(events.iter().filter(|e| e.status.is_finished()).count() >= told.len());
        Ok(())
    }

    /// Beside drafts, vLLM's runner after a verify step: of the states it wrote after each
    /// of the step's last `1 + d` tokens, the one after the accepted tokens is where the
    /// next step reads (`mamba_cursor`), and if the accepted tokens reach or pass a block
    /// boundary the step's tokens crossed, the state at that boundary is copied into the
    /// block that ends there, where the prefix cache finds it. The accepted tokens are the
    /// request's computed ones after the output (a session's stop keeps fewer than the
    /// runner sampled; its next input goes on from those).
    fn runner_keeps_mamba_boundary_states(&mut self, p: &Pending) -> Result<(), TestCaseError> {
        if !self.kv_exact || !self.cfg.mamba_aligned() || self.k() == 0 {
            return Ok(());
        }
        let bs = self.cfg.block_size();
        let groups = self.cfg.kv_cache_groups();
        for (i, &h) in p.step.req_handles.iter().enumerate() {
            let Some(&(curr, _)) = self.mamba_cursor.get(&h) else { continue };
            let Some(computed) = self.sched.request(h).map(|r| r.num_computed_tokens()) else {
                self.mamba_cursor.remove(&h);
                continue;
            };
            let (c, n) = (i64::from(p.step.num_computed_tokens[i]), i64::from(p.step.num_scheduled_tokens[i]));
            let running = c + n - i64::from(p.step.num_spec_tokens[i]);
            if computed < running {
                // Preempted by the output (its KV given back): the runner sees it resumed.
                self.mamba_cursor.remove(&h);
                continue;
            }
            let aligned = computed / bs * bs;
            let mut ahead = (computed - running) as usize;
            if aligned >= running && aligned > 0 {
                let dest = (aligned / bs - 1) as usize;
                for (g, table) in self.tables[&h].iter().enumerate() {
                    if groups.kind(g) != AttentionKind::Mamba {
                        continue;
                    }
                    let (from, to) = (table[curr + (aligned - running) as usize], table[dest]);
                    if to == 0 {
                        // The runner's copy lands in the null block: no hit reads that state.
                        continue;
                    }
                    prop_assert!(
                        from != 0,
                        "{}: group {g} copies the state after {aligned} from table index {} to {dest}: {table:?}",
                        self.sched.request(h).map_or("?".into(), |r| r.id().to_string()),
                        curr + (aligned - running) as usize
                    );
                    self.kv[to as usize][0] = self.kv[from as usize][0];
                }
                if dest == curr {
                    ahead = 0;
                }
            }
            self.mamba_cursor.insert(h, (curr, ahead));
        }
        Ok(())
    }

    fn trace_apply(&self, p: &Pending, events: &[RequestEvent]) {
        eprintln!("apply step {}: rows {:?} tokens {:?} -> {events:?}", p.step.step_id, p.counts, p.tokens);
        for &h in &p.step.req_handles {
            if let Some(r) = self.sched.request(h) {
                eprintln!(
                    "    {}: C={} N={} P={} S={:?}",
                    r.id(),
                    r.num_computed_tokens(),
                    r.num_tokens(),
                    r.num_output_placeholders(),
                    r.spec_token_ids()
                );
            }
        }
    }

    /// One event of the output: its request's entry and runner row, the tokens delivered
    /// (a prefix of the row, none past a stop), which the test adds to its record, and the
    /// request's state after them.
    fn check_event(
        &mut self,
        p: &Pending,
        e: &RequestEvent,
        row_offsets: &[usize],
        seen: &mut HashSet<Handle>,
        before: &HashMap<Handle, (i64, i64, i64)>,
    ) -> Result<(), TestCaseError> {
        let (m, k) = (self.m(), self.k());
        let idx = *self.by_handle.get(&e.handle).ok_or_else(|| TestCaseError::fail("event for an unknown handle"))?;
        let i = p
            .step
            .req_handles
            .iter()
            .position(|&h| h == e.handle)
            .ok_or_else(|| TestCaseError::fail("event for a request not in the step"))?;
        let row = p.rows.as_ref().map_or(i, |r| r[i] as usize);
        let t = &mut self.tracked[idx];
        prop_assert!(seen.insert(e.handle), "{}: two events in one output", t.id);
        prop_assert!(!t.finished, "{}: an event after its finish", t.id);
        prop_assert_eq!(e.entry as usize, i, "{}: the event's step position", t.id);
        prop_assert_eq!(e.token_offset, row_offsets[row], "{}: token offset", t.id);
        prop_assert!(e.num_tokens <= p.counts[row] as usize, "{}: more tokens than the runner gave", t.id);
        prop_assert!(e.num_tokens as i64 <= 1 + k);
        t.delivered += e.num_tokens as i64;
        t.tokens.extend_from_slice(&p.tokens[e.token_offset..e.token_offset + e.num_tokens]);
        // A stop ends the output: no token before the last is an EOS or a stop id
        // (min_tokens does not hold a stop back: the sampler masks those tokens).
        let outputs = &t.tokens[t.prompt_len as usize..];
        if let Some(j) =
            outputs[..outputs.len().saturating_sub(1)].iter().position(|x| Some(*x) == t.eos || t.stops.contains(x))
        {
            prop_assert!(false, "{}: output {} is a stop token ({}) but more followed", t.id, j, outputs[j]);
        }
        let (num_tokens, num_output_tokens) = (t.tokens.len() as i64, t.tokens.len() as i64 - t.prompt_len);
        prop_assert_eq!(t.delivered, num_output_tokens, "{}: delivered tokens vs the tokens held", t.id);
        prop_assert!(e.status != RequestStatus::FinishedAborted);
        prop_assert!(e.num_tokens > 0 || e.status.is_finished(), "{}: an empty, unfinished event", t.id);
        prop_assert!(num_output_tokens <= t.max_tokens, "{}: outputs > max_tokens", t.id);
        prop_assert!(num_tokens <= m, "{}: N > M", t.id);
        // A session's stop ends its input: unless its end (or an input that does not fit)
        // is next, it goes on.
        if e.status.is_finished() {
            match self.at_stop(idx) {
                AtStop::Finishes => {}
                next => return self.session_goes_on(idx, e, next, before.get(&e.handle).copied().unwrap_or_default()),
            }
        }
        let t = &self.tracked[idx];
        // A finished request's record is freed at once (only its id waits for the next
        // step's report): what it ended with is the test's own record of its tokens.
        let req = self.sched.request(e.handle);
        if e.status.is_finished() {
            prop_assert!(req.is_none(), "{}: finished, but its record is kept", t.id);
            prop_assert!(
                self.sched.get_request(&t.id).is_err() && !self.sched.running_ids().iter().any(|id| **id == *t.id),
                "{}: finished, but still live",
                t.id
            );
        } else {
            let req = req.ok_or_else(|| TestCaseError::fail("an unfinished event without a slot"))?;
            prop_assert_eq!(t.delivered, req.num_output_tokens(), "{}: delivered tokens vs output tokens", t.id);
            prop_assert!(req.all_token_ids().eq(t.tokens.iter().copied()), "{}: the request's tokens", t.id);
            prop_assert_eq!(e.status, req.status(), "{}: event status", t.id);
        }
        if e.status.is_finished() {
            self.check_finish(idx, e)?;
        }
        Ok(())
    }

    /// A finishing event: its request is done, on the stop `check_stop` checks.
    fn check_finish(&mut self, idx: usize, e: &RequestEvent) -> Result<(), TestCaseError> {
        let t = &mut self.tracked[idx];
        t.finished = true;
        if t.session.is_some() {
            self.cov.sessions_ended_at_stop += 1;
        }
        self.check_stop(idx, e)
    }

    /// A stop (a finish, or the end of a session's input): the one `check_stop` gives on the
    /// last delivered token (the EOS, a stop id as the stop reason, or the length cap).
    fn check_stop(&mut self, idx: usize, e: &RequestEvent) -> Result<(), TestCaseError> {
        let m = self.m();
        let pooling = self.cfg.num_sampled_tokens_per_step() == 0;
        let t = &self.tracked[idx];
        if e.status == RequestStatus::FinishedStopped {
            self.cov.finished_stop += 1;
        } else {
            self.cov.finished_length += 1;
        }
        let (num_tokens, num_output_tokens) = (t.tokens.len() as i64, t.tokens.len() as i64 - t.prompt_len);
        let last = *t.tokens.last().expect("a request has tokens");
        self.cov.pool_capped += u64::from(
            e.status == RequestStatus::FinishedLengthCapped
                && num_tokens == m
                && m < self.cfg.max_model_len()
                && num_output_tokens < t.max_tokens,
        );
        match e.status {
            // Pooling: the output of the final prompt chunk finishes the request.
            RequestStatus::FinishedStopped if pooling => prop_assert!(
                e.num_tokens == 0 && e.stop_reason.is_none(),
                "{}: a pooling request finished with {} tokens",
                t.id,
                e.num_tokens
            ),
            RequestStatus::FinishedStopped => prop_assert!(
                (Some(last) == t.eos && e.stop_reason == t.stop_reason)
                    || (Some(last) != t.eos && t.stops.contains(&last) && e.stop_reason == Some(last)),
                "{}: stopped on {last} with reason {:?}",
                t.id,
                e.stop_reason
            ),
            RequestStatus::FinishedLengthCapped => prop_assert!(
                Some(last) != t.eos
                    && !t.stops.contains(&last)
                    && (num_tokens >= m || num_output_tokens >= t.max_tokens),
                "{}: length-capped at N = {}, outputs = {}",
                t.id,
                num_tokens,
                num_output_tokens
            ),
            other => prop_assert!(false, "{}: finished as {other:?}", t.id),
        }
        if e.stop_reason.is_some() {
            self.tracked[idx].stop_reason = e.stop_reason;
        }
        Ok(())
    }

    /// Resolves the KV the step computed for positions unknown at schedule time: rejected
    /// drafts and tokens never appended hold garbage.
    fn resolve_pending_kv(&mut self, p: &Pending) {
        for &(i, block, pos) in &p.pending_kv {
            let (bs, s) = (self.cfg.block_size(), self.s());
            let slot = &mut self.kv[block as usize][(pos % bs) as usize];
            if *slot != (Kv::Pending { step_id: p.step.step_id, pos }) {
                continue; // overwritten since
            }
            let h = p.step.req_handles[i];
            let row = p.rows.as_ref().map_or(i, |r| r[i] as usize);
            let (c, n, spec) = (
                p.step.num_computed_tokens[i] as i64,
                p.step.num_scheduled_tokens[i] as i64,
                p.step.num_spec_tokens[i] as i64,
            );
            let count = p.counts[row] as i64;
            let rejected = if spec > 0 && count > 0 { spec - (count - s).max(0) } else { 0 };
            let t = &self.tracked[self.by_handle[&h]];
            let tokens = &t.tokens;
            // A session that stopped since the step was scheduled kept only its tokens then
            // (not the last sampled one): the KV past them is of tokens that are gone.
            let known =
                t.epoch_kept.get(p.epochs[i]).map_or(tokens.len() as i64, |&kept| kept.min(tokens.len() as i64));
            *slot = if pos >= c + n - rejected || pos >= known { Kv::Garbage } else { Kv::Token(tokens[pos as usize]) };
        }
    }

    /// The engine's part in structured output: reports each unreported grammar with
    /// probability `1/odds`, then fails the requests whose failed grammar a waiting loop
    /// saw; checks those are exactly such requests. Returns how many it failed.
    fn grammars(&mut self, rng: &mut Rng, odds: u64) -> Result<usize, TestCaseError> {
        for i in 0..self.tracked.len() {
            let t = &self.tracked[i];
            let Some((compiles, false)) = t.grammar else { continue };
            if t.finished || rng.below(odds) != 0 {
                continue;
            }
            let id = t.id.clone();
            self.sched
                .resolve_grammar(RequestRef::Id(&id), compiles)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let again = self.sched.resolve_grammar(RequestRef::Id(&id), compiles);
            prop_assert!(matches!(again, Err(CoreError::InvalidRequest { .. })), "{id}: a second report: {again:?}");
            self.tracked[i].grammar = Some((compiles, true));
        }
        let failed = self.sched.finish_failed_grammars();
        for (_, id) in &failed {
            let t = self.tracked.iter_mut().find(|t| *t.id == **id).expect("tracked");
            prop_assert_eq!(t.grammar, Some((false, true)), "{} failed for its grammar", t.id);
            prop_assert!(!t.finished, "{} finished twice", t.id);
            t.finished = true;
            self.cov.grammar_failed += 1;
        }
        let mismatched = self.sched.finish_encoder_mismatches();
        for (_, id) in &mismatched {
            let i = self.tracked.iter().position(|t| *t.id == **id).expect("tracked");
            let reused = self.tracked[i].images.iter().any(|(image, length)| {
                self.tracked.iter().flat_map(|t| &t.images).any(|(other, l)| other == image && l != length)
            });
            let t = &mut self.tracked[i];
            prop_assert!(reused, "{} failed, but no other request has one of its images at another size", t.id);
            prop_assert!(!t.finished, "{} finished twice", t.id);
            t.finished = true;
            self.cov.image_mismatches += 1;
        }
        invariants!(self, "after the grammars");
        Ok(failed.len() + mismatched.len())
    }

    fn abort(&mut self, ids: &[String]) -> Result<(), TestCaseError> {
        let refs: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
        let finished = self
            .sched
            .finish_requests(Some(&refs), RequestStatus::FinishedAborted)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut expected = Vec::new();
        for id in ids {
            if let Some(t) = self.tracked.iter().find(|t| &t.id == id && !t.finished) {
                if !expected.contains(&t.id) {
                    expected.push(t.id.clone());
                }
            }
        }
        let got: Vec<String> = finished.iter().map(|s| s.to_string()).collect();
        prop_assert_eq!(&got, &expected, "abort finished these ids");
        self.cov.aborted += got.len() as u64;
        for id in &got {
            let t = self.tracked.iter_mut().find(|t| &t.id == id).expect("tracked");
            t.finished = true;
        }
        invariants!(self, "after abort");
        Ok(())
    }

    fn abort_all(&mut self) -> Result<(), TestCaseError> {
        let finished = self
            .sched
            .finish_requests(None, RequestStatus::FinishedAborted)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut got: Vec<String> = finished.iter().map(|s| s.to_string()).collect();
        let mut expected: Vec<String> = self.live().map(|t| t.id.clone()).collect();
        got.sort();
        expected.sort();
        prop_assert_eq!(&got, &expected);
        self.cov.aborted += got.len() as u64;
        for t in self.tracked.iter_mut() {
            t.finished = true;
        }
        invariants!(self, "after abort all");
        Ok(())
    }

    fn drafts(&mut self, rng: &mut Rng) -> Result<(), TestCaseError> {
        let k = self.k();
        if k == 0 || self.cfg.async_scheduling() || !self.queue.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<String> = Vec::new();
        let mut drafts: Vec<Vec<i64>> = Vec::new();
        for t in self.tracked.iter() {
            // Like vLLM's runner, drafts only for running requests (the batch just
            // executed; a prefill chunk's are dropped by the core). Finished
            // requests now and then: they are ignored. See
            // `regression_drafts_for_a_waiting_request_with_a_pipelined_sync_step`
            // for drafts given to a waiting request.
            let running = self.sched.request(t.handle).is_some_and(|r| r.status() == RequestStatus::Running);
            if (running && !t.finished && rng.below(4) != 0) || (t.finished && rng.below(16) == 0) {
                ids.push(t.id.clone());
                let len = rng.below(k as u64 + 1);
                drafts.push((0..len).map(|_| if rng.below(8) == 0 { -1 } else { rng.below(VOCAB) as i64 }).collect());
            }
        }
        if rng.below(8) == 0 {
            ids.push("ghost".into());
            drafts.push(vec![]);
        }
        if tracing() {
            eprintln!("drafts {ids:?} {drafts:?}");
        }
        let refs: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
        let flat: Vec<i64> = drafts.concat();
        let counts: Vec<i64> = drafts.iter().map(|d| d.len() as i64).collect();
        if let Err(e) = self.sched.update_draft_token_ids(&refs, &flat, &counts) {
            return Err(TestCaseError::fail(format!("update_draft_token_ids: {e}")));
        }
        // What the next step may schedule: the drafts of live requests that are not prefill chunks.
        for (id, d) in ids.iter().zip(&drafts) {
            let Some(t) = self.tracked.iter().find(|t| &t.id == id && !t.finished) else { continue };
            let chunk = self.sched.request(t.handle).is_some_and(|r| r.is_prefill_chunk());
            self.drafts_given.insert(t.handle, if chunk { Vec::new() } else { d.iter().map(|&x| x as i32).collect() });
        }
        invariants!(self, "after update_draft_token_ids");
        Ok(())
    }

    fn reset_prefix_cache(&mut self, reset_running: bool) -> Result<(), TestCaseError> {
        let ok = self.sched.reset_prefix_cache(reset_running);
        if ok {
            self.cov.resets_ok += 1;
        } else {
            self.cov.resets_refused += 1;
        }
        if reset_running {
            prop_assert_eq!(self.sched.get_request_counts().0, 0, "running requests left after a reset");
        }
        let all_free = self.sched.num_free_blocks() as i64 == self.cfg.num_gpu_blocks() - 1;
        prop_assert_eq!(ok, all_free, "reset_prefix_cache succeeds exactly when no block is in use");
        if ok {
            prop_assert_eq!(self.sched.num_cached_blocks(), 0);
        }
        invariants!(self, "after reset_prefix_cache");
        Ok(())
    }

    /// An upper bound on drain iterations (one `schedule()` each, plus at most
    /// one output applied), with no new arrivals.
    ///
    /// It assumes the per-request budget `R = min(max_num_scheduled_tokens,
    /// max_num_batched_tokens - draft_slots)` can admit any legal request alone:
    /// `R >= 1 + K` with drafts, `R >= M - s` with chunked prefill off. Without
    /// it a head-of-line request can block the waiting loop forever (findings
    /// 1 and 2, `fit_budget_rules`).
    ///
    /// Derivation. Let `d` be the pipeline depth and, for each live request,
    /// `w = min(Np + max_tokens, M) + K + 2` (the tokens it can ever hold, plus
    /// slack for draft positions). FCFS: the head of `running` (or, when
    /// `running` is empty, the request the waiting loop admits) is never
    /// preempted: the victim is the tail, and it is the head itself only if it
    /// cannot fit alone in the pool, which `add_request` rules out. It gets the
    /// full budgets (>= 1 token) in every step where it is not waiting for its
    /// own output (at most `d - 1` iterations in a row: the drain applies the
    /// oldest step whenever `d` are in flight, and an empty step applies one
    /// too). Each of its steps advances `C` by >= 1 during (re)computation or
    /// appends >= 1 token when it decodes, so it finishes within
    /// `d * (w + d + 2)` iterations; an admission of a new head waits at most
    /// `d` iterations for stale output. Each request is head once:
    /// `bound_fcfs = sum(d * (w + d + 3)) + 4d + 8`.
    /// Priority, with distinct `(priority, arrival_time)` keys: the victim is
    /// the running request with the largest key, so the live request with the
    /// smallest key, once admitted, is never preempted; while it waits, it waits
    /// only for requests already running (the waiting heap admits it first),
    /// and those only leave `running` before it. Each request can thus be
    /// recomputed once per request that overtakes it:
    /// `bound_priority = R * bound_fcfs`, `R` the number of live requests.
    /// With tied keys there is no bound: the tie goes to the first in running
    /// order, and two tied requests can preempt each other forever
    /// (`regression_priority_victim_ties_do_not_ping_pong`), so the
    /// generator gives distinct arrival times under the priority policy.
    fn liveness_bound(&self) -> u64 {
        let (m, k) = (self.m(), self.k());
        let d = self.depth.max(self.queue.len()) as u64;
        let live: Vec<&Tracked> = self.live().collect();
        // A session's inputs still queued: each a request of at most `M` tokens to come.
        let inputs: u64 =
            live.iter().filter_map(|t| t.session.as_ref()).map(|s| s.queued.iter().flatten().count() as u64).sum();
        let fcfs: u64 =
            live.iter().map(|t| d * (((t.prompt_len + t.max_tokens).min(m) + k + 2) as u64 + d + 3)).sum::<u64>()
                + inputs * d * ((m + k + 2) as u64 + d + 3)
                + 4 * d
                + 8;
        match self.cfg.policy() {
            Policy::Fcfs => fcfs,
            Policy::Priority => fcfs * (live.len() as u64 + inputs).max(1),
        }
    }

    /// Ends every session, then runs to completion with no new arrivals, within
    /// `liveness_bound`. (A session waiting for input is not work `has_requests` counts: left
    /// live, it would outlive the drain.)
    fn drain(&mut self, seed: u64) -> Result<u64, TestCaseError> {
        let mut rng = Rng(seed);
        self.end_sessions(&mut rng)?;
        self.check_sessions("the drain's start")?;
        self.ec.draining = true;
        let bound = self.liveness_bound();
        let mut iterations = 0u64;
        while self.sched.has_requests() || !self.queue.is_empty() {
            iterations += 1;
            if iterations > bound {
                return Err(TestCaseError::fail(format!(
                    "drain did not finish within {bound} iterations\n{}",
                    self.sched.debug_snapshot()
                )));
            }
            if self.queue.len() >= self.depth {
                self.apply()?;
                if rng.below(2) == 0 {
                    self.drafts(&mut rng)?;
                }
            }
            // Every grammar is done compiling by now.
            self.grammars(&mut rng, 1)?;
            let in_flight_before = self.queue.len();
            let stats_before = self.sched.stats().num_preemptions;
            let loads_in_flight = |h: &Self| h.tracked.iter().any(|t| h.sched.kv_load_in_flight(&t.id));
            let mut loading = loads_in_flight(self);
            let n = self.schedule(&mut rng)?;
            loading |= loads_in_flight(self);
            let failed = self.grammars(&mut rng, 1)?;
            if n == 0
                && in_flight_before == 0
                && self.sched.stats().num_preemptions == stats_before
                && failed == 0
                && self.connector.unknown.is_empty()
                && self.connector.answered_async == 0
                && self.ec.in_transit.is_empty()
                && self.sched.num_held_kv_requests() == 0
                && !loading
            {
                // Nothing scheduled, nothing in flight, nothing preempted: the
                // next schedule() sees the same state. A livelock, found early.
                prop_assert!(
                    !self.sched.has_requests(),
                    "drain is stuck: nothing schedulable and nothing in flight ({:?})\n{}",
                    self.sched.check_invariants(),
                    self.sched.debug_snapshot()
                );
            }
            if n == 0 && !self.queue.is_empty() {
                self.apply()?;
                if rng.below(2) == 0 {
                    self.drafts(&mut rng)?;
                }
            }
            self.check_sessions("the drain")?;
        }
        self.cov.drain_iterations += iterations;
        self.cov.max_drain_ratio = iterations as f64 / bound as f64;
        Ok(iterations)
    }

    /// Releases some of the held blocks of finished requests (a connector done sending),
    /// checking a bad release changes nothing.
    fn release_some_held(&mut self, rng: &mut Rng) {
        if self.held.is_empty() {
            return;
        }
        let free = self.sched.num_free_blocks();
        assert!(self.sched.release_kv_blocks(&["never-added"]).is_err());
        assert_eq!(self.sched.num_free_blocks(), free, "a refused release changed the pool");
        // Blocks a load may still be writing stay held until the load is reported.
        if let Some(loading) = self.held.iter().find(|id| self.sched.kv_load_in_flight(id)) {
            assert!(self.sched.release_kv_blocks(&[loading]).is_err());
            assert_eq!(self.sched.num_free_blocks(), free, "a refused release changed the pool");
        }
        let (loading, mut ready): (Vec<Arc<str>>, Vec<Arc<str>>) =
            std::mem::take(&mut self.held).into_iter().partition(|id| self.sched.kv_load_in_flight(id));
        let keep = rng.below(ready.len() as u64 + 1) as usize;
        let released: Vec<Arc<str>> = ready.drain(keep..).collect();
        self.held = loading.into_iter().chain(ready).collect();
        let ids: Vec<&str> = released.iter().map(|id| &**id).collect();
        // The connector's own release, or the runner reporting them sent.
        if rng.below(2) == 0 {
            self.sched.release_kv_blocks(&ids).expect("held blocks release");
        } else {
            self.sched.finish_kv_transfers(&[], &ids);
        }
        self.cov.held_released += ids.len() as u64;
    }

    /// The blocks each entry of `step` writes. With `defer_block_free`, none of them is one
    /// a step in flight writes for another request: a freed block returns to the pool only
    /// once the steps that may write it are applied.
    fn blocks_written(&self, step: &Step) -> Result<Vec<(Handle, Vec<u32>)>, TestCaseError> {
        let bs = self.cfg.block_size();
        let mut writes = Vec::with_capacity(step.len());
        for (i, &h) in step.req_handles.iter().enumerate() {
            let table = self.sched.request(h).expect("scheduled request is live").block_ids();
            let (c, n) = (i64::from(step.num_computed_tokens[i]), i64::from(step.num_scheduled_tokens[i]));
            let blocks: Vec<u32> = (c / bs..=(c + n - 1) / bs).filter_map(|b| table.get(b as usize).copied()).collect();
            if self.cfg.defer_block_free() {
                for pending in &self.queue {
                    for (other, written) in &pending.writes {
                        // (The null block holds nothing: a recomputed last token after a load
                        // of every token may land there, as in vLLM; see `runner_takes_entry`.)
                        if let Some(block) = blocks.iter().find(|&&b| *other != h && b != 0 && written.contains(&b)) {
                            return Err(TestCaseError::fail(format!(
                                "step {}: block {block} is written for {h:?} while step {} in flight writes it for {other:?}",
                                step.step_id, pending.step.step_id
                            )));
                        }
                    }
                }
            }
            writes.push((h, blocks));
        }
        Ok(writes)
    }

    /// The runner reports some loads in flight done (each with probability 1/2): the
    /// connector wrote their KV into the blocks the load took. A finished request's blocks
    /// go back with the report.
    fn report_some_loads(&mut self, rng: &mut Rng) {
        let bs = self.cfg.block_size();
        // Now and then a load fails: whole, or from one of its blocks on (recomputed).
        let mut any_failed = false;
        for (index, t) in self.tracked.iter().enumerate() {
            if t.loading.is_none() || !self.sched.kv_load_in_flight(&t.id) || rng.below(6) != 0 {
                continue;
            }
            let Ok(r) = self.sched.get_request(&t.id) else { continue };
            // A block it loads into. One that a running request or a finished one whose
            // blocks are held also holds, or that a step in flight writes for another
            // request, is a prefix hit no connector loads: failing it would fail that
            // request's KV, which is not served.
            let handle = self.by_handle.iter().find(|&(_, &i)| i == index).map(|(&h, _)| h);
            let mut others: HashSet<u32> = self
                .sched
                .running_ids()
                .iter()
                .flat_map(|id| self.sched.get_request(id).expect("running").block_ids().to_vec())
                .collect();
            for id in self.sched.held_kv_request_ids() {
                others.extend(self.sched.held_kv_blocks(&id, 0).unwrap_or_default());
            }
            for pending in &self.queue {
                for (writer, written) in &pending.writes {
                    if Some(*writer) != handle {
                        others.extend(written);
                    }
                }
            }
            let blocks: Vec<u32> = r.block_ids().iter().copied().filter(|b| !others.contains(b)).collect();
            // Over several groups a block id names one group's block: loads fail whole.
            let whole = blocks.is_empty() || self.cfg.kv_cache_groups().len() > 1;
            let failed: Vec<String> = if whole || rng.below(2) == 0 {
                self.sched.fail_kv_loads(&[&t.id], &[]).expect("a load fails whole")
            } else {
                let block = blocks[rng.below(blocks.len() as u64) as usize];
                self.sched.fail_kv_loads(&[], &[block]).expect("a load fails from a block on")
            }
            .iter()
            .map(|id| id.to_string())
            .collect();
            assert!(failed.is_empty(), "the recompute policy fails no request");
            self.cov.loads_failed += 1;
            any_failed = true;
        }
        if any_failed {
            // A failed block may be another loading request's too (a prefix-hit block they
            // share): every load in flight now starts where the core says. Nothing left: it
            // is a new request again once the load is reported done. (A load already in
            // keeps its record: one of every token of a one-token prompt left C = 0.)
            for t in self.tracked.iter_mut().filter(|t| t.loading.is_some()) {
                if let Ok(r) = self.sched.get_request(&t.id) {
                    if r.status() == RequestStatus::WaitingForRemoteKvs {
                        let c = r.num_computed_tokens();
                        t.loading = (c > 0).then_some(c);
                    }
                }
            }
        }
        let mut received: Vec<String> = Vec::new();
        for t in &self.tracked {
            if self.sched.kv_load_in_flight(&t.id) && rng.below(2) == 0 {
                received.push(t.id.clone());
            }
        }
        for id in &received {
            if let Ok(r) = self.sched.get_request(id) {
                if self.kv_exact {
                    // Every attention group's table (a window's null blocks hold nothing;
                    // a Mamba group's state blocks map no position).
                    let groups = self.cfg.kv_cache_groups();
                    for g in (0..groups.len()).filter(|&g| groups.kind(g) != AttentionKind::Mamba) {
                        let table = r.group_block_ids(g);
                        for (pos, token) in r.all_token_ids().take(r.num_computed_tokens() as usize).enumerate() {
                            let block = table[pos / bs as usize] as usize;
                            if block != 0 {
                                self.kv[block][pos % bs as usize] = Kv::Token(token);
                            }
                        }
                    }
                }
            } else {
                self.held.retain(|held| **held != **id);
            }
        }
        let ids: Vec<&str> = received.iter().map(String::as_str).collect();
        self.sched.finish_kv_transfers(&ids, &[]);
        self.cov.loads_reported += ids.len() as u64;
    }

    fn finish(&mut self) -> Result<(), TestCaseError> {
        let (m, num_blocks) = (self.m(), self.cfg.num_gpu_blocks() as usize);
        // The connector is done loading and sending: whatever finished requests still hold
        // goes back.
        let loading: Vec<String> =
            self.tracked.iter().filter(|t| self.sched.kv_load_in_flight(&t.id)).map(|t| t.id.clone()).collect();
        let loading: Vec<&str> = loading.iter().map(String::as_str).collect();
        self.sched.finish_kv_transfers(&loading, &[]);
        self.held.retain(|id| !loading.contains(&&**id));
        let held: Vec<Arc<str>> = std::mem::take(&mut self.held);
        let ids: Vec<&str> = held.iter().map(|id| &**id).collect();
        if !ids.is_empty() {
            self.sched.release_kv_blocks(&ids).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        prop_assert_eq!(self.sched.num_held_kv_requests(), 0, "finished requests hold blocks nobody released");
        for t in &self.tracked {
            prop_assert!(t.finished && t.reported, "{} did not finish exactly once: {t:?}", t.id);
            prop_assert!(t.delivered <= t.max_tokens, "{}: {} outputs > max_tokens", t.id, t.delivered);
            prop_assert!(t.prompt_len + t.delivered <= m, "{}: {} tokens > M", t.id, t.prompt_len + t.delivered);
        }
        prop_assert_eq!(self.sched.num_free_blocks(), num_blocks - 1, "blocks still in use after the drain");
        prop_assert_eq!(self.sched.num_waiting_for_streaming_input(), 0, "sessions wait for input after the drain");
        prop_assert!(!self.sched.has_requests());
        prop_assert_eq!(self.sched.get_request_counts(), (0, 0));
        prop_assert_eq!(self.sched.num_steps_in_flight(), 0);
        invariants!(self, "after the drain");
        self.cov.preemptions = self.sched.stats().num_preemptions;
        let stats = self.sched.prefix_cache_stats();
        self.cov.prefix_hit_tokens = stats.hits + stats.preempted_hits;
        if self.cfg.kv_cache_groups().is_hybrid() {
            self.cov.hybrid_hit_tokens = self.cov.prefix_hit_tokens;
        }
        Ok(())
    }
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    run_case_with_coverage(case).map(|_| ())
}

fn run_case_with_coverage(case: &Case) -> Result<Coverage, TestCaseError> {
    let mut h = Harness::new(case.config.clone(), case.depth);
    for op in &case.ops {
        match op {
            Op::Add(add) => h.add(add)?,
            Op::Schedule { seed } => {
                if h.queue.len() >= h.depth {
                    h.apply()?;
                }
                h.schedule(&mut Rng(*seed))?;
            }
            Op::Apply => {
                h.apply()?;
            }
            Op::Abort { picks, num, ghost } => {
                let mut ids: Vec<String> = if h.tracked.is_empty() {
                    Vec::new()
                } else {
                    picks[..*num as usize].iter().map(|&p| h.tracked[p as usize % h.tracked.len()].id.clone()).collect()
                };
                if *ghost {
                    ids.push("ghost".into());
                }
                h.abort(&ids)?;
            }
            Op::AbortAll => h.abort_all()?,
            Op::Drafts { seed } => h.drafts(&mut Rng(*seed))?,
            Op::ResetPrefixCache { reset_running } => h.reset_prefix_cache(*reset_running)?,
            Op::Duplicate { pick } => h.duplicate(*pick)?,
            Op::Grammars { seed } => {
                h.grammars(&mut Rng(*seed), 2)?;
            }
            Op::Input { pick, kind, len_raw, max_tokens_raw, seed } => {
                h.input(*pick, (*kind, *len_raw, *max_tokens_raw, *seed))?;
            }
        }
        h.check_kv_events(op)?;
        h.check_sessions(op)?;
    }
    h.drain(case.drain_seed)?;
    h.check_kv_events("the drain")?;
    h.finish()?;
    Ok(h.cov)
}

proptest! {
    #![proptest_config(proptest_config(512))]

    /// Random configurations and operation sequences, then a drain.
    #[test]
    fn stateful_fuzz(case in case(120)) {
        run_case(&case)?;
    }
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// Liveness: a burst of arrivals, then only the drain, within the bound.
    #[test]
    fn drain_after_a_burst_is_live(case in burst_case()) {
        run_case(&case)?;
    }
}

/// Prints what the generators exercise: `cargo test --test proptest_scheduler coverage -- --ignored --nocapture`.
#[test]
#[ignore = "a report, not a test"]
fn coverage() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    for (name, strategy) in [("stateful_fuzz", case(120).boxed()), ("drain_after_a_burst", burst_case().boxed())] {
        let mut runner = TestRunner::new(proptest_config(1000));
        let mut total = Coverage::default();
        let mut async_cases = 0;
        let mut max_ratio: f64 = 0.0;
        for _ in 0..cases(1000) {
            let case = strategy.new_tree(&mut runner).expect("a case").current();
            async_cases += case.config.async_scheduling as u64;
            let c = run_case_with_coverage(&case).expect("the case passes");
            max_ratio = max_ratio.max(c.max_drain_ratio);
            macro_rules! add {
                ($($f:ident),*) => { $(total.$f += c.$f;)* };
            }
            add!(
                cases,
                accepted,
                refused,
                kv_holding_arrivals,
                steps,
                entries,
                padded,
                draft_slots,
                preemptions,
                prefix_hit_tokens,
                finished_stop,
                finished_length,
                aborted,
                resets_ok,
                resets_refused,
                reordered_rows,
                at_model_len_edge,
                pool_capped,
                drain_iterations,
                lora_set_aside,
                grammar_set_aside,
                grammar_failed,
                blocks_stored,
                hits_reported,
                blocks_removed,
                hybrid_hit_tokens,
                window_nulls,
                sessions,
                session_pauses,
                inputs_taken_at_stop,
                inputs_queued,
                inputs_taken_when_added,
                inputs_refused,
                sessions_ended_at_stop,
                sessions_ended_while_paused,
                paused_set_aside,
                wedged_passed_over,
                caches_cleared,
                images,
                image_mismatches,
                encoder_set_aside,
                lookahead_set_aside,
                connector_set_aside,
                external_tokens,
                held_released,
                loads_started,
                loads_reported,
                loads_failed,
                encoded,
                evicted,
                ec_loaded,
                ec_in_transit
            );
            total.max_in_flight = total.max_in_flight.max(c.max_in_flight);
        }
        total.max_drain_ratio = max_ratio;
        eprintln!("{name}: async cases {async_cases}\n{total:#?}");
    }
}

// ---------------------------------------------------------------------------
// Regressions: minimal cases of what the fuzz found, each named for what it
// now asserts. The livelock cases accept any of the fixes (the configuration
// refused, the request refused, or the request scheduled to completion).
// ---------------------------------------------------------------------------

fn sync_config(f: impl FnOnce(&mut ConfigParams)) -> Option<Arc<SchedulerConfig>> {
    let mut p = ConfigParams { async_scheduling: false, enable_prefix_caching: false, ..ConfigParams::default() };
    f(&mut p);
    SchedulerConfig::new(p).ok().map(Arc::new)
}

/// Runs steps one at a time, sampling one token for each entry that is not a
/// prefill chunk, until nothing is left or `max_steps` have run.
fn run_sync(sched: &mut Scheduler, max_steps: usize) -> usize {
    let mut steps = 0;
    while sched.has_requests() && steps < max_steps {
        steps += 1;
        let step = sched.schedule();
        if step.is_empty() {
            continue;
        }
        let counts: Vec<i32> =
            step.req_handles.iter().map(|&h| (!sched.request(h).expect("live").is_prefill_chunk()) as i32).collect();
        let tokens = vec![7; counts.iter().sum::<i32>() as usize];
        let out = RunnerOutput { sampled_token_ids: &tokens, num_sampled: &counts, row_of_entry: None };
        sched.update_from_output(step.step_id, &out).expect("output matches its step");
        sched.check_invariants().expect("invariants");
    }
    steps
}

/// Finding 1a. Chunked prefill off requires `max_num_batched_tokens >= M`, but
/// `max_num_scheduled_tokens` (the token budget) may be smaller: a legal prompt
/// of `M - 1` tokens then hits the waiting loop's "chunked prefill off and
/// n > budget: break" in every step. It is never scheduled, and blocks every
/// request queued behind it.
#[test]
fn regression_chunked_prefill_off_with_a_small_token_budget_does_not_livelock() {
    let Some(cfg) = sync_config(|p| {
        p.max_model_len = 10;
        p.max_num_seqs = 1;
        p.max_num_batched_tokens = 10;
        p.max_num_scheduled_tokens = Some(5);
        p.block_size = 2;
        p.num_gpu_blocks = 6;
        p.enable_chunked_prefill = false;
    }) else {
        return; // fixed: the configuration is refused
    };
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    if sched.add_request(NewRequest::new("long", (1..=9).collect(), 1)).is_err() {
        return; // fixed: the request is refused
    }
    run_sync(&mut sched, 100);
    assert!(!sched.has_requests(), "the 9-token prompt was never scheduled:\n{}", sched.debug_snapshot());
}

/// Finding 1b. Same break, through draft slots: the per-request budget is
/// `max_num_batched_tokens - max_num_new_slots_for_drafting`, 10 - 2 = 8 < 9.
#[test]
fn regression_chunked_prefill_off_with_draft_slots_does_not_livelock() {
    let Some(cfg) = sync_config(|p| {
        p.max_model_len = 10;
        p.max_num_seqs = 1;
        p.max_num_batched_tokens = 10;
        p.num_speculative_tokens = 2;
        p.max_num_new_slots_for_drafting = 2;
        p.enable_chunked_prefill = false;
    }) else {
        return;
    };
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    if sched.add_request(NewRequest::new("long", (1..=9).collect(), 1)).is_err() {
        return;
    }
    run_sync(&mut sched, 100);
    assert!(!sched.has_requests(), "the 9-token prompt was never scheduled:\n{}", sched.debug_snapshot());
}

/// Finding 2. A one-token admission with `C > 0` (a prefix-cache hit, here of
/// the first block) is padded to `1 + K`, and "the padded size exceeds the
/// request budget" breaks the waiting loop to wait for a step with more
/// budget. With a budget below `1 + K` (here 2 < 5) that step never comes: the
/// request is never scheduled, and blocks every request behind it.
#[test]
fn regression_padding_larger_than_the_token_budget_does_not_livelock() {
    let Some(cfg) = sync_config(|p| {
        p.max_model_len = 64;
        p.max_num_seqs = 1;
        p.max_num_batched_tokens = 2;
        p.block_size = 4;
        p.num_speculative_tokens = 4;
        p.enable_prefix_caching = true;
    }) else {
        return;
    };
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    // Caches the block [1, 2, 3, 4].
    sched.add_request(NewRequest::new("first", (1..=5).collect(), 1)).expect("a valid request");
    run_sync(&mut sched, 100);
    assert!(!sched.has_requests());
    // Hits 4 tokens: n = 1 with C = 4 > 0, padded to 5 > budget 2.
    if sched.add_request(NewRequest::new("hit", (1..=5).collect(), 1)).is_err() {
        return;
    }
    run_sync(&mut sched, 100);
    assert!(!sched.has_requests(), "the prefix-hit request was never scheduled:\n{}", sched.debug_snapshot());
}

/// Finding 3 (outside vLLM's own call pattern, where drafts only come for the
/// batch just executed). `update_draft_token_ids` keeps drafts given to a
/// waiting request; the waiting loop admits it with `n = N - C`, leaving `S`
/// set. If the next step is scheduled before the admission's output returns
/// (two steps in flight, sync), the running loop schedules `n = N + len(S) - C
/// = len(S)` positions, all of them drafts placed after a token that is not
/// known yet. When the draft is rejected `C` is rolled back to `N - 2`, and
/// `check_invariants` fails ("nothing in flight, decoding, but C != N - 1").
#[test]
fn regression_drafts_for_a_waiting_request_with_a_pipelined_sync_step() {
    let cfg = sync_config(|p| p.num_speculative_tokens = 1).expect("a valid configuration");
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    sched.add_request(NewRequest::new("a", vec![1, 2, 3], 8)).expect("a valid request");
    sched.update_draft_token_ids(&["a"], &[5], &[1]).expect("valid drafts");
    let first = sched.schedule();
    assert_eq!(first.num_scheduled_tokens, vec![3]);
    // Scheduled while the first step is in flight: the drafts given while the request
    // was waiting were dropped, so there is nothing to schedule yet.
    let second = sched.schedule();
    assert!(second.is_empty(), "drafts given to a waiting request must not be scheduled");
    sched.check_invariants().expect("invariants after the second schedule");
    for (step, token) in [(&first, 7), (&second, 8)] {
        if step.is_empty() {
            continue;
        }
        let counts: Vec<i32> = vec![1; step.len()];
        let tokens = vec![token; step.len()];
        let out = RunnerOutput { sampled_token_ids: &tokens, num_sampled: &counts, row_of_entry: None };
        sched.update_from_output(step.step_id, &out).expect("output matches its step");
    }
    sched.check_invariants().expect("invariants once nothing is in flight");
}

/// Finding 4. Priority policy, two requests with the same `(priority,
/// arrival_time)`, both admitted mid-prefill (`scheduler_reserve_full_isl` off)
/// and together larger than the pool. When one needs a block, the victim is
/// "the running request with the largest key, the first such in running
/// order": with tied keys that is the oldest admitted one, the one with the
/// most progress. Each preemption throws away a prefill that has not produced
/// a token yet, so the two preempt each other forever (1176 preemptions in
/// 10000 steps). With distinct arrival times, or under FCFS, the same case
/// finishes in 31 steps with 2 preemptions.
#[test]
fn regression_priority_victim_ties_do_not_ping_pong() {
    let cfg = sync_config(|p| {
        p.max_model_len = 21;
        p.max_num_seqs = 2;
        p.max_num_batched_tokens = 2;
        p.block_size = 2;
        p.num_gpu_blocks = 13;
        p.policy = Policy::Priority;
        p.scheduler_reserve_full_isl = false;
        p.long_prefill_token_threshold = 1;
    })
    .expect("a valid configuration");
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    for id in ["a", "b"] {
        // 10 blocks of 2 each, 11 with the sampled token: one fits in the 12 usable blocks, two do not.
        let mut r = NewRequest::new(id, (1..=20).collect(), 1);
        r.arrival_time = Some(0.0);
        sched.add_request(r).expect("a valid request");
    }
    run_sync(&mut sched, 1000);
    assert!(
        !sched.has_requests(),
        "not done after 1000 steps, {} preemptions:\n{}",
        sched.stats().num_preemptions,
        sched.debug_snapshot()
    );
}

/// Finding 5 (serious: wrong KV served from the prefix cache). Priority policy,
/// prefix caching on. `allocate_slots` registers in the prefix cache the full
/// blocks the step will compute (spec §4.4: "prompt blocks become hits before
/// their forward pass has run"). When a later running request then cannot
/// allocate and the victim is a request already scheduled in this step, the
/// victim's entry is undone (`StepBuilder::undo`) and it is preempted: the
/// step never computes those positions, but the blocks stay registered. Here
/// `a` has computed 23 tokens; its undone chunk (23..26) had registered its
/// 6th block (tokens 20..23), so the cache now offers 24 tokens of `a`'s
/// prompt, and `a` is resumed from C = 24 without ever computing position 23
/// (the KV of the block's last slot is whatever the pool held).
#[test]
fn regression_priority_undo_uncaches_the_victims_uncomputed_blocks() {
    let cfg = sync_config(|p| {
        p.max_model_len = 64;
        p.max_num_seqs = 2;
        p.max_num_batched_tokens = 8;
        p.block_size = 4;
        p.num_gpu_blocks = 12;
        p.policy = Policy::Priority;
        p.long_prefill_token_threshold = 3;
        p.enable_prefix_caching = true;
    })
    .expect("a valid configuration");
    let mut sched = Scheduler::new(cfg).expect("a valid scheduler");
    // `a` runs first; `b`, more important, joins behind it in running order.
    let mut a = NewRequest::new("a", (1..=32).collect(), 1);
    a.priority = 1;
    a.arrival_time = Some(0.0);
    sched.add_request(a).expect("a valid request");
    run_sync(&mut sched, 1);
    let mut b = NewRequest::new("b", (101..=132).collect(), 1);
    b.arrival_time = Some(1.0);
    sched.add_request(b).expect("a valid request");
    // Steps run one at a time and their output is applied: while `a` runs,
    // C is exactly what it has computed.
    let mut computed = 0;
    let mut preempted = false;
    for _ in 0..40 {
        run_sync(&mut sched, 1);
        let Ok(a) = sched.get_request("a") else { break };
        if a.status() == RequestStatus::Running {
            computed = a.num_computed_tokens();
        } else if a.num_preemptions() > 0 && !preempted {
            preempted = true;
            let hit_tokens = sched.prefix_cache_hit_tokens(a);
            assert!(
                hit_tokens <= computed,
                "a computed {computed} tokens before its preemption, but the prefix cache offers {hit_tokens}"
            );
        }
    }
    assert!(preempted, "the scenario no longer preempts `a`");
}

/// Finding 6. Chunked local attention with a chunk that is not a multiple of the block size
/// (29 tokens, blocks of 16), three steps in flight: once the chunk starts mid-block, a
/// request holds one block more per chunked group than vLLM's admission cap counts
/// (`cdiv(chunk + in-flight tokens, B)`). A 65-token prompt in a pool of 11 usable blocks
/// was accepted (11 counted, 13 needed), then preempted itself at its last chunk and
/// recomputed forever. It is now refused at `add_request` (that pool holds a request of 49
/// tokens at most); with two blocks more it finishes.
#[test]
fn regression_a_chunk_starting_mid_block_holds_one_block_more() {
    let config = |num_gpu_blocks| {
        sync_config(|p| {
            (p.max_model_len, p.max_num_seqs, p.max_num_batched_tokens) = (66, 1, 3);
            (p.num_gpu_blocks, p.pipeline_parallel_size, p.scheduler_reserve_full_isl) = (num_gpu_blocks, 3, false);
            p.kv_cache_groups = KvCacheGroups::parse("chunked_local:29,chunked_local:29,full").unwrap();
        })
        .expect("a valid configuration")
    };
    let prompt: Vec<i64> = (0..65).collect();
    let mut small = Scheduler::new(config(12)).expect("a valid scheduler");
    let refused = small.add_request(NewRequest::new("r", prompt.clone(), 1)).unwrap_err().to_string();
    assert!(refused.contains("at most 48 tokens") && refused.contains("11 usable blocks"), "{refused}");

    let mut sched = Scheduler::new(config(14)).expect("a valid scheduler");
    sched.add_request(NewRequest::new("r", prompt, 1)).expect("a request that fits");
    let mut in_flight = VecDeque::new();
    for _ in 0..200 {
        let step = sched.schedule();
        let idle = step.is_empty();
        if !idle {
            in_flight.push_back(step);
        }
        if in_flight.len() == 3 || idle {
            let Some(step) = in_flight.pop_front() else { break };
            let counts: Vec<i32> = step
                .num_scheduled_tokens
                .iter()
                .zip(&step.num_computed_tokens)
                .map(|(&n, &c)| i32::from(c + n >= 65))
                .collect();
            let tokens = vec![7; counts.iter().sum::<i32>() as usize];
            let out = RunnerOutput { sampled_token_ids: &tokens, num_sampled: &counts, row_of_entry: None };
            sched.update_from_output(step.step_id, &out).expect("output matches its step");
        }
    }
    assert!(!sched.has_requests(), "the request did not finish");
    assert_eq!(sched.stats().num_preemptions, 0);
}

/// Finding 7. Sliding-window groups, three pipeline stages and a drafter's lookahead
/// slots: a request held its window, a step's budget per step in flight and its lookahead
/// slots, one block more than the pool check counted, and preempted itself forever (24
/// preemptions in 263 steps). The check now counts the lookahead slots: it is refused.
#[test]
fn regression_a_windowed_group_holds_the_lookahead_slots_too() {
    let config = ConfigParams {
        max_model_len: 96,
        max_num_seqs: 1,
        max_num_batched_tokens: 7,
        block_size: 8,
        num_gpu_blocks: 26,
        num_speculative_tokens: 2,
        num_lookahead_tokens: 3,
        async_scheduling: false,
        pipeline_parallel_size: 3,
        scheduler_reserve_full_isl: false,
        enable_prefix_caching: false,
        kv_cache_groups: hybrid_groups(2, 27),
        ..ConfigParams::default()
    };
    let add = AddOp {
        len_kind: 3,
        len_raw: 7289,
        prefix: 0,
        prefix_len: 0,
        max_tokens_kind: 0,
        max_tokens_raw: 0,
        computed: None,
        eos: None,
        stops: [None, None],
        min_tokens: 0,
        priority: 0,
        arrival_delta: 0,
        salt: None,
        token_seed: 0,
        lora: None,
        skip_prefix_cache: false,
        grammar: None,
        session: false,
    };
    run_case(&Case { config, depth: 3, ops: vec![Op::Add(add)], drain_seed: 0 }).unwrap();
}
