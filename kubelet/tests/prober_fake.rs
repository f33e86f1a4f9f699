//! Probes and lifecycle hooks over the fake CRI runtime (exec probes and
//! hooks run through its scripted `ExecSync`): thresholds, restarts, readiness
//! both ways, startup gating, sidecars holding back the app, postStart.
//! The real runtime and the HTTP, TCP and gRPC probes: `node_probes`.

#[path = "support/rig.rs"]
mod rig;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use evlet::pod::PodUid;
use evlet_cri::ExecOutput;
use evlet_testkit::eventually;
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use rig::{IMAGE, Rig, add, pod, rig};

fn exit(code: i32) -> ExecOutput {
    ExecOutput {
        stdout: b"probe says so".to_vec(),
        stderr: vec![],
        exit_code: code,
    }
}

/// Exec probes answer by their command's first word: `healthy` as `up` says,
/// `starting` as `started` says; everything else succeeds. Counts each.
#[derive(Default)]
struct Script {
    up: AtomicBool,
    started: AtomicBool,
    healthy_calls: AtomicU32,
    starting_calls: AtomicU32,
    hook_calls: AtomicU32,
    hook_fails: AtomicBool,
}

fn script(rig: &Rig) -> Arc<Script> {
    let s = Arc::new(Script::default());
    let h = Arc::clone(&s);
    rig.server.runtime().on_exec(Arc::new(move |_, cmd| {
        match cmd.first().map(String::as_str) {
            Some("healthy") => {
                h.healthy_calls.fetch_add(1, Ordering::SeqCst);
                exit(if h.up.load(Ordering::SeqCst) { 0 } else { 1 })
            }
            Some("starting") => {
                h.starting_calls.fetch_add(1, Ordering::SeqCst);
                exit(if h.started.load(Ordering::SeqCst) {
                    0
                } else {
                    1
                })
            }
            Some("hook") => {
                h.hook_calls.fetch_add(1, Ordering::SeqCst);
                exit(if h.hook_fails.load(Ordering::SeqCst) {
                    2
                } else {
                    0
                })
            }
            _ => exit(0),
        }
    }));
    s
}

fn status(rig: &Rig, uid: &str) -> Option<PodStatus> {
    rig.workers.view(&PodUid::from(uid)).map(|v| v.status)
}

fn container<'a>(s: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

fn condition(s: &PodStatus, kind: &str) -> String {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn events(rig: &Rig, reason: &str) -> Vec<String> {
    rig.diagnostics
        .events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| e.message)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_liveness_probe_that_starts_failing_restarts_the_container() {
    let rig = rig().await;
    let s = script(&rig);
    s.up.store(true, Ordering::SeqCst);
    let p = pod(
        "live",
        &format!(
            "  containers:\n  - name: app\n    image: {IMAGE}\n    livenessProbe: {{exec: {{command: [healthy]}}, periodSeconds: 1, failureThreshold: 2}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "probed healthy", || async {
        (s.healthy_calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert_eq!(
        status(&rig, "live").and_then(|st| container(&st, "app").map(|c| c.restart_count)),
        Some(0),
        "a passing liveness probe kills nothing"
    );
    s.up.store(false, Ordering::SeqCst);
    let failed_at = tokio::time::Instant::now();
    eventually(Duration::from_secs(10), "a restart", || async {
        let st = status(&rig, "live")?;
        let c = container(&st, "app")?;
        (c.restart_count == 1 && c.state.as_ref()?.running.is_some()).then_some(())
    })
    .await;
    // period × failureThreshold, plus one period of slack.
    assert!(
        failed_at.elapsed() < Duration::from_secs(3 + 1),
        "restarted after {:?}",
        failed_at.elapsed()
    );
    let unhealthy = events(&rig, "Unhealthy");
    assert!(
        unhealthy.len() >= 2
            && unhealthy
                .iter()
                .all(|m| m == "Liveness probe failed: probe says so"),
        "{unhealthy:?}"
    );
    assert!(
        events(&rig, "Killing")
            .contains(&"Container app failed liveness probe, will be restarted".to_owned()),
        "{:?}",
        events(&rig, "Killing")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_probe_both_ways() {
    let rig = rig().await;
    let s = script(&rig);
    let p = pod(
        "ready",
        &format!(
            "  containers:\n  - name: app\n    image: {IMAGE}\n    readinessProbe: {{exec: {{command: [healthy]}}, periodSeconds: 1, failureThreshold: 1}}\n"
        ),
    );
    add(&rig, &p);
    let ready = |want: bool| {
        let rig = &rig;
        async move {
            eventually(
                Duration::from_secs(10),
                &format!("ready {want}"),
                || async {
                    let st = status(rig, "ready")?;
                    let c = container(&st, "app")?;
                    (c.state.as_ref()?.running.is_some()
                        && c.ready == want
                        && condition(&st, "Ready") == if want { "True" } else { "False" })
                    .then_some(())
                },
            )
            .await;
        }
    };
    ready(false).await;
    s.up.store(true, Ordering::SeqCst);
    ready(true).await;
    s.up.store(false, Ordering::SeqCst);
    ready(false).await;
    s.up.store(true, Ordering::SeqCst);
    ready(true).await;
    let st = status(&rig, "ready").expect("status");
    assert_eq!(
        container(&st, "app").map(|c| c.restart_count),
        Some(0),
        "readiness never restarts"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_startup_probe_holds_back_liveness_until_it_passes() {
    let rig = rig().await;
    let s = script(&rig);
    let p = pod(
        "slow",
        &format!(
            "  containers:\n  - name: app\n    image: {IMAGE}\n    startupProbe: {{exec: {{command: [starting]}}, periodSeconds: 1, failureThreshold: 30}}\n    livenessProbe: {{exec: {{command: [healthy]}}, periodSeconds: 1, failureThreshold: 1}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "startup probed twice", || async {
        (s.starting_calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let st = status(&rig, "slow").expect("status");
    let app = container(&st, "app").expect("app");
    assert_eq!((app.started, app.ready), (Some(false), false));
    assert_eq!(
        s.healthy_calls.load(Ordering::SeqCst),
        0,
        "liveness waits for the startup probe"
    );
    s.up.store(true, Ordering::SeqCst);
    s.started.store(true, Ordering::SeqCst);
    eventually(Duration::from_secs(10), "started and live", || async {
        let st = status(&rig, "slow")?;
        let app = container(&st, "app")?;
        (app.started == Some(true) && s.healthy_calls.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert_eq!(
        status(&rig, "slow").and_then(|st| container(&st, "app").map(|c| c.restart_count)),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_with_a_startup_probe_holds_back_the_app() {
    let rig = rig().await;
    let s = script(&rig);
    let p = pod(
        "side",
        &format!(
            "  initContainers:\n  - name: proxy\n    image: {IMAGE}\n    restartPolicy: Always\n    startupProbe: {{exec: {{command: [starting]}}, periodSeconds: 1, failureThreshold: 30}}\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "the sidecar probed", || async {
        (s.starting_calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let created = |name: &str| {
        rig.server
            .runtime()
            .snapshot()
            .containers
            .values()
            .any(|c| c.config.metadata.as_ref().is_some_and(|m| m.name == name))
    };
    assert!(created("proxy"));
    assert!(
        !created("app"),
        "the app waits for the sidecar's startup probe"
    );
    s.started.store(true, Ordering::SeqCst);
    eventually(Duration::from_secs(10), "the app running", || async {
        let st = status(&rig, "side")?;
        (container(&st, "app")?.state.as_ref()?.running.is_some()
            && condition(&st, "Initialized") == "True")
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_post_start_hook_kills_the_container_and_it_restarts() {
    let rig = rig().await;
    let s = script(&rig);
    s.hook_fails.store(true, Ordering::SeqCst);
    let p = pod(
        "hooked",
        &format!(
            "  containers:\n  - name: app\n    image: {IMAGE}\n    lifecycle: {{postStart: {{exec: {{command: [hook]}}}}}}\n"
        ),
    );
    add(&rig, &p);
    eventually(Duration::from_secs(10), "FailedPostStartHook", || async {
        (!events(&rig, "FailedPostStartHook").is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        events(&rig, "FailedPostStartHook"),
        ["PostStartHook failed"]
    );
    assert!(events(&rig, "Killing").contains(&"FailedPostStartHook".to_owned()));
    s.hook_fails.store(false, Ordering::SeqCst);
    eventually(
        Duration::from_secs(30),
        "running after a good hook",
        || async {
            let st = status(&rig, "hooked")?;
            let c = container(&st, "app")?;
            (c.restart_count >= 1 && c.state.as_ref()?.running.is_some()).then_some(())
        },
    )
    .await;
    assert!(s.hook_calls.load(Ordering::SeqCst) >= 2);
}
