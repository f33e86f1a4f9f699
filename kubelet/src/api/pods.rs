//! The API pod source: LIST + WATCH of pods with `spec.nodeName=<node>`
//! (kube-runtime's watcher: relists on 410 Gone, backs off on errors).
//!
//! It keeps its own store and sends whole snapshots to the merger, coalescing
//! the events that are ready at once. Mirror pods (annotation
//! `kubernetes.io/config.mirror`) are not pods to run: they go to the mirror
//! manager and the status manager instead. While the API server is unreachable
//! nothing is sent, so the last snapshot (and every pod) stays.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::pod::{self, PodUid, labels};
use crate::source::{Source, SourceMessage};

/// Mirror pods on this node by `(namespace, name)`.
pub type Mirrors = BTreeMap<(String, String), Pod>;

/// Is `pod` a mirror pod?
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::CONFIG_MIRROR))
}

/// An API pod as the agent uses it: defaulted, with its source annotated.
fn prepare(mut pod: Pod) -> Pod {
    pod::apply_defaults(&mut pod);
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(labels::CONFIG_SOURCE.into(), Source::Api.as_str().into());
    pod
}

/// What the watch knows: this node's pods, prepared, and its mirror pods.
#[derive(Default)]
struct Store {
    pods: BTreeMap<PodUid, Pod>,
    mirrors: Mirrors,
}

impl Store {
    fn from_list(list: BTreeMap<PodUid, Pod>) -> Self {
        let mut store = Self::default();
        for p in list.into_values() {
            store.apply(p);
        }
        store
    }

    /// Adds or replaces `p`. Returns the prepared pod if it is one to run.
    fn apply(&mut self, p: Pod) -> Option<&Pod> {
        if is_mirror(&p) {
            self.mirrors
                .insert((pod::namespace(&p).to_owned(), pod::name(&p).to_owned()), p);
            return None;
        }
        let uid = pod::uid(&p);
        let slot = self.pods.entry(uid).insert_entry(prepare(p));
        Some(slot.into_mut())
    }

    /// Removes `p`. Returns true if it was a pod to run.
    fn delete(&mut self, p: &Pod) -> bool {
        if is_mirror(p) {
            let key = (pod::namespace(p).to_owned(), pod::name(p).to_owned());
            // A mirror recreated under the same name is another pod: keep it.
            if self.mirrors.get(&key).map(pod::uid) == Some(pod::uid(p)) {
                self.mirrors.remove(&key);
            }
            return false;
        }
        self.pods.remove(&pod::uid(p)).is_some()
    }
}

/// Told what the API server holds for this node's pods (mirror pods
/// included), as the watch sees them: the status manager puts right a status
/// another writer changed.
pub trait Observer: Send + Sync {
    /// `pod` as the API server now has it.
    fn seen(&self, pod: &Pod);
    /// The pod of this UID is gone from the API server.
    fn gone(&self, uid: &str);
    /// The watch listed again: these are all the pods there are.
    fn relisted(&self, pods: &mut dyn Iterator<Item = &Pod>);
}

/// Changes to send since the last message: the latest version of each changed
/// pod, `None` if it is gone.
type Pending = BTreeMap<PodUid, Option<Pod>>;

/// Watches this node's pods until `shutdown`, from once `node_synced`
/// resolves.
///
/// As upstream's pod source (`NewSourceApiserver` waits for the node
/// informer's `HasSynced`), no pod is listed before the agent's watch of its
/// own Node has its first list: admission then always judges a pod against
/// the live Node (labels, taints), never against none. The first complete
/// list (and every relist) goes to the merger as a snapshot; after that only
/// the pods that changed are sent, so one watch event costs the same at 10
/// pods and at 500.
pub async fn run(
    client: kube::Client,
    node: String,
    node_synced: impl std::future::Future<Output = ()> + Send,
    tx: mpsc::Sender<SourceMessage>,
    mirrors: watch::Sender<Mirrors>,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
) {
    tracing::debug!(node = %node, "waiting for the node watch to sync before watching pods");
    tokio::select! {
        () = shutdown.cancelled() => return,
        () = node_synced => {}
    }
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut store = Store::default();
    let mut initial: Option<BTreeMap<PodUid, Pod>> = None;
    let mut synced = false;
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let Some(first) = first else { return };
        let mut listed = false;
        let mut pending = Pending::new();
        let mut mirrors_changed = false;
        let mut next = Some(first);
        // Apply every event that is ready now, then send one message.
        while let Some(ev) = next {
            match ev {
                Ok(Event::Init) => initial = Some(BTreeMap::new()),
                Ok(Event::InitApply(p)) => {
                    if let Some(m) = initial.as_mut() {
                        m.insert(pod::uid(&p), p);
                    }
                }
                Ok(Event::InitDone) => {
                    store = Store::from_list(initial.take().unwrap_or_default());
                    observer.relisted(&mut store.pods.values().chain(store.mirrors.values()));
                    if !synced {
                        tracing::info!(node = %node, pods = store.pods.len(), "API pod source synced");
                    }
                    synced = true;
                    listed = true;
                    mirrors_changed = true;
                    pending.clear();
                }
                Ok(Event::Apply(p)) => {
                    observer.seen(&p);
                    let uid = pod::uid(&p);
                    match store.apply(p) {
                        Some(prepared) => {
                            pending.insert(uid, Some(prepared.clone()));
                        }
                        None => mirrors_changed = true,
                    }
                }
                Ok(Event::Delete(p)) => {
                    observer.gone(&pod::uid(&p).0);
                    mirrors_changed |= is_mirror(&p);
                    if store.delete(&p) {
                        pending.insert(pod::uid(&p), None);
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "watching this node's pods failed; retrying (pods keep running)");
                }
            }
            next = stream.next().now_or_never().flatten();
        }
        if !synced {
            continue;
        }
        if mirrors_changed {
            mirrors.send_replace(store.mirrors.clone());
        }
        let message = if listed {
            SourceMessage::Snapshot(
                Source::Api,
                store.pods.values().cloned().map(Arc::new).collect(),
            )
        } else if pending.is_empty() {
            continue;
        } else {
            let (mut upserts, mut removed) = (Vec::new(), Vec::new());
            for (uid, p) in pending {
                match p {
                    Some(p) => upserts.push(Arc::new(p)),
                    None => removed.push(uid),
                }
            }
            SourceMessage::Changes {
                source: Source::Api,
                upserts,
                removed,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = tx.send(message) => if r.is_err() { return },
        }
    }
}
