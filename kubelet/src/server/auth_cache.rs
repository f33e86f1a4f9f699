//! The caches of authentication and authorization answers: each entry lives
//! for its TTL, and a cache holds at most its capacity, the least recently
//! used entry making room for a new one (upstream's authorizer cache is an
//! `LRUExpireCache` of 8192 entries, `k8s.io/apiserver/plugin/pkg/authorizer/webhook`;
//! its token cache keeps each answer for `cacheTTL`, successes and failures
//! alike, `k8s.io/apiserver/pkg/authentication/token/cache`, sized for some
//! 32k tokens in use). A client sending a new bad token with every request
//! therefore costs a bounded amount of memory.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock::lock;

/// Token answers kept at most (upstream's token cache is sized for 32k tokens).
pub const TOKENS: usize = 32 * 1024;
/// Authorization answers kept at most (upstream's `LRUExpireCache(8192)`).
pub const DECISIONS: usize = 8192;

/// A cache bounded by entries and TTL.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    capacity: usize,
    inner: Mutex<Inner<K, V>>,
}

#[derive(Debug)]
struct Inner<K, V> {
    /// Value, expiry, and its place in `order`.
    entries: HashMap<K, (V, Instant, u64)>,
    /// Keys from least to most recently used.
    order: BTreeMap<u64, K>,
    next: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: BTreeMap::new(),
                next: 0,
            }),
        }
    }

    /// The value of `key` if it has not expired (it becomes the most
    /// recently used).
    pub fn get(&self, key: &K) -> Option<V> {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let seq = inner.next;
        let Inner { entries, order, .. } = &mut *inner;
        let (value, expires, place) = entries.get_mut(key)?;
        if *expires <= now {
            order.remove(place);
            entries.remove(key);
            return None;
        }
        let value = value.clone();
        if let Some(k) = order.remove(place) {
            order.insert(seq, k);
        }
        *place = seq;
        inner.next += 1;
        Some(value)
    }

    /// Keeps `value` for `key` for `ttl`, making room by dropping the least
    /// recently used entries.
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        let mut inner = lock(&self.inner);
        let seq = inner.next;
        inner.next += 1;
        if let Some((_, _, place)) = inner.entries.remove(&key) {
            inner.order.remove(&place);
        }
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
        inner.order.insert(seq, key.clone());
        inner
            .entries
            .insert(key, (value, Instant::now() + ttl, seq));
    }

    /// Entries held (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_their_ttl_and_the_least_recently_used_go_first() {
        let cache = TtlCache::new(2);
        cache.insert("a", 1, Duration::from_secs(10));
        cache.insert("b", 2, Duration::from_secs(60));
        assert_eq!(cache.get(&"a"), Some(1), "a is now the most recently used");
        cache.insert("c", 3, Duration::from_secs(60));
        assert_eq!(
            (cache.get(&"a"), cache.get(&"b"), cache.len()),
            (Some(1), None, 2),
            "b was the least recently used"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(cache.get(&"a"), None, "expired");
        assert_eq!(cache.get(&"c"), Some(3));
        assert_eq!(cache.len(), 1, "an expired entry is dropped when read");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_new_keys_never_holds_more_than_the_capacity() {
        let cache = TtlCache::new(100);
        for i in 0..10_000 {
            cache.insert(i, (), Duration::from_secs(120));
        }
        assert_eq!(cache.len(), 100);
        assert_eq!(cache.get(&9_999), Some(()), "the newest stay");
        assert_eq!(cache.get(&0), None);
    }
}
