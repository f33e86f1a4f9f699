//! [`RuntimeClient`]: the CRI v1 `RuntimeService` and `ImageService` over a Unix socket.
//!
//! Each public method builds its request, names its call (a read, or a
//! mutation that may or may not be retried) and runs it with `rpc!`; how a
//! call runs (deadline, span, retries) is the `call` module's.

mod call;
mod dial;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::Channel;
use tracing::Instrument as _;

use self::call::{Call, Idempotent, required, rpc};
use crate::api;
use crate::api::image_service_client::ImageServiceClient;
use crate::api::runtime_service_client::RuntimeServiceClient;
use crate::error::{Error, ErrorKind};
use crate::filter::{ContainerFilter, SandboxFilter};
use crate::ids::{ContainerId, SandboxId};

/// Deadlines and retry budget of a [`RuntimeClient`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline of mutating calls and image pulls; upstream kubelet's
    /// `runtimeRequestTimeout` default (2 min).
    pub request_timeout: Duration,
    /// Deadline of read-only calls (status, list, version, stats). Shorter, so a
    /// hung runtime is noticed well before the PLEG health threshold (3 min).
    pub status_timeout: Duration,
    /// Tries of a read-only call that failed with `Unavailable` (e.g. while the
    /// runtime restarts).
    pub read_attempts: u32,
    /// Told about every finished call (the agent's runtime-operation metrics).
    pub observer: Option<Arc<dyn Observer>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(120),
            status_timeout: Duration::from_secs(15),
            read_attempts: 4,
            observer: None,
        }
    }
}

/// Watches the calls a [`RuntimeClient`] makes: one report per call, with its
/// retries inside, after it finished or failed.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// `call` (the CRI method, e.g. `RunPodSandbox`) took `elapsed` and failed
    /// with `error` if it did.
    fn observe(&self, call: &'static str, elapsed: Duration, error: Option<&Error>);
}

/// Result of [`RuntimeClient::exec_sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code.
    pub exit_code: i32,
}

/// A stream of CRI container events (`GetContainerEvents`).
pub type EventStream =
    Pin<Box<dyn Stream<Item = Result<api::ContainerEventResponse, Error>> + Send>>;

/// A cheap-to-clone handle on one CRI endpoint.
///
/// The connection is made lazily and re-made transparently after the runtime
/// restarts: the first call after a restart may see `Unavailable`, which read-only
/// calls retry within their deadline. Every call runs in a `cri` tracing span.
///
/// # Cancel safety
/// Dropping a call's future abandons the request; the runtime may still carry it out.
#[derive(Debug, Clone)]
pub struct RuntimeClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    options: Options,
    socket: Arc<PathBuf>,
    /// The PID of the process that accepted the newest connection
    /// (`SO_PEERCRED`): it changes when the runtime restarts.
    peer: Arc<watch::Sender<Option<u32>>>,
}

impl RuntimeClient {
    /// A client for `endpoint` (`unix:///path/to.sock` or a plain path). Does no IO.
    ///
    /// # Errors
    /// `InvalidArgument` if the endpoint is not a Unix socket.
    pub fn connect(endpoint: &str, options: Options) -> Result<Self, Error> {
        let path = match endpoint.strip_prefix("unix://") {
            Some(path) => path,
            None if endpoint.starts_with('/') => endpoint,
            None => {
                return Err(Error {
                    call: "connect",
                    object: Some(endpoint.to_owned()),
                    kind: ErrorKind::InvalidArgument,
                    message: "only unix:// endpoints are supported".into(),
                });
            }
        };
        let socket = Arc::new(PathBuf::from(path));
        let peer = Arc::new(watch::Sender::new(None));
        let channel = dial::channel(Arc::clone(&socket), Arc::clone(&peer));
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20),
            images: ImageServiceClient::new(channel).max_decoding_message_size(64 << 20),
            options,
            socket,
            peer,
        })
    }

    /// The PID of the runtime process that accepted this client's newest
    /// connection (`None` before the first call). A new PID means the runtime
    /// restarted; whatever it forgot or did meanwhile must be read again.
    pub fn runtime_pid(&self) -> watch::Receiver<Option<u32>> {
        self.peer.subscribe()
    }

    /// The socket this client dials.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The options this client was made with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// `Version`: the runtime's name and versions.
    pub async fn version(&self) -> Result<api::VersionResponse, Error> {
        let req = api::VersionRequest {
            version: "v1".into(),
        };
        rpc!(self.runtime.version(req), self.read("Version", None)).await
    }

    /// `Status`: runtime conditions (RuntimeReady, NetworkReady).
    pub async fn status(&self, verbose: bool) -> Result<api::StatusResponse, Error> {
        let req = api::StatusRequest { verbose };
        rpc!(self.runtime.status(req), self.read("Status", None)).await
    }

    /// `RuntimeConfig`: the runtime's own configuration the kubelet must
    /// match (its cgroup driver). Runtimes before it (containerd 1.6) answer
    /// `Unimplemented`.
    pub async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse, Error> {
        let req = api::RuntimeConfigRequest {};
        rpc!(
            self.runtime.runtime_config(req),
            self.read("RuntimeConfig", None)
        )
        .await
    }

    /// `RunPodSandbox`: creates and starts a sandbox.
    pub async fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<SandboxId, Error> {
        let object = config
            .metadata
            .as_ref()
            .map(|m| format!("{}/{}", m.namespace, m.name));
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_owned(),
        };
        let call = self.mutate("RunPodSandbox", object.as_deref(), Idempotent::No);
        let resp = rpc!(self.runtime.run_pod_sandbox(req), call).await?;
        Ok(SandboxId::new(resp.pod_sandbox_id))
    }

    /// `StopPodSandbox`: stops every container of the sandbox and tears down its network. Idempotent.
    pub async fn stop_pod_sandbox(&self, id: &SandboxId) -> Result<(), Error> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let call = self.mutate("StopPodSandbox", Some(id.as_str()), Idempotent::Yes);
        rpc!(self.runtime.stop_pod_sandbox(req), call).await?;
        Ok(())
    }

    /// `RemovePodSandbox`: removes a stopped sandbox and its containers. Idempotent.
    pub async fn remove_pod_sandbox(&self, id: &SandboxId) -> Result<(), Error> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let call = self.mutate("RemovePodSandbox", Some(id.as_str()), Idempotent::Yes);
        rpc!(self.runtime.remove_pod_sandbox(req), call).await?;
        Ok(())
    }

    /// `PodSandboxStatus`.
    pub async fn pod_sandbox_status(
        &self,
        id: &SandboxId,
        verbose: bool,
    ) -> Result<api::PodSandboxStatusResponse, Error> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose,
        };
        let call = self.read("PodSandboxStatus", Some(id.as_str()));
        let resp = rpc!(self.runtime.pod_sandbox_status(req), call).await?;
        required(call, resp.status.as_ref(), "no status")?;
        Ok(resp)
    }

    /// `ListPodSandbox`.
    pub async fn list_pod_sandbox(
        &self,
        filter: SandboxFilter,
    ) -> Result<Vec<api::PodSandbox>, Error> {
        let req = api::ListPodSandboxRequest {
            filter: filter.into_api(),
        };
        let call = self.read("ListPodSandbox", None);
        Ok(rpc!(self.runtime.list_pod_sandbox(req), call).await?.items)
    }

    /// `CreateContainer` in `sandbox`; `sandbox_config` is the config the sandbox was run with.
    pub async fn create_container(
        &self,
        sandbox: &SandboxId,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<ContainerId, Error> {
        let object = config
            .metadata
            .as_ref()
            .map(|m| format!("{}/{}", sandbox.short(), m.name));
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let call = self.mutate("CreateContainer", object.as_deref(), Idempotent::No);
        let resp = rpc!(self.runtime.create_container(req), call).await?;
        Ok(ContainerId::new(resp.container_id))
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &ContainerId) -> Result<(), Error> {
        let req = api::StartContainerRequest {
            container_id: id.to_string(),
        };
        let call = self.mutate("StartContainer", Some(id.as_str()), Idempotent::No);
        rpc!(self.runtime.start_container(req), call).await?;
        Ok(())
    }

    /// `StopContainer`: SIGTERM (or the image's stop signal), SIGKILL after `grace`. Idempotent.
    pub async fn stop_container(&self, id: &ContainerId, grace: Duration) -> Result<(), Error> {
        let req = api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        let call = self.mutate("StopContainer", Some(id.as_str()), Idempotent::Yes);
        rpc!(self.runtime.stop_container(req), call.extended_by(grace)).await?;
        Ok(())
    }

    /// `RemoveContainer` (force-removes a running container). Idempotent.
    pub async fn remove_container(&self, id: &ContainerId) -> Result<(), Error> {
        let req = api::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        let call = self.mutate("RemoveContainer", Some(id.as_str()), Idempotent::Yes);
        rpc!(self.runtime.remove_container(req), call).await?;
        Ok(())
    }

    /// `ListContainers`.
    pub async fn list_containers(
        &self,
        filter: ContainerFilter,
    ) -> Result<Vec<api::Container>, Error> {
        let req = api::ListContainersRequest {
            filter: filter.into_api(),
        };
        let call = self.read("ListContainers", None);
        let resp = rpc!(self.runtime.list_containers(req), call).await?;
        Ok(resp.containers)
    }

    /// `ContainerStatus`.
    pub async fn container_status(&self, id: &ContainerId) -> Result<api::ContainerStatus, Error> {
        let (call, resp) = self.container_status_call(id, false).await?;
        required(call, resp.status, "no status")
    }

    /// `ContainerStatus` with `verbose`: the runtime's extra information (for
    /// containerd, `info` holds JSON with the init process `pid`).
    pub async fn container_info(
        &self,
        id: &ContainerId,
    ) -> Result<std::collections::HashMap<String, String>, Error> {
        Ok(self.container_status_call(id, true).await?.1.info)
    }

    /// `ContainerStatus`, plain or `verbose`, with the call it ran as.
    async fn container_status_call<'a>(
        &self,
        id: &'a ContainerId,
        verbose: bool,
    ) -> Result<(Call<'a>, api::ContainerStatusResponse), Error> {
        let req = api::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose,
        };
        let call = self.read("ContainerStatus", Some(id.as_str()));
        Ok((call, rpc!(self.runtime.container_status(req), call).await?))
    }

    /// The host PID of a running container's init process (containerd's verbose info).
    pub async fn container_pid(&self, id: &ContainerId) -> Result<Option<u32>, Error> {
        Ok(info_pid(&self.container_info(id).await?))
    }

    /// The host PID of a ready sandbox's init (its pause process), from
    /// `PodSandboxStatus` with `verbose` (`None`: the runtime names none).
    pub async fn sandbox_pid(&self, id: &SandboxId) -> Result<Option<u32>, Error> {
        Ok(info_pid(&self.pod_sandbox_status(id, true).await?.info))
    }

    /// `UpdateContainerResources` (Linux resources).
    pub async fn update_container_resources(
        &self,
        id: &ContainerId,
        linux: api::LinuxContainerResources,
    ) -> Result<(), Error> {
        let req = api::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(linux),
            ..Default::default()
        };
        let call = self.mutate(
            "UpdateContainerResources",
            Some(id.as_str()),
            Idempotent::Yes,
        );
        rpc!(self.runtime.update_container_resources(req), call).await?;
        Ok(())
    }

    /// `ReopenContainerLog` (after log rotation).
    pub async fn reopen_container_log(&self, id: &ContainerId) -> Result<(), Error> {
        let req = api::ReopenContainerLogRequest {
            container_id: id.to_string(),
        };
        let call = self.mutate("ReopenContainerLog", Some(id.as_str()), Idempotent::Yes);
        rpc!(self.runtime.reopen_container_log(req), call).await?;
        Ok(())
    }

    /// `ExecSync`: runs `cmd` in the container and waits up to `timeout` (zero: no limit).
    pub async fn exec_sync(
        &self,
        id: &ContainerId,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, Error> {
        let req = api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        let call = self.mutate("ExecSync", Some(id.as_str()), Idempotent::No);
        let resp = rpc!(self.runtime.exec_sync(req), call.extended_by(timeout)).await?;
        Ok(ExecOutput {
            stdout: resp.stdout,
            stderr: resp.stderr,
            exit_code: resp.exit_code,
        })
    }

    /// `Exec`: prepares a streaming exec session and returns its URL.
    pub async fn exec(&self, req: api::ExecRequest) -> Result<String, Error> {
        let id = req.container_id.clone();
        let call = self.mutate("Exec", Some(id.as_str()), Idempotent::No);
        Ok(rpc!(self.runtime.exec(req), call).await?.url)
    }

    /// `Attach`: prepares a streaming attach session and returns its URL.
    pub async fn attach(&self, req: api::AttachRequest) -> Result<String, Error> {
        let id = req.container_id.clone();
        let call = self.mutate("Attach", Some(id.as_str()), Idempotent::No);
        Ok(rpc!(self.runtime.attach(req), call).await?.url)
    }

    /// `PortForward`: prepares a streaming port-forward session into a sandbox
    /// and returns its URL.
    pub async fn port_forward(&self, req: api::PortForwardRequest) -> Result<String, Error> {
        let id = req.pod_sandbox_id.clone();
        let call = self.mutate("PortForward", Some(id.as_str()), Idempotent::No);
        Ok(rpc!(self.runtime.port_forward(req), call).await?.url)
    }

    /// `ContainerStats`.
    pub async fn container_stats(&self, id: &ContainerId) -> Result<api::ContainerStats, Error> {
        let req = api::ContainerStatsRequest {
            container_id: id.to_string(),
        };
        let call = self.read("ContainerStats", Some(id.as_str()));
        let resp = rpc!(self.runtime.container_stats(req), call).await?;
        required(call, resp.stats, "no stats")
    }

    /// `ListContainerStats` (the filter's state is ignored).
    pub async fn list_container_stats(
        &self,
        filter: ContainerFilter,
    ) -> Result<Vec<api::ContainerStats>, Error> {
        let req = api::ListContainerStatsRequest {
            filter: filter.into_stats_api(),
        };
        let call = self.read("ListContainerStats", None);
        Ok(rpc!(self.runtime.list_container_stats(req), call)
            .await?
            .stats)
    }

    /// `PodSandboxStats`.
    pub async fn pod_sandbox_stats(&self, id: &SandboxId) -> Result<api::PodSandboxStats, Error> {
        let req = api::PodSandboxStatsRequest {
            pod_sandbox_id: id.to_string(),
        };
        let call = self.read("PodSandboxStats", Some(id.as_str()));
        let resp = rpc!(self.runtime.pod_sandbox_stats(req), call).await?;
        required(call, resp.stats, "no stats")
    }

    /// `GetContainerEvents`: the runtime's container event stream (containerd 1.7+).
    ///
    /// # Errors
    /// `Unsupported` on runtimes without the call (containerd 1.6). Items of the
    /// stream are `Err` when the stream breaks (e.g. the runtime restarts); the
    /// stream has no replay, so a consumer must relist after any error.
    pub async fn container_events(&self) -> Result<EventStream, Error> {
        let mut client = self.runtime.clone();
        let span = tracing::debug_span!("cri", call = "GetContainerEvents");
        let resp = async { client.get_container_events(api::GetEventsRequest {}).await }
            .instrument(span)
            .await
            .map_err(|status| Error::from_status("GetContainerEvents", None, &status))?;
        let stream = resp.into_inner().map(|item| {
            item.map_err(|status| Error::from_status("GetContainerEvents", None, &status))
        });
        Ok(Box::pin(stream))
    }

    /// `ListImages`, optionally only those matching `image`.
    pub async fn list_images(&self, image: Option<&str>) -> Result<Vec<api::Image>, Error> {
        let req = api::ListImagesRequest {
            filter: image.map(|i| api::ImageFilter {
                image: Some(image_spec(i)),
            }),
        };
        let call = self.read("ListImages", image);
        Ok(rpc!(self.images.list_images(req), call).await?.images)
    }

    /// `ImageStatus`: `None` if the image is not present on the node.
    pub async fn image_status(&self, image: &str) -> Result<Option<api::Image>, Error> {
        let req = api::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let call = self.read("ImageStatus", Some(image));
        Ok(rpc!(self.images.image_status(req), call).await?.image)
    }

    /// `PullImage` with registry credentials `auth`: returns the image
    /// reference (digest) the runtime resolved.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, Error> {
        let req = api::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config,
        };
        let call = self.mutate("PullImage", Some(image), Idempotent::No);
        Ok(rpc!(self.images.pull_image(req), call).await?.image_ref)
    }

    /// `RemoveImage`.
    pub async fn remove_image(&self, image: &str) -> Result<(), Error> {
        let req = api::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        let call = self.mutate("RemoveImage", Some(image), Idempotent::Yes);
        rpc!(self.images.remove_image(req), call).await?;
        Ok(())
    }

    /// `ImageFsInfo`: usage of the image filesystem(s).
    pub async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse, Error> {
        let req = api::ImageFsInfoRequest {};
        rpc!(
            self.images.image_fs_info(req),
            self.read("ImageFsInfo", None)
        )
        .await
    }
}

fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

/// The `pid` a runtime's verbose `info` JSON names (containerd and CRI-O put
/// it at the top of `info["info"]`); 0 (containerd's value once the task
/// exited) is none.
fn info_pid(info: &std::collections::HashMap<String, String>) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Info {
        pid: Option<u32>,
    }
    let info: Info = serde_json::from_str(info.get("info")?).ok()?;
    info.pid.filter(|pid| *pid > 0)
}

#[cfg(test)]
mod info_tests {
    use super::info_pid;

    #[test]
    fn the_init_pid_is_read_from_the_runtimes_verbose_info() {
        let info = |json: &str| [("info".to_owned(), json.to_owned())].into();
        assert_eq!(
            info_pid(&info(
                r#"{"sandboxID":"s","pid":4242,"runtimeSpec":{"process":{"args":["sh"]},"linux":{"namespaces":[{"type":"pid"}],"resources":{"pids":{"limit":5}}}}}"#
            )),
            Some(4242)
        );
        assert_eq!(info_pid(&info(r#"{"pid":0}"#)), None, "an exited task");
        assert_eq!(info_pid(&info("not json")), None);
        assert_eq!(info_pid(&Default::default()), None);
    }
}
