//! [`Hints`]: what the hint sources and the pod workers tell the dispatcher.
//!
//! It is a set, not a queue (design invariant 5): a pod hinted a thousand times
//! before the dispatcher gets to it is relisted once; nothing can overflow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::pod::PodUid;

#[derive(Debug, Default)]
struct Inner {
    /// Pods to relist, with the earliest hint's CLOCK_MONOTONIC origin (ns), if known.
    dirty: BTreeMap<PodUid, Option<u64>>,
    /// Pods whose SyncPod is running: their relists wait (invariant 4).
    suspended: BTreeSet<PodUid>,
    /// A full relist is needed, and why.
    full: Option<String>,
    /// Pods hinted since the last full relist (for missed-event counting).
    hinted: BTreeSet<PodUid>,
    /// Pods whose workers wait for an entry newer than this (their last sync).
    wanted: BTreeMap<PodUid, Instant>,
}

/// The shared hint set.
#[derive(Debug, Default)]
pub struct Hints {
    inner: Mutex<Inner>,
    notify: Notify,
}

/// What the dispatcher should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A full relist, for this reason.
    Full(String),
    /// Relist this pod; the hint's monotonic origin if any.
    Pod(PodUid, Option<u64>),
    /// These pods' workers want an entry newer than the instant given: prove
    /// them quiet (or relist them).
    Fresh(Vec<(PodUid, Instant)>),
    /// Nothing to do now.
    Idle,
}

impl Hints {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pod `uid` may have changed (kernel or runtime event at `origin_ns`, CLOCK_MONOTONIC).
    pub fn pod(&self, uid: PodUid, origin_ns: Option<u64>) {
        {
            let mut inner = self.lock();
            inner.hinted.insert(uid.clone());
            let slot = inner.dirty.entry(uid).or_insert(origin_ns);
            *slot = match (*slot, origin_ns) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        self.notify.notify_one();
    }

    /// A worker of `uid` waits for a cache entry newer than `since`. No hint
    /// says the pod changed, so the dispatcher may vouch for the entry it has
    /// instead of reading the runtime again.
    pub fn fresh(&self, uid: PodUid, since: Instant) {
        {
            let mut inner = self.lock();
            let slot = inner.wanted.entry(uid).or_insert(since);
            *slot = (*slot).max(since);
        }
        self.notify.notify_one();
    }

    /// Is `uid` free of pending work (no hint, no SyncPod, no full relist due)?
    pub fn settled(&self, uid: &PodUid) -> bool {
        let inner = self.lock();
        inner.full.is_none() && !inner.dirty.contains_key(uid) && !inner.suspended.contains(uid)
    }

    /// Everything must be relisted (events were lost, a reader restarted, ...).
    pub fn full(&self, reason: impl Into<String>) {
        self.lock().full.get_or_insert_with(|| reason.into());
        self.notify.notify_one();
    }

    /// SyncPod started for `uid`: hold its relists.
    pub fn suspend(&self, uid: PodUid) {
        self.lock().suspended.insert(uid);
    }

    /// SyncPod ended for `uid`: one merged relist now if it changed anything or
    /// hints arrived meanwhile.
    pub fn resume(&self, uid: PodUid, changed: bool) {
        {
            let mut inner = self.lock();
            inner.suspended.remove(&uid);
            inner.hinted.insert(uid.clone());
            if changed {
                inner.dirty.entry(uid).or_insert(None);
            }
        }
        self.notify.notify_one();
    }

    /// Takes the next unit of work: a full relist first, then a pod that is not
    /// suspended, then the pods whose workers want freshness.
    pub fn next(&self) -> Next {
        let mut inner = self.lock();
        if let Some(reason) = inner.full.take() {
            return Next::Full(reason);
        }
        let ready = inner
            .dirty
            .keys()
            .find(|uid| !inner.suspended.contains(*uid))
            .cloned();
        match ready {
            Some(uid) => {
                let origin = inner.dirty.remove(&uid).flatten();
                Next::Pod(uid, origin)
            }
            None if !inner.wanted.is_empty() => {
                Next::Fresh(std::mem::take(&mut inner.wanted).into_iter().collect())
            }
            None => Next::Idle,
        }
    }

    /// Puts a pod back after a failed relist (keeps the earliest origin).
    pub fn retry(&self, uid: PodUid, origin_ns: Option<u64>) {
        let mut inner = self.lock();
        let slot = inner.dirty.entry(uid).or_insert(origin_ns);
        *slot = slot.or(origin_ns);
    }

    /// Pods hinted (or synced, or pending) since the previous call; resets the record.
    pub fn take_hinted(&self) -> BTreeSet<PodUid> {
        let mut inner = self.lock();
        let mut set = std::mem::take(&mut inner.hinted);
        set.extend(inner.dirty.keys().cloned());
        set.extend(inner.suspended.iter().cloned());
        set
    }

    /// Waits until something is added.
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_hints_for_one_pod_make_one_relist_with_the_earliest_origin() {
        let h = Hints::default();
        for t in [30, 10, 20] {
            h.pod(PodUid::from("a"), Some(t));
        }
        assert_eq!(h.next(), Next::Pod(PodUid::from("a"), Some(10)));
        assert_eq!(h.next(), Next::Idle);
    }

    #[test]
    fn a_syncing_pod_is_held_and_relisted_once_after() {
        let h = Hints::default();
        h.suspend(PodUid::from("a"));
        h.pod(PodUid::from("a"), Some(5));
        h.pod(PodUid::from("b"), None);
        assert_eq!(h.next(), Next::Pod(PodUid::from("b"), None));
        assert_eq!(h.next(), Next::Idle, "a is suspended");
        h.resume(PodUid::from("a"), true);
        assert_eq!(h.next(), Next::Pod(PodUid::from("a"), Some(5)));
        assert_eq!(h.next(), Next::Idle);
    }

    #[test]
    fn a_full_relist_comes_first_and_hinted_pods_are_remembered() {
        let h = Hints::default();
        h.pod(PodUid::from("a"), None);
        h.full("lost events");
        assert_eq!(h.next(), Next::Full("lost events".into()));
        assert!(h.take_hinted().contains(&PodUid::from("a")));
        assert!(
            h.take_hinted().contains(&PodUid::from("a")),
            "still dirty, so still counted"
        );
    }

    #[test]
    fn freshness_wanted_comes_after_hinted_pods_with_the_latest_instant() {
        let h = Hints::default();
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_millis(1);
        h.fresh(PodUid::from("a"), t1);
        h.fresh(PodUid::from("a"), t0);
        h.pod(PodUid::from("b"), None);
        assert!(h.settled(&PodUid::from("a")));
        assert!(!h.settled(&PodUid::from("b")), "b has a hint");
        assert_eq!(h.next(), Next::Pod(PodUid::from("b"), None));
        assert_eq!(h.next(), Next::Fresh(vec![(PodUid::from("a"), t1)]));
        assert_eq!(h.next(), Next::Idle);
        h.suspend(PodUid::from("a"));
        assert!(!h.settled(&PodUid::from("a")), "a is in a SyncPod");
        h.resume(PodUid::from("a"), false);
        h.full("test");
        assert!(!h.settled(&PodUid::from("a")), "a full relist is due");
    }
}
