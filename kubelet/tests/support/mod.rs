//! Shared harness of the `node_*` agent tests: each test starts its own agent
//! (own node name, root dir, manifest dir) and removes what it made, even on
//! failure. Tests hold a lock: one agent per runtime at a time, as on a real
//! node (another agent's pods would be orphans to it).
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::future::Future;
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

pub struct World {
    pub node: NodeEnv,
    pub name: String,
    pub root: tempfile::TempDir,
    pub manifests: tempfile::TempDir,
    pub client: RuntimeClient,
    /// Clean-ups of what the test made off the node (a real cluster's
    /// namespace and Node object), run by [`e2e`] after the runtime's, also
    /// when the test failed.
    cleanups: std::sync::Mutex<Vec<Cleanup>>,
}

/// One clean-up [`World::on_cleanup`] registered.
pub type Cleanup = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

pub struct Running {
    pub handles: Handles,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
    /// A test that panics drops its agent without `stop`: the agent must stop
    /// then too, or it recreates the pods the clean-up removes.
    _stop_on_drop: tokio_util::sync::DropGuard,
}

/// A plain-HTTP GET with curl (the read-only port): status, content type, body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}\n%{content_type}",
            &format!("http://{addr}{path}"),
        ])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (rest, content_type) = text.rsplit_once('\n').expect("content type");
    let (body, code) = rest.rsplit_once('\n').expect("status");
    (
        code.parse().expect("code"),
        content_type.to_owned(),
        body.to_owned(),
    )
}

/// The machine's memory, between the containerd lines' suites (they run in
/// parallel): the test that moves `memory.available` across a threshold holds
/// it exclusively, tests that start many pods (hundreds of shims, about a GiB)
/// hold it shared, so neither pushes the other's node under its threshold. An
/// `flock`, released when the file closes: taken around [`e2e`], so a test's
/// pods are gone (its clean-up ran, even after a failure) before the next
/// holder reads the memory.
pub async fn node_memory_lock(exclusive: bool) -> std::fs::File {
    tokio::task::spawn_blocking(move || flock_node_memory(exclusive))
        .await
        .expect("lock")
}

fn flock_node_memory(exclusive: bool) -> std::fs::File {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/evlet-node-memory-test.lock")
        .expect("lock file");
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: a valid open descriptor; flock takes no pointers.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    file
}

/// The eviction settings of test agents: upstream's memory threshold alone.
/// The disk thresholds stay off: this machine kind's root filesystem runs with
/// less free space than upstream's 10 % `nodefs.available` (7.9 % measured),
/// which would put every test node under DiskPressure and refuse its API pods.
pub fn test_eviction() -> evlet::eviction::Settings {
    evlet::eviction::thresholds::parse(&evlet::eviction::thresholds::Config {
        hard: Some([("memory.available".to_owned(), "100Mi".to_owned())].into()),
        ..Default::default()
    })
    .expect("valid eviction settings")
}

/// Image GC off (high threshold 100, no maximum age), as test agents share
/// each containerd line's images.
pub fn test_image_gc() -> evlet::image_gc::Policy {
    evlet::image_gc::Policy {
        high_threshold_percent: 100,
        low_threshold_percent: 80,
        ..Default::default()
    }
}

pub fn mode() -> PlegMode {
    match std::env::var("EVLET_E2E_PLEG").as_deref() {
        Ok("ebpf") => PlegMode::Ebpf,
        Ok("cri-events") => PlegMode::CriEvents,
        Ok("generic") | Err(_) => PlegMode::Generic,
        Ok(other) => panic!("EVLET_E2E_PLEG={other:?}: use generic, ebpf or cri-events"),
    }
}

/// The cgroup driver of the node under test: `EVLET_E2E_CGROUP_DRIVER`
/// (`systemd` in `vm-test`'s systemd guest, whose containerd has
/// `SystemdCgroup = true`), else cgroupfs.
pub fn cgroup_driver() -> evlet::cm::Driver {
    match std::env::var("EVLET_E2E_CGROUP_DRIVER") {
        Ok(d) => evlet::cm::Driver::parse(&d).expect("EVLET_E2E_CGROUP_DRIVER"),
        Err(_) => evlet::cm::Driver::Cgroupfs,
    }
}

impl World {
    /// Runs `cleanup` when the test ends, after the runtime's clean-up (in
    /// registration order), whether the test passed or not.
    pub fn on_cleanup(&self, cleanup: impl Future<Output = ()> + Send + 'static) {
        self.cleanups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::pin(cleanup));
    }

    pub fn config(&self) -> Config {
        Config {
            node_name: self.name.clone(),
            root_dir: self.root.path().to_path_buf(),
            pod_manifest_path: Some(self.manifests.path().to_path_buf()),
            manifest_url: None,
            runtime_endpoint: self.node.endpoint.clone(),
            cgroup_root: format!("{}/{}", self.node.cgroup_root, self.name),
            cgroup_driver: cgroup_driver(),
            http: evlet::config::HttpEndpoints {
                read_only: Some("127.0.0.1:0".parse().expect("address")),
                local_socket: Some(self.root.path().join(evlet::server::local::SOCKET)),
                ..Default::default()
            },
            file_check_frequency: Duration::from_secs(2),
            http_check_frequency: Duration::from_secs(20),
            node_ip: Some("127.0.0.1".into()),
            pleg_mode: mode(),
            relist_period: Duration::from_secs(1),
            // Short, so the safety relist runs during each test and would count
            // any change the hints missed.
            ebpf_relist_period: Duration::from_secs(2),
            ebpf_ring_bytes: 1 << 20,
            log_format: LogFormat::Text,
            api: None,
            max_pods: evlet::config::MAX_PODS,
            register_with_taints: Vec::new(),
            node_labels: Default::default(),
            secure: None,
            sync_frequency: evlet::workers::RESYNC,
            pods: Default::default(),
            eviction: test_eviction(),
            // Off: the containerd lines are shared by parallel tests, and the
            // host's disk may be fuller than upstream's defaults allow.
            image_gc: test_image_gc(),
            pod_infra_container_image: None,
            container_gc: Default::default(),
            reservations: evlet::cm::allocatable::Reservations {
                enforce_pods: true,
                ..Default::default()
            },
            pod_pids_limit: -1,
            cgroup_layout: None,
            single_process_oom_kill: None,
        }
    }

    pub async fn start(&self) -> Running {
        self.start_with(self.config()).await
    }

    /// Starts an agent with a modified configuration.
    /// The requested PLEG mode must be the active one: a test never passes on
    /// a silent fallback to `generic`.
    pub async fn start_with(&self, config: Config) -> Running {
        let shutdown = CancellationToken::new();
        let wanted = config.pleg_mode;
        let (handles, task) = agent::start(config, shutdown.clone())
            .await
            .expect("agent starts");
        let active = handles
            .served
            .mode
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        assert_eq!(active, wanted.as_str(), "PLEG mode {wanted:?} is active");
        Running {
            handles,
            _stop_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            task,
        }
    }

    pub fn write(&self, file: &str, yaml: &str) {
        // Write then rename, as an editor would, so the agent never reads half a file.
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.path().join(file)).expect("rename manifest");
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.path().join(file)).expect("remove manifest");
    }

    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.name)
    }

    /// Sandboxes and containers of pods named `<name>-<node>` (all states).
    pub async fn runtime_objects(&self, name: &str) -> (Vec<String>, Vec<String>) {
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
    pub async fn cleanup(&self) {
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
        // The pods' tmpfs and bind mounts under the root (Secrets, tokens,
        // local claims): a stopped agent leaves them, as upstream's does, and
        // the root's TempDir cannot remove a mounted directory.
        for mount in evlet::volume::mount::mounts_under(self.root.path()) {
            if let Err(e) = evlet::volume::mount::unmount(&mount) {
                tracing::warn!(mount = %mount.display(), error = %e, "cleanup: unmount failed");
            }
        }
        match cgroup_driver() {
            evlet::cm::Driver::Cgroupfs => self.node.remove_cgroups(&self.name),
            // systemd owns the slices: stopping the world's root slice
            // removes it and every slice in it.
            evlet::cm::Driver::Systemd => {
                let root = format!("{}/{}", self.node.cgroup_root, self.name);
                let parts: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
                let _ = std::process::Command::new("systemctl")
                    .args(["stop", &evlet::cm::systemd::slice_name(&parts)])
                    .status();
            }
        }
    }
}

impl Running {
    pub fn status(&self, pod: &str) -> Option<PodStatus> {
        self.handles
            .workers
            .views()
            .into_iter()
            .find(|v| v.pod.metadata.name.as_deref() == Some(pod))
            .map(|v| v.status)
    }

    /// The container ID of `pod`'s container `name` once it runs.
    pub async fn running_id(&self, pod: &str, name: &str) -> String {
        self.wait_status(pod, "the container running", Duration::from_secs(60), |s| {
            container(s, name)
                .filter(|_| running(s, name))
                .and_then(|c| c.container_id.clone())
        })
        .await
    }

    pub async fn wait_status<T>(
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

    /// The value of metric `name` (a full sample name such as
    /// `evlet_pleg_missed_events_total`). Panics if it is not exported: a
    /// renamed metric must fail the test, not read as 0.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.handles.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} is not exported"))
    }

    /// In the hinted PLEG modes: asks for a full relist that counts every
    /// change no hint announced, waits until one has run, and asserts it found
    /// none. In `generic` mode every change is found by polling by design, so
    /// there is nothing to count.
    pub async fn assert_no_missed_events(&self) {
        let Some(hints) = &self.handles.hints else {
            return;
        };
        let before = self.metric("evlet_pleg_counted_relists_total");
        hints.verify();
        eventually(
            Duration::from_secs(15),
            "a full relist counting missed events",
            || async { (self.metric("evlet_pleg_counted_relists_total") > before).then_some(()) },
        )
        .await;
        assert_eq!(
            self.metric("evlet_pleg_missed_events_total"),
            0.0,
            "a full relist found changes no hint announced"
        );
    }

    /// Stops the agent, checking first that no state change escaped the hints.
    pub async fn stop(self) {
        self.assert_no_missed_events().await;
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

pub fn container<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

/// The exit code of container `name` if it is terminated now.
pub fn exit_code(status: &PodStatus, name: &str) -> Option<i32> {
    container(status, name)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

pub fn running(status: &PodStatus, name: &str) -> bool {
    container(status, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

pub async fn e2e<F, Fut>(test: &str, body: F)
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
        cleanups: Default::default(),
    });
    let outcome = tokio::spawn(body(world.clone())).await;
    if outcome.is_err() {
        // The failed body's agent was told to stop when it was dropped; give
        // it time to, so it does not start what the clean-up removes.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    world.cleanup().await;
    let cleanups = std::mem::take(&mut *world.cleanups.lock().unwrap_or_else(|p| p.into_inner()));
    for cleanup in cleanups {
        cleanup.await;
    }
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

/// The host PID of the init process of `pod`'s running container `name`,
/// with its container ID.
pub async fn init_pid(world: &World, agent: &Running, pod: &str, name: &str) -> (String, u32) {
    let id = agent.running_id(pod, name).await;
    let cid = ContainerId::new(id.trim_start_matches("containerd://"));
    let pid = world
        .client
        .container_pid(&cid)
        .await
        .expect("verbose status")
        .expect("pid");
    (id, pid)
}

/// SIGKILLs a container init process this test started.
pub fn sigkill((_, pid): (String, u32)) {
    // SAFETY: plain kill(2) of a process the test's own pod runs.
    assert_eq!(
        unsafe { libc::kill(pid as i32, libc::SIGKILL) },
        0,
        "kill {pid}"
    );
}

/// SIGKILLs the init process of `pod`'s container `name` (which must be running)
/// and returns its container ID.
pub async fn kill(world: &World, agent: &Running, pod: &str, name: &str) -> String {
    let (id, pid) = init_pid(world, agent, pod, name).await;
    sigkill((id.clone(), pid));
    id
}

/// The workload image.
pub const IMAGE: &str = "evlet.local/test:v1";
