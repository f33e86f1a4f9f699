//! An in-process CRI runtime for fast tests of the agent's logic.
//!
//! [`FakeServer::start`] serves `RuntimeService` and `ImageService` on a Unix socket
//! in a temp directory, backed by an in-memory model of sandboxes, containers and
//! images ([`state`]). Tests steer it through [`FakeRuntime`]: make containers
//! exit, script `ExecSync`, add per-call latency, and inject faults (errors,
//! hangs, dropped event streams).
//!
//! Containers run until told otherwise. A container whose config carries the
//! environment variables `FAKE_EXIT_CODE` (and optionally `FAKE_RUN_MS`, default
//! 0) exits by itself with that code after that long, which is how pod-level
//! tests express "this container crashes" or "this init container completes".
//!
//! This fake exists so logic tests run in milliseconds. It never replaces the
//! tests against real containerd.

mod image_service;
mod runtime_service;
pub mod state;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::JoinHandle;

use crate::api;
use crate::client::ExecOutput;
use crate::ids::ContainerId;
use state::State;

/// The gRPC status codes [`Fault::Error`] answers with.
pub use tonic::Code;

/// A fault to inject into calls of one RPC.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this gRPC error.
    Error(tonic::Code, String),
    /// Never answer (the client's deadline must fire).
    Hang,
    /// Answer normally after this extra delay.
    Delay(Duration),
}

/// Scripted `ExecSync` behaviour: `(container, command) -> output`.
pub type ExecHandler = Arc<dyn Fn(&ContainerId, &[String]) -> ExecOutput + Send + Sync>;

#[derive(Debug, Default)]
struct Faults {
    /// Per RPC name: the fault and how many more calls it applies to (`None`: all).
    by_call: HashMap<&'static str, (Fault, Option<u32>)>,
    latency: Duration,
}

struct Shared {
    state: Mutex<State>,
    faults: Mutex<Faults>,
    calls: Mutex<HashMap<&'static str, u64>>,
    events: broadcast::Sender<api::ContainerEventResponse>,
    /// Bumped to end every open event stream with an error.
    stream_epoch: watch::Sender<u64>,
    exec: Mutex<Option<ExecHandler>>,
}

/// Control handle of a fake runtime (cheap to clone).
#[derive(Clone)]
pub struct FakeRuntime {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRuntime").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not hide later failures.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FakeRuntime {
    /// A runtime holding the given images (by name).
    pub fn new(images: &[&str]) -> Self {
        let (events, _) = broadcast::channel(4096);
        let (stream_epoch, _) = watch::channel(0);
        let rt = Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                faults: Mutex::new(Faults::default()),
                calls: Mutex::new(HashMap::new()),
                events,
                stream_epoch,
                exec: Mutex::new(None),
            }),
        };
        for image in images {
            rt.add_image(image);
        }
        rt
    }

    /// Makes `image` present on the node.
    pub fn add_image(&self, image: &str) {
        lock(&self.shared.state).add_image(image);
    }

    /// Makes `image` pullable: `PullImage` succeeds for it (other names fail as "not found").
    pub fn allow_pull(&self, image: &str) {
        lock(&self.shared.state).allow_pull(image);
    }

    /// Makes `image` pullable only with user `user` and password `password`.
    pub fn private_image(&self, image: &str, user: &str, password: &str) {
        let mut state = lock(&self.shared.state);
        state.allow_pull(image);
        state
            .private
            .insert(image.to_owned(), (user.to_owned(), password.to_owned()));
    }

    /// Every `PullImage` so far: the image and the credentials it came with.
    pub fn pulls(&self) -> Vec<(String, Option<api::AuthConfig>)> {
        lock(&self.shared.state).pulls.clone()
    }

    /// Injects `fault` into the next `times` calls of `call` (an RPC name such as
    /// `"ContainerStatus"`), or into all of them with `None`.
    pub fn inject(&self, call: &'static str, fault: Fault, times: Option<u32>) {
        lock(&self.shared.faults)
            .by_call
            .insert(call, (fault, times));
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).by_call.clear();
    }

    /// Adds `latency` to every call.
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.shared.faults).latency = latency;
    }

    /// Ends every open `GetContainerEvents` stream with `Unavailable`.
    pub fn drop_event_streams(&self) {
        self.shared.stream_epoch.send_modify(|e| *e += 1);
    }

    /// Scripts `ExecSync`. Without a handler, exec succeeds with empty output.
    pub fn on_exec(&self, handler: ExecHandler) {
        *lock(&self.shared.exec) = Some(handler);
    }

    /// How many times `call` was invoked (including failed calls).
    pub fn calls(&self, call: &str) -> u64 {
        lock(&self.shared.calls).get(call).copied().unwrap_or(0)
    }

    /// Makes a running container's process die now with `exit_code` and
    /// `reason` (e.g. `"OOMKilled"`); the runtime shows it after the exit lag.
    /// Returns false if no such running container exists.
    pub fn exit_container(&self, id: &ContainerId, exit_code: i32, reason: &str) -> bool {
        let mut state = lock(&self.shared.state);
        let before = state.containers.get(id.as_str()).map(|c| c.dying.is_some());
        let event = state.exit(id.as_str(), exit_code, reason);
        let died = before == Some(false)
            && state.containers.get(id.as_str()).is_some_and(|c| {
                c.dying.is_some() || c.state == api::ContainerState::ContainerExited
            });
        drop(state);
        if let Some(event) = event {
            let _ = self.shared.events.send(event);
        }
        died
    }

    /// The runtime shows a container's exit `lag` after its process died, as
    /// containerd does while it reaps and deletes the task (tens of ms idle,
    /// seconds under a start burst). Zero (the default): at once.
    pub fn set_exit_lag(&self, lag: Duration) {
        lock(&self.shared.state).exit_lag_ns = i64::try_from(lag.as_nanos()).unwrap_or(i64::MAX);
    }

    /// Makes the runtime report `code` for every exit from now on (`None`: the
    /// real code), as a runtime that lost track of its tasks does.
    pub fn report_exit_code(&self, code: Option<i32>) {
        lock(&self.shared.state).reported_exit_code = code;
    }

    /// Makes `RuntimeConfig` report the systemd cgroup driver (`true`) or
    /// cgroupfs, as containerd does from its runc options.
    pub fn set_systemd_cgroup(&self, systemd: bool) {
        lock(&self.shared.state).systemd_cgroup = systemd;
    }

    /// The container processes that died since the last call, as the kernel
    /// sees them: at once, before the runtime shows the exits.
    pub fn take_deaths(&self) -> Vec<state::ProcessExit> {
        lock(&self.shared.state).take_deaths()
    }

    /// The start of live init process `pid` (see [`State::live`]): the
    /// fake's `/proc`.
    pub fn live(&self, pid: u32) -> Option<u64> {
        lock(&self.shared.state).live(pid)
    }

    /// Verbose statuses name no init process from now on (a runtime that
    /// does not report it): the kernel side can only presume inits.
    pub fn hide_pids(&self, hide: bool) {
        lock(&self.shared.state).hide_pids = hide;
    }

    /// A snapshot of the in-memory model.
    pub fn snapshot(&self) -> State {
        lock(&self.shared.state).clone()
    }

    /// Applies latency and faults for `call`, and counts it. Every RPC starts here.
    async fn enter(&self, call: &'static str) -> Result<(), tonic::Status> {
        *lock(&self.shared.calls).entry(call).or_default() += 1;
        let (latency, fault) = {
            let mut faults = lock(&self.shared.faults);
            let latency = faults.latency;
            let fault = match faults.by_call.get_mut(call) {
                Some((fault, None)) => Some(fault.clone()),
                Some((fault, Some(n))) if *n > 0 => {
                    *n -= 1;
                    Some(fault.clone())
                }
                _ => None,
            };
            (latency, fault)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fault {
            None => Ok(()),
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Error(code, message)) => Err(tonic::Status::new(code, message)),
        }
    }

    /// Runs a state transition and publishes the events it produced.
    fn apply<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<(T, Vec<api::ContainerEventResponse>), tonic::Status>,
    ) -> Result<T, tonic::Status> {
        let (value, events) = f(&mut lock(&self.shared.state))?;
        for event in events {
            let _ = self.shared.events.send(event);
        }
        Ok(value)
    }

    /// Exits containers whose scripted run time is over; called on every RPC
    /// and by the server's ticker.
    fn tick(&self) {
        let events = lock(&self.shared.state).run_scripts(state::now_ns());
        for event in events {
            let _ = self.shared.events.send(event);
        }
    }
}

/// A fake runtime served on a Unix socket in its own temp directory.
#[derive(Debug)]
pub struct FakeServer {
    runtime: FakeRuntime,
    dir: tempfile::TempDir,
    socket: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Starts serving a runtime that holds `images`.
    ///
    /// # Errors
    /// If the temp directory or socket cannot be created.
    pub async fn start(images: &[&str]) -> std::io::Result<Self> {
        let runtime = FakeRuntime::new(images);
        let dir = tempfile::Builder::new()
            .prefix("evlet-fake-cri")
            .tempdir()?;
        let socket = dir.path().join("cri.sock");
        let (shutdown, task) = serve(&runtime, &socket)?;
        Ok(Self {
            runtime,
            dir,
            socket,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// Stops serving and serves again on the same socket with the same model,
    /// as a runtime restart looks to clients (connections break, state survives).
    ///
    /// # Errors
    /// If the socket cannot be bound again.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.stop().await;
        let (shutdown, task) = serve(&self.runtime, &self.socket)?;
        self.shutdown = Some(shutdown);
        self.task = Some(task);
        Ok(())
    }

    /// The endpoint to give a [`RuntimeClient`](crate::RuntimeClient).
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The temp directory the server lives in (also usable for logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The control handle.
    pub fn runtime(&self) -> &FakeRuntime {
        &self.runtime
    }

    /// Stops serving (as if the runtime went away); the model is kept.
    pub async fn stop(&mut self) {
        self.runtime.drop_event_streams();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            // Graceful shutdown waits for in-flight calls; a hung (fault-injected)
            // call would wait forever, so give up after a moment.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves `runtime` on `socket` until the returned sender fires.
fn serve(
    runtime: &FakeRuntime,
    socket: &Path,
) -> std::io::Result<(oneshot::Sender<()>, JoinHandle<()>)> {
    let listener = tokio::net::UnixListener::bind(socket)?;
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let svc = runtime.clone();
    let ticker = runtime.clone();
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let serve = tonic::transport::Server::builder()
            .add_service(api::runtime_service_server::RuntimeServiceServer::new(
                svc.clone(),
            ))
            .add_service(api::image_service_server::ImageServiceServer::new(svc))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = shutdown_rx.await;
            });
        let tick = async {
            let mut interval = tokio::time::interval(Duration::from_millis(5));
            loop {
                interval.tick().await;
                ticker.tick();
            }
        };
        tokio::select! {
            result = serve => {
                if let Err(err) = result {
                    tracing::error!(%err, "fake CRI server failed");
                }
            }
            () = tick => {}
        }
    });
    Ok((shutdown, task))
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
