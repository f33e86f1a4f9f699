//! `PodConfig`: merges the pod sources into one stream of ADD / UPDATE / REMOVE /
//! RECONCILE updates, and tracks which sources have reported (`sourcesReady`).
//!
//! Every source sends whole snapshots; the merger diffs each against that
//! source's previous snapshot (upstream's `PodConfigNotificationIncremental`).
//! A pod is held once: the merger, the sync loop and the pod's worker share
//! its `Arc`, and a snapshot's unchanged pods keep the one already held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{self, PodUid, labels};

/// A pod source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The static manifest directory (`--pod-manifest-path`).
    File,
    /// The manifest URL (`--manifest-url`).
    Http,
    /// The API server (pods bound to this node).
    Api,
}

impl Source {
    /// The name used in annotations and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Http => "http",
            Source::Api => "api",
        }
    }
}

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// New pods.
    Add,
    /// Pods whose spec (or labels, annotations, deletion) changed.
    Update,
    /// Pods gone from their source.
    Remove,
    /// Pods whose status alone changed (API pods).
    Reconcile,
}

/// One update for the sync loop.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    /// What changed.
    pub op: Op,
    /// The pods it changed.
    pub pods: Vec<Arc<Pod>>,
    /// Where they come from.
    pub source: Source,
}

/// The merge state.
#[derive(Debug)]
pub struct PodConfig {
    expected: BTreeSet<Source>,
    seen: BTreeSet<Source>,
    pods: BTreeMap<Source, BTreeMap<PodUid, Arc<Pod>>>,
}

/// Do `a` and `b` differ in the parts whose change is an UPDATE (spec, labels,
/// annotations but `config.seen`, deletion)? A status-only change is a RECONCILE.
fn semantic_change(a: &Pod, b: &Pod) -> bool {
    fn annotations(p: &Pod) -> Vec<(&String, &String)> {
        p.metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != labels::CONFIG_SEEN)
            .collect()
    }
    a.spec != b.spec
        || a.metadata.labels != b.metadata.labels
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
        || a.metadata.deletion_grace_period_seconds != b.metadata.deletion_grace_period_seconds
        || annotations(a) != annotations(b)
}

/// The updates one merge implies, by operation.
#[derive(Default)]
struct Changes {
    adds: Vec<Arc<Pod>>,
    updates: Vec<Arc<Pod>>,
    removes: Vec<Arc<Pod>>,
    reconciles: Vec<Arc<Pod>>,
}

impl Changes {
    /// Files `new` by how it differs from `old` (its previous version, if
    /// any); returns the version to hold: `old` itself when nothing an update
    /// carries changed, so that the one copy stays shared.
    fn classify(&mut self, old: Option<&Arc<Pod>>, new: Arc<Pod>) -> Arc<Pod> {
        let list = match old {
            None => &mut self.adds,
            Some(prev) if Arc::ptr_eq(prev, &new) => return new,
            Some(prev) if semantic_change(prev, &new) => &mut self.updates,
            Some(prev) if prev.status != new.status => &mut self.reconciles,
            Some(prev) => return Arc::clone(prev),
        };
        list.push(Arc::clone(&new));
        new
    }

    fn into_updates(self, source: Source) -> Vec<PodUpdate> {
        [
            (Op::Add, self.adds),
            (Op::Update, self.updates),
            (Op::Remove, self.removes),
            (Op::Reconcile, self.reconciles),
        ]
        .into_iter()
        .filter(|(_, pods)| !pods.is_empty())
        .map(|(op, pods)| PodUpdate { op, pods, source })
        .collect()
    }
}

impl PodConfig {
    /// A merger that is ready once every source in `expected` has reported.
    pub fn new(expected: impl IntoIterator<Item = Source>) -> Self {
        Self {
            expected: expected.into_iter().collect(),
            seen: BTreeSet::new(),
            pods: BTreeMap::new(),
        }
    }

    /// True once every configured source has sent at least one snapshot.
    pub fn sources_ready(&self) -> bool {
        self.expected.is_subset(&self.seen)
    }

    /// Applies `source`'s full snapshot and returns the updates it implies.
    pub fn merge(&mut self, source: Source, snapshot: Vec<Arc<Pod>>) -> Vec<PodUpdate> {
        self.seen.insert(source);
        let old = self.pods.remove(&source).unwrap_or_default();
        let mut changes = Changes::default();
        let snapshot: BTreeMap<PodUid, Arc<Pod>> =
            snapshot.into_iter().map(|p| (pod::uid(&p), p)).collect();
        let new: BTreeMap<PodUid, Arc<Pod>> = snapshot
            .into_iter()
            .map(|(uid, p)| {
                let held = changes.classify(old.get(&uid), p);
                (uid, held)
            })
            .collect();
        for (uid, p) in old {
            if !new.contains_key(&uid) {
                changes.removes.push(p);
            }
        }
        self.pods.insert(source, new);
        changes.into_updates(source)
    }

    /// Applies changes to `source`'s set: `upserts` are new or changed pods,
    /// `removed` are gone. Costs what changed, not the size of the set.
    pub fn apply(
        &mut self,
        source: Source,
        upserts: Vec<Arc<Pod>>,
        removed: Vec<PodUid>,
    ) -> Vec<PodUpdate> {
        let pods = self.pods.entry(source).or_default();
        let mut changes = Changes::default();
        for p in upserts {
            let uid = pod::uid(&p);
            let held = changes.classify(pods.get(&uid), p);
            pods.insert(uid, held);
        }
        for uid in removed {
            if let Some(p) = pods.remove(&uid) {
                changes.removes.push(p);
            }
        }
        changes.into_updates(source)
    }

    /// Every pod of every source.
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.pods
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod")
    }

    fn arcs(pods: Vec<Pod>) -> Vec<Arc<Pod>> {
        pods.into_iter().map(Arc::new).collect()
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(Op, Vec<String>)> {
        updates
            .iter()
            .map(|u| (u.op, u.pods.iter().map(|p| crate::pod::uid(p).0).collect()))
            .collect()
    }

    #[test]
    fn snapshots_become_add_update_remove() {
        let mut c = PodConfig::new([Source::File, Source::Http]);
        assert_eq!(
            ops(&c.merge(Source::File, arcs(vec![p("a", "i:1"), p("b", "i:1")]))),
            [(Op::Add, vec!["a".into(), "b".into()])]
        );
        assert!(!c.sources_ready(), "http has not reported yet");
        assert!(c.merge(Source::Http, arcs(vec![])).is_empty());
        assert!(c.sources_ready());
        assert_eq!(
            ops(&c.merge(Source::File, arcs(vec![p("a", "i:2"), p("c", "i:1")]))),
            [
                (Op::Add, vec!["c".into()]),
                (Op::Update, vec!["a".into()]),
                (Op::Remove, vec!["b".into()])
            ]
        );
        assert!(
            c.merge(Source::File, arcs(vec![p("a", "i:2"), p("c", "i:1")]))
                .is_empty(),
            "no change, no update"
        );
        let mut seen_again = p("c", "i:1");
        seen_again.metadata.annotations =
            Some([(labels::CONFIG_SEEN.to_owned(), "later".to_owned())].into());
        assert!(
            c.merge(Source::File, arcs(vec![p("a", "i:2"), seen_again]))
                .is_empty(),
            "config.seen alone is no update"
        );
        let mut labelled = p("c", "i:1");
        labelled.metadata.labels = Some([("tier".to_owned(), "web".to_owned())].into());
        assert_eq!(
            ops(&c.merge(Source::File, arcs(vec![p("a", "i:2"), labelled]))),
            [(Op::Update, vec!["c".into()])]
        );
    }

    #[test]
    fn status_only_changes_are_reconciles() {
        let mut c = PodConfig::new([Source::Api]);
        c.merge(Source::Api, arcs(vec![p("a", "i:1")]));
        let mut changed = p("a", "i:1");
        changed.status = Some(Default::default());
        assert_eq!(
            ops(&c.merge(Source::Api, arcs(vec![changed]))),
            [(Op::Reconcile, vec!["a".into()])]
        );
    }

    #[test]
    fn changes_touch_only_the_pods_they_name() {
        let mut c = PodConfig::new([Source::Api]);
        c.merge(Source::Api, arcs(vec![p("a", "i:1"), p("b", "i:1")]));
        assert!(c.apply(Source::Api, arcs(vec![]), vec![]).is_empty());
        let mut a_status = p("a", "i:1");
        a_status.status = Some(Default::default());
        let updates = c.apply(
            Source::Api,
            arcs(vec![a_status, p("b", "i:2"), p("c", "i:1")]),
            vec!["gone".into()],
        );
        assert_eq!(
            ops(&updates),
            [
                (Op::Add, vec!["c".into()]),
                (Op::Update, vec!["b".into()]),
                (Op::Reconcile, vec!["a".into()]),
            ],
            "an unknown removal is ignored"
        );
        assert_eq!(
            ops(&c.apply(Source::Api, arcs(vec![]), vec!["a".into()])),
            [(Op::Remove, vec!["a".into()])]
        );
        let mut left: Vec<String> = c.all().iter().map(|p| crate::pod::uid(p).0).collect();
        left.sort();
        assert_eq!(
            left,
            ["b", "c"],
            "the set after changes is what a snapshot would hold"
        );
    }
}
