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
use evlet::pleg::hints::{ExitRecord, Hints, KernelExit, Reason};
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
    server: FakeServer,
    workers: PodWorkers,
    hints: Arc<Hints>,
    metrics: Arc<Metrics>,
    cache: evlet::cache::PodCache,
    kernel: Arc<std::sync::Mutex<Kernel>>,
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
        prove_for: Duration::from_millis(200),
        grace: Duration::from_millis(200),
    }
}

/// How the fake kernel behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// Deaths become exit hints; proofs are answered after each drain.
    Normal,
    /// The reader is dead: no hints, no proofs.
    Dead,
    /// The loss counter cannot be read: hints flow, proofs are not given.
    LossUnreadable,
    /// The next drain finds lost records: a full relist is asked for, then
    /// the proof is answered (as the real reader does).
    LossFound,
}

/// The kernel of this rig: turns the fake's process deaths into exit hints,
/// and answers quiet proofs after handing over every death so far, through
/// the same `Quiet::drained` rule as the real reader.
fn fake_kernel(
    server: &FakeServer,
    hints: Arc<Hints>,
    quiet: Arc<Quiet>,
    mode: Arc<std::sync::Mutex<Kernel>>,
    stop: CancellationToken,
) {
    let runtime = server.runtime().clone();
    tokio::spawn(async move {
        loop {
            let proof = tokio::select! {
                () = stop.cancelled() => return,
                () = quiet.requested() => Some(Instant::now()),
                () = tokio::time::sleep(Duration::from_millis(1)) => None,
            };
            let now = *mode.lock().expect("mode");
            if now == Kernel::Dead {
                continue;
            }
            for death in runtime.take_deaths() {
                if let Some(uid) = death.labels.get(labels::POD_UID) {
                    // Every fake container has a PID namespace of its own:
                    // the kernel's record is certain.
                    hints.exit(
                        PodUid(uid.clone()),
                        death.container_id,
                        KernelExit {
                            at: evlet_ebpf::monotonic_ns(),
                            record: Some(ExitRecord {
                                exit_code: death.exit_code,
                                finished_unix_ns: death.at_ns,
                                oom: death.reason == "OOMKilled",
                            }),
                        },
                    );
                }
            }
            if now == Kernel::LossFound && proof.is_some() {
                hints.full(Reason::LostEvents, "fake kernel");
                *mode.lock().expect("mode") = Kernel::Normal;
            }
            if let Some(at) = proof {
                quiet.drained(at, now != Kernel::LossUnreadable);
            }
        }
    });
}

/// The hint source of a rig.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The fake kernel (`ebpf` mode's shape, with quiet proofs).
    Kernel,
    /// The fake runtime's CRI event stream (`cri-events` mode).
    CriEvents,
}

async fn rig(exit_lag: Duration) -> Rig {
    rig_with(exit_lag, Source::Kernel).await
}

async fn rig_with(exit_lag: Duration, source: Source) -> Rig {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    server.runtime().set_exit_lag(exit_lag);
    let client = RuntimeClient::connect(&server.endpoint(), Options::default()).expect("endpoint");
    let root = tempfile::tempdir().expect("root");
    let metrics = Arc::new(Metrics::new());
    let (writer, reader) = cache::new();
    let reader_for_tests = reader.clone();
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
        Arc::new(evlet::diagnostics::Diagnostics::default()),
    );
    let kernel = Arc::new(std::sync::Mutex::new(Kernel::Normal));
    match source {
        Source::Kernel => fake_kernel(
            &server,
            Arc::clone(&hints),
            Arc::clone(&quiet),
            Arc::clone(&kernel),
            shutdown.clone(),
        ),
        Source::CriEvents => {
            tokio::spawn(evlet::pleg::cri_events::run(
                client.clone(),
                Arc::clone(&hints),
                shutdown.clone(),
            ));
        }
    }
    tokio::spawn(hinted::run(
        relister,
        Arc::clone(&hints),
        (source == Source::Kernel).then_some(quiet),
        timing(),
        Arc::clone(&metrics),
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
    let (done_tx, _done) = mpsc::unbounded_channel();
    let diagnostics = Arc::new(evlet::diagnostics::Diagnostics::default());
    // No probes in these pods: the prober's updates go nowhere.
    let (probe_tx, _) = mpsc::unbounded_channel();
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
                Arc::new(NoApiServer),
                Arc::new(evlet::volume::VolumeManager::new(
                    root.path().to_path_buf(),
                    Arc::new(evlet::volume::NoApiServer),
                    evlet::volume::NodeFacts::default(),
                )),
                Arc::new(evlet::cm::CgroupManager::off()),
                diagnostics,
                Arc::clone(&metrics),
            )),
            cache: reader,
            metrics: Arc::clone(&metrics),
            hints: Some(Arc::clone(&hints)),
            status_sink: None,
            resync: evlet::workers::RESYNC,
            prober,
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
        server,
        workers,
        hints,
        metrics,
        cache: reader_for_tests,
        kernel,
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

    fn set_kernel(&self, k: Kernel) {
        *self.kernel.lock().expect("mode") = k;
    }

    /// Full relists done for `reason` (0 before the first).
    fn full_relists(&self, reason: &str) -> f64 {
        let name = format!("evlet_pleg_full_relists_total{{reason=\"{reason}\"}}");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Asks for `uid`'s entry newer than 10 ms ago, as a worker's periodic sync does,
    /// and says how the dispatcher answered within `limit` (`None`: not yet).
    async fn freshness(&self, uid: &str, limit: Duration) -> Option<Answer> {
        let proofs = self.metric("evlet_pleg_quiet_proofs_total");
        let relists = self.metric("evlet_pleg_pod_relist_duration_seconds_count");
        // A worker asks for an entry newer than its last sync, a while ago
        // (a proof vouches up to its drain, minus 2 ms for records in flight).
        // Work already under way (a relist in flight) may land meanwhile: pick
        // an instant after which the entry stayed as it was.
        let mut since = Instant::now();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if self.cache.fresh(&PodUid::from(uid), since).is_none() {
                break;
            }
            since = Instant::now();
        }
        assert!(
            self.cache.fresh(&PodUid::from(uid), since).is_none(),
            "the entry keeps changing by itself"
        );
        self.hints.fresh(PodUid::from(uid), since);
        let fresh = tokio::time::timeout(limit, async {
            while self.cache.fresh(&PodUid::from(uid), since).is_none() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .is_ok();
        if !fresh {
            assert_eq!(
                self.metric("evlet_pleg_quiet_proofs_total"),
                proofs,
                "no proof for a pod that is not fresh"
            );
            return None;
        }
        Some(if self.metric("evlet_pleg_quiet_proofs_total") > proofs {
            Answer::Proven
        } else if self.metric("evlet_pleg_pod_relist_duration_seconds_count") > relists {
            Answer::Relisted
        } else {
            Answer::FullRelist
        })
    }

    fn app_id(&self, uid: &str) -> evlet_cri::ContainerId {
        let state = self.server.runtime().snapshot();
        let id = state
            .containers
            .values()
            .filter(|c| c.config.labels.get(labels::POD_UID).map(String::as_str) == Some(uid))
            .find(|c| c.config.metadata.as_ref().is_some_and(|m| m.name == "app"))
            .map(|c| c.id.clone())
            .expect("the app container");
        evlet_cri::ContainerId::new(id)
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

/// How a freshness request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A quiet proof vouched for the entry (no runtime read).
    Proven,
    /// The pod was read again.
    Relisted,
    /// A full relist stamped every entry.
    FullRelist,
}

fn app_pod(uid: &str, policy: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
    ))
    .expect("pod")
}

/// Starts an app pod and waits until it runs and its post-sync relist is done.
async fn running_pod(rig: &Rig, uid: &str) {
    running_pod_with(rig, uid, "Always").await;
}

async fn running_pod_with(rig: &Rig, uid: &str, policy: &str) {
    rig.add(&app_pod(uid, policy));
    eventually(Duration::from_secs(10), "the app running", || async {
        rig.app_running(uid).then_some(())
    })
    .await;
    eventually(Duration::from_secs(5), "the pod settled", || async {
        (rig.hints.settled(&PodUid::from(uid)) && rig.metric("evlet_pleg_expectations") == 0.0)
            .then_some(())
    })
    .await;
    // The start's own PLEG events wake the worker a few more times.
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    // Kernel-first: the apps run before the runtime shows the inits' exits,
    // so the last burst's expectations close a runtime lag later.
    eventually(
        Duration::from_secs(3),
        "every expectation confirmed",
        || async { (rig.metric("evlet_pleg_expectations") == 0.0).then_some(()) },
    )
    .await;
}

/// A quiet pod's freshness is proven without a runtime read; every condition
/// under which the kernel cannot vouch for it makes the dispatcher read it.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_proof_is_refused_whenever_the_kernel_cannot_vouch_for_the_pod() {
    let rig = rig(Duration::from_millis(500)).await;
    running_pod(&rig, "q").await;
    let limit = Duration::from_secs(3);
    assert_eq!(
        rig.freshness("q", limit).await,
        Some(Answer::Proven),
        "quiet: proven"
    );
    // A pod no listing has shown anything of (a new pod's first sync): its
    // emptiness is proven too, without a read.
    assert_eq!(
        rig.freshness("new", limit).await,
        Some(Answer::Proven),
        "an unseen pod: proven"
    );
    let entry = rig
        .cache
        .get(&PodUid::from("new"))
        .and_then(|e| e.status.ok());
    assert!(
        entry.is_some_and(|s| s.sandboxes.is_empty() && s.containers.is_empty()),
        "and empty"
    );

    // A SyncPod running with a hint pending: nothing answers until it ends.
    rig.hints.suspend(PodUid::from("q"));
    rig.hints.pod(PodUid::from("q"), None);
    assert_eq!(
        rig.freshness("q", Duration::from_millis(300)).await,
        None,
        "held while it syncs"
    );
    rig.hints.resume(PodUid::from("q"), false);
    eventually(limit, "the held hint relisted", || async {
        rig.hints.settled(&PodUid::from("q")).then_some(())
    })
    .await;

    for (kernel, why) in [
        (Kernel::Dead, "a dead reader"),
        (Kernel::LossUnreadable, "an unreadable loss counter"),
    ] {
        rig.set_kernel(kernel);
        assert_eq!(
            rig.freshness("q", limit).await,
            Some(Answer::Relisted),
            "{why}: relisted"
        );
        rig.set_kernel(Kernel::Normal);
    }

    let lost = rig.full_relists("lost_events");
    rig.set_kernel(Kernel::LossFound);
    let answer = rig.freshness("q", limit).await;
    assert_ne!(
        answer,
        Some(Answer::Proven),
        "a full relist due: not proven"
    );
    assert!(answer.is_some(), "the full relist answers");
    assert!(rig.full_relists("lost_events") > lost, "and it ran");

    // The kernel saw the app die; the runtime shows it 500 ms later.
    assert!(
        rig.server
            .runtime()
            .exit_container(&rig.app_id("q"), 137, "Error")
    );
    eventually(limit, "the expectation open", || async {
        (rig.metric("evlet_pleg_expectations") == 1.0).then_some(())
    })
    .await;
    let answer = rig.freshness("q", limit).await;
    assert_ne!(
        answer,
        Some(Answer::Proven),
        "an unconfirmed exit: not proven"
    );
}

/// Invariant 4 holds for expectations too: while the pod's SyncPod runs, its
/// unconfirmed exit is not polled; afterwards it is, and it is confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn an_expected_exit_is_not_polled_while_its_pod_syncs() {
    let rig = rig(Duration::from_millis(800)).await;
    // Never: the worker's own sync after the exit restarts nothing.
    running_pod_with(&rig, "s", "Never").await;
    assert!(
        rig.server
            .runtime()
            .exit_container(&rig.app_id("s"), 137, "Error")
    );
    eventually(Duration::from_secs(3), "the expectation open", || async {
        (rig.metric("evlet_pleg_expectations") == 1.0).then_some(())
    })
    .await;
    rig.hints.suspend(PodUid::from("s"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let polls = rig.server.runtime().calls("ContainerStatus");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rig.server.runtime().calls("ContainerStatus"),
        polls,
        "no poll while the pod syncs"
    );
    rig.hints.resume(PodUid::from("s"), false);
    eventually(Duration::from_secs(3), "the exit confirmed", || async {
        (rig.metric("evlet_pleg_expectations") == 0.0).then_some(())
    })
    .await;
    assert!(
        rig.server.runtime().calls("ContainerStatus") > polls,
        "polled after"
    );
}

/// The CRI event stream has no replay: losing it costs a full relist, and so
/// does each reconnection.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_cri_event_stream_costs_a_full_relist() {
    let rig = rig_with(Duration::ZERO, Source::CriEvents).await;
    eventually(Duration::from_secs(5), "the stream connected", || async {
        (rig.full_relists("stream_connected") >= 1.0).then_some(())
    })
    .await;
    rig.server.runtime().drop_event_streams();
    eventually(
        Duration::from_secs(3),
        "a full relist for the lost stream",
        || async { (rig.full_relists("stream_lost") >= 1.0).then_some(()) },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "reconnected and relisted",
        || async { (rig.full_relists("stream_connected") >= 2.0).then_some(()) },
    )
    .await;
}

/// Kernel-first exits: with the runtime 2 s behind, a killed container shows
/// terminated (the kernel's code) at once, and its replacement starts before
/// the runtime has shown the old one's exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_exit_is_in_the_status_and_restarts_the_container_before_the_runtime_shows_it() {
    let rig = rig(Duration::from_secs(2)).await;
    running_pod(&rig, "k").await;
    let old = rig.app_id("k");
    let killed = Instant::now();
    assert!(rig.server.runtime().exit_container(&old, 137, "Error"));
    let restarted = eventually(
        Duration::from_secs(5),
        "the replacement running",
        || async {
            let view = rig.workers.view(&PodUid::from("k"))?;
            let app = view
                .status
                .container_statuses?
                .into_iter()
                .find(|c| c.name == "app")?;
            (app.restart_count == 1 && app.state.as_ref()?.running.is_some()).then_some(app)
        },
    )
    .await;
    let took = killed.elapsed();
    let last = restarted
        .last_state
        .and_then(|l| l.terminated)
        .expect("lastState terminated");
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("Error"))
    );
    let state = rig.server.runtime().snapshot();
    assert_eq!(
        state.containers[old.as_str()].state,
        evlet_cri::api::ContainerState::ContainerRunning,
        "the runtime had not shown the exit when the replacement ran ({took:?})"
    );
    assert!(took < Duration::from_secs(1), "restarted in {took:?}");
    eventually(Duration::from_secs(5), "the runtime confirms", || async {
        (rig.metric("evlet_pleg_expectations") == 0.0).then_some(())
    })
    .await;
}

/// Where the runtime reports another exit code than the kernel's, the kernel's
/// stands and the disagreement is counted once.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_that_disagrees_with_the_kernel_is_counted_and_the_kernel_wins() {
    let rig = rig(Duration::from_millis(200)).await;
    running_pod(&rig, "d").await;
    rig.server.runtime().report_exit_code(Some(255));
    let old = rig.app_id("d");
    assert!(rig.server.runtime().exit_container(&old, 137, "Error"));
    eventually(
        Duration::from_secs(5),
        "the disagreement counted",
        || async {
            let metrics = rig.metrics.encode();
            metrics
                .lines()
                .any(|l| l == r#"evlet_pleg_runtime_disagreements_total{field="exit_code"} 1"#)
                .then_some(())
        },
    )
    .await;
    let last = eventually(Duration::from_secs(5), "the restart", || async {
        rig.workers
            .view(&PodUid::from("d"))?
            .status
            .container_statuses?
            .into_iter()
            .find(|c| c.name == "app" && c.restart_count == 1)?
            .last_state?
            .terminated
    })
    .await;
    assert_eq!(
        last.exit_code, 137,
        "the kernel's code, not the runtime's 255"
    );
}

/// `kubelet_running_pods` and `kubelet_running_containers` follow each change
/// the hints bring, as upstream's every relist counts them, and do not wait
/// for the next safety relist.
#[tokio::test(flavor = "multi_thread")]
async fn the_running_gauges_follow_the_hinted_relists() {
    let rig = rig(Duration::ZERO).await;
    running_pod(&rig, "g").await;
    assert_eq!(rig.metric("kubelet_running_pods"), 1.0);
    assert_eq!(
        rig.metric(r#"kubelet_running_containers{container_state="running"}"#),
        1.0
    );
}
