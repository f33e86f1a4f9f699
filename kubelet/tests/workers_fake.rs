//! The pod worker state machine over the fake CRI runtime, with the generic
//! relist every 20 ms: fast, unprivileged tests of sync, ordering, duplicate
//! avoidance, and kill-during-sync.

#[path = "support/rig.rs"]
mod rig;

use std::time::Duration;

use evlet::pod::PodUid;
use evlet::workers::UpdateKind;
use evlet_cri::fake::Fault;
use evlet_testkit::{eventually, within};
use rig::{IMAGE, add, phase, pod, rig};

#[tokio::test(flavor = "multi_thread")]
async fn many_updates_create_each_container_once() {
    let rig = rig().await;
    let p = pod(
        "dup",
        &format!(
            "  containers:\n  - {{name: a, image: {IMAGE}}}\n  - {{name: b, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    for _ in 0..20 {
        rig.workers.update(p.clone(), UpdateKind::Sync);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually(Duration::from_secs(10), "Running", || async {
        (phase(&rig, "dup").as_deref() == Some("Running")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rt = rig.server.runtime();
    assert_eq!(
        (
            rt.calls("RunPodSandbox"),
            rt.calls("CreateContainer"),
            rt.calls("StartContainer")
        ),
        (1, 2, 2)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn init_containers_finish_before_app_containers_start() {
    let rig = rig().await;
    let p = pod(
        "ordered",
        &format!(
            "  initContainers:\n  - name: i1\n    image: {IMAGE}\n    env: [{{name: FAKE_EXIT_CODE, value: '0'}}, {{name: FAKE_RUN_MS, value: '100'}}]\n  - name: i2\n    image: {IMAGE}\n    env: [{{name: FAKE_EXIT_CODE, value: '0'}}, {{name: FAKE_RUN_MS, value: '50'}}]\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "Running", || async {
        (phase(&rig, "ordered").as_deref() == Some("Running")).then_some(())
    })
    .await;
    let state = rig.server.runtime().snapshot();
    let by_name = |n: &str| {
        state
            .containers
            .values()
            .find(|c| c.config.metadata.as_ref().is_some_and(|m| m.name == n))
            .cloned()
            .expect(n)
    };
    let (i1, i2, app) = (by_name("i1"), by_name("i2"), by_name("app"));
    assert!(
        i1.finished_at > 0 && i2.finished_at > 0,
        "both init containers finished: {} {}",
        i1.finished_at,
        i2.finished_at
    );
    assert!(
        i1.finished_at <= i2.created_at,
        "i2 was created after i1 finished"
    );
    assert!(
        i2.finished_at <= app.created_at,
        "app was created after i2 finished"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_during_a_slow_sync_terminates_and_removes_everything() {
    let mut rig = rig().await;
    rig.server.runtime().inject(
        "CreateContainer",
        Fault::Delay(Duration::from_millis(400)),
        None,
    );
    let p = pod(
        "slow",
        &format!(
            "  containers:\n  - {{name: a, image: {IMAGE}}}\n  - {{name: b, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    eventually(
        Duration::from_secs(5),
        "the sync to be creating containers",
        || async { (rig.server.runtime().calls("CreateContainer") >= 1).then_some(()) },
    )
    .await;
    rig.workers.update(p.clone(), UpdateKind::Kill(Some(1)));
    let uid = within(
        Duration::from_secs(20),
        "the worker to finish",
        rig.done.recv(),
    )
    .await
    .expect("done");
    assert_eq!(uid, PodUid::from("slow"));
    let state = rig.server.runtime().snapshot();
    assert!(
        state.sandboxes.is_empty() && state.containers.is_empty(),
        "{state:?}"
    );
    assert!(
        rig.server.runtime().calls("CreateContainer") < 2,
        "the cancelled sync did not go on to create the second container"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completed_pod_succeeds_and_its_sandbox_stops() {
    let rig = rig().await;
    let p = pod(
        "job",
        &format!(
            "  restartPolicy: OnFailure\n  containers:\n  - name: run\n    image: {IMAGE}\n    env: [{{name: FAKE_EXIT_CODE, value: '0'}}, {{name: FAKE_RUN_MS, value: '50'}}]\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "Succeeded", || async {
        (phase(&rig, "job").as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    eventually(Duration::from_secs(5), "sandbox stopped", || async {
        rig.server
            .runtime()
            .snapshot()
            .sandboxes
            .values()
            .all(|s| s.state == evlet_cri::api::PodSandboxState::SandboxNotready)
            .then_some(())
    })
    .await;
    assert_eq!(
        rig.server.runtime().calls("CreateContainer"),
        1,
        "a succeeded container under OnFailure is not restarted"
    );
}

/// While StartContainer is slow, the container exists in `Created` state and
/// relists keep waking the worker: it must wait for a cache newer than its own
/// sync, never take the half-done state for a missing container, and create
/// each container exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_start_creates_each_container_exactly_once() {
    let rig = rig().await;
    rig.server.runtime().inject(
        "StartContainer",
        Fault::Delay(Duration::from_millis(300)),
        None,
    );
    let p = pod(
        "slowstart",
        &format!(
            "  containers:\n  - {{name: a, image: {IMAGE}}}\n  - {{name: b, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    for _ in 0..30 {
        rig.workers.update(p.clone(), UpdateKind::Sync);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually(Duration::from_secs(10), "Running", || async {
        (phase(&rig, "slowstart").as_deref() == Some("Running")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rt = rig.server.runtime();
    assert_eq!(
        (rt.calls("CreateContainer"), rt.calls("StartContainer")),
        (2, 2),
        "one create and one start per container"
    );
}

/// A container whose StartContainer fails is removed at once, not left in
/// `Created` state (where a real runtime keeps its `runc init` alive); the
/// pod waits with `RunContainerError` and the next attempt starts it.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_that_fails_to_start_is_removed_and_started_again() {
    let rig = rig().await;
    rig.server.runtime().inject(
        "StartContainer",
        Fault::Error(
            evlet_cri::fake::Code::Internal,
            "runc: exec format error".into(),
        ),
        Some(1),
    );
    let p = pod(
        "failstart",
        &format!("  containers:\n  - {{name: app, image: {IMAGE}}}\n"),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(20), "Running after a retry", || async {
        (phase(&rig, "failstart").as_deref() == Some("Running")).then_some(())
    })
    .await;
    let rt = rig.server.runtime();
    assert_eq!(
        (
            rt.calls("CreateContainer"),
            rt.calls("StartContainer"),
            rt.calls("RemoveContainer")
        ),
        (2, 2, 1),
        "the failed instance was removed, the second started"
    );
    let left: Vec<_> = rt.snapshot().containers.values().map(|c| c.state).collect();
    assert_eq!(left.len(), 1, "only the running instance is left: {left:?}");
}

/// An image that cannot be pulled leaves the container waiting with
/// `ErrImagePull` and the runtime's reason, and starts nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_image_waits_with_err_image_pull() {
    let rig = rig().await;
    let p = pod(
        "noimage",
        "  containers:\n  - {name: app, image: registry.invalid/missing:v1, imagePullPolicy: Always}\n",
    );
    add(&rig, &p);
    let waiting = eventually(Duration::from_secs(10), "ErrImagePull", || async {
        rig.workers
            .view(&PodUid::from("noimage"))?
            .status
            .container_statuses?
            .into_iter()
            .find(|c| c.name == "app")?
            .state?
            .waiting
            .filter(|w| w.reason.as_deref() == Some("ErrImagePull"))
    })
    .await;
    let message = waiting.message.unwrap_or_default();
    assert!(
        message.contains("failed to pull image \"registry.invalid/missing:v1\"")
            && message.contains("not found"),
        "{message}"
    );
    assert_eq!(rig.server.runtime().calls("CreateContainer"), 0);
    assert_eq!(phase(&rig, "noimage").as_deref(), Some("Pending"));
}

/// The stats summary takes a pod's running containers from the runtime, as
/// upstream's CRI stats provider does, so a container whose start the status
/// does not show yet still has its usage (the eviction manager ranks and names
/// it by that usage).
#[tokio::test(flavor = "multi_thread")]
async fn the_stats_summary_names_running_containers_the_status_does_not_show() {
    let rig = rig().await;
    let p = pod(
        "statsy",
        &format!(
            "  containers:\n  - {{name: app, image: {IMAGE}}}\n  - {{name: side, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "Running", || async {
        (phase(&rig, "statsy").as_deref() == Some("Running")).then_some(())
    })
    .await;
    let mut view = rig.workers.view(&PodUid::from("statsy")).expect("view");
    // The status as it was before the PLEG saw the containers start.
    view.status = Default::default();
    let client =
        evlet_cri::RuntimeClient::connect(&rig.server.endpoint(), evlet_cri::Options::default())
            .expect("endpoint");
    let root = tempfile::tempdir().expect("root");
    let stats = evlet::stats::StatsProvider::new(
        client,
        root.path().to_path_buf(),
        root.path().join("logs"),
        "n".into(),
        evlet::cm::Names::new(evlet::cm::Driver::Cgroupfs, "/evlet-fake"),
    );
    let summary = stats.summary(&[view], true).await.expect("summary");
    let pod = summary
        .pods
        .iter()
        .find(|s| s.pod_ref.uid == "statsy")
        .expect("the pod's stats");
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app", "side"], "spec order");
    assert!(
        pod.containers
            .iter()
            .all(|c| c.start_time.is_some() && c.memory.is_some()),
        "{pod:?}"
    );
}

/// `activeDeadlineSeconds`: the pod's status says Failed / DeadlineExceeded as
/// soon as the deadline passes, while its container (ignoring SIGTERM here:
/// the runtime's StopContainer takes 4 s) is still being killed, as upstream's
/// status manager shows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_passed_active_deadline_is_in_the_status_before_the_kill_ends() {
    let rig = rig().await;
    rig.server.runtime().inject(
        "StopContainer",
        evlet_cri::fake::Fault::Delay(Duration::from_secs(4)),
        None,
    );
    let p: k8s_openapi::api::core::v1::Pod = serde_yaml::from_str(&format!(
        "metadata: {{name: deadline, namespace: default, uid: deadline}}\nspec:\n  activeDeadlineSeconds: 1\n  terminationGracePeriodSeconds: 30\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
    ))
    .expect("pod");
    add(&rig, &p);
    eventually(Duration::from_secs(10), "the pod running", || async {
        (phase(&rig, "deadline").as_deref() == Some("Running")).then_some(())
    })
    .await;
    let running = std::time::Instant::now();
    let status = eventually(Duration::from_secs(10), "the pod failed", || async {
        rig.workers
            .view(&PodUid::from("deadline"))
            .map(|v| v.status)
            .filter(|s| s.phase.as_deref() == Some("Failed"))
    })
    .await;
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert!(
        running.elapsed() < Duration::from_millis(3500),
        "Failed within the deadline's second and a sync, not after the 4 s kill: {:?}",
        running.elapsed()
    );
    assert_eq!(
        rig.server.runtime().calls("StopContainer"),
        1,
        "the kill is under way"
    );
}
