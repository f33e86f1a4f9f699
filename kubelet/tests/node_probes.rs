//! Probes and lifecycle hooks on the real runtime: exec liveness restarts,
//! HTTP, TCP and gRPC readiness both ways, startup probes holding back a
//! sidecar's app, postStart before running, and every preStop kind before
//! SIGTERM. Files the pods serve or write live in a host directory mounted
//! into them (`/host`), so the test flips probes by writing files.

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use evlet_testkit::eventually;
use k8s_openapi::api::core::v1::PodStatus;
use support::{IMAGE, Running, container, e2e, running};

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&path, text).expect("write");
}

fn ready(s: &PodStatus, name: &str) -> bool {
    container(s, name).is_some_and(|c| c.ready)
}

fn condition(s: &PodStatus, kind: &str) -> String {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn events(agent: &Running, reason: &str) -> Vec<String> {
    agent
        .handles
        .diagnostics
        .events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| format!("{}: {}", e.container.unwrap_or_default(), e.message))
        .collect()
}

/// The Unix ns a container wrote to `name` with `/bin/now`.
fn marker(dir: &Path, name: &str) -> Option<i128> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn host_volume(dir: &Path) -> String {
    format!(
        "  volumes: [{{name: host, hostPath: {{path: {}}}}}]\n",
        dir.display()
    )
}

const MOUNT: &str = "    volumeMounts: [{name: host, mountPath: /host}]\n";

#[tokio::test(flavor = "multi_thread")]
async fn an_exec_liveness_probe_restarts_a_container_that_stops_being_healthy() {
    e2e(
        "an_exec_liveness_probe_restarts_a_container_that_stops_being_healthy",
        |w| async move {
            let host = tempfile::tempdir().expect("host dir");
            write(host.path(), "healthy", "yes");
            w.write(
                "live.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: live}}\nspec:\n  terminationGracePeriodSeconds: 30\n{}  containers:\n  - name: app\n    image: {IMAGE}\n    command: [/bin/sleep, '3600']\n{MOUNT}    livenessProbe:\n      exec: {{command: [cat, /host/healthy]}}\n      periodSeconds: 1\n      failureThreshold: 2\n      terminationGracePeriodSeconds: 1\n",
                    host_volume(host.path())
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("live");
            agent.running_id(&pod, "app").await;
            // Healthy for a while: nothing happens.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let s = agent.status(&pod).expect("status");
            assert_eq!(container(&s, "app").map(|c| c.restart_count), Some(0));
            std::fs::remove_file(host.path().join("healthy")).expect("rm");
            let broke = tokio::time::Instant::now();
            let s = agent
                .wait_status(&pod, "a restart", Duration::from_secs(30), |s| {
                    (running(s, "app") && container(s, "app")?.restart_count == 1)
                        .then(|| s.clone())
                })
                .await;
            // period × failureThreshold + one period, plus the probe's own
            // grace period (1 s, raised to the 2 s floor: sleep ignores SIGTERM
            // as PID 1) and a restart.
            assert!(
                broke.elapsed() < Duration::from_secs(2 + 1 + 2 + 3),
                "restarted after {:?}",
                broke.elapsed()
            );
            let last = container(&s, "app")
                .and_then(|c| c.last_state.as_ref())
                .and_then(|l| l.terminated.as_ref())
                .expect("lastState.terminated");
            assert_eq!(last.exit_code, 137, "killed after the probe's grace period");
            let unhealthy = events(&agent, "Unhealthy");
            assert!(
                unhealthy
                    .iter()
                    .any(|m| m.starts_with("app: Liveness probe failed: cat: can't open '/host/healthy'")),
                "{unhealthy:?}"
            );
            assert!(
                events(&agent, "Killing")
                    .contains(&"app: Container app failed liveness probe, will be restarted".into()),
                "{:?}",
                events(&agent, "Killing")
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_tcp_and_grpc_readiness_probes_flip_ready_both_ways() {
    e2e(
        "http_tcp_and_grpc_readiness_probes_flip_ready_both_ways",
        |w| async move {
            let host = tempfile::tempdir().expect("host dir");
            write(host.path(), "www/index.html", "hello");
            w.write(
                "ready.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: ready}}\nspec:\n  terminationGracePeriodSeconds: 1\n{}  containers:\n  - name: web\n    image: {IMAGE}\n    command: [httpd, -f, -p, '8080', -h, /host/www]\n    ports: [{{name: http, containerPort: 8080}}]\n{MOUNT}    readinessProbe: {{httpGet: {{path: /ready, port: http}}, periodSeconds: 1, failureThreshold: 1}}\n  - name: grpc\n    image: {IMAGE}\n    command: [/bin/grpc-health, '9090', /host/grpc-ok]\n{MOUNT}    readinessProbe: {{grpc: {{port: 9090, service: app}}, periodSeconds: 1, failureThreshold: 1}}\n  - name: tcp\n    image: {IMAGE}\n    command: [/bin/sleep, '3600']\n    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n  - name: closed\n    image: {IMAGE}\n    command: [/bin/sleep, '3600']\n    readinessProbe: {{tcpSocket: {{port: 9999}}, periodSeconds: 1}}\n",
                    host_volume(host.path())
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("ready");
            let readiness = |web: bool, grpc: bool| {
                let (agent, pod) = (&agent, &pod);
                async move {
                    agent
                        .wait_status(
                            pod,
                            &format!("web ready {web}, grpc ready {grpc}"),
                            Duration::from_secs(20),
                            |s| {
                                (running(s, "web")
                                    && running(s, "grpc")
                                    && ready(s, "web") == web
                                    && ready(s, "grpc") == grpc
                                    // The pod's port 8080 is open: TCP is ready.
                                    && ready(s, "tcp")
                                    && !ready(s, "closed")
                                    && condition(s, "Ready") == "False")
                                    .then_some(())
                            },
                        )
                        .await;
                }
            };
            readiness(false, false).await;
            write(host.path(), "www/ready", "ok");
            write(host.path(), "grpc-ok", "");
            readiness(true, true).await;
            std::fs::remove_file(host.path().join("www/ready")).expect("rm");
            readiness(false, true).await;
            std::fs::remove_file(host.path().join("grpc-ok")).expect("rm");
            readiness(false, false).await;
            write(host.path(), "www/ready", "ok");
            readiness(true, false).await;
            let unhealthy = events(&agent, "Unhealthy");
            for expected in [
                "web: Readiness probe failed: HTTP probe failed with statuscode: 404",
                "grpc: Readiness probe failed: service unhealthy (responded with \"NOT_SERVING\")",
            ] {
                assert!(unhealthy.iter().any(|m| m == expected), "{expected} in {unhealthy:?}");
            }
            assert!(
                unhealthy.iter().any(|m| m.starts_with("closed: Readiness probe failed: dial tcp")
                    && m.ends_with(":9999: connect: connection refused")),
                "{unhealthy:?}"
            );
            let s = agent.status(&pod).expect("status");
            assert!(
                s.container_statuses.iter().flatten().all(|c| c.restart_count == 0),
                "readiness never restarts"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecars_startup_probe_holds_back_the_app_and_post_start_runs_before_running() {
    e2e(
        "a_sidecars_startup_probe_holds_back_the_app_and_post_start_runs_before_running",
        |w| async move {
            let host = tempfile::tempdir().expect("host dir");
            w.write(
                "side.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: side}}\nspec:\n  terminationGracePeriodSeconds: 1\n{}  initContainers:\n  - name: proxy\n    image: {IMAGE}\n    restartPolicy: Always\n    command: [/bin/sleep, '3600']\n{MOUNT}    startupProbe: {{exec: {{command: [cat, /host/started]}}, periodSeconds: 1, failureThreshold: 60}}\n    livenessProbe: {{exec: {{command: [sh, -c, '/bin/now >> /host/liveness']}}, periodSeconds: 1}}\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [/bin/sleep, '3600']\n{MOUNT}    lifecycle:\n      postStart: {{exec: {{command: [sh, -c, 'sleep 2; /bin/now > /host/post-start']}}}}\n",
                    host_volume(host.path())
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("side");
            agent.running_id(&pod, "proxy").await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let s = agent.status(&pod).expect("status");
            assert!(
                container(&s, "app").is_none_or(|c| c.container_id.is_none()),
                "the app waits for the sidecar's startup probe: {s:?}"
            );
            assert_eq!(condition(&s, "Initialized"), "False");
            assert!(
                !host.path().join("liveness").exists(),
                "liveness waits for the startup probe"
            );
            write(host.path(), "started", "yes");
            // The first status showing the app running comes after its postStart hook.
            let seen_running = agent
                .wait_status(&pod, "the app running", Duration::from_secs(30), |s| {
                    running(s, "app").then(evlet::clock::unix_ns)
                })
                .await;
            let hook = marker(host.path(), "post-start").expect("postStart wrote its marker");
            assert!(
                hook <= i128::from(seen_running),
                "postStart finished ({hook}) before the app was shown running ({seen_running})"
            );
            eventually(Duration::from_secs(10), "liveness probing", || async {
                host.path().join("liveness").exists().then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_pre_stop_kind_runs_before_sigterm() {
    e2e("every_pre_stop_kind_runs_before_sigterm", |w| async move {
        let host = tempfile::tempdir().expect("host dir");
        write(
            host.path(),
            "www/cgi-bin/stop",
            "#!/bin/sh\n/bin/now > /host/pre-stop-http\necho 'Content-Type: text/plain'\necho\necho stopping\n",
        );
        std::fs::set_permissions(
            host.path().join("www/cgi-bin/stop"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        // Each container writes when SIGTERM reaches it.
        let trap = |name: &str| {
            format!(
                "[sh, -c, 'trap \"/bin/now > /host/term-{name}; exit 0\" TERM; while true; do sleep 1 & wait $!; done']"
            )
        };
        w.write(
            "stop.yaml",
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: stop}}\nspec:\n  terminationGracePeriodSeconds: 20\n{vol}  containers:\n  - name: exec\n    image: {IMAGE}\n    command: {exec}\n{MOUNT}    lifecycle: {{preStop: {{exec: {{command: [sh, -c, '/bin/now > /host/pre-stop-exec']}}}}}}\n  - name: http\n    image: {IMAGE}\n    command: [sh, -c, 'httpd -p 8080 -h /host/www; {http}']\n{MOUNT}    lifecycle: {{preStop: {{httpGet: {{path: /cgi-bin/stop, port: 8080}}}}}}\n  - name: sleep\n    image: {IMAGE}\n    command: {sleep}\n{MOUNT}    lifecycle: {{preStop: {{sleep: {{seconds: 3}}}}}}\n  - name: tcp\n    image: {IMAGE}\n    command: {tcp}\n{MOUNT}    lifecycle: {{preStop: {{tcpSocket: {{port: 8080}}}}}}\n",
                vol = host_volume(host.path()),
                exec = trap("exec"),
                http = trap("http")
                    .trim_start_matches("[sh, -c, '")
                    .trim_end_matches("']"),
                sleep = trap("sleep"),
                tcp = trap("tcp"),
            ),
        );
        let agent = w.start().await;
        let pod = w.pod_name("stop");
        agent
            .wait_status(&pod, "all running", Duration::from_secs(60), |s| {
                ["exec", "http", "sleep", "tcp"]
                    .iter()
                    .all(|c| running(s, c))
                    .then_some(())
            })
            .await;
        let deleted = evlet::clock::unix_ns();
        w.remove("stop.yaml");
        eventually(Duration::from_secs(30), "every container stopped", || async {
            ["exec", "http", "sleep", "tcp"]
                .iter()
                .all(|c| marker(host.path(), &format!("term-{c}")).is_some())
                .then_some(())
        })
        .await;
        let term = |c: &str| marker(host.path(), &format!("term-{c}")).expect("term marker");
        for (hook, c) in [("pre-stop-exec", "exec"), ("pre-stop-http", "http")] {
            let ran = marker(host.path(), hook).unwrap_or_else(|| panic!("{hook} ran"));
            assert!(ran <= term(c), "{hook} ({ran}) before SIGTERM ({})", term(c));
        }
        let slept = term("sleep") - i128::from(deleted);
        assert!(
            slept >= 3_000_000_000,
            "SIGTERM came {slept} ns after the delete, after the 3 s sleep hook"
        );
        // tcpSocket passes validation but cannot run, as upstream: the hook
        // fails with an event and termination goes on.
        assert!(
            events(&agent, "FailedPreStopHook").contains(&"tcp: PreStopHook failed".into()),
            "{:?}",
            events(&agent, "FailedPreStopHook")
        );
        agent.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sidecars_stop_after_the_app_containers_in_reverse_order() {
    e2e(
        "sidecars_stop_after_the_app_containers_in_reverse_order",
        |w| async move {
            let host = tempfile::tempdir().expect("host dir");
            // Each container takes a second to stop after SIGTERM, so an order
            // that is not enforced shows as overlapping times.
            let trap = |name: &str| {
                format!(
                    "[sh, -c, 'trap \"/bin/now > /host/term-{name}; sleep 1; exit 0\" TERM; while true; do sleep 1 & wait $!; done']"
                )
            };
            w.write(
                "order.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: order}}\nspec:\n  terminationGracePeriodSeconds: 20\n{vol}  initContainers:\n  - name: first\n    image: {IMAGE}\n    restartPolicy: Always\n    command: {first}\n{MOUNT}  - name: second\n    image: {IMAGE}\n    restartPolicy: Always\n    command: {second}\n{MOUNT}  containers:\n  - name: app\n    image: {IMAGE}\n    command: {app}\n{MOUNT}",
                    vol = host_volume(host.path()),
                    first = trap("first"),
                    second = trap("second"),
                    app = trap("app"),
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("order");
            agent
                .wait_status(&pod, "all running", Duration::from_secs(60), |s| {
                    ["first", "second", "app"]
                        .iter()
                        .all(|c| running(s, c))
                        .then_some(())
                })
                .await;
            w.remove("order.yaml");
            eventually(Duration::from_secs(30), "every container stopped", || async {
                ["first", "second", "app"]
                    .iter()
                    .all(|c| marker(host.path(), &format!("term-{c}")).is_some())
                    .then_some(())
            })
            .await;
            let term = |c: &str| marker(host.path(), &format!("term-{c}")).expect("term marker");
            assert!(
                term("app") + 900_000_000 <= term("second"),
                "the last sidecar gets SIGTERM after the app stopped: app {} second {}",
                term("app"),
                term("second")
            );
            assert!(
                term("second") + 900_000_000 <= term("first"),
                "sidecars stop in reverse order: second {} first {}",
                term("second"),
                term("first")
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn termination_messages_come_from_the_file_or_the_log() {
    e2e(
        "termination_messages_come_from_the_file_or_the_log",
        |w| async move {
            w.write(
                "bye.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: bye}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: file\n    image: {IMAGE}\n    command: [sh, -c, 'echo -n \"written on the way out\" > /dev/termination-log; exit 3']\n  - name: logs\n    image: {IMAGE}\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, 'echo first >&2; echo last words >&2; exit 1']\n  - name: custom\n    image: {IMAGE}\n    terminationMessagePath: /tmp/why\n    command: [sh, -c, 'echo custom path > /tmp/why']\n"
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("bye");
            let s = agent
                .wait_status(&pod, "every container terminated", Duration::from_secs(60), |s| {
                    ["file", "logs", "custom"]
                        .iter()
                        .all(|c| {
                            container(s, c)
                                .and_then(|c| c.state.as_ref())
                                .is_some_and(|st| st.terminated.is_some())
                        })
                        .then(|| s.clone())
                })
                .await;
            let message = |c: &str| {
                container(&s, c)
                    .and_then(|c| c.state.as_ref())
                    .and_then(|st| st.terminated.as_ref())
                    .and_then(|t| t.message.clone())
                    .unwrap_or_default()
            };
            assert_eq!(message("file"), "written on the way out");
            assert_eq!(message("logs"), "first\nlast words\n");
            assert_eq!(message("custom"), "custom path\n");
            agent.stop().await;
        },
    )
    .await;
}
