//! [`Hints`]: what the hint sources and the pod workers tell the dispatcher.
//!
//! It is a set, not a queue (design invariant 5): a pod hinted a thousand times
//! before the dispatcher gets to it is relisted once; nothing can overflow.
//! A kernel hint that a container's init exited names the container
//! ([`Hints::exit`]): the dispatcher then keeps the pod "expecting" until the
//! runtime shows that container stopped (see `pleg::hinted`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::process::Process;
use crate::pod::PodUid;

/// What the kernel knows for certain about a container's death: the process
/// that exited is the one the runtime named as the container's init, so
/// this is the container's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRecord {
    /// The exit code as runtimes report it (`128 + signal`, or the status).
    pub exit_code: i32,
    /// When it exited (wall clock, Unix ns: the kernel's time, converted once).
    pub finished_unix_ns: i64,
    /// The kernel's OOM killer killed the init (directly or by a group kill).
    pub oom: bool,
    /// The init process that exited: before the record is believed, this
    /// process must be gone (a status that is never wrong).
    pub process: Process,
}

/// A kernel report that a container's (or sandbox's) init exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelExit {
    /// CLOCK_MONOTONIC ns of the exit.
    pub at: u64,
    /// What the status may show at once; `None` when the init is only
    /// presumed (the runtime has not named it yet) or the container's cgroup
    /// went: then the runtime decides.
    pub record: Option<ExitRecord>,
}

/// What the hints say about one pod since the dispatcher last took it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dirty {
    /// The earliest hint's CLOCK_MONOTONIC origin (ns), if any hint carried one.
    pub origin: Option<u64>,
    /// Containers (or sandboxes) whose init process the kernel saw exit (the
    /// earliest report of each).
    pub exits: BTreeMap<String, KernelExit>,
}

impl Dirty {
    fn merge(&mut self, other: Dirty) {
        self.origin = match (self.origin, other.origin) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for (id, exit) in other.exits {
            let slot = self.exits.entry(id).or_insert(exit);
            if exit.at < slot.at {
                *slot = exit;
            }
        }
    }
}

/// Why everything must be relisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The agent started.
    Start,
    /// The safety period passed.
    Periodic,
    /// A test (or an operator) asked for a counting relist.
    Verification,
    /// The kernel lost ring-buffer records.
    LostEvents,
    /// The eBPF reader died and was replaced.
    ReaderRestarted,
    /// The eBPF ring buffer could not be opened.
    ReaderUnavailable,
    /// A kernel event came from a pod cgroup nobody knows.
    UnknownCgroup,
    /// The container runtime restarted (a new process answers its socket).
    RuntimeRestarted,
    /// A runtime read failed as unavailable; relist once it answers again.
    RuntimeUnavailable,
    /// The runtime has not shown a kernel-reported exit for a long time.
    UnconfirmedExit,
    /// The CRI event stream (re)connected: it has no replay.
    StreamConnected,
    /// The CRI event stream was lost.
    StreamLost,
    /// A CRI event named no pod.
    StreamEventWithoutPod,
}

impl Reason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Periodic => "periodic",
            Reason::Verification => "verification",
            Reason::LostEvents => "lost_events",
            Reason::ReaderRestarted => "reader_restarted",
            Reason::ReaderUnavailable => "reader_unavailable",
            Reason::UnknownCgroup => "unknown_cgroup",
            Reason::RuntimeRestarted => "runtime_restarted",
            Reason::RuntimeUnavailable => "runtime_unavailable",
            Reason::UnconfirmedExit => "unconfirmed_exit",
            Reason::StreamConnected => "stream_connected",
            Reason::StreamLost => "stream_lost",
            Reason::StreamEventWithoutPod => "stream_event_without_pod",
        }
    }
}

/// A full relist that was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Full {
    reason: Reason,
    /// Further reasons asked for while it was pending (each is counted).
    also: Vec<Reason>,
    /// Details for the log.
    detail: String,
    /// Count the changes it finds that no hint announced (missed events).
    counting: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// Pods to relist and what their hints said.
    dirty: BTreeMap<PodUid, Dirty>,
    /// Pods whose SyncPod (or GC of their containers) is running, with how
    /// many are: their relists wait until the last one ends (invariant 4).
    suspended: BTreeMap<PodUid, u32>,
    /// A full relist is needed, and why.
    full: Option<Full>,
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
    /// A full relist, for this reason; `counting`: count missed events.
    Full {
        /// Why (the first request).
        reason: Reason,
        /// Further reasons that asked for it while it was pending.
        also: Vec<Reason>,
        /// Details for the log.
        detail: String,
        /// Whether changes no hint announced are counted as missed events.
        counting: bool,
    },
    /// Relist this pod; what its hints said.
    Pod(PodUid, Dirty),
    /// These pods' workers want an entry newer than the instant given: prove
    /// them quiet (or relist them).
    Fresh(Vec<(PodUid, Instant)>),
    /// Nothing to do now.
    Idle,
}

impl Full {
    /// Counts `reason` with this relist too (once).
    fn also_for(&mut self, reason: Reason) {
        if self.reason != reason && !self.also.contains(&reason) {
            self.also.push(reason);
        }
    }
}

impl Hints {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::lock::lock(&self.inner)
    }

    fn add(&self, uid: PodUid, dirty: Dirty) {
        self.lock().dirty.entry(uid).or_default().merge(dirty);
        self.notify.notify_one();
    }

    /// Pod `uid` may have changed (kernel or runtime event at `origin_ns`, CLOCK_MONOTONIC).
    pub fn pod(&self, uid: PodUid, origin_ns: Option<u64>) {
        self.add(
            uid,
            Dirty {
                origin: origin_ns,
                exits: BTreeMap::new(),
            },
        );
    }

    /// The kernel saw the init process of `container` (a container or sandbox
    /// ID of pod `uid`) exit: the pod is kept "expecting" until the runtime
    /// shows it stopped, and an exit with a record is in the status at once.
    pub fn exit(&self, uid: PodUid, container: String, exit: KernelExit) {
        self.add(
            uid,
            Dirty {
                origin: Some(exit.at),
                exits: [(container, exit)].into(),
            },
        );
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

    /// Does `uid` have a hint waiting or a SyncPod running (a relist is coming)?
    pub fn pending(&self, uid: &PodUid) -> bool {
        let inner = self.lock();
        inner.dirty.contains_key(uid) || inner.suspended.contains_key(uid)
    }

    /// Is `uid` in a SyncPod (its relists are held)?
    pub fn suspended(&self, uid: &PodUid) -> bool {
        self.lock().suspended.contains_key(uid)
    }

    /// Is `uid` free of pending work (no hint, no SyncPod, no full relist due)?
    pub fn settled(&self, uid: &PodUid) -> bool {
        let inner = self.lock();
        inner.full.is_none() && !inner.dirty.contains_key(uid) && !inner.suspended.contains_key(uid)
    }

    /// Everything must be relisted (events were lost, a reader restarted, ...).
    /// Requests coalesce into one relist: the first reason and its details
    /// lead, and every other reason is counted with it.
    pub fn full(&self, reason: Reason, detail: impl Into<String>) {
        {
            let mut inner = self.lock();
            match &mut inner.full {
                Some(full) => full.also_for(reason),
                None => {
                    inner.full = Some(Full {
                        reason,
                        also: Vec::new(),
                        detail: detail.into(),
                        counting: false,
                    });
                }
            }
        }
        self.notify.notify_one();
    }

    /// Asks for a full relist that counts every change no hint announced as a
    /// missed event (tests check the hint path with it; the periodic safety
    /// relist does the same).
    pub fn verify(&self) {
        self.lock()
            .full
            .get_or_insert_with(|| Full {
                reason: Reason::Verification,
                also: Vec::new(),
                detail: String::new(),
                counting: true,
            })
            .counting = true;
        self.notify.notify_one();
    }

    /// SyncPod (or another of the agent's own runtime changes) started for
    /// `uid`: hold its relists until every such change has ended.
    pub fn suspend(&self, uid: PodUid) {
        *self.lock().suspended.entry(uid).or_default() += 1;
    }

    /// SyncPod ended for `uid`: one merged relist now if it changed anything or
    /// hints arrived meanwhile (they stayed in the set while it ran).
    pub fn resume(&self, uid: PodUid, changed: bool) {
        {
            let mut inner = self.lock();
            if let Some(n) = inner.suspended.get_mut(&uid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    inner.suspended.remove(&uid);
                }
            }
            if changed {
                inner.dirty.entry(uid).or_default();
            }
        }
        self.notify.notify_one();
    }

    /// Takes the next unit of work: a full relist first, then a pod that is not
    /// suspended, then the pods whose workers want freshness.
    pub fn next(&self) -> Next {
        let mut inner = self.lock();
        if let Some(Full {
            reason,
            also,
            detail,
            counting,
        }) = inner.full.take()
        {
            return Next::Full {
                reason,
                also,
                detail,
                counting,
            };
        }
        let ready = inner
            .dirty
            .keys()
            .find(|uid| !inner.suspended.contains_key(*uid))
            .cloned();
        match ready {
            Some(uid) => {
                let dirty = inner.dirty.remove(&uid).unwrap_or_default();
                Next::Pod(uid, dirty)
            }
            None if !inner.wanted.is_empty() => {
                Next::Fresh(std::mem::take(&mut inner.wanted).into_iter().collect())
            }
            None => Next::Idle,
        }
    }

    /// Puts a pod's hints back after a failed relist.
    pub fn retry(&self, uid: PodUid, dirty: Dirty) {
        self.lock().dirty.entry(uid).or_default().merge(dirty);
    }

    /// Puts a full relist back after it failed (keeps it counting if it was).
    pub fn retry_full(&self, reason: Reason, also: Vec<Reason>, detail: String, counting: bool) {
        let mut inner = self.lock();
        let full = inner.full.get_or_insert(Full {
            reason,
            also: Vec::new(),
            detail,
            counting: false,
        });
        for r in also.into_iter().chain([reason]) {
            full.also_for(r);
        }
        full.counting |= counting;
    }

    /// Waits until something is added.
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(origin: Option<u64>) -> Dirty {
        Dirty {
            origin,
            exits: BTreeMap::new(),
        }
    }

    #[test]
    fn many_hints_for_one_pod_make_one_relist_with_the_earliest_origin() {
        let h = Hints::default();
        for t in [30, 10, 20] {
            h.pod(PodUid::from("a"), Some(t));
        }
        assert_eq!(h.next(), Next::Pod(PodUid::from("a"), plain(Some(10))));
        assert_eq!(h.next(), Next::Idle);
    }

    fn at(t: u64) -> KernelExit {
        KernelExit {
            at: t,
            record: None,
        }
    }

    #[test]
    fn exits_name_their_containers_and_keep_each_ones_earliest_report() {
        let h = Hints::default();
        h.exit(PodUid::from("a"), "c1".into(), at(30));
        h.exit(PodUid::from("a"), "c1".into(), at(20));
        h.exit(PodUid::from("a"), "c2".into(), at(40));
        h.pod(PodUid::from("a"), Some(5));
        assert_eq!(
            h.next(),
            Next::Pod(
                PodUid::from("a"),
                Dirty {
                    origin: Some(5),
                    exits: [("c1".into(), at(20)), ("c2".into(), at(40))].into()
                }
            )
        );
    }

    #[test]
    fn an_exit_during_a_sync_survives_the_suspension() {
        let h = Hints::default();
        h.suspend(PodUid::from("a"));
        h.exit(PodUid::from("a"), "init".into(), at(5));
        h.pod(PodUid::from("b"), None);
        assert!(h.pending(&PodUid::from("a")));
        assert_eq!(h.next(), Next::Pod(PodUid::from("b"), plain(None)));
        assert_eq!(h.next(), Next::Idle, "a is suspended");
        h.resume(PodUid::from("a"), false);
        assert_eq!(
            h.next(),
            Next::Pod(
                PodUid::from("a"),
                Dirty {
                    origin: Some(5),
                    exits: [("init".into(), at(5))].into()
                }
            ),
            "the exit is still there, though the sync changed nothing"
        );
        assert_eq!(h.next(), Next::Idle);
    }

    #[test]
    fn a_pod_stays_suspended_until_every_suspender_resumed() {
        let h = Hints::default();
        h.suspend(PodUid::from("a"));
        h.suspend(PodUid::from("a"));
        h.resume(PodUid::from("a"), true);
        assert!(h.suspended(&PodUid::from("a")), "one change still runs");
        assert_eq!(h.next(), Next::Idle);
        h.resume(PodUid::from("a"), false);
        assert_eq!(h.next(), Next::Pod(PodUid::from("a"), plain(None)));
    }

    #[test]
    fn a_full_relist_comes_first_and_a_verification_makes_it_count() {
        let h = Hints::default();
        h.pod(PodUid::from("a"), None);
        h.full(Reason::LostEvents, "3 lost");
        h.full(Reason::RuntimeRestarted, "pid 1 -> 2");
        h.verify();
        assert_eq!(
            h.next(),
            Next::Full {
                reason: Reason::LostEvents,
                also: vec![Reason::RuntimeRestarted],
                detail: "3 lost".into(),
                counting: true
            },
            "one relist, every reason counted"
        );
        assert_eq!(h.next(), Next::Pod(PodUid::from("a"), plain(None)));
        h.retry_full(Reason::RuntimeUnavailable, vec![], "down".into(), true);
        assert_eq!(
            h.next(),
            Next::Full {
                reason: Reason::RuntimeUnavailable,
                also: vec![],
                detail: "down".into(),
                counting: true
            }
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
        assert_eq!(h.next(), Next::Pod(PodUid::from("b"), plain(None)));
        assert_eq!(h.next(), Next::Fresh(vec![(PodUid::from("a"), t1)]));
        assert_eq!(h.next(), Next::Idle);
        h.suspend(PodUid::from("a"));
        assert!(!h.settled(&PodUid::from("a")), "a is in a SyncPod");
        h.resume(PodUid::from("a"), false);
        h.full(Reason::Start, "");
        assert!(!h.settled(&PodUid::from("a")), "a full relist is due");
    }
}
