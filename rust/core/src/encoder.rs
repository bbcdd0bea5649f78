//! The encoder cache that holds the encoder outputs of requests' multimodal inputs (vLLM's
//! `EncoderCacheManager`).
//!
//! An input's encoder output is computed whole, in the step whose chunk first reaches one
//! of its embeddings, and read by every chunk that covers its placeholders; it is freed
//! once the request's computed tokens have passed it. Outputs are shared by identifier
//! (vLLM's `mm_hash`): a request whose image another request already encoded uses that
//! output. An output no request references stays cached until its room is needed, oldest
//! first; what was evicted is reported with the next step (`free_encoder_mm_hashes`).
//! Space and the per-step compute budget are counted in embeddings, not placeholder tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::mm_inputs::RequestInputs;
use crate::slab::Handle;

#[derive(Clone, Debug)]
struct CacheEntry {
    /// The requests that reference it; none: it is freeable.
    holders: Vec<Handle>,
    num_embeds: i64,
    /// Its place in the freeable order while it is freeable.
    freeable_at: Option<u64>,
}

/// vLLM's `EncoderCacheManager`: encoder outputs by identifier, their space counted in
/// embeddings; outputs no request references are evicted oldest first when room is needed.
#[derive(Clone, Debug)]
pub(crate) struct EncoderCache {
    cache_size: i64,
    num_free_slots: i64,
    /// Free slots plus those of outputs no request references.
    num_freeable_slots: i64,
    entries: FxHashMap<Arc<str>, CacheEntry>,
    /// The unreferenced outputs, oldest first.
    freeable: BTreeMap<u64, Arc<str>>,
    next_freeable: u64,
    /// Evicted since the last step.
    freed: Vec<Arc<str>>,
    /// Outputs cached for an encoding a preemption undid in the step being built: not
    /// computed (evicting one frees nothing in the runner).
    orphans: Vec<Arc<str>>,
    /// With an encoder-cache connector: each input a request's computed tokens passed
    /// since the last call, as `(request id, input index)` (vLLM tells its connector with
    /// `update_state_after_free`); None without.
    passed: Option<Vec<(Arc<str>, u32)>>,
}

impl EncoderCache {
    pub fn new(cache_size: i64, records_passed: bool) -> Self {
        Self {
            cache_size,
            num_free_slots: cache_size,
            num_freeable_slots: cache_size,
            entries: FxHashMap::default(),
            freeable: BTreeMap::new(),
            next_freeable: 0,
            freed: Vec::new(),
            orphans: Vec::new(),
            passed: records_passed.then(Vec::new),
        }
    }

    /// Forgets every output (vLLM's `reset`, on a weight update). Requests' references are
    /// the caller's to clear.
    pub fn reset(&mut self) {
        *self = Self::new(self.cache_size, self.passed.is_some());
    }

    /// The embeddings the output cached under `identifier` holds, if there is one.
    pub fn cached_num_embeds(&self, identifier: &str) -> Option<i64> {
        self.entries.get(identifier).map(|e| e.num_embeds)
    }

    /// Whether input `i`'s output is cached; if so, `handle` now references it.
    pub fn check_and_reference(&mut self, handle: Handle, mm: &mut RequestInputs, i: usize) -> bool {
        let Some(entry) = self.entries.get_mut(&*mm.inputs[i].identifier) else { return false };
        if entry.holders.is_empty() {
            let at = entry.freeable_at.take().expect("an unreferenced output is freeable");
            self.freeable.remove(&at);
            self.num_freeable_slots -= entry.num_embeds;
        }
        if !entry.holders.contains(&handle) {
            entry.holders.push(handle);
        }
        mm.add_reference(i);
        true
    }

    /// Whether `num_embeds` more embeddings, after `num_embeds_scheduled` already planned
    /// in this request's step, fit the compute budget and the cache, evicting unreferenced
    /// outputs (oldest first) for room if needed.
    pub fn can_allocate(&mut self, num_embeds: i64, compute_budget: i64, num_embeds_scheduled: i64) -> bool {
        if num_embeds > compute_budget {
            return false;
        }
        let needed = num_embeds + num_embeds_scheduled;
        if needed <= self.num_free_slots {
            return true;
        }
        if needed > self.num_freeable_slots {
            return false;
        }
        while needed > self.num_free_slots {
            let (_, identifier) = self.freeable.pop_first().expect("freeable slots cover the need");
            let entry = self.entries.remove(&identifier).expect("a freeable output is cached");
            self.num_free_slots += entry.num_embeds;
            match self.orphans.iter().position(|o| *o == identifier) {
                Some(at) => {
                    self.orphans.swap_remove(at);
                }
                None => self.freed.push(identifier),
            }
        }
        true
    }

    /// Reserves input `i`'s output for `handle` (after `can_allocate`).
    pub fn allocate(&mut self, handle: Handle, mm: &mut RequestInputs, i: usize) {
        let input = &mm.inputs[i];
        let num_embeds = input.num_embeds();
        let entry = self.entries.entry(input.identifier.clone()).or_insert(CacheEntry {
            holders: Vec::new(),
            num_embeds,
            freeable_at: None,
        });
        debug_assert_eq!(entry.num_embeds, num_embeds);
        debug_assert!(self.num_free_slots >= num_embeds && self.num_freeable_slots >= num_embeds);
        if !entry.holders.contains(&handle) {
            entry.holders.push(handle);
        }
        mm.add_reference(i);
        self.num_free_slots -= num_embeds;
        self.num_freeable_slots -= num_embeds;
    }

    /// Drops `handle`'s reference to input `i`'s output; an output no request references
    /// becomes freeable (it stays cached until its room is needed).
    pub fn release(&mut self, handle: Handle, mm: &mut RequestInputs, i: usize) {
        if let Ok(at) = mm.referenced.binary_search(&(i as u32)) {
            mm.referenced.remove(at);
        }
        let identifier = &mm.inputs[i].identifier;
        // Another input of the request with the same identifier still holds it.
        if mm.references_identifier(identifier) {
            return;
        }
        let Some(entry) = self.entries.get_mut(&**identifier) else { return };
        if entry.holders.is_empty() {
            return;
        }
        entry.holders.retain(|&h| h != handle);
        if entry.holders.is_empty() {
            entry.freeable_at = Some(self.next_freeable);
            self.freeable.insert(self.next_freeable, identifier.clone());
            self.next_freeable += 1;
            self.num_freeable_slots += entry.num_embeds;
        }
    }

    /// `release` of input `i`, which `request_id`'s computed tokens have passed.
    pub fn release_passed(&mut self, handle: Handle, request_id: &Arc<str>, mm: &mut RequestInputs, i: usize) {
        self.release(handle, mm, i);
        if let Some(passed) = &mut self.passed {
            passed.push((request_id.clone(), i as u32));
        }
    }

    /// The inputs passed since the last call (see `passed`), taken.
    pub fn take_passed(&mut self) -> Vec<(Arc<str>, u32)> {
        self.passed.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Drops every reference of `handle` (finished, preempted, or not admitted after all).
    pub fn release_all(&mut self, handle: Handle, mm: &mut RequestInputs) {
        while let Some(&i) = mm.referenced.first() {
            self.release(handle, mm, i as usize);
        }
    }

    /// Marks the output cached under `identifier` as not computed after all (the request
    /// that was to encode it in the step being built was preempted).
    pub fn orphan(&mut self, identifier: Arc<str>) {
        if !self.orphans.contains(&identifier) {
            self.orphans.push(identifier);
        }
    }

    /// The orphaned outputs still cached, taken.
    pub fn take_orphans(&mut self) -> Vec<Arc<str>> {
        let mut orphans = std::mem::take(&mut self.orphans);
        orphans.retain(|identifier| self.entries.contains_key(identifier));
        orphans
    }

    /// Forgets the output cached under `identifier`, which its step will not compute after
    /// all (the request that was to encode it was preempted in that step, and no other
    /// request of the step needs it): its room comes back. Returns the requests that
    /// referenced it, whose references the caller drops.
    pub fn forget_unencoded(&mut self, identifier: &str) -> Vec<Handle> {
        let Some(entry) = self.entries.remove(identifier) else { return Vec::new() };
        if let Some(at) = entry.freeable_at {
            self.freeable.remove(&at);
            self.num_freeable_slots -= entry.num_embeds;
        }
        self.num_free_slots += entry.num_embeds;
        self.num_freeable_slots += entry.num_embeds;
        entry.holders
    }

    /// The identifiers evicted since the last call and not cached again since: the
    /// runner frees their outputs (vLLM's `get_freed_mm_hashes`).
    pub fn take_freed(&mut self) -> Vec<Arc<str>> {
        let mut freed = std::mem::take(&mut self.freed);
        freed.retain(|identifier| !self.entries.contains_key(identifier));
        freed
    }

    /// `(free, freeable)` slots.
    pub fn slots(&self) -> (i64, i64) {
        (self.num_free_slots, self.num_freeable_slots)
    }

    pub fn num_cached(&self) -> usize {
        self.entries.len()
    }

    /// Every cached output: its identifier, embeddings and referencing requests.
    pub fn entries(&self) -> impl Iterator<Item = (&Arc<str>, i64, &[Handle])> {
        self.entries.iter().map(|(identifier, e)| (identifier, e.num_embeds, e.holders.as_slice()))
    }

    /// The outputs no request references, oldest (first evicted) first.
    pub fn freeable(&self) -> impl Iterator<Item = &Arc<str>> {
        self.freeable.values()
    }
}

impl EncoderCache {
    /// Checks the cache against the requests' references (`holders`: each identifier's
    /// referencing requests): every referenced output cached with exactly those holders,
    /// the unreferenced ones freeable in order, and the slot counts their sums.
    pub(crate) fn check(&self, holders: &FxHashMap<&str, Vec<Handle>>) -> Result<(), String> {
        let mut used = 0;
        let mut unreferenced = 0;
        for (identifier, entry) in &self.entries {
            used += entry.num_embeds;
            let mut expected = holders.get(&**identifier).cloned().unwrap_or_default();
            let mut actual = entry.holders.clone();
            expected.sort_unstable();
            actual.sort_unstable();
            if expected != actual {
                return Err(format!("encoder output {identifier:?} is held by {actual:?}, referenced by {expected:?}"));
            }
            match entry.freeable_at {
                Some(at) if actual.is_empty() && self.freeable.get(&at) == Some(identifier) => {
                    unreferenced += entry.num_embeds
                }
                None if !actual.is_empty() => {}
                at => {
                    return Err(format!("encoder output {identifier:?} with holders {actual:?} is freeable at {at:?}"))
                }
            }
        }
        if let Some(identifier) = holders.keys().find(|id| !self.entries.contains_key(**id)) {
            return Err(format!("encoder output {identifier:?} is referenced but not cached"));
        }
        if self.freeable.len() != self.entries.values().filter(|e| e.holders.is_empty()).count() {
            return Err(format!("{} freeable encoder outputs listed", self.freeable.len()));
        }
        if self.num_free_slots != self.cache_size - used
            || self.num_freeable_slots != self.num_free_slots + unreferenced
        {
            return Err(format!(
                "encoder cache slots: {} free and {} freeable of {}, {used} used ({unreferenced} unreferenced)",
                self.num_free_slots, self.num_freeable_slots, self.cache_size
            ));
        }
        Ok(())
    }
}
