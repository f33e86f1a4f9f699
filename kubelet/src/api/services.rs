//! [`ServiceCache`]: every Service of the cluster, watched once (as upstream's
//! service informer) for the service environment variables of containers.

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio_util::sync::CancellationToken;

/// The cluster's Services, as last listed and watched.
#[derive(Clone)]
pub struct ServiceCache {
    store: Store<Service>,
}

impl std::fmt::Debug for ServiceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCache")
            .field("services", &self.store.state().len())
            .finish()
    }
}

impl ServiceCache {
    /// Starts the watch of all Services; it stops at `shutdown`.
    pub fn start(client: kube::Client, shutdown: CancellationToken) -> Arc<Self> {
        let (store, writer) = reflector::store();
        let api: Api<Service> = Api::all(client);
        // Headless services carry no variables: not even listed (upstream's selector).
        let config = watcher::Config::default().fields("spec.clusterIP!=None");
        let stream = watcher::watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::debug!(error = %e, "service watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        Arc::new(Self { store })
    }

    /// Has the first list come back?
    pub async fn wait_ready(&self, limit: std::time::Duration) -> bool {
        tokio::time::timeout(limit, self.store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The variables of a container in `namespace`: the `kubernetes` service
    /// of `default` always, the namespace's own services with `links`.
    pub fn env(&self, namespace: &str, links: bool) -> Vec<(String, String)> {
        let mut services: Vec<Arc<Service>> = self
            .store
            .state()
            .into_iter()
            .filter(|s| {
                let ns = s.metadata.namespace.as_deref().unwrap_or("");
                let name = s.metadata.name.as_deref().unwrap_or("");
                (ns == "default" && name == "kubernetes") || (links && ns == namespace)
            })
            .collect();
        services.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        services.dedup_by(|a, b| a.metadata.name == b.metadata.name);
        crate::envvars::from_services(services.iter().map(|s| s.as_ref()))
    }
}
