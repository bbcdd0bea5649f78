//! The invariants of spec Appendix A, checked over the whole state, and a
//! deterministic dump of that state. Both are O(everything): for tests.

use std::fmt::Write;

use rustc_hash::FxHashMap;

use crate::error::{CoreError, CoreResult};
use crate::queue::RequestQueue;
use crate::request::{QueueKind, Request, RequestStatus};
use crate::scheduler::Scheduler;
use crate::slab::Handle;

fn broken(reason: String) -> CoreError {
    CoreError::Invariant { reason }
}

/// The block hash of spec §5.3, written again from its definition for the checker:
/// XXH3-128 (seed `prefix::SEED`) of the parent hash, each token, then, with lookahead
/// hashes, a 0xfd separator and each token after the block, then, under a LoRA
/// adapter, a 0xfe separator and the adapter's id, then, for a salted first block, a 0xff
/// separator, the salt's length and the salt, then for each multimodal input the block
/// overlaps, a 0xfc separator, the identifier's length, the identifier and the input's
/// offset from the block's start, then for a block of a prompt given as embeddings, a 0xfb
/// separator, the length of its embeddings' key and the key, all little-endian. A second
/// writing, not a call of `prefix::hash_block`: a checker that called the code it checks
/// could not see it broken.
fn reference_block_hash(
    parent: u128,
    (tokens, after): (&[i32], &[i32]),
    lora_id: Option<u32>,
    salt: Option<&[u8]>,
    mm: &[(&str, i64)],
    embeds_key: Option<&[u8]>,
    bytes: &mut Vec<u8>,
) -> u128 {
    bytes.clear();
    bytes.extend(parent.to_le_bytes());
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    if !after.is_empty() {
        bytes.push(0xfd);
        bytes.extend(after.iter().flat_map(|t| t.to_le_bytes()));
    }
    if let Some(lora_id) = lora_id {
        bytes.push(0xfe);
        bytes.extend(lora_id.to_le_bytes());
    }
    if let Some(salt) = salt {
        bytes.push(0xff);
        bytes.extend((salt.len() as u64).to_le_bytes());
        bytes.extend(salt.iter().copied());
    }
    for (identifier, offset) in mm {
        bytes.push(0xfc);
        bytes.extend((identifier.len() as u64).to_le_bytes());
        bytes.extend(identifier.bytes());
        bytes.extend(offset.to_le_bytes());
    }
    if let Some(key) = embeds_key {
        bytes.push(0xfb);
        bytes.extend((key.len() as u64).to_le_bytes());
        bytes.extend(key.iter().copied());
    }
    xxhash_rust::xxh3::xxh3_128_with_seed(bytes, crate::kv::prefix::SEED)
}

/// Where each live request is: running, or one waiting queue (by name).
type Places = FxHashMap<Handle, &'static str>;

impl Scheduler {
    /// Checks every invariant of spec Appendix A over the whole state; the error names the
    /// first one broken.
    pub fn check_invariants(&self) -> CoreResult<()> {
        let places = self.check_places()?;
        self.check_finished_pending()?;
        let in_flight = self.in_flight_tokens();
        let mut block_refs = vec![0u32; self.kv.pool().num_blocks()];
        let mut live = 0usize;
        let mut skipped = 0usize;
        let mut structured = 0usize;
        let mut paused_sessions = 0usize;
        for (h, r) in self.requests.iter() {
            if r.status.is_finished() {
                return Err(broken(format!("finished request {:?} still holds its record", r.id)));
            }
            live += 1;
            if r.skipped_waiting {
                if r.queued_in.is_none() {
                    return Err(broken(format!("request {:?} is a skipped waiting one but in no queue", r.id)));
                }
                skipped += 1;
            }
            if r.grammar.is_some() {
                structured += 1;
            }
            if r.status == RequestStatus::WaitingForStructuredOutputGrammar
                && (r.grammar.is_none() || !r.skipped_waiting)
            {
                return Err(broken(format!(
                    "request {:?} waits for a grammar (grammar {:?}) but is not a skipped waiting request",
                    r.id, r.grammar
                )));
            }
            if r.status == RequestStatus::WaitingForStreamingReq {
                paused_sessions += 1;
                if !r.is_resumable() || !r.skipped_waiting || r.num_queued_inputs() > 0 {
                    return Err(broken(format!(
                        "request {:?} waits for streaming input, but resumable={}, skipped={}, {} inputs queued",
                        r.id,
                        r.is_resumable(),
                        r.skipped_waiting,
                        r.num_queued_inputs()
                    )));
                }
            }
            self.check_live_request(h, r, &places, &in_flight)?;
            self.check_block_hashes(r)?;
            self.check_block_table(r, &mut block_refs)?;
        }
        if live != self.ids.len() {
            return Err(broken(format!("{} ids registered for {live} live requests", self.ids.len())));
        }
        if skipped != self.num_skipped_waiting {
            return Err(broken(format!(
                "num_skipped_waiting {} but {skipped} requests are marked skipped",
                self.num_skipped_waiting
            )));
        }
        if paused_sessions != self.num_waiting_for_streaming_input {
            return Err(broken(format!(
                "num_waiting_for_streaming_input {} but {paused_sessions} sessions wait for input",
                self.num_waiting_for_streaming_input
            )));
        }
        if structured != self.num_structured_output {
            return Err(broken(format!(
                "num_structured_output {} but {structured} live requests use structured output",
                self.num_structured_output
            )));
        }
        for &h in &self.grammar_failures {
            if let Some(r) = self.requests.get(h) {
                if r.grammar != Some(crate::request::Grammar::Failed { seen: true }) {
                    return Err(broken(format!(
                        "request {:?} is to be failed for its grammar, which is {:?}",
                        r.id, r.grammar
                    )));
                }
            }
        }
        for table in self.held_kv_tables().chain(self.deferred_frees().map(|(_, blocks)| blocks)) {
            for &block in table {
                block_refs[block as usize] += 1;
            }
        }
        if let Some(h) = self.inflight_prefills.iter().find(|&&h| self.requests.get(h).is_none()) {
            return Err(broken(format!("a request no longer live ({h:?}) is counted as prefilling")));
        }
        self.check_block_pool(&block_refs)?;
        let mut holders: FxHashMap<&str, Vec<Handle>> = FxHashMap::default();
        for (h, r) in self.requests.iter() {
            for &input in r.referenced_mm_inputs() {
                let list = holders.entry(&*r.mm_inputs()[input as usize].identifier).or_default();
                if !list.contains(&h) {
                    list.push(h);
                }
            }
        }
        self.encoder.check(&holders).map_err(broken)?;
        self.check_steps_in_flight()
    }

    /// The running list and the waiting queues: within their caps, no request twice, queue
    /// counts that match their live entries, dead entries swept. Returns each live
    /// request's place.
    fn check_places(&self) -> CoreResult<Places> {
        let cfg = &self.config;
        if self.running.len() as i64 > cfg.max_num_seqs() {
            return Err(broken(format!(
                "{} running requests > max_num_seqs {}",
                self.running.len(),
                cfg.max_num_seqs()
            )));
        }
        let mut place = Places::default();
        for &h in &self.running {
            if place.insert(h, "running").is_some() {
                return Err(broken(format!("handle {h:?} is twice in running")));
            }
        }
        let mut loras: Vec<u32> = self.running.iter().filter_map(|&h| self.requests[h].lora_id).collect();
        loras.sort_unstable();
        loras.dedup();
        if loras.len() as i64 > cfg.max_loras() {
            return Err(broken(format!(
                "the running requests use {} LoRA adapters {loras:?} > max_loras {}",
                loras.len(),
                cfg.max_loras()
            )));
        }
        for (queue, name) in [(&self.waiting, "waiting"), (&self.kv_holding_waiting, "kv_holding_waiting")] {
            let live = queue.live_handles(&self.requests);
            if live.len() != queue.len() {
                return Err(broken(format!("{name} counts {} requests but holds {}", queue.len(), live.len())));
            }
            for h in live {
                if place.insert(h, name).is_some() {
                    return Err(broken(format!("request {:?} is queued twice", self.requests[h].id)));
                }
            }
            if queue.raw_len() < queue.len() {
                return Err(broken(format!("{name} has fewer entries than live requests")));
            }
            if queue.raw_len() > RequestQueue::max_raw_len(queue.len()) {
                return Err(broken(format!(
                    "{name} keeps {} entries for {} live requests: dead entries are not swept",
                    queue.raw_len(),
                    queue.len()
                )));
            }
        }
        Ok(place)
    }

    /// A finished request keeps only its handle and id until a step reports it.
    fn check_finished_pending(&self) -> CoreResult<()> {
        let mut reported = rustc_hash::FxHashSet::default();
        for (h, id) in &self.finished_since_last_step {
            if self.requests.get(*h).is_some() || self.ids.get(&**id) == Some(h) {
                return Err(broken(format!("finished request {id:?} still holds its slot or its id")));
            }
            if !reported.insert(*h) {
                return Err(broken(format!("request {id:?} finished twice")));
            }
        }
        Ok(())
    }

    /// In-flight tokens per request, from the step records.
    fn in_flight_tokens(&self) -> FxHashMap<Handle, i64> {
        let mut in_flight: FxHashMap<Handle, i64> = FxHashMap::default();
        for record in &self.in_flight {
            for e in &record.entries {
                *in_flight.entry(e.handle).or_default() += e.num_new_tokens();
            }
        }
        in_flight
    }

    /// One live request: registered under its id, in the place its status says, its
    /// counters in range and agreeing with the steps in flight, the capacity rule, its
    /// drafts, and what its status implies of its blocks and counters.
    fn check_live_request(
        &self,
        h: Handle,
        r: &Request,
        places: &Places,
        in_flight: &FxHashMap<Handle, i64>,
    ) -> CoreResult<()> {
        let cfg = &self.config;
        let (m, s) = (cfg.max_request_len(), cfg.num_sampled_tokens_per_step());
        let id = &r.id;
        let (c, n, p, f) =
            (r.num_computed_tokens(), r.num_tokens(), r.num_output_placeholders(), r.num_in_flight_tokens());
        if self.ids.get(&**id) != Some(&h) {
            return Err(broken(format!("live request {id:?} is not registered under its id")));
        }
        let Some(&where_) = places.get(&h) else {
            return Err(broken(format!("live request {id:?} ({:?}) is neither running nor queued", r.status)));
        };
        let expected_place = match r.status {
            RequestStatus::Running => "running",
            RequestStatus::Waiting
            | RequestStatus::Preempted
            | RequestStatus::WaitingForStructuredOutputGrammar
            | RequestStatus::WaitingForRemoteKvs
            | RequestStatus::WaitingForStreamingReq => match r.queued_in {
                Some(QueueKind::Waiting) => "waiting",
                Some(QueueKind::KvHolding) => "kv_holding_waiting",
                None => "nowhere",
            },
            other => return Err(broken(format!("request {id:?} has status {other:?}, which llmsched never sets"))),
        };
        if where_ != expected_place {
            return Err(broken(format!("request {id:?} is {:?} but sits in {where_}", r.status)));
        }
        if p < 0 || f < 0 || r.num_stale_output_tokens() < 0 || r.num_stale_output_tokens() > f {
            return Err(broken(format!(
                "request {id:?}: counters out of range: P={p}, F={f}, stale={}",
                r.num_stale_output_tokens()
            )));
        }
        if in_flight.get(&h).copied().unwrap_or(0) != f {
            return Err(broken(format!(
                "request {id:?}: F={f} but its steps in flight hold {} tokens",
                in_flight.get(&h).copied().unwrap_or(0)
            )));
        }
        // The capacity rule in state form, restated from the spec rather than taken
        // from `capacity` (a checker that called the rule it checks could not see it
        // broken): every step kept C + n + s <= M and C advanced by n, so C + s <= M.
        if c < 0 || c + s > m {
            return Err(broken(format!("request {id:?}: C={c}, s={s}: C + s > M={m}")));
        }
        if n > m - s + 1 || n > m {
            return Err(broken(format!("request {id:?}: N={n} exceeds the longest request, M={m}")));
        }
        if r.spec_token_ids.len() as i64 > cfg.num_speculative_tokens() {
            return Err(broken(format!("request {id:?}: {} drafts > K", r.spec_token_ids.len())));
        }
        self.check_status_state(r)?;
        if self.in_flight.is_empty() && (p != 0 || f != 0) {
            return Err(broken(format!("request {id:?}: nothing in flight but P={p}, F={f}")));
        }
        Ok(())
    }

    /// What a request's status says of its blocks and counters: a running one's table
    /// covers `C` plus lookahead and, decoding with nothing in flight, `C = N - 1`; a
    /// waiting one holds no block unless a KV load gave it blocks covering `C` (in flight,
    /// or in and not yet admitted), a preempted one has `P = 0` and `C = 0` but after
    /// such a load.
    fn check_status_state(&self, r: &Request) -> CoreResult<()> {
        let cfg = &self.config;
        let (m, s, b) = (cfg.max_model_len(), cfg.num_sampled_tokens_per_step(), cfg.block_size());
        let id = &r.id;
        let (c, n, p) = (r.num_computed_tokens(), r.num_tokens(), r.num_output_placeholders());
        match r.status {
            RequestStatus::Running => {
                // Appendix A.7: every attention group's table covers C plus lookahead, capped
                // at M; a Mamba group's holds exactly its state blocks.
                let needed = (c + cfg.num_lookahead_tokens()).min(m);
                let groups = cfg.kv_cache_groups();
                // (Tables past the groups hold nothing: `check_block_table`.)
                for (g, table) in Self::tables(r).enumerate().take(groups.len()) {
                    let mut needed = needed;
                    if groups.kind(g) == crate::config::AttentionKind::Mamba && cfg.mamba_aligned() {
                        // (Its positions hold no lookahead slots: drafters have no Mamba layers.)
                        needed = c.min(m);
                        // Aligned, it holds a state block or a few (nulls elsewhere), and its
                        // positions cover C as an attention table's do (checked below).
                        let held = table.iter().filter(|&&id| id != crate::kv::NULL_BLOCK).count() as i64;
                        if !(1..=cfg.mamba_state_blocks()).contains(&held) {
                            return Err(broken(format!(
                                "request {id:?}: aligned Mamba group {g} holds {held} state blocks, not 1 to {}",
                                cfg.mamba_state_blocks()
                            )));
                        }
                    } else if groups.kind(g) == crate::config::AttentionKind::Mamba {
                        let state = cfg.mamba_state_blocks();
                        if table.len() as i64 != state {
                            return Err(broken(format!(
                                "request {id:?}: Mamba group {g} holds {} blocks, not 1 + K = {state}",
                                table.len()
                            )));
                        }
                        continue;
                    }
                    let covered = table.len() as i64 * b;
                    if covered < needed {
                        return Err(broken(format!(
                            "request {id:?}: group {g}'s {} blocks cover {covered} tokens < min(C + L, M) = {needed}",
                            table.len(),
                        )));
                    }
                }
                // (A synchronous load's failure takes C back until the request is scheduled.)
                if self.in_flight.is_empty() && s == 1 && !r.is_prefill_chunk && !r.kv_load_failed && c != n - 1 {
                    return Err(broken(format!(
                        "request {id:?}: nothing in flight, decoding, but C={c} != N - 1 = {}",
                        n - 1
                    )));
                }
            }
            _ => {
                // A KV load's blocks, held from its start to the request's admission (a
                // load of a one-token prompt leaves C = 0 once in).
                let loaded = !r.block_ids.is_empty();
                // (C = 0 once a load failed whole, until it is reported done.)
                if r.status == RequestStatus::WaitingForRemoteKvs && (!loaded || (c == 0 && !r.kv_load_failed)) {
                    return Err(broken(format!(
                        "request {id:?} waits for a KV load with C={c} and {} blocks",
                        r.block_ids.len()
                    )));
                }
                if loaded {
                    // A stopped session keeps the KV of the tokens it keeps.
                    let kept = r.is_resumable() && c > 0;
                    if !kept && (!cfg.kv_connector() || !self.inflight_prefills.contains(&self.ids[id])) {
                        return Err(broken(format!("waiting request {id:?} holds blocks, but no KV load gave them")));
                    }
                    // Each attention group's table covers `C` (a Mamba group's holds its state).
                    let groups = cfg.kv_cache_groups();
                    let attention =
                        |g: usize| g >= groups.len() || groups.kind(g) != crate::config::AttentionKind::Mamba;
                    if let Some((g, table)) =
                        Self::tables(r).enumerate().find(|&(g, table)| attention(g) && (table.len() as i64) * b < c)
                    {
                        return Err(broken(format!(
                            "request {id:?} holds KV while waiting: group {g}'s {} blocks cover less than C={c}",
                            table.len()
                        )));
                    }
                    // (One left with C = 0 stays where it was until set aside.)
                    let holding = r.queued_in == Some(QueueKind::KvHolding);
                    if !holding && (c > 0 || r.status == RequestStatus::WaitingForRemoteKvs) {
                        return Err(broken(format!("request {id:?} loaded KV (C={c}) but waits in the wrong queue")));
                    }
                } else if let Some((g, table)) = Self::tables(r).enumerate().find(|(_, t)| !t.is_empty()) {
                    return Err(broken(format!("waiting request {id:?} holds {} blocks in group {g}", table.len())));
                }
                if r.status == RequestStatus::Preempted && ((c != 0 && !loaded) || p != 0) {
                    return Err(broken(format!("preempted request {id:?} has C={c}, P={p}")));
                }
            }
        }
        Ok(())
    }

    /// Appendix A.8: hashes depend only on (parent, block tokens, lookahead tokens, adapter,
    /// salt, inputs, embeddings' key): one hash per full block followed by its lookahead
    /// tokens, and the newest ones (those appended since the previous check, when checks run
    /// every step) chain correctly. Tokens and hashes are append-only, so every block is
    /// checked once while newest.
    fn check_block_hashes(&self, r: &Request) -> CoreResult<()> {
        if !self.kv.enable_caching() {
            return Ok(());
        }
        let id = &r.id;
        let b = self.config.block_size() as usize;
        let lookahead = self.config.num_hash_lookahead_tokens() as usize;
        let full = (r.num_tokens() as usize).saturating_sub(lookahead) / b;
        if r.block_hashes.len() != full {
            return Err(broken(format!(
                "request {id:?}: {} block hashes for {full} full blocks",
                r.block_hashes.len()
            )));
        }
        let mut scratch = Vec::new();
        // A session's kept hash may cover the sampled token its last input discarded (vLLM
        // keeps it; see `Scheduler::rehash_session`): with lookahead hashes, only counted.
        let checked = if r.is_resumable() && lookahead > 0 { 0 } else { 4 };
        for i in full.saturating_sub(checked)..full {
            let parent = if i == 0 { crate::kv::prefix::NONE_HASH } else { r.block_hashes[i - 1] };
            let salt = if i == 0 { r.cache_salt.as_deref() } else { None };
            let block: Vec<i32> = r.all_token_ids().skip(i * b).take(b + lookahead).collect();
            let (tokens, after) = block.split_at(b);
            let (start, end) = ((i * b) as i64, ((i + 1) * b) as i64);
            let mm: Vec<(&str, i64)> = r
                .mm_inputs()
                .iter()
                .filter(|input| input.offset < end && input.offset + input.length > start)
                .map(|input| (&*input.identifier, input.offset - start))
                .collect();
            let embeds_key = r.prompt_embeds_keys.as_deref().and_then(|keys| keys.get(i)).map(|key| &**key);
            if reference_block_hash(parent, (tokens, after), r.lora_id, salt, &mm, embeds_key, &mut scratch)
                != r.block_hashes[i]
            {
                return Err(broken(format!("request {id:?}: block {i}'s hash does not match its tokens")));
            }
        }
        Ok(())
    }

    /// Every group's table of a request, group 0's first.
    fn tables(r: &Request) -> impl Iterator<Item = &[u32]> {
        std::iter::once(&r.block_ids[..]).chain(r.extra_tables.iter().map(|t| &t.ids[..]))
    }

    /// A table's settled leading entries (`num_cached_blocks`) are cached under the
    /// request's hashes in the table's group, the others under none; a full-attention
    /// table never holds the null block, a sliding-window table only before its other
    /// blocks, and only where a settled entry may skip caching (the blocks no hit can
    /// reach); counts each block's holders into `block_refs`.
    fn check_block_table(&self, r: &Request, block_refs: &mut [u32]) -> CoreResult<()> {
        let id = &r.id;
        let groups = self.config.kv_cache_groups();
        let settled = std::iter::once(r.num_cached_blocks).chain(r.extra_tables.iter().map(|t| t.num_cached));
        for (g, (table, num_cached)) in Self::tables(r).zip(settled).enumerate() {
            if g >= groups.len() && !table.is_empty() {
                return Err(broken(format!("request {id:?} holds blocks in group {g} of {}", groups.len())));
            }
            let sliding = g < groups.len() && groups.kind(g) != crate::config::AttentionKind::Full;
            if num_cached > table.len() {
                return Err(broken(format!(
                    "request {id:?}: group {g}: {num_cached} cached blocks of {}",
                    table.len()
                )));
            }
            let nulls = table.iter().take_while(|&&block| block == crate::kv::NULL_BLOCK).count();
            // An aligned Mamba group's state blocks lie among nulls.
            let interior_nulls = g < groups.len()
                && groups.kind(g) == crate::config::AttentionKind::Mamba
                && self.config.mamba_aligned();
            if (nulls > 0 && !sliding) || (!interior_nulls && table[nulls..].contains(&crate::kv::NULL_BLOCK)) {
                return Err(broken(format!("request {id:?}: group {g}'s table {table:?} holds the null block")));
            }
            for (i, &block) in
                table.iter().enumerate().skip(nulls).filter(|&(_, &block)| block != crate::kv::NULL_BLOCK)
            {
                let held = self.kv.pool().block_hash(block);
                let want = if i < num_cached { r.block_hashes.get(i).copied() } else { None };
                // A sliding window leaves the blocks no hit can reach out of the cache; an
                // aligned Mamba checkpoint block may hold the boundary's a block before
                // (EAGLE's block drop).
                let masked = sliding && i < num_cached && held.is_none();
                let checkpoint =
                    interior_nulls && i > 0 && held.is_some() && held == r.block_hashes.get(i - 1).copied();
                if held != want && !masked && !checkpoint {
                    return Err(broken(format!(
                        "request {id:?}: group {g}: block {block} (table index {i}) holds hash {held:?}, expected {want:?}"
                    )));
                }
                if held.is_some() && self.kv.pool().block_group(block) != g {
                    return Err(broken(format!(
                        "request {id:?}: group {g}: block {block} is cached in group {}",
                        self.kv.pool().block_group(block)
                    )));
                }
                block_refs[block as usize] += 1;
            }
        }
        Ok(())
    }

    /// The pool against the tables: each block's reference count is the number of tables
    /// holding it, and the free queue, walked from outside the pool, is exactly the blocks
    /// no table holds, each once, never the null block; then the pool's own structure.
    fn check_block_pool(&self, block_refs: &[u32]) -> CoreResult<()> {
        let pool = self.kv.pool();
        for (block, &expected) in block_refs.iter().enumerate().skip(1) {
            let block = block as u32;
            if pool.ref_cnt(block) != expected {
                return Err(broken(format!(
                    "block {block}: ref_cnt {} but {expected} request tables hold it",
                    pool.ref_cnt(block)
                )));
            }
        }
        let queue = pool.free_queue();
        let mut queued = vec![false; block_refs.len()];
        for &block in &queue {
            let Some(slot) = queued.get_mut(block as usize) else {
                return Err(broken(format!("block {block} in the free queue is not in the pool")));
            };
            if block == crate::kv::NULL_BLOCK || std::mem::replace(slot, true) {
                return Err(broken(format!("block {block} is the null block or twice in the free queue")));
            }
        }
        if let Some(block) = (1..block_refs.len()).find(|&b| queued[b] != (block_refs[b] == 0)) {
            return Err(broken(format!(
                "block {block}: held by {} tables but {}in the free queue",
                block_refs[block],
                if queued[block] { "" } else { "not " }
            )));
        }
        if queue.len() != self.kv.num_free_blocks() {
            return Err(broken(format!("{} free blocks counted, {} queued", self.kv.num_free_blocks(), queue.len())));
        }
        // The pool's own structure (links, flags, the hash chains).
        self.kv.check().map_err(broken)
    }

    /// No step is in flight twice.
    fn check_steps_in_flight(&self) -> CoreResult<()> {
        let mut ids = rustc_hash::FxHashSet::default();
        for record in &self.in_flight {
            if !ids.insert(record.step_id) {
                return Err(broken(format!("step {} is in flight twice", record.step_id)));
            }
        }
        Ok(())
    }

    /// Every piece of state, in a deterministic order.
    pub fn debug_snapshot(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "config: {:?}", self.config);
        let _ = writeln!(out, "next_step_id: {} stats: {:?}", self.next_step_id, self.stats);
        let name = |h: &Handle| self.requests.get(*h).map(|r| r.id.to_string()).unwrap_or_else(|| format!("<{h:?}>"));
        let _ = writeln!(out, "running: {:?}", self.running.iter().map(name).collect::<Vec<_>>());
        for (queue, label) in [(&self.kv_holding_waiting, "kv_holding_waiting"), (&self.waiting, "waiting")] {
            let _ =
                writeln!(out, "{label}: {:?}", queue.live_handles(&self.requests).iter().map(name).collect::<Vec<_>>());
        }
        let _ = writeln!(out, "finished_since_last_step: {:?}", self.finished_since_last_step);
        let _ = writeln!(out, "preempted_since_last_step: {:?}", self.preempted_since_last_step);
        for record in &self.in_flight {
            let _ = writeln!(out, "in_flight step {}: {:?}", record.step_id, record.entries);
        }
        let mut requests: Vec<_> = self.requests.iter().collect();
        requests.sort_by(|a, b| a.1.id.cmp(&b.1.id).then(a.0.cmp(&b.0)));
        for (h, r) in requests {
            let _ = writeln!(out, "request {h:?}: {r:?}");
        }
        let pool = self.kv.pool();
        let refs: Vec<u32> = (0..pool.num_blocks() as u32).map(|b| pool.ref_cnt(b)).collect();
        let _ = writeln!(out, "block ref counts: {refs:?}");
        let _ = writeln!(out, "free queue: {:?}", pool.free_queue());
        out
    }
}
