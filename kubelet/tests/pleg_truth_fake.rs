//! Design invariant 1 over the fake runtime: the kernel's record decides a
//! container's end only for the process the runtime named as its init, and a
//! record whose process lives is refused. Records fed by hand through the
//! kernel view (as the ring buffer brings them) that name the wrong pod, the
//! wrong container, a reused PID, a nested cgroup or a presumption never
//! change a running container's status and never start a second instance.

#[path = "support/pleg_rig.rs"]
mod pleg_rig;

use std::time::Duration;

use evlet::pleg::hints::{ExitRecord, KernelExit};
use evlet::pleg::kernel::{self, Meaning};
use evlet::pleg::process::Process;
use evlet::pod::{PodUid, labels};
use evlet_cri::fake::state::FakeProcess;
use evlet_testkit::eventually;
use k8s_openapi::api::core::v1::Pod;
use pleg_rig::*;

/// A container of a pod in the fake runtime: its ID and its init process.
#[derive(Debug, Clone)]
struct Instance {
    id: String,
    init: Process,
}

impl Rig {
    /// The instances of container `name` of pod `uid` in the runtime, oldest first.
    fn instances(&self, uid: &str, name: &str) -> Vec<(String, bool, Option<FakeProcess>)> {
        let state = self.server.runtime().snapshot();
        let mut found: Vec<_> = state
            .containers
            .values()
            .filter(|c| c.config.labels.get(labels::POD_UID).map(String::as_str) == Some(uid))
            .filter(|c| c.config.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|c| {
                let running = c.state == evlet_cri::api::ContainerState::ContainerRunning
                    && c.dying.is_none();
                (c.created_at, c.id.clone(), running, c.init)
            })
            .collect();
        found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        found
            .into_iter()
            .map(|(_, id, running, init)| (id, running, init))
            .collect()
    }

    /// The one running instance of `name`, with the kernel map knowing its cgroup.
    fn instance(&self, uid: &str, name: &str, cgroup: u64) -> Instance {
        let all = self.instances(uid, name);
        assert_eq!(all.len(), 1, "one instance of {name}: {all:?}");
        let (id, running, init) = all[0].clone();
        assert!(running, "{name} runs");
        let init = init.expect("a running container has an init");
        self.view
            .lock()
            .expect("view")
            .mkdir(cgroup, &format!("/kubepods/besteffort/pod{uid}/{id}"));
        Instance {
            id,
            init: Process {
                pid: init.pid,
                start_ticks: init.start_ticks,
            },
        }
    }

    /// Feeds the kernel view the exit of `process` in cgroup `cgroup` (exit
    /// code 3, PID 1 of a PID namespace) and hands its meaning to the dispatcher.
    fn kernel_exit(&self, cgroup: u64, process: Process) -> Meaning {
        let exit = evlet_ebpf::Exit {
            origin: evlet_ebpf::Origin {
                ktime_ns: evlet_ebpf::monotonic_ns(),
                pid: process.pid,
                tgid: process.pid,
                cgroup_id: cgroup,
                watched: true,
            },
            wait_status: 3 << 8,
            ns_init: true,
            pid_ns: true,
            start_ns: process.start_ticks * (1_000_000_000 / TICKS_PER_SECOND),
            comm: "sh".into(),
        };
        let meaning = self.view.lock().expect("view").exit(&exit);
        kernel::hint(&self.hints, meaning.clone());
        meaning
    }

    /// `name` of pod `uid` still runs as the only instance, never restarted,
    /// after the dispatcher had time to act on whatever it was given.
    async fn assert_untouched(&self, uid: &str, name: &str) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let instances = self.instances(uid, name);
        assert_eq!(instances.len(), 1, "exactly one instance: {instances:?}");
        assert!(instances[0].1, "it still runs");
        let view = self
            .workers
            .view(&PodUid::from(uid))
            .expect("the pod's view");
        let status = view
            .status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .expect("a status of the container");
        assert!(
            status.state.as_ref().is_some_and(|s| s.running.is_some()),
            "the status says running: {status:?}"
        );
        assert_eq!(status.restart_count, 0);
        assert!(
            status
                .last_state
                .as_ref()
                .is_none_or(|s| s.terminated.is_none())
        );
    }

    fn disagreements(&self, field: &str) -> f64 {
        let name = format!("evlet_pleg_runtime_disagreements_total{{field=\"{field}\"}}");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or(0.0)
    }
}

fn two_container_pod(uid: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE}}}\n  - {{name: side, image: {IMAGE}}}\n"
    ))
    .expect("pod")
}

/// The exit of another pod's init, of another container's init, or of a
/// process whose PID the init once had: none is the container's end.
#[tokio::test(flavor = "multi_thread")]
async fn exits_of_other_pods_other_containers_and_reused_pids_never_end_a_container() {
    let rig = rig(Duration::from_secs(2)).await;
    running_pod(&rig, "a").await;
    running_pod(&rig, "b").await;
    let a = rig.instance("a", "app", 10);
    let b = rig.instance("b", "app", 20);
    assert_eq!(
        rig.kernel_exit(10, b.init),
        Meaning::Nothing,
        "pod b's init exiting in pod a's cgroup"
    );
    let reused = Process {
        pid: a.init.pid,
        start_ticks: a.init.start_ticks + 1,
    };
    assert_eq!(
        rig.kernel_exit(10, reused),
        Meaning::Nothing,
        "a reused PID"
    );
    rig.assert_untouched("a", "app").await;
    rig.assert_untouched("b", "app").await;

    rig.add(&two_container_pod("c"));
    eventually(
        Duration::from_secs(10),
        "both containers running",
        || async {
            (rig.instances("c", "app").iter().any(|i| i.1)
                && rig.instances("c", "side").iter().any(|i| i.1))
            .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.instance("c", "app", 30);
    let side = rig.instance("c", "side", 31);
    assert_eq!(
        rig.kernel_exit(30, side.init),
        Meaning::Nothing,
        "the side container's init exiting in app's cgroup"
    );
    rig.assert_untouched("c", "app").await;
    rig.assert_untouched("c", "side").await;
    assert_eq!(rig.metric("evlet_pleg_expectations"), 0.0);
}

/// A cgroup made inside a container (Docker-in-Docker, a kind node) and a
/// PID-1 process of a nested PID namespace in it: neither its exit nor the
/// cgroup's removal ends the container. Its own init's exit, wherever that
/// process moved, still does, at once and before the runtime shows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_nested_cgroup_never_ends_its_container_but_the_runtimes_init_does() {
    let rig = rig(Duration::from_secs(2)).await;
    running_pod(&rig, "n").await;
    let app = rig.instance("n", "app", 40);
    let nested = format!("/kubepods/besteffort/podn/{}/inner", app.id);
    rig.view.lock().expect("view").mkdir(41, &nested);
    assert!(rig.view.lock().expect("view").exec(41, 777_001, true));
    let unshared = Process {
        pid: 777_001,
        start_ticks: 5,
    };
    assert_eq!(rig.kernel_exit(41, unshared), Meaning::Nothing);
    let removed = rig
        .view
        .lock()
        .expect("view")
        .rmdir(41, evlet_ebpf::monotonic_ns());
    assert_eq!(removed, Meaning::Nothing, "a nested cgroup's removal");
    rig.assert_untouched("n", "app").await;

    // The init itself exits from the nested cgroup (DinD moves its processes
    // to `<container>/init`): certain, in the status before the runtime's 2 s lag.
    rig.set_kernel(Kernel::Dead);
    let id = evlet_cri::ContainerId::new(app.id.clone());
    rig.view
        .lock()
        .expect("view")
        .mkdir(42, &format!("{nested}2"));
    assert!(rig.server.runtime().exit_container(&id, 3, "Error"));
    let started = tokio::time::Instant::now();
    let meaning = rig.kernel_exit(42, app.init);
    assert!(
        matches!(&meaning, Meaning::Exit { exit: KernelExit { record: Some(r), .. }, .. } if r.exit_code == 3),
        "{meaning:?}"
    );
    eventually(
        Duration::from_secs(1),
        "the kernel's exit in the status",
        || async {
            rig.workers.view(&PodUid::from("n")).and_then(|v| {
                v.status
                    .container_statuses
                    .iter()
                    .flatten()
                    .find(|c| c.name == "app")
                    .and_then(|c| {
                        c.last_state
                            .as_ref()?
                            .terminated
                            .as_ref()?
                            .exit_code
                            .eq(&3)
                            .then_some(())
                    })
                    .or_else(|| {
                        v.status
                            .container_statuses
                            .iter()
                            .flatten()
                            .find(|c| c.name == "app")
                            .and_then(|c| {
                                c.state
                                    .as_ref()?
                                    .terminated
                                    .as_ref()?
                                    .exit_code
                                    .eq(&3)
                                    .then_some(())
                            })
                    })
            })
        },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "before the runtime's 2 s lag"
    );
}

/// A runtime that names no init: the first namespaced exec is presumed, a
/// later PID-1 process never replaces it, and the presumption's wrong exit
/// (a hostPID container's `unshare -fp`) is a hint the runtime decides: the
/// container keeps running, and the expectation ends, counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_presumed_init_is_never_upgraded_and_a_wrong_presumption_ends_unconfirmed() {
    let rig = rig(Duration::ZERO).await;
    rig.server.runtime().hide_pids(true);
    running_pod(&rig, "p").await;
    let all = rig.instances("p", "app");
    let id = all[0].0.clone();
    rig.view
        .lock()
        .expect("view")
        .mkdir(50, &format!("/kubepods/besteffort/podp/{id}"));
    assert!(
        rig.map.lock().expect("map").bound(&id).is_none(),
        "the runtime named no init"
    );
    let view = &rig.view;
    assert!(view.lock().expect("view").exec(50, 888_001, true));
    assert!(view.lock().expect("view").exec(50, 888_002, true));
    let later = Process {
        pid: 888_002,
        start_ticks: 9,
    };
    assert_eq!(
        rig.kernel_exit(50, later),
        Meaning::Nothing,
        "a later PID-namespace init is not the container's"
    );
    let presumed = Process {
        pid: 888_001,
        start_ticks: 9,
    };
    assert!(matches!(
        rig.kernel_exit(50, presumed),
        Meaning::Exit {
            exit: KernelExit { record: None, .. },
            ..
        }
    ));
    rig.assert_untouched("p", "app").await;
    eventually(
        Duration::from_secs(15),
        "the unconfirmed expectation given up",
        || async {
            (rig.metric("evlet_pleg_expectations_abandoned_total") == 1.0
                && rig.metric("evlet_pleg_expectations") == 0.0)
                .then_some(())
        },
    )
    .await;
    rig.assert_untouched("p", "app").await;
}

/// The last line of defence: a certain record (as a kernel side with a bug
/// would give) for a container whose init lives is refused, counted and
/// logged; the status keeps the runtime's word and no second instance starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_record_of_a_living_init_is_refused_and_starts_no_second_instance() {
    let rig = rig(Duration::from_secs(2)).await;
    running_pod(&rig, "l").await;
    running_pod(&rig, "m").await;
    let app = rig.instance("l", "app", 60);
    let other = rig.instance("m", "app", 61);
    let record = |process: Process| KernelExit {
        at: evlet_ebpf::monotonic_ns(),
        record: Some(ExitRecord {
            exit_code: 3,
            finished_unix_ns: 1,
            oom: false,
            process,
        }),
    };
    rig.hints
        .exit(PodUid::from("l"), app.id.clone(), record(app.init));
    // Another pod's container named under this pod: its init lives too.
    rig.hints
        .exit(PodUid::from("l"), other.id.clone(), record(other.init));
    rig.assert_untouched("l", "app").await;
    rig.assert_untouched("m", "app").await;
    assert_eq!(rig.disagreements("running"), 2.0);
    assert_eq!(rig.metric("evlet_pleg_expectations"), 0.0);
    rig.assert_no_missed_events().await;
}
