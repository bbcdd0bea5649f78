//! The waiting queues (spec §1.3): an FCFS deque, or a priority heap ordered
//! by `(priority, arrival_time, request_id)`.
//!
//! Removing a request from the middle (an abort) is lazy: the request is
//! marked as no longer queued and its entry is dropped when it reaches the
//! front, so an abort costs O(1) whatever the queue's length.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::config::Policy;
use crate::request::QueueKind;
use crate::slab::{Handle, Slab};

#[derive(Clone, Debug)]
struct PriorityEntry {
    priority: i32,
    arrival_time: f64,
    request_id: Arc<str>,
    /// Insertion order, the last tie-breaker (vLLM falls back to identity).
    sequence: u64,
    handle: Handle,
}

/// The priority policy's order of requests, `(priority, arrival_time, request_id)`:
/// the waiting queue serves the smallest first and preemption takes the largest.
pub(crate) fn priority_order(a: (i32, f64, &str), b: (i32, f64, &str)) -> Ordering {
    a.0.cmp(&b.0).then_with(|| a.1.total_cmp(&b.1)).then_with(|| a.2.cmp(b.2))
}

impl PriorityEntry {
    fn key_cmp(&self, other: &Self) -> Ordering {
        priority_order(
            (self.priority, self.arrival_time, &self.request_id),
            (other.priority, other.arrival_time, &other.request_id),
        )
        .then_with(|| self.sequence.cmp(&other.sequence))
    }
}

impl PartialEq for PriorityEntry {
    fn eq(&self, other: &Self) -> bool {
        self.key_cmp(other) == Ordering::Equal
    }
}
impl Eq for PriorityEntry {}
impl PartialOrd for PriorityEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PriorityEntry {
    // BinaryHeap is a max-heap: reverse so the smallest key comes out first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key_cmp(self)
    }
}

#[derive(Clone, Debug)]
enum Entries {
    Fcfs(VecDeque<Handle>),
    Priority { heap: BinaryHeap<PriorityEntry>, next_sequence: u64 },
}

#[derive(Clone, Debug)]
pub struct RequestQueue {
    kind: QueueKind,
    entries: Entries,
    /// Live requests only; dead entries awaiting lazy removal are not counted.
    len: usize,
}

impl RequestQueue {
    pub fn new(kind: QueueKind, policy: Policy) -> Self {
        let entries = match policy {
            Policy::Fcfs => Entries::Fcfs(VecDeque::new()),
            Policy::Priority => Entries::Priority { heap: BinaryHeap::new(), next_sequence: 0 },
        };
        Self { kind, entries, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn is_live(&self, slab: &Slab, handle: Handle) -> bool {
        slab.get(handle).is_some_and(|r| r.queued_in == Some(self.kind))
    }

    fn push_entry(&mut self, slab: &Slab, handle: Handle, front: bool) {
        let request = &slab[handle];
        match &mut self.entries {
            Entries::Fcfs(deque) => {
                if front {
                    deque.push_front(handle)
                } else {
                    deque.push_back(handle)
                }
            }
            Entries::Priority { heap, next_sequence } => {
                heap.push(PriorityEntry {
                    priority: request.priority,
                    arrival_time: request.arrival_time,
                    request_id: request.id.clone(),
                    sequence: *next_sequence,
                    handle,
                });
                *next_sequence += 1;
            }
        }
        self.len += 1;
    }

    /// Appends (FCFS) or inserts (priority). The caller has set `queued_in`.
    pub fn add(&mut self, slab: &Slab, handle: Handle) {
        self.push_entry(slab, handle, false)
    }

    /// Puts a request back at the front (FCFS) or inserts it (priority).
    pub fn prepend(&mut self, slab: &Slab, handle: Handle) {
        self.push_entry(slab, handle, true)
    }

    /// Puts `handles` back at the front in their given order.
    pub fn prepend_all(&mut self, slab: &Slab, handles: &[Handle]) {
        for &handle in handles.iter().rev() {
            self.prepend(slab, handle);
        }
    }

    fn drop_dead_front(&mut self, slab: &Slab) {
        loop {
            let front = match &self.entries {
                Entries::Fcfs(deque) => deque.front().copied(),
                Entries::Priority { heap, .. } => heap.peek().map(|e| e.handle),
            };
            match front {
                Some(handle) if !self.is_live(slab, handle) => match &mut self.entries {
                    Entries::Fcfs(deque) => {
                        deque.pop_front();
                    }
                    Entries::Priority { heap, .. } => {
                        heap.pop();
                    }
                },
                _ => return,
            }
        }
    }

    pub fn peek(&mut self, slab: &Slab) -> Option<Handle> {
        self.drop_dead_front(slab);
        match &self.entries {
            Entries::Fcfs(deque) => deque.front().copied(),
            Entries::Priority { heap, .. } => heap.peek().map(|e| e.handle),
        }
    }

    /// Pops the front request. The caller clears its `queued_in`.
    pub fn pop(&mut self, slab: &Slab) -> Option<Handle> {
        self.drop_dead_front(slab);
        let handle = match &mut self.entries {
            Entries::Fcfs(deque) => deque.pop_front(),
            Entries::Priority { heap, .. } => heap.pop().map(|e| e.handle),
        }?;
        self.len -= 1;
        // One live entry fewer lowers the bound on dead ones.
        self.sweep_if_needed(slab);
        Some(handle)
    }

    /// Removes a live request from the middle now, its entry included (not lazily: it may
    /// come back into this queue). The caller has cleared its `queued_in`. O(entries).
    pub fn remove(&mut self, slab: &Slab, handle: Handle) {
        match &mut self.entries {
            Entries::Fcfs(deque) => deque.retain(|&h| h != handle),
            Entries::Priority { heap, .. } => heap.retain(|e| e.handle != handle),
        }
        self.len -= 1;
        self.sweep_if_needed(slab);
    }

    /// Accounts for a request removed from the middle, after the caller has
    /// cleared its `queued_in` (which makes its entry dead).
    pub fn forget_one(&mut self, slab: &Slab) {
        self.len -= 1;
        self.sweep_if_needed(slab);
    }

    /// Dead entries leave at the front, but under the priority policy an entry
    /// with a poor key may never reach it while better requests keep arriving,
    /// so dead entries are swept out once they outnumber the live ones (plus a
    /// slack). A sweep costs O(entries) < 2 x the dead entries it removes, each
    /// made by one abort: O(1) amortized per abort, and memory O(live).
    fn sweep_if_needed(&mut self, slab: &Slab) {
        if self.raw_len() <= Self::max_raw_len(self.len) {
            return;
        }
        let kind = self.kind;
        let live = |h: Handle| slab.get(h).is_some_and(|r| r.queued_in == Some(kind));
        match &mut self.entries {
            Entries::Fcfs(deque) => deque.retain(|&h| live(h)),
            Entries::Priority { heap, .. } => heap.retain(|e| live(e.handle)),
        }
    }

    /// The most entries (dead included) a queue of `len` live requests keeps.
    pub(crate) fn max_raw_len(len: usize) -> usize {
        const SLACK: usize = 64;
        2 * len + SLACK
    }

    /// Live handles in queue order (FCFS) or key order (priority). O(n log n); not for the hot path.
    pub fn live_handles(&self, slab: &Slab) -> Vec<Handle> {
        match &self.entries {
            Entries::Fcfs(deque) => deque.iter().copied().filter(|&h| self.is_live(slab, h)).collect(),
            Entries::Priority { heap, .. } => {
                let mut entries: Vec<&PriorityEntry> = heap.iter().filter(|e| self.is_live(slab, e.handle)).collect();
                entries.sort_by(|a, b| a.key_cmp(b));
                entries.into_iter().map(|e| e.handle).collect()
            }
        }
    }

    /// Every entry, dead ones included, for invariant checks.
    pub(crate) fn raw_len(&self) -> usize {
        match &self.entries {
            Entries::Fcfs(deque) => deque.len(),
            Entries::Priority { heap, .. } => heap.len(),
        }
    }
}
