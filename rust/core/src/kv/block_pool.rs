//! The paged KV block pool (spec §5.1, §5.2): ref counts and the free queue.
//!
//! The free queue is an intrusive doubly linked list over block ids, so
//! `touch` can unlink a cached block from the middle in O(1). Block 0 is the
//! null block: taken out at construction, never allocated, never freed.

use std::collections::TryReserveError;
use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::kv::events::{EventLog, KvEvent};
use crate::kv::residency::Residency;

/// A full block's content hash, chained on its parent's (see `kv::prefix`).
pub type BlockHash = u128;

const NIL: u32 = u32::MAX;
pub const NULL_BLOCK: u32 = 0;

/// What the free queue and the ref counts keep of one block, together: popping a block
/// touches one 16-byte node (and its neighbour's), not one line per array.
#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    ref_cnt: u32,
    in_free_queue: bool,
    /// `hash[id]` holds the block's hash and the block is in the prefix cache.
    hashed: bool,
    /// The KV-cache group whose prefix cache holds the block (when `hashed`).
    group: u8,
}

/// A chain of blocks linked among themselves: freed ones not yet in the free queue, or
/// the queue itself.
#[derive(Clone, Copy)]
struct Run {
    first: u32,
    last: u32,
}

impl Run {
    const EMPTY: Run = Run { first: NIL, last: NIL };
}

const FREE_NODE: Node = Node { prev: NIL, next: NIL, ref_cnt: 0, in_free_queue: false, hashed: false, group: 0 };

#[derive(Clone, Debug)]
pub struct BlockPool {
    nodes: Vec<Node>,
    /// Read only where `nodes[id].hashed` (prefix caching on).
    hash: Vec<BlockHash>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// Per KV-cache group, hash -> the first block cached with that content (the one a
    /// lookup returns): groups share the pool, never a cached block.
    cached: Vec<FxHashMap<BlockHash, u32>>,
    /// Later blocks with the same content as a block, in caching order (rare): an
    /// intrusive list, so caching a block allocates nothing.
    next_duplicate: Vec<u32>,
    num_cached: usize,
    enable_caching: bool,
    /// Blocks leaving the cache are recorded here (the manager records those entering).
    pub(crate) events: EventLog,
    /// With `kv_cache_metrics_sample`, the sampled blocks' residency (None without).
    pub(crate) residency: Option<Box<Residency>>,
}

fn filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.resize(n, value);
    Ok(v)
}

impl BlockPool {
    /// Reports a block table too large to allocate instead of aborting the
    /// process (Rust's default on allocation failure).
    pub fn try_new(num_blocks: usize, enable_caching: bool) -> Result<Self, TryReserveError> {
        let n = num_blocks;
        // Without prefix caching no block is ever hashed: the hash columns stay empty.
        let hashed_blocks = if enable_caching { n } else { 0 };
        let mut pool = Self {
            nodes: filled(n, FREE_NODE)?,
            hash: filled(hashed_blocks, 0)?,
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: vec![FxHashMap::default()],
            next_duplicate: filled(hashed_blocks, NIL)?,
            num_cached: 0,
            enable_caching,
            events: EventLog::default(),
            residency: None,
        };
        for id in 1..n as u32 {
            pool.push_back(id);
        }
        Ok(pool)
    }

    /// Gives each of `num_groups` KV-cache groups its own prefix cache (one by default;
    /// none for a model without a KV cache).
    pub fn set_num_groups(&mut self, num_groups: usize) {
        debug_assert!(self.num_cached == 0 && num_groups <= 256);
        self.cached.resize_with(num_groups, FxHashMap::default);
    }

    /// Bytes of per-block state a pool of `num_blocks` allocates up front.
    pub fn table_bytes(num_blocks: usize) -> usize {
        let per_block = std::mem::size_of::<Node>() + std::mem::size_of::<BlockHash>() + std::mem::size_of::<u32>();
        num_blocks.saturating_mul(per_block)
    }

    pub fn num_blocks(&self) -> usize {
        self.nodes.len()
    }

    /// Blocks with `ref_cnt == 0`, cached ones (eviction candidates) included.
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    pub fn ref_cnt(&self, block: u32) -> u32 {
        self.nodes[block as usize].ref_cnt
    }

    pub fn block_hash(&self, block: u32) -> Option<BlockHash> {
        self.nodes[block as usize].hashed.then(|| self.hash[block as usize])
    }

    /// The group whose prefix cache holds the block (meaningful while it is cached).
    pub fn block_group(&self, block: u32) -> usize {
        self.nodes[block as usize].group as usize
    }

    fn unlink(&mut self, id: u32) {
        let Node { prev: p, next: n, .. } = self.nodes[id as usize];
        if p == NIL {
            self.head = n;
        } else {
            self.nodes[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.nodes[n as usize].prev = p;
        }
        let node = &mut self.nodes[id as usize];
        node.prev = NIL;
        node.next = NIL;
        node.in_free_queue = false;
        self.num_free -= 1;
    }

    fn push_back(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        node.prev = self.tail;
        node.next = NIL;
        node.in_free_queue = true;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.nodes[self.tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    /// Pops `k` blocks from the head of the free queue into `out`, evicting
    /// any cached content they hold. The caller has checked `k <= num_free`;
    /// checked again in release builds, where a short queue would otherwise
    /// walk off its end (the `NIL` link is `u32::MAX`).
    pub fn get_new_blocks(&mut self, k: usize, out: &mut Vec<u32>) {
        assert!(k <= self.num_free, "{k} blocks asked of a free queue of {}", self.num_free);
        let start = out.len();
        out.resize(start + k, NULL_BLOCK);
        // The first k blocks leave as one run: only the block after them is relinked
        // (a prefill takes hundreds of blocks in one call).
        let mut id = self.head;
        for slot in &mut out[start..] {
            let node = &mut self.nodes[id as usize];
            let next = node.next;
            let hashed = node.hashed;
            *node = Node { prev: NIL, next: NIL, ref_cnt: 1, in_free_queue: false, hashed, group: node.group };
            if hashed {
                self.uncache(id);
            }
            *slot = id;
            id = next;
        }
        self.head = id;
        if id == NIL {
            self.tail = NIL;
        } else {
            self.nodes[id as usize].prev = NIL;
        }
        self.num_free -= k;
        if let Some(residency) = &mut self.residency {
            let now = Instant::now();
            // With prefix caching, vLLM counts every block handed out again as evicted.
            out[start..].iter().for_each(|&id| residency.handed_out(id, self.enable_caching, now));
        }
    }

    /// Forgets a block's cached content, if any: when the block is reused
    /// (eviction), or when its KV will not be computed after all.
    pub fn uncache(&mut self, id: u32) {
        if !std::mem::replace(&mut self.nodes[id as usize].hashed, false) {
            return;
        }
        let hash = self.hash[id as usize];
        self.num_cached -= 1;
        let group = self.nodes[id as usize].group;
        self.events.record(|| KvEvent::Removed { block: id, group: u32::from(group) });
        let next = std::mem::replace(&mut self.next_duplicate[id as usize], NIL);
        let cached = &mut self.cached[self.nodes[id as usize].group as usize];
        let first = cached.get_mut(&hash).expect("a hashed block is cached");
        if *first == id {
            if next == NIL {
                cached.remove(&hash);
            } else {
                *first = next;
            }
            return;
        }
        let mut prev = *first;
        while self.next_duplicate[prev as usize] != id {
            prev = self.next_duplicate[prev as usize];
        }
        self.next_duplicate[prev as usize] = next;
    }

    /// The block a lookup of `hash` in `group`'s prefix cache finds: the first cached with it.
    #[inline]
    pub fn get_cached_block(&self, hash: BlockHash, group: usize) -> Option<u32> {
        self.cached[group].get(&hash).copied()
    }

    /// `group`'s prefix cache, if the pool has that group.
    pub(crate) fn cached_in(&self, group: usize) -> Option<&FxHashMap<BlockHash, u32>> {
        self.cached.get(group)
    }

    /// Registers `blocks[i]` under `hashes[i]` in `group`'s prefix cache for `i` in
    /// `from..to` where `keep(i)`. A block with the same content as one already cached is
    /// registered too (duplicates are kept, never merged, so block tables stay append-only).
    #[inline(always)]
    pub fn cache_full_blocks(
        &mut self,
        blocks: &[u32],
        hashes: &[BlockHash],
        (from, to): (usize, usize),
        group: usize,
        keep: impl Fn(usize) -> bool,
    ) {
        debug_assert!(self.enable_caching, "cache_full_blocks without prefix caching");
        for i in from..to {
            let id = blocks[i];
            if id == NULL_BLOCK || !keep(i) {
                continue;
            }
            let hash = hashes[i];
            debug_assert!(!self.nodes[id as usize].hashed, "block {id} cached twice");
            self.nodes[id as usize].hashed = true;
            self.nodes[id as usize].group = group as u8;
            self.hash[id as usize] = hash;
            self.num_cached += 1;
            match self.cached[group].entry(hash) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(id);
                }
                std::collections::hash_map::Entry::Occupied(first) => {
                    let mut last = *first.get();
                    while self.next_duplicate[last as usize] != NIL {
                        last = self.next_duplicate[last as usize];
                    }
                    self.next_duplicate[last as usize] = id;
                }
            }
        }
    }

    /// Forgets every cached hash; only possible when no block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free + 1 != self.num_blocks() {
            return false;
        }
        self.cached.iter_mut().for_each(FxHashMap::clear);
        self.nodes.iter_mut().for_each(|node| node.hashed = false);
        self.next_duplicate.iter_mut().for_each(|n| *n = NIL);
        self.num_cached = 0;
        self.events.record(|| KvEvent::Cleared);
        if let Some(residency) = &mut self.residency {
            residency.reset();
        }
        true
    }

    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached
    }

    /// A prefix hit takes a reference; a block with none leaves the free queue.
    pub fn touch(&mut self, blocks: &[u32]) {
        for &id in blocks {
            if id == NULL_BLOCK {
                continue;
            }
            if self.nodes[id as usize].ref_cnt == 0 {
                self.unlink(id);
            }
            self.nodes[id as usize].ref_cnt += 1;
        }
        if let Some(residency) = &mut self.residency {
            let now = Instant::now();
            blocks.iter().filter(|&&id| id != NULL_BLOCK).for_each(|&id| residency.read(id, now));
        }
    }

    /// Drops one reference from each block, in eviction order (first evicted
    /// first). Blocks reaching zero go to the head if they hold no cached
    /// content (reused first), to the tail otherwise (LRU), in the given order.
    pub fn free_blocks(&mut self, ordered: impl Iterator<Item = u32>) {
        // The freed blocks are chained into two runs, spliced in once at the end: a
        // finished request returns hundreds of blocks in one call.
        let mut to_head = Run::EMPTY;
        let mut to_tail = Run::EMPTY;
        let mut freed = 0;
        for id in ordered {
            if id == NULL_BLOCK {
                continue;
            }
            let node = &mut self.nodes[id as usize];
            node.ref_cnt -= 1;
            if node.ref_cnt == 0 {
                freed += 1;
                // Each branch names its run: the runs stay in registers.
                if node.hashed {
                    self.append(&mut to_tail, id);
                } else {
                    self.append(&mut to_head, id);
                }
            }
        }
        let queue = Run { first: self.head, last: self.tail };
        let front = self.join(to_head, queue);
        let joined = self.join(front, to_tail);
        (self.head, self.tail) = (joined.first, joined.last);
        self.num_free += freed;
    }

    /// Links chain `b` after chain `a` (either may be empty).
    fn join(&mut self, a: Run, b: Run) -> Run {
        if a.first == NIL {
            return b;
        }
        if b.first != NIL {
            self.nodes[a.last as usize].next = b.first;
            self.nodes[b.first as usize].prev = a.last;
        }
        Run { first: a.first, last: if b.first == NIL { a.last } else { b.last } }
    }

    /// Links a freed block after the end of `run`.
    #[inline(always)]
    fn append(&mut self, run: &mut Run, id: u32) {
        let node = &mut self.nodes[id as usize];
        node.prev = run.last;
        node.next = NIL;
        node.in_free_queue = true;
        if run.last == NIL {
            run.first = id;
        } else {
            self.nodes[run.last as usize].next = id;
        }
        run.last = id;
    }

    pub fn free_queue(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut id = self.head;
        while id != NIL {
            out.push(id);
            id = self.nodes[id as usize].next;
        }
        out
    }

    /// Invariant checks of spec Appendix A item 6 (the pool's part).
    pub(crate) fn check(&self) -> Result<(), String> {
        let queue = self.free_queue();
        if queue.len() != self.num_free {
            return Err(format!("free queue holds {} blocks but num_free is {}", queue.len(), self.num_free));
        }
        let mut seen = vec![false; self.num_blocks()];
        for &id in &queue {
            if id == NULL_BLOCK {
                return Err("the null block is in the free queue".into());
            }
            if std::mem::replace(&mut seen[id as usize], true) {
                return Err(format!("block {id} is twice in the free queue"));
            }
            if self.nodes[id as usize].ref_cnt != 0 {
                return Err(format!("block {id} is free with ref_cnt {}", self.nodes[id as usize].ref_cnt));
            }
        }
        for (id, &in_queue) in seen.iter().enumerate().skip(1) {
            if self.nodes[id].ref_cnt == 0 && !in_queue {
                return Err(format!("block {id} has ref_cnt 0 but is not in the free queue"));
            }
            if in_queue != self.nodes[id].in_free_queue {
                return Err(format!("block {id}: in_free_queue flag disagrees with the queue"));
            }
        }
        let mut chained = 0;
        for (group, (hash, &first)) in
            self.cached.iter().enumerate().flat_map(|(g, map)| map.iter().map(move |e| (g, e)))
        {
            let mut id = first;
            while id != NIL {
                if self.block_hash(id) != Some(*hash) {
                    return Err(format!("block {id} is cached under {hash:032x} but holds {:?}", self.block_hash(id)));
                }
                if self.nodes[id as usize].group as usize != group {
                    return Err(format!(
                        "block {id} is cached in group {group} but says {}",
                        self.nodes[id as usize].group
                    ));
                }
                chained += 1;
                id = self.next_duplicate[id as usize];
            }
        }
        let hashed = self.nodes.iter().filter(|node| node.hashed).count();
        if hashed != chained || chained != self.num_cached {
            return Err(format!(
                "{hashed} blocks hold a hash, the cache chains {chained} and counts {}",
                self.num_cached
            ));
        }
        if self.nodes[NULL_BLOCK as usize].hashed {
            return Err("the null block holds a hash".into());
        }
        let used = self.nodes.iter().skip(1).filter(|node| node.ref_cnt > 0).count();
        if self.num_free + used + 1 != self.num_blocks() {
            return Err(format!(
                "KV conservation: free {} + used {} + null 1 != num_gpu_blocks {}",
                self.num_free,
                used,
                self.num_blocks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_starts_after_the_null_block_in_id_order() {
        let mut pool = BlockPool::try_new(6, false).unwrap();
        assert_eq!(pool.num_free_blocks(), 5);
        let mut out = Vec::new();
        pool.get_new_blocks(3, &mut out);
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(pool.free_queue(), vec![4, 5]);
        pool.check().unwrap();
    }

    #[test]
    fn unhashed_blocks_return_to_the_head_in_the_given_order() {
        let mut pool = BlockPool::try_new(8, false).unwrap();
        let mut table = Vec::new();
        pool.get_new_blocks(4, &mut table);
        // A request frees its table tail first.
        pool.free_blocks(table.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![4, 3, 2, 1, 5, 6, 7]);
        pool.check().unwrap();
    }

    /// vLLM's test_prefill free-queue order, at the pool level: req0 holds
    /// [1,2,3,4] (4 partial), req1 holds [1,2,3,5] (5 partial).
    #[test]
    fn free_queue_order_of_vllms_test_prefill() {
        let mut pool = BlockPool::try_new(11, true).unwrap();
        let mut req0 = Vec::new();
        pool.get_new_blocks(4, &mut req0);
        pool.cache_full_blocks(&req0, &[10, 20, 30], (0, 3), 0, |_| true);
        let mut req1 = vec![1, 2, 3];
        pool.touch(&req1);
        pool.get_new_blocks(1, &mut req1);
        assert_eq!(req1, vec![1, 2, 3, 5]);
        pool.free_blocks(req0.iter().rev().copied());
        pool.free_blocks(req1.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
        // A miss of 10 blocks takes them in that order, evicting the cached ones.
        let mut miss = Vec::new();
        pool.get_new_blocks(10, &mut miss);
        assert_eq!(miss, vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
        assert_eq!(pool.get_cached_block(10, 0), None);
        pool.check().unwrap();
    }

    /// vLLM's test_evict: req0 holds 1..=6 (6 partial), req1 holds 7..=9.
    #[test]
    fn free_queue_order_of_vllms_test_evict() {
        let mut pool = BlockPool::try_new(11, true).unwrap();
        let mut req0 = Vec::new();
        pool.get_new_blocks(6, &mut req0);
        pool.cache_full_blocks(&req0, &[1, 2, 3, 4, 5], (0, 5), 0, |_| true);
        let mut req1 = Vec::new();
        pool.get_new_blocks(3, &mut req1);
        pool.cache_full_blocks(&req1, &[6, 7, 8], (0, 3), 0, |_| true);
        pool.free_blocks(req0.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![6, 10, 5, 4, 3, 2, 1]);
        pool.free_blocks(req1.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![6, 10, 5, 4, 3, 2, 1, 9, 8, 7]);
        pool.check().unwrap();
    }

    #[test]
    fn duplicate_content_is_kept_and_lookup_returns_the_first() {
        let mut pool = BlockPool::try_new(5, true).unwrap();
        let mut blocks = Vec::new();
        pool.get_new_blocks(2, &mut blocks);
        pool.cache_full_blocks(&blocks, &[7, 7], (0, 2), 0, |_| true);
        assert_eq!(pool.get_cached_block(7, 0), Some(blocks[0]));
        pool.free_blocks(blocks.iter().rev().copied());
        // Block 2 (freed first, at the tail's front) ... the head is block 3, uncached.
        let mut out = Vec::new();
        pool.get_new_blocks(2, &mut out);
        assert_eq!(out, vec![3, 4]);
        pool.get_new_blocks(1, &mut out);
        assert_eq!(out[2], 2, "cached blocks are evicted last, tail of the request first");
        assert_eq!(pool.get_cached_block(7, 0), Some(1), "evicting one duplicate keeps the other");
        pool.check().unwrap();
    }

    #[test]
    fn reset_needs_every_block_free() {
        let mut pool = BlockPool::try_new(4, true).unwrap();
        let mut blocks = Vec::new();
        pool.get_new_blocks(1, &mut blocks);
        pool.cache_full_blocks(&blocks, &[9], (0, 1), 0, |_| true);
        assert!(!pool.reset_prefix_cache());
        pool.free_blocks(blocks.iter().copied());
        assert!(pool.reset_prefix_cache());
        assert_eq!(pool.get_cached_block(9, 0), None);
        pool.check().unwrap();
    }

    #[test]
    fn shared_block_is_freed_only_with_its_last_reference() {
        let mut pool = BlockPool::try_new(4, true).unwrap();
        let mut a = Vec::new();
        pool.get_new_blocks(1, &mut a);
        pool.touch(&a);
        assert_eq!(pool.ref_cnt(a[0]), 2);
        pool.free_blocks(a.iter().copied());
        assert_eq!(pool.num_free_blocks(), 2);
        pool.free_blocks(a.iter().copied());
        assert_eq!(pool.num_free_blocks(), 3);
        pool.check().unwrap();
    }

    /// The free queue's order, from a plain model of its rule: popped from the head,
    /// a freed unhashed block goes before the rest of the queue (after the ones freed
    /// with it), a freed hashed one to the tail, a touched free block leaves its place.
    #[derive(Default)]
    struct QueueModel {
        queue: std::collections::VecDeque<u32>,
        ref_cnt: Vec<u32>,
        hashed: Vec<bool>,
    }

    impl QueueModel {
        fn new(n: usize) -> Self {
            Self { queue: (1..n as u32).collect(), ref_cnt: vec![0; n], hashed: vec![false; n] }
        }
        fn pop(&mut self, k: usize) -> Vec<u32> {
            let out: Vec<u32> = self.queue.drain(..k).collect();
            for &id in &out {
                self.ref_cnt[id as usize] = 1;
                self.hashed[id as usize] = false;
            }
            out
        }
        fn free(&mut self, ordered: &[u32]) {
            let mut at_head = 0;
            for &id in ordered {
                self.ref_cnt[id as usize] -= 1;
                if self.ref_cnt[id as usize] == 0 {
                    if self.hashed[id as usize] {
                        self.queue.push_back(id);
                    } else {
                        self.queue.insert(at_head, id);
                        at_head += 1;
                    }
                }
            }
        }
        fn touch(&mut self, id: u32) {
            if self.ref_cnt[id as usize] == 0 {
                self.queue.retain(|&b| b != id);
            }
            self.ref_cnt[id as usize] += 1;
        }
    }

    proptest::proptest! {
        /// Batched pops and frees keep the queue order of one block at a time.
        #[test]
        fn the_free_queue_follows_its_rule(ops in proptest::collection::vec((0u8..4, 0usize..4, 0usize..12, 0u8..3), 1..60)) {
            const N: usize = 24;
            let mut pool = BlockPool::try_new(N, true).unwrap();
            let mut model = QueueModel::new(N);
            let mut tables: Vec<Vec<u32>> = vec![Vec::new(); 4];
            let mut cached_upto = [0usize; 4];
            for (op, t, k, salt) in ops {
                match op {
                    0 => {
                        let k = k.min(pool.num_free_blocks());
                        pool.get_new_blocks(k, &mut tables[t]);
                        let expected = model.pop(k);
                        proptest::prop_assert_eq!(&tables[t][tables[t].len() - k..], &expected[..]);
                    }
                    1 => {
                        let hashes: Vec<BlockHash> = tables[t].iter().map(|&b| u128::from(b % 5 + 10 * u32::from(salt))).collect();
                        pool.cache_full_blocks(&tables[t], &hashes, (cached_upto[t], tables[t].len()), 0, |_| true);
                        for &b in &tables[t][cached_upto[t]..] {
                            model.hashed[b as usize] = true;
                        }
                        cached_upto[t] = tables[t].len();
                    }
                    2 => {
                        let freed = std::mem::take(&mut tables[t]);
                        pool.free_blocks(freed.iter().rev().copied());
                        model.free(&freed.iter().rev().copied().collect::<Vec<_>>());
                        cached_upto[t] = 0;
                    }
                    _ => {
                        // A prefix hit on a cached block, free or held, joins table t.
                        let hit = (1..N as u32).map(|b| (b + k as u32) % N as u32).find(|&b| model.hashed[b as usize] && b != NULL_BLOCK);
                        if let Some(b) = hit {
                            if cached_upto[t] == tables[t].len() && !tables[t].contains(&b) {
                                pool.touch(&[b]);
                                model.touch(b);
                                tables[t].push(b);
                                cached_upto[t] += 1;
                            }
                        }
                    }
                }
                proptest::prop_assert_eq!(pool.free_queue(), Vec::from(model.queue.clone()));
                proptest::prop_assert_eq!(pool.num_free_blocks(), model.queue.len());
                pool.check().map_err(proptest::test_runner::TestCaseError::fail)?;
            }
        }
    }
}
