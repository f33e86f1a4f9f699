//! The pod workers over the fake CRI runtime, with the generic relist every
//! 20 ms and a minimal sync loop (PLEG events and changed probe verdicts wake
//! the pod's worker): shared by the `*_fake` tests.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::sync::Arc;
use std::time::Duration;

use evlet::cache;
use evlet::metrics::Metrics;
use evlet::pleg::relist::Relister;
use evlet::pleg::{Health, generic};
use evlet::pod::PodUid;
use evlet::runtime::Runtime;
use evlet::sync::Syncer;
use evlet::sync::objects::NoApiServer;
use evlet::sync::spec::NodeContext;
use evlet::workers::{Collaborators, PodWorkers, UpdateKind};
use evlet_cri::fake::FakeServer;
use evlet_cri::{Options, RuntimeClient};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const IMAGE: &str = "evlet.local/test:v1";

pub struct Rig {
    pub server: FakeServer,
    pub diagnostics: Arc<evlet::diagnostics::Diagnostics>,
    pub workers: PodWorkers,
    pub done: mpsc::UnboundedReceiver<PodUid>,
    /// The pods the mini sync loop knows.
    pub pods: Arc<std::sync::Mutex<Vec<Pod>>>,
    pub shutdown: CancellationToken,
    pub _root: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn rig() -> Rig {
    rig_with(Arc::new(NoApiServer)).await
}

/// The rig with `objects` as the source of Secrets, ConfigMaps, RuntimeClass
/// handlers and Services.
pub async fn rig_with(objects: Arc<dyn evlet::sync::objects::EnvObjects>) -> Rig {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    let client = RuntimeClient::connect(&server.endpoint(), Options::default()).expect("endpoint");
    let root = tempfile::tempdir().expect("root");
    let metrics = Arc::new(Metrics::new());
    let (writer, reader) = cache::new();
    let (events, mut events_rx) = mpsc::channel(1000);
    let shutdown = CancellationToken::new();
    let relister = Relister::new(
        Runtime::new(client.clone()),
        writer,
        events,
        Arc::clone(&metrics),
        Arc::new(Health::default()),
        Arc::new(evlet::diagnostics::Diagnostics::default()),
    );
    tokio::spawn(generic::run(
        relister,
        Duration::from_millis(20),
        shutdown.clone(),
    ));
    let node = NodeContext {
        node_name: "n".into(),
        root_dir: root.path().to_path_buf(),
        cgroups: evlet::cm::Names::new(evlet::cm::Driver::Cgroupfs, "/evlet-fake"),
        host_ip: None,
        memory_capacity: 1 << 30,
        parallel_pod_starts: evlet::config::DEFAULT_PARALLEL_POD_STARTS,
        ..Default::default()
    };
    let (done_tx, done) = mpsc::unbounded_channel();
    let diagnostics = Arc::new(evlet::diagnostics::Diagnostics::default());
    let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
    let prober = evlet::prober::Prober::new(
        client.clone(),
        Arc::clone(&diagnostics) as _,
        Arc::clone(&metrics),
        probe_tx,
        shutdown.clone(),
    );
    let workers = PodWorkers::new(
        Collaborators {
            syncer: Arc::new(Syncer::new(
                client,
                node,
                objects,
                Arc::new(evlet::volume::VolumeManager::new(
                    root.path().to_path_buf(),
                    Arc::new(evlet::volume::NoApiServer),
                    evlet::volume::NodeFacts::default(),
                )),
                Arc::new(evlet::cm::CgroupManager::off()),
                Arc::clone(&diagnostics) as _,
                Arc::clone(&metrics),
            )),
            cache: reader,
            metrics,
            hints: None,
            status_sink: None,
            resync: evlet::workers::RESYNC,
            prober,
        },
        done_tx,
        shutdown.clone(),
    );
    // A minimal sync loop: every PLEG event and changed probe verdict wakes the pod's worker.
    let w = workers.clone();
    let pods: Arc<std::sync::Mutex<Vec<Pod>>> = Arc::default();
    let known = Arc::clone(&pods);
    tokio::spawn(async move {
        loop {
            let uid = tokio::select! {
                Some(e) = events_rx.recv() => e.uid.0,
                Some(u) = probe_rx.recv() => u.uid.0,
                else => return,
            };
            let pod = known
                .lock()
                .expect("pods")
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(&uid))
                .cloned();
            if let Some(p) = pod {
                w.update(p, UpdateKind::Sync);
            }
        }
    });
    Rig {
        server,
        diagnostics,
        workers,
        done,
        pods,
        shutdown,
        _root: root,
    }
}

/// Registers `pod` with the mini sync loop and sends its first update.
pub fn add(rig: &Rig, pod: &Pod) {
    rig.pods.lock().expect("pods").push(pod.clone());
    rig.workers.update(pod.clone(), UpdateKind::Sync);
}

pub fn pod(uid: &str, yaml_containers: &str) -> Pod {
    serde_yaml::from_str(&format!("metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{yaml_containers}")).expect("pod")
}

pub fn phase(rig: &Rig, uid: &str) -> Option<String> {
    rig.workers
        .view(&PodUid::from(uid))
        .and_then(|v| v.status.phase)
}
