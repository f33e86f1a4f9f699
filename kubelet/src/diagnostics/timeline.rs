//! Pod timelines: what happened to each pod, from every part of the agent
//! (kernel events, CRI calls, PLEG events, syncs, status publishes, probe
//! results, Kubernetes events), in a bounded ring per pod. Pure: the caller
//! gives the time; `store` writes them to disk.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Entries kept per pod (oldest dropped first).
pub const KEEP_ENTRIES: usize = 128;
/// Pods kept (the least recently touched dropped first).
pub const KEEP_PODS: usize = 256;
/// An entry's text is cut to this many bytes.
const WHAT_MAX: usize = 400;

/// Which part of the agent an entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The eBPF probes (process exits, OOM kills).
    Kernel,
    /// A call to the container runtime.
    Cri,
    /// A PLEG event.
    Pleg,
    /// A pod sync.
    Sync,
    /// A status publish.
    Status,
    /// A probe result change.
    Probe,
    /// A Kubernetes event about the pod.
    Event,
}

impl Source {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Cri => "cri",
            Self::Pleg => "pleg",
            Self::Sync => "sync",
            Self::Status => "status",
            Self::Probe => "probe",
            Self::Event => "event",
        }
    }
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Wall-clock Unix nanoseconds.
    pub unix_ns: i64,
    /// Where it comes from.
    pub source: Source,
    /// What happened.
    pub what: String,
}

/// One pod's timeline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTimeline {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace (empty until a worker names it).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Single-pod relists made for it.
    pub relists: u64,
    /// What happened, oldest first.
    pub entries: VecDeque<Entry>,
    /// When it was last touched (a sequence number), for eviction.
    #[serde(default)]
    pub touched: u64,
    /// Its containers' names by container ID, as the syncer created them: a
    /// kernel record about a container the pod cache does not show yet (an
    /// OOM kill right after the start) still names it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub containers: std::collections::BTreeMap<String, String>,
}

/// Every kept timeline.
#[derive(Debug, Default)]
pub struct Timelines {
    pods: HashMap<String, PodTimeline>,
    seq: u64,
    /// Changed since the last [`Timelines::take_changes`].
    dirty: BTreeSet<String>,
    /// Dropped since then.
    dropped: BTreeSet<String>,
}

impl Timelines {
    /// Timelines loaded from disk.
    pub fn from_loaded(loaded: Vec<PodTimeline>) -> Self {
        let mut t = Self::default();
        for p in loaded {
            t.seq = t.seq.max(p.touched);
            t.pods.insert(p.uid.clone(), p);
        }
        t.evict();
        t.dropped.clear();
        t
    }

    fn pod(&mut self, uid: &str) -> &mut PodTimeline {
        self.seq += 1;
        let seq = self.seq;
        self.dirty.insert(uid.to_owned());
        self.dropped.remove(uid);
        let p = self
            .pods
            .entry(uid.to_owned())
            .or_insert_with(|| PodTimeline {
                uid: uid.to_owned(),
                ..PodTimeline::default()
            });
        p.touched = seq;
        p
    }

    /// Adds an entry to `uid`'s timeline.
    pub fn record(&mut self, uid: &str, unix_ns: i64, source: Source, what: String) {
        if uid.is_empty() {
            return;
        }
        let mut what = what;
        if what.len() > WHAT_MAX {
            let mut cut = WHAT_MAX;
            while !what.is_char_boundary(cut) {
                cut -= 1;
            }
            what.truncate(cut);
            what.push('…');
        }
        let p = self.pod(uid);
        if p.entries.len() >= KEEP_ENTRIES {
            p.entries.pop_front();
        }
        p.entries.push_back(Entry {
            unix_ns,
            source,
            what,
        });
        self.evict();
    }

    /// Names `uid`'s timeline (a worker knows the pod).
    pub fn name(&mut self, uid: &str, namespace: &str, name: &str) {
        if self
            .pods
            .get(uid)
            .is_some_and(|p| p.namespace == namespace && p.name == name)
        {
            return;
        }
        let p = self.pod(uid);
        p.namespace = namespace.to_owned();
        p.name = name.to_owned();
        self.evict();
    }

    /// Counts a single-pod relist of a pod with a timeline (not written to
    /// disk on its own).
    pub fn relisted(&mut self, uid: &str) {
        if let Some(p) = self.pods.get_mut(uid) {
            p.relists += 1;
        }
    }

    fn evict(&mut self) {
        while self.pods.len() > KEEP_PODS {
            let Some(oldest) = self
                .pods
                .values()
                .min_by_key(|p| p.touched)
                .map(|p| p.uid.clone())
            else {
                return;
            };
            self.pods.remove(&oldest);
            self.dirty.remove(&oldest);
            self.dropped.insert(oldest);
        }
    }

    /// Notes that the pod `uid`'s container `id` is named `name`.
    pub fn name_container(&mut self, uid: &str, id: &str, name: &str) {
        self.pod(uid)
            .containers
            .insert(id.to_owned(), name.to_owned());
    }

    /// The namespace, name and container name known for the pod `uid` and its
    /// container `id` (empty strings where unknown); None: no timeline.
    pub fn identify(&self, uid: &str, id: &str) -> Option<(String, String, String)> {
        let p = self.pods.get(uid)?;
        Some((
            p.namespace.clone(),
            p.name.clone(),
            p.containers.get(id).cloned().unwrap_or_default(),
        ))
    }

    /// The timeline of the pod `uid`.
    pub fn get(&self, uid: &str) -> Option<&PodTimeline> {
        self.pods.get(uid)
    }

    /// The timeline of the pod `namespace/name` (the most recently touched,
    /// if several pods of that name were kept).
    pub fn find(&self, namespace: &str, name: &str) -> Option<&PodTimeline> {
        self.pods
            .values()
            .filter(|p| p.namespace == namespace && p.name == name)
            .max_by_key(|p| p.touched)
    }

    /// Single-pod relists per kept pod: (namespace/name or UID, count).
    pub fn relists(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .pods
            .values()
            .filter(|p| p.relists > 0)
            .map(|p| {
                let key = if p.name.is_empty() {
                    p.uid.clone()
                } else {
                    format!("{}/{}", p.namespace, p.name)
                };
                (key, p.relists)
            })
            .collect();
        v.sort();
        v
    }

    /// Whether a timeline changed or a pod was dropped since the last
    /// [`Self::take_changes`].
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || !self.dropped.is_empty()
    }

    /// What changed and what was dropped since the last call.
    pub fn take_changes(&mut self) -> (Vec<PodTimeline>, Vec<String>) {
        let changed = std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|uid| self.pods.get(&uid).cloned())
            .collect();
        let dropped = std::mem::take(&mut self.dropped).into_iter().collect();
        (changed, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_known_until_taken() {
        let mut t = Timelines::default();
        assert!(!t.has_changes());
        t.record("u0", 1, Source::Kernel, "exit".into());
        assert!(t.has_changes());
        let (changed, dropped) = t.take_changes();
        assert_eq!((changed.len(), dropped.len()), (1, 0));
        assert!(!t.has_changes(), "nothing new to flush");
    }

    #[test]
    fn a_dropped_timeline_started_again_is_found_by_uid_only() {
        let mut t = Timelines::default();
        t.name("u0", "default", "p0");
        for i in 1..=KEEP_PODS {
            t.record(&format!("u{i}"), 1, Source::Kernel, "exit".into());
        }
        assert!(t.get("u0").is_none(), "the least recently touched went");
        t.record("u0", 2, Source::Kernel, "exit".into());
        assert!(
            t.find("default", "p0").is_none(),
            "no name: the worker named it once"
        );
        assert_eq!(t.get("u0").map(|p| p.entries.len()), Some(1));
    }

    #[test]
    fn each_pod_keeps_its_newest_entries_and_the_least_recent_pods_go() {
        let mut t = Timelines::default();
        for i in 0..(KEEP_ENTRIES + 5) {
            t.record("a", i as i64, Source::Sync, format!("sync {i}"));
        }
        t.name("a", "ns", "pod-a");
        let a = t.find("ns", "pod-a").expect("timeline");
        assert_eq!(a.entries.len(), KEEP_ENTRIES);
        assert_eq!(a.entries.front().map(|e| e.unix_ns), Some(5));
        for i in 0..KEEP_PODS {
            t.record(&format!("p{i}"), 0, Source::Event, "x".into());
        }
        assert!(t.find("ns", "pod-a").is_none(), "the least recent pod went");
        let (changed, dropped) = t.take_changes();
        assert_eq!(dropped, ["a"]);
        assert_eq!(changed.len(), KEEP_PODS);
        assert_eq!(t.take_changes(), (Vec::new(), Vec::new()));
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let mut t = Timelines::default();
        t.record("a", 0, Source::Event, "é".repeat(WHAT_MAX));
        let (changed, _) = t.take_changes();
        let what = &changed[0].entries[0].what;
        assert!(what.len() <= WHAT_MAX + '…'.len_utf8());
        assert!(what.ends_with('…'));
    }

    #[test]
    fn a_container_the_syncer_named_is_identified_by_its_id() {
        let mut t = Timelines::default();
        assert_eq!(t.identify("a", "c1"), None);
        t.name("a", "ns", "p");
        t.name_container("a", "c1", "hog");
        assert_eq!(
            t.identify("a", "c1"),
            Some(("ns".into(), "p".into(), "hog".into()))
        );
        assert_eq!(
            t.identify("a", "c2"),
            Some(("ns".into(), "p".into(), String::new()))
        );
    }

    #[test]
    fn loaded_timelines_come_back_findable() {
        let mut t = Timelines::default();
        t.name("a", "ns", "p");
        t.record("a", 7, Source::Kernel, "init exited".into());
        let (saved, _) = t.take_changes();
        let json = serde_json::to_string(&saved).expect("json");
        let loaded: Vec<PodTimeline> = serde_json::from_str(&json).expect("parse");
        let t = Timelines::from_loaded(loaded);
        assert_eq!(t.find("ns", "p").map(|p| p.entries.len()), Some(1));
    }
}
