//! The hinted PLEG dispatcher over the fake runtime, with a fake kernel: a
//! container's process death becomes an exit hint at once, while the runtime
//! shows the exit only after a lag (as containerd does while it reaps and
//! deletes the task). Fast, unprivileged tests of what the dispatcher promises.

use std::sync::Arc;
use std::time::Duration;

use evlet::cache;
use evlet::metrics::Metrics;
use evlet::pleg::Health;
use evlet::pleg::ebpf::Quiet;
use evlet::pleg::hinted::{self, Timing};
use evlet::pleg::hints::Hints;
use evlet::pleg::relist::Relister;
use evlet::pod::{PodUid, labels};
use evlet::runtime::Runtime;
use evlet::sync::Syncer;
use evlet::sync::objects::NoApiServer;
use evlet::sync::spec::NodeContext;
use evlet::workers::{Collaborators, PodWorkers, UpdateKind};
use evlet_cri::fake::FakeServer;
use evlet_cri::{Options, RuntimeClient};
use evlet_testkit::eventually;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "evlet.local/test:v1";

struct Rig {
    _server: FakeServer,
    workers: PodWorkers,
    hints: Arc<Hints>,
    metrics: Arc<Metrics>,
    pods: Arc<std::sync::Mutex<Vec<Pod>>>,
    shutdown: CancellationToken,
    _root: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Short windows so a test sees every phase of an expectation in a second.
fn timing() -> Timing {
    Timing {
        safety: Duration::from_secs(300),
        fast_for: Duration::from_millis(100),
        fast_step: Duration::from_millis(5),
        slow_step: Duration::from_millis(50),
        full_after: Duration::from_secs(5),
        prove_for: Duration::from_secs(1),
        grace: Duration::from_millis(200),
    }
}

/// The kernel of this rig: turns the fake's process deaths into exit hints,
/// and answers quiet proofs after handing over every death so far.
fn fake_kernel(server: &FakeServer, hints: Arc<Hints>, quiet: Arc<Quiet>, stop: CancellationToken) {
    let runtime = server.runtime().clone();
    let drain = move || {
        for death in runtime.take_deaths() {
            if let Some(uid) = death.labels.get(labels::POD_UID) {
                hints.exit(
                    PodUid(uid.clone()),
                    death.container_id,
                    evlet_ebpf::monotonic_ns(),
                );
            }
        }
    };
    tokio::spawn(async move {
        loop {
            let proof = tokio::select! {
                () = stop.cancelled() => return,
                () = quiet.requested() => Some(Instant::now()),
                () = tokio::time::sleep(Duration::from_millis(1)) => None,
            };
            drain();
            if let Some(at) = proof {
                quiet.answer(at);
            }
        }
    });
}

async fn rig(exit_lag: Duration) -> Rig {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    server.runtime().set_exit_lag(exit_lag);
    let client = RuntimeClient::connect(&server.endpoint(), Options::default()).expect("endpoint");
    let root = tempfile::tempdir().expect("root");
    let metrics = Arc::new(Metrics::new());
    let (writer, reader) = cache::new();
    let (events, mut events_rx) = mpsc::channel(1000);
    let shutdown = CancellationToken::new();
    let hints = Arc::new(Hints::default());
    let quiet = Arc::new(Quiet::default());
    let relister = Relister::new(
        Runtime::new(client.clone()),
        writer,
        events,
        Arc::clone(&metrics),
        Arc::new(Health::default()),
    );
    fake_kernel(
        &server,
        Arc::clone(&hints),
        Arc::clone(&quiet),
        shutdown.clone(),
    );
    tokio::spawn(hinted::run(
        relister,
        Arc::clone(&hints),
        Some(quiet),
        timing(),
        Arc::clone(&metrics),
        shutdown.clone(),
    ));
    let node = NodeContext {
        node_name: "n".into(),
        root_dir: root.path().to_path_buf(),
        pods_cgroup: "/evlet-fake/kubepods".into(),
        host_ip: None,
        memory_capacity: 1 << 30,
    };
    let (done_tx, _done) = mpsc::unbounded_channel();
    let workers = PodWorkers::new(
        Collaborators {
            syncer: Arc::new(Syncer::new(
                client,
                node,
                Arc::new(NoApiServer),
                Arc::new(evlet::diagnostics::Diagnostics::default()),
            )),
            cache: reader,
            metrics: Arc::clone(&metrics),
            hints: Some(Arc::clone(&hints)),
            status_sink: None,
            resync: evlet::workers::RESYNC,
        },
        done_tx,
        shutdown.clone(),
    );
    // A minimal sync loop: every PLEG event wakes the pod's worker.
    let w = workers.clone();
    let pods: Arc<std::sync::Mutex<Vec<Pod>>> = Arc::default();
    let known = Arc::clone(&pods);
    tokio::spawn(async move {
        while let Some(e) = events_rx.recv().await {
            let pod = known
                .lock()
                .expect("pods")
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(&e.uid.0))
                .cloned();
            if let Some(p) = pod {
                w.update(p, UpdateKind::Sync);
            }
        }
    });
    Rig {
        _server: server,
        workers,
        hints,
        metrics,
        pods,
        shutdown,
        _root: root,
    }
}

impl Rig {
    fn add(&self, pod: &Pod) {
        self.pods.lock().expect("pods").push(pod.clone());
        self.workers.update(pod.clone(), UpdateKind::Sync);
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} is not exported:\n{text}"))
    }

    /// Asks for a counting full relist, waits for it, and asserts that it
    /// found no change the hints had not announced.
    async fn assert_no_missed_events(&self) {
        let before = self.metric("evlet_pleg_counted_relists_total");
        self.hints.verify();
        eventually(Duration::from_secs(5), "a counting full relist", || async {
            (self.metric("evlet_pleg_counted_relists_total") > before).then_some(())
        })
        .await;
        assert_eq!(
            self.metric("evlet_pleg_missed_events_total"),
            0.0,
            "a full relist found changes no hint announced"
        );
    }

    fn app_running(&self, uid: &str) -> bool {
        self.workers.view(&PodUid::from(uid)).is_some_and(|v| {
            v.status
                .container_statuses
                .iter()
                .flatten()
                .any(|c| c.name == "app" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    }
}

fn quick_init_pod(uid: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - name: init\n    image: {IMAGE}\n    env: [{{name: FAKE_EXIT_CODE, value: '0'}}, {{name: FAKE_RUN_MS, value: '0'}}]\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
    ))
    .expect("pod")
}

/// Issue 22 over the fake: the runtime shows each init container's exit 400 ms
/// after the kernel does (past the 100 ms fast window), while the pod's own
/// SyncPod is still running. Every app container must start within a second
/// or two, long before the 5-minute safety relist, in 20 bursts of 20 pods.
#[tokio::test(flavor = "multi_thread")]
async fn init_containers_that_exit_at_once_never_hold_back_a_burst_behind_a_slow_runtime() {
    let rig = rig(Duration::from_millis(400)).await;
    let mut slowest = Duration::ZERO;
    for burst in 0..20 {
        let uids: Vec<String> = (0..20).map(|i| format!("b{burst}-p{i}")).collect();
        let started = Instant::now();
        for uid in &uids {
            rig.add(&quick_init_pod(uid));
        }
        eventually(
            Duration::from_secs(10),
            &format!("burst {burst}: every app container running"),
            || async { uids.iter().all(|u| rig.app_running(u)).then_some(()) },
        )
        .await;
        slowest = slowest.max(started.elapsed());
        rig.assert_no_missed_events().await;
    }
    eprintln!("slowest burst of 20 pods: {slowest:?}");
    assert!(
        rig.metric("evlet_pleg_expectation_wait_seconds_count") >= 20.0,
        "the exits waited for the runtime, so expectations were exercised"
    );
    assert_eq!(rig.metric("evlet_pleg_expectations"), 0.0, "none left open");
}
