//! The hinted PLEG dispatcher over the fake runtime, with a fake kernel: a
//! container's process death becomes an exit hint at once, while the runtime
//! shows the exit only after a lag (as containerd does while it reaps and
//! deletes the task). Shared by `pleg_fake` and `pleg_truth_fake`.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::sync::Arc;
use std::time::Duration;

use evlet::cache;
use evlet::metrics::Metrics;
use evlet::pleg::Health;
use evlet::pleg::cgroup_map::CgroupMap;
use evlet::pleg::ebpf::Quiet;
use evlet::pleg::hinted::{self, Timing};
use evlet::pleg::hints::{ExitRecord, Hints, KernelExit, Reason};
use evlet::pleg::kernel::{Binder, KernelView};
use evlet::pleg::process::{Process, Processes};
use evlet::pleg::relist::Relister;
use evlet::pod::{PodUid, labels};
use evlet::runtime::Runtime;
use evlet::sync::Syncer;
use evlet::sync::objects::NoApiServer;
use evlet::sync::spec::NodeContext;
use evlet::workers::{Collaborators, PodWorkers, UpdateKind};
use evlet_cri::fake::{FakeRuntime, FakeServer};
use evlet_cri::{Options, RuntimeClient};
use evlet_testkit::eventually;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const IMAGE: &str = "evlet.local/test:v1";

pub struct Rig {
    pub server: FakeServer,
    pub workers: PodWorkers,
    pub hints: Arc<Hints>,
    pub metrics: Arc<Metrics>,
    pub cache: evlet::cache::PodCache,
    pub kernel: Arc<std::sync::Mutex<Kernel>>,
    /// The kernel side's interpretation of records fed by hand.
    pub view: Arc<std::sync::Mutex<KernelView>>,
    /// The cgroup map the view reads and the relister binds inits into.
    pub map: Arc<std::sync::Mutex<CgroupMap>>,
    pub pods: Arc<std::sync::Mutex<Vec<Pod>>>,
    pub shutdown: CancellationToken,
    pub _root: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Short windows so a test sees every phase of an expectation in a second.
pub fn timing() -> Timing {
    Timing {
        safety: Duration::from_secs(300),
        fast_for: Duration::from_millis(100),
        fast_step: Duration::from_millis(5),
        slow_step: Duration::from_millis(50),
        full_after: Duration::from_secs(5),
        give_up_after: Duration::from_secs(8),
        prove_for: Duration::from_millis(200),
        grace: Duration::from_millis(200),
    }
}

/// How the fake kernel behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
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
pub fn fake_kernel(
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
                    // The fake's deaths are of the inits it reports: the
                    // kernel's record is certain.
                    hints.exit(
                        PodUid(uid.clone()),
                        death.container_id,
                        KernelExit {
                            at: evlet_ebpf::monotonic_ns(),
                            record: Some(ExitRecord {
                                exit_code: death.exit_code,
                                finished_unix_ns: death.at_ns,
                                oom: death.reason == "OOMKilled",
                                process: Process {
                                    pid: death.process.pid,
                                    start_ticks: death.process.start_ticks,
                                },
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
pub enum Source {
    /// The fake kernel (`ebpf` mode's shape, with quiet proofs).
    Kernel,
    /// The fake runtime's CRI event stream (`cri-events` mode).
    CriEvents,
}

pub async fn rig(exit_lag: Duration) -> Rig {
    rig_with(exit_lag, Source::Kernel).await
}

pub async fn rig_with(exit_lag: Duration, source: Source) -> Rig {
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
    let processes: Arc<dyn Processes> = Arc::new(FakeProcesses(server.runtime().clone()));
    let map = Arc::new(std::sync::Mutex::new(CgroupMap::default()));
    let view = Arc::new(std::sync::Mutex::new(KernelView::new(
        Arc::clone(&map),
        TICKS_PER_SECOND,
    )));
    let relister = relister.with_kernel(
        Some(Arc::new(Binder::new(
            Arc::clone(&map),
            Arc::clone(&processes),
        ))),
        processes,
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
        view,
        map,
        pods,
        shutdown,
        _root: root,
    }
}

/// Clock ticks per second of the fake kernel's process starts.
pub const TICKS_PER_SECOND: u64 = 100;

/// The fake runtime's init processes, as `/proc` would show them.
#[derive(Debug)]
pub struct FakeProcesses(pub FakeRuntime);

impl Processes for FakeProcesses {
    fn live(&self, pid: u32) -> Option<u64> {
        self.0.live(pid)
    }

    fn ticks_per_second(&self) -> u64 {
        TICKS_PER_SECOND
    }
}

impl Rig {
    pub fn add(&self, pod: &Pod) {
        self.pods.lock().expect("pods").push(pod.clone());
        self.workers.update(pod.clone(), UpdateKind::Sync);
    }

    pub fn metric(&self, name: &str) -> f64 {
        let text = self.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} is not exported:\n{text}"))
    }

    /// Asks for a counting full relist, waits for it, and asserts that it
    /// found no change the hints had not announced.
    pub async fn assert_no_missed_events(&self) {
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

    pub fn set_kernel(&self, k: Kernel) {
        *self.kernel.lock().expect("mode") = k;
    }

    /// Full relists done for `reason` (0 before the first).
    pub fn full_relists(&self, reason: &str) -> f64 {
        let name = format!("evlet_pleg_full_relists_total{{reason=\"{reason}\"}}");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Asks for `uid`'s entry newer than 10 ms ago, as a worker's periodic sync does,
    /// and says how the dispatcher answered within `limit` (`None`: not yet).
    pub async fn freshness(&self, uid: &str, limit: Duration) -> Option<Answer> {
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

    pub fn app_id(&self, uid: &str) -> evlet_cri::ContainerId {
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

    pub fn app_running(&self, uid: &str) -> bool {
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
pub enum Answer {
    /// A quiet proof vouched for the entry (no runtime read).
    Proven,
    /// The pod was read again.
    Relisted,
    /// A full relist stamped every entry.
    FullRelist,
}

pub fn app_pod(uid: &str, policy: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
    ))
    .expect("pod")
}

/// Starts an app pod and waits until it runs and its post-sync relist is done.
pub async fn running_pod(rig: &Rig, uid: &str) {
    running_pod_with(rig, uid, "Always").await;
}

pub async fn running_pod_with(rig: &Rig, uid: &str, policy: &str) {
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

pub fn quick_init_pod(uid: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - name: init\n    image: {IMAGE}\n    env: [{{name: FAKE_EXIT_CODE, value: '0'}}, {{name: FAKE_RUN_MS, value: '0'}}]\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
    ))
    .expect("pod")
}
