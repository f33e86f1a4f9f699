//! The pod cache: the runtime status of every pod, with one writer (the PLEG
//! relister) and a global "fresh as of" stamp.
//!
//! **Invariant:** only [`CacheWriter`] (owned by the PLEG) writes; pod workers
//! hold a [`PodCache`] and wait in [`PodCache::newer_than`] until the cache has
//! caught up with their own last sync (upstream's `GetNewerThan`). Every relist,
//! full or per-pod, bumps the stamp, so a worker never waits for an event that
//! will not come, and never acts on a cache older than its own actions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use evlet_cri::ContainerId;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lock::lock;
use crate::pod::PodUid;
use crate::runtime::{PodStatus, State};

/// Why a pod's entry holds no status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    /// The runtime answered the pod's status read with an error.
    #[error(transparent)]
    Runtime(#[from] evlet_cri::Error),
    /// The PLEG stopped (the agent is shutting down): nothing newer will come.
    #[error("pod cache writer stopped")]
    WriterStopped,
}

/// One pod's cached status.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The runtime status, or the error reading it.
    pub status: Result<Arc<PodStatus>, CacheError>,
    /// When the relist that produced it started.
    pub modified: Instant,
}

#[derive(Debug)]
struct Inner {
    pods: HashMap<PodUid, Entry>,
    /// Every pod's entry is at least this fresh.
    global: Option<Instant>,
    /// Bumped when a pod joins or leaves the known ones (those the runtime
    /// has something of).
    known_generation: u64,
}

/// Does the runtime have something of the entry's pod?
fn is_known(e: &Entry) -> bool {
    e.status
        .as_ref()
        .is_ok_and(|s| !s.sandboxes.is_empty() || !s.containers.is_empty())
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Bumped on every write so waiters re-check.
    changed: watch::Sender<u64>,
}

/// Read side (cheap to clone).
#[derive(Debug, Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

/// Write side: exactly one exists, owned by the PLEG. It cannot be cloned,
/// so a second writer cannot appear by accident:
///
/// ```compile_fail
/// let (writer, _reader) = evlet::cache::new();
/// let second = writer.clone();
/// ```
#[derive(Debug)]
pub struct CacheWriter {
    shared: Arc<Shared>,
}

/// A new, empty cache: the single writer and a reader.
pub fn new() -> (CacheWriter, PodCache) {
    let (changed, _) = watch::channel(0);
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            pods: HashMap::new(),
            global: None,
            known_generation: 0,
        }),
        changed,
    });
    (
        CacheWriter {
            shared: Arc::clone(&shared),
        },
        PodCache { shared },
    )
}

impl CacheWriter {
    /// Stores `uid`'s status as of `time` (when the read started). An older write
    /// never replaces a newer one.
    pub fn set(&self, uid: &PodUid, status: Result<PodStatus, CacheError>, time: Instant) {
        {
            let mut inner = lock(&self.shared.inner);
            if inner.pods.get(uid).is_some_and(|e| e.modified > time) {
                return;
            }
            let entry = Entry {
                status: status.map(Arc::new),
                modified: time,
            };
            let known = is_known(&entry);
            let was = inner.pods.insert(uid.clone(), entry);
            if was.as_ref().is_some_and(is_known) != known {
                inner.known_generation += 1;
            }
        }
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Declares `uid`'s entry unchanged up to `time` (the kernel proved the pod
    /// quiet; see `pleg::hinted`). Only an entry that holds a status can be
    /// vouched for: returns false for a failed one, and for a missing one
    /// unless `unseen` (the runtime has shown nothing of the pod: it is empty).
    pub fn touch(&self, uid: &PodUid, time: Instant, unseen: bool) -> bool {
        {
            let mut inner = lock(&self.shared.inner);
            match inner.pods.get_mut(uid) {
                Some(e) if e.status.is_ok() => e.modified = e.modified.max(time),
                // An empty entry: not a known pod, the generation stays.
                None if unseen => {
                    let entry = Entry {
                        status: Ok(Arc::new(PodStatus::empty(uid.clone()))),
                        modified: time,
                    };
                    inner.pods.insert(uid.clone(), entry);
                }
                _ => return false,
            }
        }
        self.shared.changed.send_modify(|n| *n += 1);
        true
    }

    /// Drops a pod that no longer exists anywhere.
    pub fn delete(&self, uid: &PodUid) {
        let mut inner = lock(&self.shared.inner);
        if inner.pods.remove(uid).as_ref().is_some_and(is_known) {
            inner.known_generation += 1;
        }
    }

    /// Declares every entry fresh as of `time` (end of a full relist).
    pub fn update_time(&self, time: Instant) {
        {
            let mut inner = lock(&self.shared.inner);
            if inner.global.is_some_and(|g| g >= time) {
                return;
            }
            inner.global = Some(time);
        }
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// A reader of this cache.
    pub fn reader(&self) -> PodCache {
        PodCache {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl PodCache {
    /// The entry of `uid` if any (an absent pod is "no containers").
    pub fn get(&self, uid: &PodUid) -> Option<Entry> {
        lock(&self.shared.inner).pods.get(uid).cloned()
    }

    /// Every pod the runtime has something of (sandboxes or containers).
    pub fn known(&self) -> Vec<Arc<PodStatus>> {
        self.known_where(|_| true)
    }

    /// The pods the runtime has something of for which `keep` holds: only
    /// those are copied out (the housekeeping's orphan check looks at every
    /// pod every 2 s and keeps almost none).
    pub fn known_where(&self, keep: impl Fn(&PodStatus) -> bool) -> Vec<Arc<PodStatus>> {
        lock(&self.shared.inner)
            .pods
            .values()
            .filter(|e| is_known(e))
            .filter_map(|e| e.status.as_ref().ok())
            .filter(|s| keep(s))
            .cloned()
            .collect()
    }

    /// Changes whenever a pod joins or leaves [`known`](Self::known): equal
    /// readings mean the same set of pods.
    pub fn known_generation(&self) -> u64 {
        lock(&self.shared.inner).known_generation
    }

    /// The containers the runtime last reported running, with their pods'
    /// entries (what the log rotation checks: read here, not listed from the
    /// runtime every check).
    pub fn running_containers(&self) -> Vec<ContainerId> {
        lock(&self.shared.inner)
            .pods
            .values()
            .filter_map(|e| e.status.as_ref().ok())
            .flat_map(|s| s.containers.iter())
            .filter(|c| c.state == State::Running)
            .map(|c| c.id.clone())
            .collect()
    }

    /// The global freshness stamp.
    pub fn global(&self) -> Option<Instant> {
        lock(&self.shared.inner).global
    }

    /// The entry of `uid` if it (or the global stamp) is newer than `min`, without waiting.
    pub fn fresh(&self, uid: &PodUid, min: Instant) -> Option<Entry> {
        let inner = lock(&self.shared.inner);
        let entry = inner.pods.get(uid);
        if let Some(e) = entry
            && e.modified > min
        {
            return Some(e.clone());
        }
        if inner.global.is_some_and(|g| g > min) {
            return Some(entry.cloned().unwrap_or(Entry {
                status: Ok(Arc::new(PodStatus::empty(uid.clone()))),
                modified: inner.global.unwrap_or(min),
            }));
        }
        None
    }

    /// Waits until `uid`'s entry (or the global stamp) is newer than `min`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn newer_than(&self, uid: &PodUid, min: Instant) -> Entry {
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if let Some(e) = self.fresh(uid, min) {
                return e;
            }
            if changed.changed().await.is_err() {
                // The writer is gone: nothing newer will come; return what there is.
                return self
                    .fresh(
                        uid,
                        Instant::now() - std::time::Duration::from_secs(1 << 20),
                    )
                    .unwrap_or(Entry {
                        status: Err(CacheError::WriterStopped),
                        modified: min,
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_known_generation_moves_when_a_pod_joins_or_leaves_only() {
        let (writer, cache) = new();
        let uid = PodUid::from("p");
        let with = |state| {
            let mut s = PodStatus::empty(uid.clone());
            s.containers
                .push(crate::runtime::ContainerStatus::test("app", 1, state));
            Ok(s)
        };
        let g0 = cache.known_generation();
        writer.set(&uid, Ok(PodStatus::empty(uid.clone())), Instant::now());
        assert_eq!(cache.known_generation(), g0, "an empty pod is not known");
        writer.set(&uid, with(State::Running), Instant::now());
        let g1 = cache.known_generation();
        assert_ne!(g1, g0, "the pod joined");
        writer.set(&uid, with(State::Exited), Instant::now());
        assert_eq!(cache.known_generation(), g1, "a known pod's new status");
        assert_eq!(cache.running_containers(), Vec::<ContainerId>::new());
        writer.set(&uid, with(State::Running), Instant::now());
        assert_eq!(cache.running_containers(), [ContainerId::new("app1")]);
        writer.delete(&uid);
        assert_ne!(cache.known_generation(), g1, "the pod left");
        assert!(cache.known().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_waits_until_a_relist_newer_than_its_sync() {
        let (writer, cache) = new();
        let uid = PodUid::from("p");
        let t0 = Instant::now();
        writer.set(&uid, Ok(PodStatus::empty(uid.clone())), t0);
        tokio::time::advance(Duration::from_millis(10)).await;
        let synced_at = Instant::now();
        let waiter = tokio::spawn({
            let cache = cache.clone();
            let uid = uid.clone();
            async move { cache.newer_than(&uid, synced_at).await.modified }
        });
        tokio::time::advance(Duration::from_millis(10)).await;
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "an entry from before the sync is not enough"
        );
        let t1 = Instant::now();
        writer.set(&uid, Ok(PodStatus::empty(uid.clone())), t1);
        assert_eq!(waiter.await.expect("join"), t1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_global_stamp_releases_waiters_of_pods_without_events() {
        let (writer, cache) = new();
        let uid = PodUid::from("quiet");
        let since = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.newer_than(&uid, since).await }
        });
        tokio::task::yield_now().await;
        writer.update_time(Instant::now());
        let entry = waiter.await.expect("join");
        assert!(entry.status.expect("empty status").sandboxes.is_empty());
    }

    #[test]
    fn an_older_write_never_replaces_a_newer_one() {
        let (writer, cache) = new();
        let uid = PodUid::from("p");
        let now = Instant::now();
        writer.set(&uid, Ok(PodStatus::empty(uid.clone())), now);
        writer.set(
            &uid,
            Err(CacheError::WriterStopped),
            now - Duration::from_secs(1),
        );
        assert!(cache.get(&uid).expect("entry").status.is_ok());
    }
}
