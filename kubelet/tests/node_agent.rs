//! The agent end to end against the private real containerd (`cargo xtask test`
//! runs this per containerd line). `EVLET_E2E_PLEG` selects the PLEG mode
//! (default `generic`); `cargo xtask test` runs it in every mode.

mod support;

use std::path::Path;
use std::time::Duration;

use evlet_cri::ContainerId;
use evlet_testkit::eventually;
use support::{IMAGE, container, e2e, kill, running};

fn three_container_pod(hostpath: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: trio}}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - {{name: host, hostPath: {{path: {host}}}}}
  initContainers:
  - name: init
    image: {IMAGE}
    command: [/bin/sh, -c, "/bin/now > /host/init-done; echo init-ran"]
    volumeMounts: [{{name: host, mountPath: /host}}]
  containers:
  - name: one
    image: {IMAGE}
    command: [/bin/sh, -c, "echo one-up; exec sleep 3600"]
    volumeMounts: [{{name: host, mountPath: /host}}]
    lifecycle:
      preStop:
        exec: {{command: [/bin/sh, -c, "echo prestop > /host/prestop-ran"]}}
  - name: two
    image: {IMAGE}
    command: [/bin/sh, -c, "trap 'exit 0' TERM; echo two-up; while true; do sleep 1; done"]
"#,
        host = hostpath.display()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn init_then_two_containers_run_with_logs_in_the_pods_layout() {
    e2e(
        "init_then_two_containers_run_with_logs_in_the_pods_layout",
        |w| async move {
            let host = tempfile::tempdir().expect("host dir");
            w.write("trio.yaml", &three_container_pod(host.path()));
            let agent = w.start().await;
            let pod = w.pod_name("trio");
            let status = agent
                .wait_status(&pod, "trio Running", Duration::from_secs(60), |s| {
                    (s.phase.as_deref() == Some("Running")
                        && running(s, "one")
                        && running(s, "two"))
                    .then(|| s.clone())
                })
                .await;
            let init = container(&status, "init")
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.clone())
                .expect("init terminated");
            assert_eq!(
                (init.exit_code, init.reason.as_deref()),
                (0, Some("Completed"))
            );
            let one_started = container(&status, "one")
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.clone())
                .expect("one's startedAt")
                .0;
            let init_finished = init.finished_at.clone().expect("init's finishedAt").0;
            assert!(
                init_finished <= one_started,
                "init finished ({init_finished}) before the app containers started ({one_started})"
            );
            // The init's own clock reading, written just before it exited.
            let marker: i128 = std::fs::read_to_string(host.path().join("init-done"))
                .expect("the init container's marker")
                .trim()
                .parse()
                .expect("nanoseconds");
            assert!(
                marker <= one_started.as_nanosecond(),
                "the init's marker ({marker} ns) predates one's start ({one_started})"
            );
            assert!(
                status
                    .pod_ip
                    .as_deref()
                    .is_some_and(|ip| ip.starts_with("10.2")),
                "pod IP {:?}",
                status.pod_ip
            );

            let view = agent
                .handles
                .workers
                .views()
                .into_iter()
                .find(|v| v.pod.metadata.name.as_deref() == Some(&pod))
                .expect("view");
            let uid = view.pod.metadata.uid.clone().expect("uid");
            let logs = w
                .root
                .path()
                .join("logs/pods")
                .join(format!("default_{pod}_{uid}"));
            for (c, line) in [("init", "init-ran"), ("one", "one-up"), ("two", "two-up")] {
                let path = logs.join(c).join("0.log");
                let text = eventually(Duration::from_secs(10), "log line", || async {
                    std::fs::read_to_string(&path)
                        .ok()
                        .filter(|t| t.contains(line))
                })
                .await;
                assert!(
                    text.contains(&format!("stdout F {line}")),
                    "CRI log format in {}: {text:?}",
                    path.display()
                );
            }

            // Removing the manifest terminates within the grace period, runs preStop, leaves nothing.
            let removed = tokio::time::Instant::now();
            w.remove("trio.yaml");
            eventually(
                Duration::from_secs(30),
                "trio removed from the runtime",
                || async {
                    let (s, c) = w.runtime_objects("trio").await;
                    (s.is_empty() && c.is_empty()).then_some(())
                },
            )
            .await;
            let slack = evlet_testkit::slack(Duration::from_secs(5));
            assert!(
                removed.elapsed() < Duration::from_secs(10) + slack,
                "within the grace period (+ {slack:?} for detection and teardown), took {:?}",
                removed.elapsed()
            );
            assert_eq!(
                std::fs::read_to_string(host.path().join("prestop-ran"))
                    .ok()
                    .as_deref(),
                Some("prestop\n")
            );
            eventually(
                Duration::from_secs(10),
                "the pod leaves the agent",
                || async { agent.status(&pod).is_none().then_some(()) },
            )
            .await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_container_restarts_with_its_exit_in_last_state() {
    e2e("a_killed_container_restarts_with_its_exit_in_last_state", |w| async move {
        w.write("kill.yaml", &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: victim}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n"));
        let agent = w.start().await;
        let pod = w.pod_name("victim");
        kill(&w, &agent, &pod, "app").await;
        let status = agent
            .wait_status(&pod, "restart after kill", Duration::from_secs(30), |s| {
                container(s, "app").filter(|c| c.restart_count == 1 && running(s, "app")).cloned()
            })
            .await;
        let last = status.last_state.and_then(|l| l.terminated).expect("lastState.terminated");
        assert_eq!(last.exit_code, 137, "SIGKILL");
        assert_eq!(last.reason.as_deref(), Some("Error"));
        agent.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashing_container_enters_crash_loop_back_off() {
    e2e("a_crashing_container_enters_crash_loop_back_off", |w| async move {
        w.write("crash.yaml", &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: crasher}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sh, -c, 'echo dying; exit 3']}}\n"));
        let agent = w.start().await;
        let pod = w.pod_name("crasher");
        let c = agent
            .wait_status(&pod, "CrashLoopBackOff after a restart", Duration::from_secs(60), |s| {
                container(s, "app")
                    .filter(|c| c.restart_count >= 1)
                    .filter(|c| c.state.as_ref().and_then(|st| st.waiting.as_ref()).and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff"))
                    .cloned()
            })
            .await;
        assert_eq!(c.last_state.and_then(|l| l.terminated).map(|t| t.exit_code), Some(3));
        assert_eq!(c.restart_count, 1, "the first crash restarts at once, the second waits");
        let first = tokio::time::Instant::now();
        // Upstream's `IsInBackOffSince` is false until a first backoff entry
        // exists: the first crash restarts at once, the second after 10 s, the
        // third after 20 s. Timed between restarts, so a slow start-up on a
        // loaded machine does not count.
        let restarted = |n: i32| {
            let agent = &agent;
            let pod = &pod;
            async move {
                agent
                    .wait_status(pod, &format!("restart {n}"), Duration::from_secs(40), |s| {
                        container(s, "app").filter(|c| c.restart_count >= n).map(|_| ())
                    })
                    .await;
                tokio::time::Instant::now()
            }
        };
        let second = restarted(2).await;
        let waited = second - first;
        assert!(
            (Duration::from_secs(8)..=Duration::from_secs(14)).contains(&waited),
            "the second restart comes 10 s after the first one's exit: after {waited:?}"
        );
        let waited = restarted(3).await - second;
        assert!(
            (Duration::from_secs(18)..=Duration::from_secs(25)).contains(&waited),
            "the third restart comes 20 s after the second one's exit: after {waited:?}"
        );
        agent.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exceeding_the_memory_limit_is_reported_as_oom_killed() {
    e2e("exceeding_the_memory_limit_is_reported_as_oom_killed", |w| async move {
        w.write(
            "oom.yaml",
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: hog}}\nspec:\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [/bin/memhog, '200']\n    resources: {{limits: {{memory: 32Mi}}}}\n"),
        );
        let agent = w.start().await;
        let pod = w.pod_name("hog");
        let reason = agent
            .wait_status(&pod, "an OOMKilled termination", Duration::from_secs(60), |s| {
                let c = container(s, "app")?;
                let t = c.last_state.as_ref().and_then(|l| l.terminated.as_ref()).or(c.state.as_ref().and_then(|st| st.terminated.as_ref()))?;
                t.reason.clone()
            })
            .await;
        assert_eq!(reason, "OOMKilled");
        agent.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_manifest_is_reported_and_a_changed_one_recreates_the_pod() {
    e2e("a_malformed_manifest_is_reported_and_a_changed_one_recreates_the_pod", |w| async move {
        let steady = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: steady}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n");
        w.write("steady.yaml", &steady);
        let agent = w.start().await;
        let pod = w.pod_name("steady");
        let id = agent.running_id(&pod, "app").await;

        w.write("broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec:\n  containers:\n  - {name: app}\n");
        eventually(Duration::from_secs(15), "the manifest error is counted", || async {
            agent.handles.metrics.encode().lines().any(|l| l.starts_with("evlet_manifest_errors_total 1")).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = agent.status(&pod).expect("steady still known");
        assert_eq!(container(&now, "app").and_then(|c| c.container_id.clone()), Some(id.clone()), "the running pod beside was not disturbed");
        assert!(agent.status(&w.pod_name("broken")).is_none());

        // A changed manifest is a new pod version: the old one goes, the new one runs.
        w.write("steady.yaml", &steady.replace("'3600'", "'3601'"));
        let new_id = agent
            .wait_status(&pod, "the changed pod running", Duration::from_secs(60), |s| {
                container(s, "app").filter(|c| running(s, "app") && c.container_id.as_ref() != Some(&id)).and_then(|c| c.container_id.clone())
            })
            .await;
        eventually(Duration::from_secs(30), "only the new version left", || async {
            let (_, containers) = w.runtime_objects("steady").await;
            (containers.len() == 1 && new_id.ends_with(&containers[0])).then_some(())
        })
        .await;
        agent.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_agent_adopts_running_pods() {
    e2e("a_restarted_agent_adopts_running_pods", |w| async move {
        w.write("adopt.yaml", &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: adopt}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n"));
        let agent = w.start().await;
        let pod = w.pod_name("adopt");
        let first = agent.wait_status(&pod, "adopt running", Duration::from_secs(60), |s| container(s, "app").filter(|_| running(s, "app")).cloned()).await;
        let id = ContainerId::new(first.container_id.clone().expect("id").trim_start_matches("containerd://"));
        let pid = w.client.container_pid(&id).await.expect("info").expect("pid");
        // SAFETY: kills a container init process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let before = agent.wait_status(&pod, "one restart", Duration::from_secs(30), |s| container(s, "app").filter(|c| c.restart_count == 1 && running(s, "app")).cloned()).await;
        agent.stop().await;

        let agent = w.start().await;
        let after = agent.wait_status(&pod, "adopted status", Duration::from_secs(30), |s| container(s, "app").filter(|_| running(s, "app")).cloned()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after_settle = agent.status(&pod).and_then(|s| container(&s, "app").cloned()).expect("status");
        assert_eq!(after.container_id, before.container_id, "no container was recreated");
        assert_eq!(after_settle.container_id, before.container_id);
        assert_eq!(after_settle.restart_count, 1, "restart count survived the agent restart");
        let (sandboxes, containers) = w.runtime_objects("adopt").await;
        assert_eq!((sandboxes.len(), containers.len()), (1, 2), "one sandbox, the running container and its dead predecessor");
        agent.stop().await;
    })
    .await;
}

/// A pod whose init container exits at once, then an app container.
fn quick_init_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - {{name: init, image: {IMAGE}, command: [/bin/sh, -c, 'echo ready > /tmp/ready']}}\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n"
    )
}

/// Issue 22: a container that exits right after it starts must never leave its
/// pod waiting for the safety relist. Bursts of pods whose init container exits
/// at once, with a 5-minute safety relist: every app container must run long
/// before any relist could have rescued it.
#[tokio::test(flavor = "multi_thread")]
async fn init_containers_that_exit_at_once_never_hold_back_a_burst_of_pods() {
    e2e(
        "init_containers_that_exit_at_once_never_hold_back_a_burst_of_pods",
        |w| async move {
            const PODS: usize = 20;
            let bursts = std::env::var("EVLET_E2E_BURSTS")
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(if support::mode() == evlet::config::PlegMode::Ebpf { 7 } else { 3 });
            let agent = w
                .start_with(evlet::config::Config {
                    ebpf_relist_period: Duration::from_secs(300),
                    ..w.config()
                })
                .await;
            let mut waits = Vec::new();
            for burst in 0..bursts {
                let names: Vec<String> = (0..PODS).map(|i| format!("b{burst}p{i}")).collect();
                let started = tokio::time::Instant::now();
                for n in &names {
                    w.write(&format!("{n}.yaml"), &quick_init_pod(n));
                }
                let mut pending: Vec<String> = names.iter().map(|n| w.pod_name(n)).collect();
                eventually(
                    Duration::from_secs(90),
                    &format!("burst {burst}: every app container running"),
                    || {
                        pending.retain(|p| {
                            let up = agent.status(p).is_some_and(|s| running(&s, "app"));
                            if up {
                                waits.push(started.elapsed());
                            }
                            !up
                        });
                        let done = pending.is_empty();
                        async move { done.then_some(()) }
                    },
                )
                .await;
                agent.assert_no_missed_events().await;
                for n in &names {
                    w.remove(&format!("{n}.yaml"));
                }
                eventually(Duration::from_secs(90), "the burst's pods removed", || async {
                    names
                        .iter()
                        .all(|n| agent.status(&w.pod_name(n)).is_none())
                        .then_some(())
                })
                .await;
            }
            waits.sort();
            let pct = |p: usize| waits[(waits.len() - 1) * p / 100];
            eprintln!(
                "{bursts} bursts of {PODS} pods ({:?}, containerd {}): burst start -> app running p50 {:?} p90 {:?} max {:?}",
                support::mode(),
                w.node.containerd_version,
                pct(50),
                pct(90),
                pct(100)
            );
            agent.stop().await;
        },
    )
    .await;
}
