//! The fake runtime's in-memory model: sandboxes, containers, images, and the
//! state transitions CRI calls make, with the container events they emit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::Status;

use crate::api::{self, ContainerEventType, ContainerState, PodSandboxState};

/// Wall-clock nanoseconds, as CRI timestamps are.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A sandbox in the model.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The sandbox ID.
    pub id: String,
    /// The config it was run with.
    pub config: api::PodSandboxConfig,
    /// Ready or not ready.
    pub state: PodSandboxState,
    /// Creation time (ns).
    pub created_at: i64,
    /// The pod IP.
    pub ip: String,
    /// Its init (pause) process while ready.
    pub init: Option<FakeProcess>,
}

/// A container in the model.
#[derive(Debug, Clone)]
pub struct Container {
    /// The container ID.
    pub id: String,
    /// Its sandbox.
    pub sandbox_id: String,
    /// The config it was created with.
    pub config: api::ContainerConfig,
    /// Lifecycle state.
    pub state: ContainerState,
    /// Creation, start and finish times (ns; 0 = not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code once exited.
    pub exit_code: i32,
    /// Reason once exited (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Scripted exit: `(code, after_ns)` from `FAKE_EXIT_CODE` / `FAKE_RUN_MS`.
    pub script: Option<(i32, i64)>,
    /// The process died (ns) with this code and reason, and the runtime has
    /// not processed the exit yet (see [`State::exit_lag_ns`]).
    pub dying: Option<(i64, i32, String)>,
    /// Its init process, from its start until it dies.
    pub init: Option<FakeProcess>,
}

/// A container's (or sandbox's) init process in the model: what a real
/// runtime reports as the task's `pid`, and the start `/proc` would show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeProcess {
    /// The PID.
    pub pid: u32,
    /// Its start, clock ticks since boot.
    pub start_ticks: u64,
}

/// A container's init process died: what the kernel knows at once, before the
/// runtime has processed the exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessExit {
    /// The container ID.
    pub container_id: String,
    /// The container's labels (the test finds its pod there).
    pub labels: std::collections::HashMap<String, String>,
    /// The exit code.
    pub exit_code: i32,
    /// Why (`OOMKilled` for the OOM killer's victim).
    pub reason: String,
    /// When it died (wall-clock ns).
    pub at_ns: i64,
    /// The process that died.
    pub process: FakeProcess,
}

/// The whole model.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Sandboxes by ID.
    pub sandboxes: BTreeMap<String, Sandbox>,
    /// Containers by ID.
    pub containers: BTreeMap<String, Container>,
    /// Images present, by name.
    pub images: BTreeSet<String>,
    /// Images `PullImage` can fetch.
    pub pullable: BTreeSet<String>,
    /// Images whose registry wants credentials: image → (user, password).
    pub private: BTreeMap<String, (String, String)>,
    /// Every `PullImage`: the image and the credentials it came with.
    pub pulls: Vec<(String, Option<api::AuthConfig>)>,
    /// How long after a process dies the runtime shows the exit (containerd
    /// reaps, deletes the task and updates its store first; 0: at once).
    pub exit_lag_ns: i64,
    /// Deaths not yet taken by [`State::take_deaths`].
    deaths: Vec<ProcessExit>,
    /// The runtime reports this exit code for every exit instead of the real
    /// one (containerd 2.x reports 255 for a task that died while it restarted).
    pub reported_exit_code: Option<i32>,
    /// `RuntimeConfig` reports the systemd cgroup driver (containerd's
    /// `SystemdCgroup = true`); else cgroupfs.
    pub systemd_cgroup: bool,
    next_id: u64,
    /// The next init process's PID (and, in ticks, its start).
    next_pid: u32,
    /// Verbose statuses name no init (a runtime without that information).
    pub hide_pids: bool,
}

fn event(
    kind: ContainerEventType,
    c: &Container,
    sandbox: Option<&Sandbox>,
) -> api::ContainerEventResponse {
    api::ContainerEventResponse {
        container_id: c.id.clone(),
        container_event_type: kind as i32,
        created_at: now_ns(),
        pod_sandbox_status: sandbox.map(Sandbox::status),
        containers_statuses: vec![c.status()],
    }
}

fn reason_for(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

impl Sandbox {
    /// The CRI status of this sandbox.
    pub fn status(&self) -> api::PodSandboxStatus {
        api::PodSandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            network: Some(api::PodSandboxNetworkStatus {
                ip: self.ip.clone(),
                additional_ips: vec![],
            }),
            linux: None,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: String::new(),
        }
    }

    /// The CRI list item of this sandbox.
    pub fn item(&self) -> api::PodSandbox {
        api::PodSandbox {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: String::new(),
        }
    }
}

impl Container {
    /// The CRI status of this container.
    pub fn status(&self) -> api::ContainerStatus {
        api::ContainerStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: self.config.image.clone(),
            image_ref: self.image_ref(),
            reason: self.reason.clone(),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            log_path: self.config.log_path.clone(),
            ..Default::default()
        }
    }

    /// The CRI list item of this container.
    pub fn item(&self) -> api::Container {
        api::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.config.image.clone(),
            image_ref: self.image_ref(),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            image_id: String::new(),
        }
    }

    fn image_ref(&self) -> String {
        self.config
            .image
            .as_ref()
            .map(|i| format!("sha256:fake-{}", i.image))
            .unwrap_or_default()
    }
}

/// What a list filter asks of a sandbox or container, as containerd matches
/// it: an ID prefix, a state, labels (each empty or absent: anything).
struct Wanted<'a> {
    id: &'a str,
    state: Option<i32>,
    labels: &'a std::collections::HashMap<String, String>,
}

impl<'a> Wanted<'a> {
    fn of(
        id: &'a str,
        state: Option<i32>,
        labels: &'a std::collections::HashMap<String, String>,
    ) -> Self {
        Self { id, state, labels }
    }

    fn matches(
        &self,
        id: &str,
        state: i32,
        labels: &std::collections::HashMap<String, String>,
    ) -> bool {
        id.starts_with(self.id)
            && self.state.is_none_or(|s| s == state)
            && self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

impl State {
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("{:016x}{:048x}", self.next_id, 0xfa4e_u64)
    }

    /// Makes `image` present.
    pub fn add_image(&mut self, image: &str) {
        self.images.insert(image.to_owned());
    }

    /// Makes `image` pullable.
    pub fn allow_pull(&mut self, image: &str) {
        self.pullable.insert(image.to_owned());
    }

    /// `RunPodSandbox`.
    pub fn run_sandbox(&mut self, config: api::PodSandboxConfig) -> Result<String, Status> {
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("sandbox config has no metadata"))?;
        let clash = self.sandboxes.values().any(|s| {
            s.config.metadata.as_ref().is_some_and(|m| {
                m.name == meta.name
                    && m.namespace == meta.namespace
                    && m.uid == meta.uid
                    && m.attempt == meta.attempt
            })
        });
        if clash {
            return Err(Status::already_exists(format!(
                "failed to reserve sandbox name \"{}_{}_{}_{}\"",
                meta.name, meta.namespace, meta.uid, meta.attempt
            )));
        }
        let id = self.new_id();
        let ip = format!(
            "10.99.{}.{}",
            (self.next_id >> 8) & 0xff,
            self.next_id & 0xff
        );
        let init = Some(self.new_process());
        self.sandboxes.insert(
            id.clone(),
            Sandbox {
                id: id.clone(),
                config,
                state: PodSandboxState::SandboxReady,
                created_at: now_ns(),
                ip,
                init,
            },
        );
        Ok(id)
    }

    /// A new init process: PIDs count up from 100000, each starting one
    /// tick after the last.
    fn new_process(&mut self) -> FakeProcess {
        self.next_pid += 1;
        FakeProcess {
            pid: 100_000 + self.next_pid,
            start_ticks: 1_000 + u64::from(self.next_pid),
        }
    }

    /// The start of live process `pid` (a ready sandbox's or a running
    /// container's init that has not died), as `/proc` would show it.
    pub fn live(&self, pid: u32) -> Option<u64> {
        self.containers
            .values()
            .filter(|c| c.dying.is_none())
            .filter_map(|c| c.init)
            .chain(self.sandboxes.values().filter_map(|s| s.init))
            .find(|p| p.pid == pid)
            .map(|p| p.start_ticks)
    }

    /// The runtime's verbose `info` for a container or sandbox: its init's
    /// `pid` in containerd's JSON shape (0 once it exited, as containerd).
    pub fn info(&self, init: Option<FakeProcess>) -> std::collections::HashMap<String, String> {
        let pid = init.filter(|_| !self.hide_pids).map_or(0, |p| p.pid);
        [("info".to_owned(), format!("{{\"pid\":{pid}}}"))].into()
    }

    fn sandbox(&self, id: &str) -> Result<&Sandbox, Status> {
        self.sandboxes.get(id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find sandbox \"{id}\": not found"
            ))
        })
    }

    fn container_mut(&mut self, id: &str) -> Result<&mut Container, Status> {
        self.containers.get_mut(id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container \"{id}\": not found"
            ))
        })
    }

    /// `StopPodSandbox`: stops its containers; events for those that were running.
    pub fn stop_sandbox(&mut self, id: &str) -> Result<Vec<api::ContainerEventResponse>, Status> {
        if !self.sandboxes.contains_key(id) {
            // Idempotent per CRI: stopping a missing sandbox succeeds.
            return Ok(vec![]);
        }
        let running: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == id && c.state == ContainerState::ContainerRunning)
            .map(|c| c.id.clone())
            .collect();
        let mut events = Vec::new();
        for cid in running {
            events.extend(self.exit(&cid, 137, "Error"));
        }
        if let Some(s) = self.sandboxes.get_mut(id) {
            s.state = PodSandboxState::SandboxNotready;
            s.init = None;
        }
        Ok(events)
    }

    /// `RemovePodSandbox`: removes the sandbox and its containers.
    pub fn remove_sandbox(&mut self, id: &str) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let Some(sandbox) = self.sandboxes.get(id) else {
            return Ok(vec![]);
        };
        if sandbox.state == PodSandboxState::SandboxReady {
            return Err(Status::failed_precondition(format!(
                "sandbox container \"{id}\" is not fully stopped"
            )));
        }
        let ids: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == id)
            .map(|c| c.id.clone())
            .collect();
        let mut events = Vec::new();
        for cid in ids {
            events.extend(self.remove_container(&cid)?);
        }
        self.sandboxes.remove(id);
        Ok(events)
    }

    /// `PodSandboxStatus`.
    pub fn sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, Status> {
        Ok(self.sandbox(id)?.status())
    }

    /// `ListPodSandbox`.
    pub fn list_sandboxes(&self, filter: Option<&api::PodSandboxFilter>) -> Vec<api::PodSandbox> {
        self.sandboxes
            .values()
            .filter(|s| {
                filter.is_none_or(|f| {
                    Wanted::of(
                        &f.id,
                        f.state.as_ref().map(|st| st.state),
                        &f.label_selector,
                    )
                    .matches(&s.id, s.state as i32, &s.config.labels)
                })
            })
            .map(Sandbox::item)
            .collect()
    }

    /// `CreateContainer`.
    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: api::ContainerConfig,
    ) -> Result<(String, Vec<api::ContainerEventResponse>), Status> {
        let sandbox = self.sandbox(sandbox_id)?;
        if sandbox.state != PodSandboxState::SandboxReady {
            return Err(Status::failed_precondition(format!(
                "sandbox {sandbox_id} is not ready"
            )));
        }
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("container config has no metadata"))?;
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if !self.images.contains(&image) {
            return Err(Status::not_found(format!(
                "failed to get image \"{image}\": not found"
            )));
        }
        let clash = self.containers.values().any(|c| {
            c.sandbox_id == sandbox_id
                && c.config
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name == meta.name && m.attempt == meta.attempt)
        });
        if clash {
            return Err(Status::already_exists(format!(
                "failed to reserve container name \"{}_{}\"",
                meta.name, meta.attempt
            )));
        }
        let env = |key: &str| {
            config
                .envs
                .iter()
                .find(|kv| kv.key == key)
                .map(|kv| kv.value.clone())
        };
        let script = env("FAKE_EXIT_CODE").and_then(|code| {
            let code = code.parse().ok()?;
            let run_ms: i64 = env("FAKE_RUN_MS")
                .and_then(|ms| ms.parse().ok())
                .unwrap_or(0);
            Some((code, run_ms * 1_000_000))
        });
        let id = self.new_id();
        let container = Container {
            id: id.clone(),
            sandbox_id: sandbox_id.to_owned(),
            config,
            state: ContainerState::ContainerCreated,
            created_at: now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            script,
            dying: None,
            init: None,
        };
        let ev = event(
            ContainerEventType::ContainerCreatedEvent,
            &container,
            self.sandboxes.get(sandbox_id),
        );
        self.containers.insert(id.clone(), container);
        Ok((id, vec![ev]))
    }

    /// `StartContainer`.
    pub fn start_container(
        &mut self,
        id: &str,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let c = self.container_mut(id)?;
        if c.state != ContainerState::ContainerCreated {
            return Err(Status::failed_precondition(format!(
                "container {id} is not in created state"
            )));
        }
        c.state = ContainerState::ContainerRunning;
        c.started_at = now_ns();
        let c = c.clone();
        let init = self.new_process();
        if let Some(c) = self.containers.get_mut(id) {
            c.init = Some(init);
        }
        Ok(vec![event(
            ContainerEventType::ContainerStartedEvent,
            &c,
            self.sandboxes.get(&c.sandbox_id),
        )])
    }

    /// A running container's process dies (also used by `StopContainer` and
    /// scripts). The runtime shows the exit at once, or after
    /// [`State::exit_lag_ns`] (then it returns no event yet).
    pub fn exit(
        &mut self,
        id: &str,
        exit_code: i32,
        reason: &str,
    ) -> Option<api::ContainerEventResponse> {
        let lag = self.exit_lag_ns;
        let c = self.containers.get_mut(id)?;
        if c.state != ContainerState::ContainerRunning || c.dying.is_some() {
            return None;
        }
        let now = now_ns();
        self.deaths.push(ProcessExit {
            container_id: c.id.clone(),
            labels: c.config.labels.clone(),
            exit_code,
            reason: reason.to_owned(),
            at_ns: now,
            process: c.init.unwrap_or(FakeProcess {
                pid: 0,
                start_ticks: 0,
            }),
        });
        c.dying = Some((now, exit_code, reason.to_owned()));
        if lag > 0 {
            return None;
        }
        self.reap(id)
    }

    /// The runtime processes a dead container's exit: it shows Exited from now on.
    fn reap(&mut self, id: &str) -> Option<api::ContainerEventResponse> {
        let reported = self.reported_exit_code;
        let c = self.containers.get_mut(id)?;
        let (at, exit_code, reason) = c.dying.take()?;
        c.init = None;
        c.state = ContainerState::ContainerExited;
        c.finished_at = at;
        c.exit_code = reported.unwrap_or(exit_code);
        c.reason = reason;
        let c = c.clone();
        Some(event(
            ContainerEventType::ContainerStoppedEvent,
            &c,
            self.sandboxes.get(&c.sandbox_id),
        ))
    }

    /// The process deaths since the last call, in order.
    pub fn take_deaths(&mut self) -> Vec<ProcessExit> {
        std::mem::take(&mut self.deaths)
    }

    /// `StopContainer`: SIGTERM-like exit (143) with a grace period, SIGKILL-like (137) without.
    pub fn stop_container(
        &mut self,
        id: &str,
        timeout: i64,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let state = self.container_mut(id)?.state;
        if state == ContainerState::ContainerCreated {
            let c = self.container_mut(id)?;
            c.state = ContainerState::ContainerExited;
            c.finished_at = now_ns();
            c.exit_code = 0;
            return Ok(vec![]);
        }
        let code = if timeout > 0 { 143 } else { 137 };
        let shown = self.exit(id, code, reason_for(code));
        // StopContainer returns once the runtime has processed the exit.
        Ok(shown.or_else(|| self.reap(id)).into_iter().collect())
    }

    /// `RemoveContainer` (idempotent).
    pub fn remove_container(
        &mut self,
        id: &str,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let Some(mut c) = self.containers.remove(id) else {
            return Ok(vec![]);
        };
        let mut events = Vec::new();
        if c.state == ContainerState::ContainerRunning {
            c.state = ContainerState::ContainerExited;
            c.exit_code = 137;
            c.finished_at = now_ns();
            events.push(event(
                ContainerEventType::ContainerStoppedEvent,
                &c,
                self.sandboxes.get(&c.sandbox_id),
            ));
        }
        events.push(event(
            ContainerEventType::ContainerDeletedEvent,
            &c,
            self.sandboxes.get(&c.sandbox_id),
        ));
        Ok(events)
    }

    /// `ListContainers`.
    pub fn list_containers(&self, filter: Option<&api::ContainerFilter>) -> Vec<api::Container> {
        self.containers
            .values()
            .filter(|c| {
                filter.is_none_or(|f| {
                    (f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
                        && Wanted::of(
                            &f.id,
                            f.state.as_ref().map(|st| st.state),
                            &f.label_selector,
                        )
                        .matches(&c.id, c.state as i32, &c.config.labels)
                })
            })
            .map(Container::item)
            .collect()
    }

    /// `ContainerStatus`.
    pub fn container_status(&self, id: &str) -> Result<api::ContainerStatus, Status> {
        self.containers
            .get(id)
            .map(Container::status)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "an error occurred when try to find container \"{id}\": not found"
                ))
            })
    }

    /// Is the container running (for exec)?
    pub fn require_running(&self, id: &str) -> Result<(), Status> {
        match self.containers.get(id) {
            None => Err(Status::not_found(format!("container \"{id}\" not found"))),
            Some(c) if c.state != ContainerState::ContainerRunning => Err(
                Status::failed_precondition(format!("container {id} is not running")),
            ),
            Some(_) => Ok(()),
        }
    }

    /// Kills running containers whose scripted run time has passed, and
    /// processes the exits whose lag is over.
    pub fn run_scripts(&mut self, now: i64) -> Vec<api::ContainerEventResponse> {
        let due: Vec<(String, i32)> = self
            .containers
            .values()
            .filter(|c| c.state == ContainerState::ContainerRunning && c.dying.is_none())
            .filter_map(|c| {
                let (code, after) = c.script?;
                (now >= c.started_at + after).then(|| (c.id.clone(), code))
            })
            .collect();
        let mut events: Vec<api::ContainerEventResponse> = due
            .into_iter()
            .filter_map(|(id, code)| self.exit(&id, code, reason_for(code)))
            .collect();
        let lag = self.exit_lag_ns;
        let reaped: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.dying.as_ref().is_some_and(|(at, _, _)| now >= at + lag))
            .map(|c| c.id.clone())
            .collect();
        events.extend(reaped.iter().filter_map(|id| self.reap(id)));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox_config(name: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    fn container_config(name: &str, envs: &[(&str, &str)]) -> api::ContainerConfig {
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: "img".into(),
                ..Default::default()
            }),
            envs: envs
                .iter()
                .map(|(k, v)| api::KeyValue {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn container_lifecycle_emits_created_started_stopped_deleted() {
        let mut s = State::default();
        s.add_image("img");
        let sb = s.run_sandbox(sandbox_config("p")).expect("run");
        let (c, ev) = s
            .create_container(&sb, container_config("c", &[]))
            .expect("create");
        let mut kinds = vec![ev[0].container_event_type];
        kinds.extend(
            s.start_container(&c)
                .expect("start")
                .iter()
                .map(|e| e.container_event_type),
        );
        kinds.extend(
            s.stop_container(&c, 0)
                .expect("stop")
                .iter()
                .map(|e| e.container_event_type),
        );
        assert_eq!(s.container_status(&c).expect("status").exit_code, 137);
        kinds.extend(
            s.remove_container(&c)
                .expect("rm")
                .iter()
                .map(|e| e.container_event_type),
        );
        assert_eq!(kinds, vec![0, 1, 2, 3]);
        assert!(s.container_status(&c).is_err());
    }

    #[test]
    fn duplicate_names_are_refused_like_containerd() {
        let mut s = State::default();
        s.add_image("img");
        let sb = s.run_sandbox(sandbox_config("p")).expect("run");
        assert_eq!(
            s.run_sandbox(sandbox_config("p")).map_err(|e| e.code()),
            Err(tonic::Code::AlreadyExists)
        );
        s.create_container(&sb, container_config("c", &[]))
            .expect("create");
        let again = s.create_container(&sb, container_config("c", &[]));
        assert_eq!(
            again.map(|_| ()).map_err(|e| e.code()),
            Err(tonic::Code::AlreadyExists)
        );
    }

    #[test]
    fn scripted_containers_exit_by_themselves() {
        let mut s = State::default();
        s.add_image("img");
        let sb = s.run_sandbox(sandbox_config("p")).expect("run");
        let (c, _) = s
            .create_container(
                &sb,
                container_config("c", &[("FAKE_EXIT_CODE", "3"), ("FAKE_RUN_MS", "10")]),
            )
            .expect("create");
        s.start_container(&c).expect("start");
        let started = s.containers[&c].started_at;
        assert!(s.run_scripts(started + 5_000_000).is_empty());
        let events = s.run_scripts(started + 10_000_000);
        assert_eq!(events.len(), 1);
        let status = s.container_status(&c).expect("status");
        assert_eq!((status.exit_code, status.reason.as_str()), (3, "Error"));
    }

    #[test]
    fn missing_image_is_not_found() {
        let mut s = State::default();
        let sb = s.run_sandbox(sandbox_config("p")).expect("run");
        let err = s
            .create_container(&sb, container_config("c", &[]))
            .map(|_| ())
            .expect_err("image is missing");
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}
