//! The paged KV cache: the block pool, block hashing for the prefix cache, and
//! the manager that hands blocks to requests.

pub mod block_pool;
pub mod events;
pub mod groups;
pub mod layout;
pub mod manager;
pub mod prefix;
pub mod residency;

pub use block_pool::{BlockHash, BlockPool, NULL_BLOCK};
pub use events::KvEvent;
pub use layout::{BlockTable, CacheHit};
pub use manager::{KvManager, PrefixCacheStats, SlotRequest};
pub use residency::EvictionEvent;
