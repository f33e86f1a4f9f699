//! The Kubernetes view of the container runtime: CRI sandboxes and containers
//! grouped into pods by their `io.kubernetes.pod.uid` label (upstream's
//! `kuberuntime` `GetPods` / `GetPodStatus`).

use std::collections::BTreeMap;

use evlet_cri::{ContainerFilter, ContainerId, RuntimeClient, SandboxFilter, SandboxId, api};

use crate::pod::{PodUid, labels};

/// A container's lifecycle state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// Unknown (or anything else the runtime says).
    Unknown,
}

impl State {
    /// The state a CRI `ContainerState` value stands for.
    pub fn from_cri(state: i32) -> Self {
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerCreated) => State::Created,
            Ok(api::ContainerState::ContainerRunning) => State::Running,
            Ok(api::ContainerState::ContainerExited) => State::Exited,
            _ => State::Unknown,
        }
    }
}

/// Which list a container comes from in the pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `spec.initContainers` (run to completion).
    Init,
    /// `spec.initContainers` with `restartPolicy: Always`.
    Sidecar,
    /// `spec.containers`.
    App,
}

impl Kind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Init => "init",
            Kind::Sidecar => "sidecar",
            Kind::App => "app",
        }
    }

    fn from_label(s: Option<&String>) -> Self {
        match s.map(String::as_str) {
            Some("init") => Kind::Init,
            Some("sidecar") => Kind::Sidecar,
            _ => Kind::App,
        }
    }
}

/// One container instance (a restart is a new instance).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStatus {
    /// Runtime ID.
    pub id: ContainerId,
    /// Name in the pod spec.
    pub name: String,
    /// Init, sidecar or app.
    pub kind: Kind,
    /// Lifecycle state.
    pub state: State,
    /// Times in Unix nanoseconds (0 = not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code once exited.
    pub exit_code: i32,
    /// Runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Runtime's message.
    pub message: String,
    /// Image as specified.
    pub image: String,
    /// Resolved image reference.
    pub image_ref: String,
    /// Hash of the spec it was created from.
    pub hash: String,
    /// Restart count at creation (annotation; survives agent restarts).
    pub restart_count: u32,
    /// The pod's termination grace period when the container was created
    /// (its `io.kubernetes.pod.terminationGracePeriod` annotation), for
    /// killing it without the pod's spec.
    pub grace_period: Option<i64>,
    /// The kernel reported this container's end: `exit_code`, `finished_at`
    /// and `reason` are the kernel's (see `pleg::relist`).
    pub kernel: Option<KernelMark>,
}

#[cfg(test)]
impl ContainerStatus {
    /// An app container instance `name` with ID `<name><created_at>`, created
    /// and started at `created_at`, everything else empty (unit tests).
    pub(crate) fn test(name: &str, created_at: i64, state: State) -> Self {
        Self {
            id: ContainerId::new(format!("{name}{created_at}")),
            name: name.into(),
            kind: Kind::App,
            state,
            created_at,
            started_at: created_at,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            hash: String::new(),
            restart_count: 0,
            grace_period: None,
            kernel: None,
        }
    }
}

/// A container whose end the kernel reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelMark {
    /// The runtime does not show the exit yet.
    Unconfirmed,
    /// The runtime shows it too.
    Confirmed,
}

/// One sandbox of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStatus {
    /// Runtime ID.
    pub id: SandboxId,
    /// Ready (running) or not.
    pub ready: bool,
    /// Creation time (Unix ns).
    pub created_at: i64,
    /// Attempt number in its metadata.
    pub attempt: u32,
    /// Pod IP, if it has a network.
    pub ip: Option<String>,
}

/// Everything the runtime knows about one pod (upstream's `kubecontainer.PodStatus`).
#[derive(Debug, Clone, PartialEq)]
pub struct PodStatus {
    /// The pod's UID.
    pub uid: PodUid,
    /// Name from the runtime labels (for pods the agent no longer has a spec of).
    pub name: String,
    /// Namespace from the runtime labels.
    pub namespace: String,
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Container instances, newest first.
    pub containers: Vec<ContainerStatus>,
}

impl PodStatus {
    /// A pod with nothing in the runtime.
    pub fn empty(uid: PodUid) -> Self {
        Self {
            uid,
            name: String::new(),
            namespace: String::new(),
            sandboxes: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// The newest instance of container `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The instance before the newest one of container `name` (for `lastState`).
    pub fn previous(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().filter(|c| c.name == name).nth(1)
    }

    /// The pod IP of the newest sandbox.
    pub fn ip(&self) -> Option<&str> {
        self.sandboxes.first().and_then(|s| s.ip.as_deref())
    }

    /// Does this status show container or sandbox `id` stopped: a container
    /// exited or gone, a sandbox not ready or gone?
    pub fn shows_stopped(&self, id: &str) -> bool {
        if let Some(s) = self.sandboxes.iter().find(|s| s.id.as_str() == id) {
            return !s.ready;
        }
        self.containers
            .iter()
            .find(|c| c.id.as_str() == id)
            .is_none_or(|c| c.state == State::Exited)
    }

    /// Any container running?
    pub fn any_running(&self) -> bool {
        self.containers.iter().any(|c| c.state == State::Running)
    }
}

/// Upstream's `MaxContainerTerminationMessageLength`: the end of the file kept.
const MAX_TERMINATION_MESSAGE: u64 = 4096;
/// `FallbackToLogsOnError`: at most this many log lines, this many bytes.
const FALLBACK_LINES: usize = 80;
const FALLBACK_BYTES: usize = 2048;

/// The runtime's message of an exited container followed by what the
/// container wrote to its termination message file (or, with
/// `FallbackToLogsOnError` and a failed exit, the end of its log), as
/// upstream's `convertToKubeContainerStatus`.
fn with_termination_message(s: &api::ContainerStatus) -> String {
    let mut message = s.message.clone();
    if s.state != api::ContainerState::ContainerExited as i32 {
        return message;
    }
    let Some(path) = s.annotations.get(labels::TERMINATION_MESSAGE_PATH) else {
        return message;
    };
    let fallback = s
        .annotations
        .get(labels::TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == "FallbackToLogsOnError")
        && s.exit_code != 0
        && s.reason != "ContainerCannotRun";
    let written = s
        .mounts
        .iter()
        .find(|m| m.container_path == *path)
        .map(|m| {
            crate::logs::tail_bytes(std::path::Path::new(&m.host_path), MAX_TERMINATION_MESSAGE)
        });
    let mut text = match written {
        Some(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some(Err(e)) if e.kind() != std::io::ErrorKind::NotFound => {
            format!("Error on reading termination log {path}: {e}")
        }
        _ => String::new(),
    };
    if text.is_empty() && fallback && !s.log_path.is_empty() {
        text = crate::logs::last_text(
            std::path::Path::new(&s.log_path),
            FALLBACK_LINES,
            FALLBACK_BYTES,
        )
        .unwrap_or_else(|e| format!("Error on reading termination message from logs: {e}"));
    }
    if !text.is_empty() {
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// A pod as a full listing shows it: IDs and states only (the relist's input).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimePod {
    /// Sandbox ID → ready.
    pub sandboxes: BTreeMap<String, bool>,
    /// Container ID → state.
    pub containers: BTreeMap<String, State>,
    /// Name and namespace from the labels.
    pub name: String,
    /// See `name`.
    pub namespace: String,
}

/// The runtime, seen as pods.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The CRI client.
    pub client: RuntimeClient,
}

fn label(labels: &std::collections::HashMap<String, String>, key: &str) -> String {
    labels.get(key).cloned().unwrap_or_default()
}

impl Runtime {
    /// A runtime over `client`.
    pub fn new(client: RuntimeClient) -> Self {
        Self { client }
    }

    /// Every pod evlet manages, with all sandboxes and containers (also exited).
    ///
    /// # Errors
    /// The CRI error of `ListPodSandbox` or `ListContainers`.
    pub async fn pods(&self) -> Result<BTreeMap<PodUid, RuntimePod>, evlet_cri::Error> {
        let (sandboxes, containers) = tokio::try_join!(
            self.client.list_pod_sandbox(SandboxFilter::new()),
            self.client.list_containers(ContainerFilter::new())
        )?;
        let mut pods: BTreeMap<PodUid, RuntimePod> = BTreeMap::new();
        for s in sandboxes {
            let Some(uid) = s.labels.get(labels::POD_UID) else {
                continue;
            };
            let pod = pods.entry(PodUid(uid.clone())).or_default();
            pod.name = label(&s.labels, labels::POD_NAME);
            pod.namespace = label(&s.labels, labels::POD_NAMESPACE);
            pod.sandboxes
                .insert(s.id, s.state == api::PodSandboxState::SandboxReady as i32);
        }
        for c in containers {
            let Some(uid) = c.labels.get(labels::POD_UID) else {
                continue;
            };
            let pod = pods.entry(PodUid(uid.clone())).or_default();
            if pod.name.is_empty() {
                pod.name = label(&c.labels, labels::POD_NAME);
                pod.namespace = label(&c.labels, labels::POD_NAMESPACE);
            }
            pod.containers.insert(c.id, State::from_cri(c.state));
        }
        Ok(pods)
    }

    /// The full status of one pod: every sandbox and container instance.
    ///
    /// # Errors
    /// The CRI error of a list or status call (a container removed meanwhile is skipped).
    pub async fn pod_status(&self, uid: &PodUid) -> Result<PodStatus, evlet_cri::Error> {
        let (sandboxes, containers) = tokio::try_join!(
            self.client
                .list_pod_sandbox(SandboxFilter::new().label(labels::POD_UID, uid.0.clone())),
            self.client
                .list_containers(ContainerFilter::new().label(labels::POD_UID, uid.0.clone()))
        )?;
        let mut status = PodStatus::empty(uid.clone());
        for s in sandboxes {
            if status.name.is_empty() {
                status.name = label(&s.labels, labels::POD_NAME);
                status.namespace = label(&s.labels, labels::POD_NAMESPACE);
            }
            let id = SandboxId::new(s.id.clone());
            let ready = s.state == api::PodSandboxState::SandboxReady as i32;
            let ip = if ready {
                match self.client.pod_sandbox_status(&id, false).await {
                    Ok(resp) => resp
                        .status
                        .and_then(|st| st.network)
                        .map(|n| n.ip)
                        .filter(|ip| !ip.is_empty()),
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                }
            } else {
                None
            };
            status.sandboxes.push(SandboxStatus {
                id,
                ready,
                created_at: s.created_at,
                attempt: s.metadata.map(|m| m.attempt).unwrap_or(0),
                ip,
            });
        }
        status
            .sandboxes
            .sort_by_key(|x| std::cmp::Reverse(x.created_at));
        let statuses = futures_util::future::join_all(containers.iter().map(|c| {
            let id = ContainerId::new(c.id.clone());
            let client = self.client.clone();
            async move { (id.clone(), client.container_status(&id).await) }
        }))
        .await;
        for (id, result) in statuses {
            let s = match result {
                Ok(s) => s,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if status.name.is_empty() {
                status.name = label(&s.labels, labels::POD_NAME);
                status.namespace = label(&s.labels, labels::POD_NAMESPACE);
            }
            status.containers.push(ContainerStatus {
                id,
                name: label(&s.labels, labels::CONTAINER_NAME),
                kind: Kind::from_label(s.labels.get(labels::CONTAINER_KIND)),
                state: State::from_cri(s.state),
                created_at: s.created_at,
                started_at: s.started_at,
                finished_at: s.finished_at,
                exit_code: s.exit_code,
                message: with_termination_message(&s),
                reason: s.reason,
                image: s.image.map(|i| i.image).unwrap_or_default(),
                image_ref: s.image_ref,
                hash: label(&s.annotations, labels::CONTAINER_HASH),
                restart_count: s
                    .annotations
                    .get(labels::RESTART_COUNT)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                grace_period: s
                    .annotations
                    .get(labels::GRACE_PERIOD)
                    .and_then(|v| v.parse().ok()),
                kernel: None,
            });
        }
        status
            .containers
            .sort_by_key(|x| std::cmp::Reverse(x.created_at));
        Ok(status)
    }
}
