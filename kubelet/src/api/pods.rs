//! The API pod source: LIST + WATCH of pods with `spec.nodeName=<node>`
//! (kube-runtime's watcher: relists on 410 Gone, backs off on errors).
//!
//! It keeps its own store and sends whole snapshots to the merger, coalescing
//! the events that are ready at once. Mirror pods (annotation
//! `kubernetes.io/config.mirror`) are not pods to run: they go to the mirror
//! manager and the status manager instead. While the API server is unreachable
//! nothing is sent, so the last snapshot (and every pod) stays.

use std::collections::BTreeMap;

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

/// Watches this node's pods until `shutdown`.
pub async fn run(
    client: kube::Client,
    node: String,
    tx: mpsc::Sender<SourceMessage>,
    mirrors: watch::Sender<Mirrors>,
    shutdown: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut store: BTreeMap<PodUid, Pod> = BTreeMap::new();
    let mut initial: Option<BTreeMap<PodUid, Pod>> = None;
    let mut synced = false;
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let Some(first) = first else { return };
        let mut dirty = false;
        let mut next = Some(first);
        // Apply every event that is ready now, then send one snapshot.
        while let Some(ev) = next {
            match ev {
                Ok(Event::Init) => initial = Some(BTreeMap::new()),
                Ok(Event::InitApply(p)) => {
                    if let Some(m) = initial.as_mut() {
                        m.insert(pod::uid(&p), p);
                    }
                }
                Ok(Event::InitDone) => {
                    store = initial.take().unwrap_or_default();
                    if !synced {
                        tracing::info!(node = %node, pods = store.len(), "API pod source synced");
                    }
                    synced = true;
                    dirty = true;
                }
                Ok(Event::Apply(p)) => {
                    store.insert(pod::uid(&p), p);
                    dirty = true;
                }
                Ok(Event::Delete(p)) => {
                    store.remove(&pod::uid(&p));
                    dirty = true;
                }
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "watching this node's pods failed; retrying (pods keep running)");
                }
            }
            next = stream.next().now_or_never().flatten();
        }
        if dirty && synced {
            let (pods, found) = split(&store);
            mirrors.send_replace(found);
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = tx.send(SourceMessage::Snapshot(Source::Api, pods)) => if r.is_err() { return },
            }
        }
    }
}

fn split(store: &BTreeMap<PodUid, Pod>) -> (Vec<Pod>, Mirrors) {
    let mut pods = Vec::new();
    let mut mirrors = Mirrors::new();
    for p in store.values() {
        if is_mirror(p) {
            mirrors.insert(
                (pod::namespace(p).to_owned(), pod::name(p).to_owned()),
                p.clone(),
            );
        } else {
            pods.push(prepare(p.clone()));
        }
    }
    (pods, mirrors)
}
