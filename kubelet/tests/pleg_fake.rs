//! The hinted PLEG dispatcher over the fake runtime, with a fake kernel: a
//! container's process death becomes an exit hint at once, while the runtime
//! shows the exit only after a lag (as containerd does while it reaps and
//! deletes the task). Fast, unprivileged tests of what the dispatcher promises.

#[path = "support/pleg_rig.rs"]
mod pleg_rig;

use std::time::Duration;

use evlet::pod::PodUid;
use evlet_testkit::eventually;
use pleg_rig::*;
use tokio::time::Instant;

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
