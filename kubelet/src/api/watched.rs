//! [`ObjectCache`]: the ConfigMaps and Secrets pods refer to, watched, not
//! re-read per pod (upstream's `configMapAndSecretChangeDetectionStrategy:
//! Watch`). One watch per object (a field selector on its name), started on
//! first use and stopped after five minutes unused. Env values and volumes
//! read from here; every change is announced, so the pods that use the object
//! are synced at once and their files follow within seconds (upstream waits
//! for the next periodic sync).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;

/// How long an object may go unread before its watch stops.
pub const IDLE: Duration = Duration::from_secs(300);
/// How long a first read waits for the watch's first list.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// A ConfigMap or a Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl Kind {
    /// `configmap`, `secret` (the API server's not-found wording).
    pub fn lower(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// An object that changed (the sync loop syncs the pods that use it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// ConfigMap or Secret.
    pub kind: Kind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What a watch knows of its object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The first list has not come back yet.
    Syncing,
    /// The object's data: key → bytes (a ConfigMap's `data` and `binaryData`,
    /// a Secret's decoded `data` and `stringData`).
    Present(Arc<BTreeMap<String, Vec<u8>>>),
    /// It does not exist.
    Absent,
}

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to sync {kind} cache: timed out waiting for the condition")]
pub struct NotSynced {
    /// `configmap` or `secret`.
    pub kind: &'static str,
}

struct Entry {
    state: watch::Receiver<Cached>,
    last_used: Instant,
    stop: CancellationToken,
}

/// The watched objects.
pub struct ObjectCache {
    client: kube::Client,
    entries: Mutex<HashMap<(Kind, String, String), Entry>>,
    /// Changes go to the sync loop.
    changed: mpsc::UnboundedSender<Changed>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for ObjectCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("watched", &lock(&self.entries).len())
            .finish()
    }
}

fn config_map_data(cm: ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    data.extend(
        cm.binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0)),
    );
    data
}

fn secret_data(s: Secret) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    data.extend(
        s.string_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes())),
    );
    data
}

impl ObjectCache {
    /// A cache reading with `client`, announcing changes on `changed`; its
    /// watches stop at `shutdown`.
    pub fn new(
        client: kube::Client,
        changed: mpsc::UnboundedSender<Changed>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let cache = Arc::new(Self {
            client,
            entries: Mutex::new(HashMap::new()),
            changed,
            shutdown: shutdown.clone(),
        });
        let weak = Arc::downgrade(&cache);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(cache) = weak.upgrade() else { return };
                cache.stop_idle();
            }
        });
        cache
    }

    /// Stops the watches of objects unread for [`IDLE`].
    fn stop_idle(&self) {
        lock(&self.entries).retain(|(kind, ns, name), e| {
            let keep = e.last_used.elapsed() < IDLE;
            if !keep {
                tracing::debug!(kind = kind.lower(), namespace = %ns, name = %name, "stopping an idle watch");
                e.stop.cancel();
            }
            keep
        });
    }

    /// The object's data, `None` if it does not exist. The first read of an
    /// object starts its watch and waits for its first list.
    ///
    /// # Errors
    /// [`NotSynced`] if the watch did not list within [`SYNC_WAIT`].
    pub async fn get(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<BTreeMap<String, Vec<u8>>>>, NotSynced> {
        let mut state = {
            let mut entries = lock(&self.entries);
            let key = (kind, namespace.to_owned(), name.to_owned());
            let entry = entries
                .entry(key)
                .or_insert_with(|| self.start(kind, namespace, name));
            entry.last_used = Instant::now();
            entry.state.clone()
        };
        let synced =
            tokio::time::timeout(SYNC_WAIT, state.wait_for(|s| *s != Cached::Syncing)).await;
        match synced {
            Ok(Ok(s)) => Ok(match &*s {
                Cached::Present(data) => Some(Arc::clone(data)),
                _ => None,
            }),
            _ => Err(NotSynced { kind: kind.lower() }),
        }
    }

    fn start(&self, kind: Kind, namespace: &str, name: &str) -> Entry {
        let (tx, rx) = watch::channel(Cached::Syncing);
        let stop = self.shutdown.child_token();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let changed = Changed {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let notify = self.changed.clone();
        match kind {
            Kind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
                tokio::spawn(follow(
                    api,
                    config,
                    config_map_data,
                    tx,
                    changed,
                    notify,
                    stop.clone(),
                ));
            }
            Kind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
                tokio::spawn(follow(
                    api,
                    config,
                    secret_data,
                    tx,
                    changed,
                    notify,
                    stop.clone(),
                ));
            }
        }
        Entry {
            state: rx,
            last_used: Instant::now(),
            stop,
        }
    }
}

/// Follows one object's watch into `tx`; a change after the first list is
/// announced on `notify`.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    data: fn(K) -> BTreeMap<String, Vec<u8>>,
    tx: watch::Sender<Cached>,
    changed: Changed,
    notify: mpsc::UnboundedSender<Changed>,
    stop: CancellationToken,
) where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listed: Option<Cached> = None;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let next = match event {
            Ok(Event::Init) => {
                listed = Some(Cached::Absent);
                continue;
            }
            Ok(Event::InitApply(obj)) => {
                listed = Some(Cached::Present(Arc::new(data(obj))));
                continue;
            }
            Ok(Event::InitDone) => listed.take().unwrap_or(Cached::Absent),
            Ok(Event::Apply(obj)) => Cached::Present(Arc::new(data(obj))),
            Ok(Event::Delete(_)) => Cached::Absent,
            Err(e) => {
                tracing::debug!(kind = changed.kind.lower(), name = %changed.name, error = %e, "object watch failed; retrying");
                continue;
            }
        };
        let was_synced = *tx.borrow() != Cached::Syncing;
        let modified = tx.send_if_modified(|current| {
            let differs = *current != next;
            if differs {
                *current = next;
            }
            differs
        });
        if modified && was_synced {
            let _ = notify.send(changed.clone());
        }
    }
}
