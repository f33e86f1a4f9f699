//! The agent end to end against the private real containerd (`cargo xtask test`
//! runs this per containerd line). Each test starts its own agent (own node
//! name, root dir, manifest dir) and removes what it made, even on failure.
//! Tests hold a lock: one agent per runtime at a time, as on a real node
//! (another agent's pods would be orphans to it).
//!
//! `EVLET_E2E_PLEG` selects the PLEG mode (default `generic`).

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use evlet::agent::{self, Handles};
use evlet::config::{Config, LogFormat, PlegMode};
use evlet::pod::labels;
use evlet_cri::{ContainerFilter, ContainerId, Options, RuntimeClient, SandboxFilter, SandboxId};
use evlet_testkit::{NodeEnv, eventually};
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use tokio_util::sync::CancellationToken;

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static N: AtomicU32 = AtomicU32::new(0);

struct World {
    node: NodeEnv,
    name: String,
    root: tempfile::TempDir,
    manifests: tempfile::TempDir,
    client: RuntimeClient,
}

struct Running {
    handles: Handles,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn mode() -> PlegMode {
    match std::env::var("EVLET_E2E_PLEG").as_deref() {
        Ok("ebpf") => PlegMode::Ebpf,
        Ok("cri-events") => PlegMode::CriEvents,
        _ => PlegMode::Generic,
    }
}

impl World {
    fn config(&self) -> Config {
        Config {
            node_name: self.name.clone(),
            root_dir: self.root.path().to_path_buf(),
            pod_manifest_path: Some(self.manifests.path().to_path_buf()),
            manifest_url: None,
            runtime_endpoint: self.node.endpoint.clone(),
            cgroup_root: format!("{}/{}", self.node.cgroup_root, self.name),
            address: "127.0.0.1:0".parse().expect("address"),
            file_check_frequency: Duration::from_secs(2),
            http_check_frequency: Duration::from_secs(20),
            node_ip: Some("127.0.0.1".into()),
            pleg_mode: mode(),
            relist_period: Duration::from_secs(1),
            ebpf_relist_period: Duration::from_secs(120),
            log_format: LogFormat::Text,
        }
    }

    async fn start(&self) -> Running {
        let shutdown = CancellationToken::new();
        let (handles, task) = agent::start(self.config(), shutdown.clone())
            .await
            .expect("agent starts");
        Running {
            handles,
            shutdown,
            task,
        }
    }

    fn write(&self, file: &str, yaml: &str) {
        // Write then rename, as an editor would, so the agent never reads half a file.
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.path().join(file)).expect("rename manifest");
    }

    fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.path().join(file)).expect("remove manifest");
    }

    fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.name)
    }

    /// Sandboxes and containers of pods named `<name>-<node>` (all states).
    async fn runtime_objects(&self, name: &str) -> (Vec<String>, Vec<String>) {
        let pod = self.pod_name(name);
        let sandboxes = self
            .client
            .list_pod_sandbox(SandboxFilter::new().label(labels::POD_NAME, pod.clone()))
            .await
            .expect("list sandboxes");
        let containers = self
            .client
            .list_containers(ContainerFilter::new().label(labels::POD_NAME, pod))
            .await
            .expect("list containers");
        (
            sandboxes.into_iter().map(|s| s.id).collect(),
            containers.into_iter().map(|c| c.id).collect(),
        )
    }

    /// Removes every pod of this test's node from the runtime, and its cgroups.
    async fn cleanup(&self) {
        let suffix = format!("-{}", self.name);
        if let Ok(sandboxes) = self.client.list_pod_sandbox(SandboxFilter::new()).await {
            for s in sandboxes.into_iter().filter(|s| {
                s.labels
                    .get(labels::POD_NAME)
                    .is_some_and(|n| n.ends_with(&suffix))
            }) {
                let id = SandboxId::new(s.id);
                let _ = self.client.stop_pod_sandbox(&id).await;
                let _ = self.client.remove_pod_sandbox(&id).await;
            }
        }
        self.node.remove_cgroups(&self.name);
    }
}

impl Running {
    fn status(&self, pod: &str) -> Option<PodStatus> {
        self.handles
            .workers
            .views()
            .into_iter()
            .find(|v| v.pod.metadata.name.as_deref() == Some(pod))
            .map(|v| v.status)
    }

    async fn wait_status<T>(
        &self,
        pod: &str,
        what: &str,
        limit: Duration,
        check: impl Fn(&PodStatus) -> Option<T>,
    ) -> T {
        eventually(limit, what, || async {
            self.status(pod).as_ref().and_then(&check)
        })
        .await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

fn container<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

fn running(status: &PodStatus, name: &str) -> bool {
    container(status, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

async fn e2e<F, Fut>(test: &str, body: F)
where
    F: FnOnce(std::sync::Arc<World>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(node) = evlet_testkit::node(test) else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(filter)
        .try_init();
    let _guard = LOCK.lock().await;
    let client = RuntimeClient::connect(&node.endpoint, Options::default()).expect("endpoint");
    let world = std::sync::Arc::new(World {
        name: format!(
            "e2e{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
        node,
        root: tempfile::tempdir().expect("root"),
        manifests: tempfile::tempdir().expect("manifests"),
        client,
    });
    let outcome = tokio::spawn(body(world.clone())).await;
    world.cleanup().await;
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

const IMAGE: &str = "evlet.local/test:v1";

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
    command: [/bin/sh, -c, "date +%s%N > /host/init-done; echo init-ran"]
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
                .and_then(|r| r.started_at.clone());
            assert!(
                init.finished_at <= one_started,
                "init finished before the app containers started"
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
            assert!(
                removed.elapsed() < Duration::from_secs(10 + 5),
                "within the grace period (+ detection), took {:?}",
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
        let id = agent
            .wait_status(&pod, "app running", Duration::from_secs(60), |s| {
                running(s, "app").then(|| container(s, "app").and_then(|c| c.container_id.clone())).flatten()
            })
            .await;
        let id = ContainerId::new(id.trim_start_matches("containerd://"));
        let pid = w.client.container_pid(&id).await.expect("info").expect("pid");
        // SAFETY: kills the init process of a container this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
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
        let started = tokio::time::Instant::now();
        let c = agent
            .wait_status(&pod, "CrashLoopBackOff after a restart", Duration::from_secs(60), |s| {
                container(s, "app")
                    .filter(|c| c.restart_count >= 1)
                    .filter(|c| c.state.as_ref().and_then(|st| st.waiting.as_ref()).and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff"))
                    .cloned()
            })
            .await;
        assert_eq!(c.last_state.and_then(|l| l.terminated).map(|t| t.exit_code), Some(3));
        // Upstream's delays: restart 1 after 10 s, restart 2 after 20 s more (loosely).
        let restarts_at_25s = agent
            .wait_status(&pod, "25 s of crash loop", Duration::from_secs(60), |s| {
                (started.elapsed() >= Duration::from_secs(25)).then(|| container(s, "app").map_or(0, |c| c.restart_count))
            })
            .await;
        assert!((1..=3).contains(&restarts_at_25s), "backoff 10 s then 20 s allows 1 to 3 restarts in 25 s, saw {restarts_at_25s}");
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
        let id = agent
            .wait_status(&pod, "steady running", Duration::from_secs(60), |s| container(s, "app").filter(|_| running(s, "app")).and_then(|c| c.container_id.clone()))
            .await;

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
