//! `RuntimeService` of the fake runtime: each RPC enters (latency, faults, count),
//! advances scripted containers, then applies a [`State`](super::state::State) transition.

use std::pin::Pin;

use tokio::sync::broadcast;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::state::{State, now_ns};
use super::{FakeRuntime, lock};
use crate::api::{self, runtime_service_server::RuntimeService};
use crate::ids::ContainerId;

/// What a fake RPC answers.
pub(super) type Reply<T> = Result<Response<T>, Status>;

fn unimplemented<T>(call: &str) -> Reply<T> {
    Err(Status::unimplemented(format!(
        "the fake runtime does not implement {call}"
    )))
}

impl FakeRuntime {
    /// Answers one RPC: enters `call` (latency, faults, count), then wraps
    /// what `f` makes of the request. Every `ImageService` RPC runs here.
    pub(super) async fn answer<Req, Resp>(
        &self,
        call: &'static str,
        req: Request<Req>,
        f: impl FnOnce(Req) -> Result<Resp, Status>,
    ) -> Reply<Resp> {
        self.enter(call).await?;
        f(req.into_inner()).map(Response::new)
    }

    /// [`answer`](Self::answer), after advancing scripted containers: every
    /// `RuntimeService` RPC runs here.
    async fn serve<Req, Resp>(
        &self,
        call: &'static str,
        req: Request<Req>,
        f: impl FnOnce(Req) -> Result<Resp, Status>,
    ) -> Reply<Resp> {
        self.answer(call, req, |req| {
            self.tick();
            f(req)
        })
        .await
    }

    /// Runs a state transition that yields only events, and publishes them.
    fn transition(
        &self,
        f: impl FnOnce(&mut State) -> Result<Vec<api::ContainerEventResponse>, Status>,
    ) -> Result<(), Status> {
        self.apply(|s| Ok(((), f(s)?)))
    }
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self, req: Request<api::VersionRequest>) -> Reply<api::VersionResponse> {
        self.serve("Version", req, |_| {
            Ok(api::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "evlet-fake".into(),
                runtime_version: "0.1.0".into(),
                runtime_api_version: "v1".into(),
            })
        })
        .await
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<api::RunPodSandboxRequest>,
    ) -> Reply<api::RunPodSandboxResponse> {
        self.serve("RunPodSandbox", req, |req| {
            let config = req
                .config
                .ok_or_else(|| Status::invalid_argument("no config"))?;
            let pod_sandbox_id = lock(&self.shared.state).run_sandbox(config)?;
            Ok(api::RunPodSandboxResponse { pod_sandbox_id })
        })
        .await
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<api::StopPodSandboxRequest>,
    ) -> Reply<api::StopPodSandboxResponse> {
        self.serve("StopPodSandbox", req, |req| {
            self.transition(|s| s.stop_sandbox(&req.pod_sandbox_id))?;
            Ok(api::StopPodSandboxResponse {})
        })
        .await
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<api::RemovePodSandboxRequest>,
    ) -> Reply<api::RemovePodSandboxResponse> {
        self.serve("RemovePodSandbox", req, |req| {
            self.transition(|s| s.remove_sandbox(&req.pod_sandbox_id))?;
            Ok(api::RemovePodSandboxResponse {})
        })
        .await
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<api::PodSandboxStatusRequest>,
    ) -> Reply<api::PodSandboxStatusResponse> {
        self.serve("PodSandboxStatus", req, |req| {
            let state = lock(&self.shared.state);
            let status = state.sandbox_status(&req.pod_sandbox_id)?;
            let init = state
                .sandboxes
                .get(&req.pod_sandbox_id)
                .and_then(|s| s.init);
            let info = if req.verbose {
                state.info(init)
            } else {
                Default::default()
            };
            drop(state);
            Ok(api::PodSandboxStatusResponse {
                status: Some(status),
                info,
                containers_statuses: vec![],
                timestamp: now_ns(),
            })
        })
        .await
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<api::ListPodSandboxRequest>,
    ) -> Reply<api::ListPodSandboxResponse> {
        self.serve("ListPodSandbox", req, |req| {
            let items = lock(&self.shared.state).list_sandboxes(req.filter.as_ref());
            Ok(api::ListPodSandboxResponse { items })
        })
        .await
    }

    async fn create_container(
        &self,
        req: Request<api::CreateContainerRequest>,
    ) -> Reply<api::CreateContainerResponse> {
        self.serve("CreateContainer", req, |req| {
            let config = req
                .config
                .ok_or_else(|| Status::invalid_argument("no config"))?;
            let container_id = self.apply(|s| s.create_container(&req.pod_sandbox_id, config))?;
            Ok(api::CreateContainerResponse { container_id })
        })
        .await
    }

    async fn start_container(
        &self,
        req: Request<api::StartContainerRequest>,
    ) -> Reply<api::StartContainerResponse> {
        self.serve("StartContainer", req, |req| {
            self.transition(|s| s.start_container(&req.container_id))?;
            Ok(api::StartContainerResponse {})
        })
        .await
    }

    async fn stop_container(
        &self,
        req: Request<api::StopContainerRequest>,
    ) -> Reply<api::StopContainerResponse> {
        self.serve("StopContainer", req, |req| {
            self.transition(|s| s.stop_container(&req.container_id, req.timeout))?;
            Ok(api::StopContainerResponse {})
        })
        .await
    }

    async fn remove_container(
        &self,
        req: Request<api::RemoveContainerRequest>,
    ) -> Reply<api::RemoveContainerResponse> {
        self.serve("RemoveContainer", req, |req| {
            self.transition(|s| s.remove_container(&req.container_id))?;
            Ok(api::RemoveContainerResponse {})
        })
        .await
    }

    async fn list_containers(
        &self,
        req: Request<api::ListContainersRequest>,
    ) -> Reply<api::ListContainersResponse> {
        self.serve("ListContainers", req, |req| {
            let containers = lock(&self.shared.state).list_containers(req.filter.as_ref());
            Ok(api::ListContainersResponse { containers })
        })
        .await
    }

    async fn container_status(
        &self,
        req: Request<api::ContainerStatusRequest>,
    ) -> Reply<api::ContainerStatusResponse> {
        self.serve("ContainerStatus", req, |req| {
            let state = lock(&self.shared.state);
            let status = state.container_status(&req.container_id)?;
            let init = state
                .containers
                .get(&req.container_id)
                .and_then(|c| c.init.filter(|_| c.dying.is_none()));
            let info = if req.verbose {
                state.info(init)
            } else {
                Default::default()
            };
            drop(state);
            Ok(api::ContainerStatusResponse {
                status: Some(status),
                info,
            })
        })
        .await
    }

    async fn update_container_resources(
        &self,
        req: Request<api::UpdateContainerResourcesRequest>,
    ) -> Reply<api::UpdateContainerResourcesResponse> {
        self.serve("UpdateContainerResources", req, |req| {
            lock(&self.shared.state).container_status(&req.container_id)?;
            Ok(api::UpdateContainerResourcesResponse {})
        })
        .await
    }

    async fn reopen_container_log(
        &self,
        req: Request<api::ReopenContainerLogRequest>,
    ) -> Reply<api::ReopenContainerLogResponse> {
        self.serve("ReopenContainerLog", req, |req| {
            lock(&self.shared.state).require_running(&req.container_id)?;
            Ok(api::ReopenContainerLogResponse {})
        })
        .await
    }

    async fn exec_sync(&self, req: Request<api::ExecSyncRequest>) -> Reply<api::ExecSyncResponse> {
        self.serve("ExecSync", req, |req| {
            lock(&self.shared.state).require_running(&req.container_id)?;
            let handler = lock(&self.shared.exec).clone();
            let out = match handler {
                Some(handler) => handler(&ContainerId::new(req.container_id), &req.cmd),
                None => crate::ExecOutput {
                    stdout: vec![],
                    stderr: vec![],
                    exit_code: 0,
                },
            };
            Ok(api::ExecSyncResponse {
                stdout: out.stdout,
                stderr: out.stderr,
                exit_code: out.exit_code,
            })
        })
        .await
    }

    async fn exec(&self, req: Request<api::ExecRequest>) -> Reply<api::ExecResponse> {
        self.serve("Exec", req, |req| {
            let id = req.container_id;
            lock(&self.shared.state).require_running(&id)?;
            Ok(api::ExecResponse {
                url: format!("http://fake.invalid/exec/{id}"),
            })
        })
        .await
    }

    async fn attach(&self, _: Request<api::AttachRequest>) -> Reply<api::AttachResponse> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _: Request<api::PortForwardRequest>,
    ) -> Reply<api::PortForwardResponse> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        req: Request<api::ContainerStatsRequest>,
    ) -> Reply<api::ContainerStatsResponse> {
        self.serve("ContainerStats", req, |req| {
            let id = req.container_id;
            let state = lock(&self.shared.state);
            let c = state
                .containers
                .get(&id)
                .ok_or_else(|| Status::not_found(format!("container \"{id}\" not found")))?;
            Ok(api::ContainerStatsResponse {
                stats: Some(stats(c)),
            })
        })
        .await
    }

    async fn list_container_stats(
        &self,
        req: Request<api::ListContainerStatsRequest>,
    ) -> Reply<api::ListContainerStatsResponse> {
        self.serve("ListContainerStats", req, |req| {
            let filter = req.filter.unwrap_or_default();
            let state = lock(&self.shared.state);
            let stats = state
                .containers
                .values()
                .filter(|c| {
                    (filter.id.is_empty() || c.id == filter.id)
                        && (filter.pod_sandbox_id.is_empty()
                            || c.sandbox_id == filter.pod_sandbox_id)
                })
                .map(stats)
                .collect();
            Ok(api::ListContainerStatsResponse { stats })
        })
        .await
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<api::PodSandboxStatsRequest>,
    ) -> Reply<api::PodSandboxStatsResponse> {
        self.serve("PodSandboxStats", req, |req| {
            let id = req.pod_sandbox_id;
            let status = lock(&self.shared.state).sandbox_status(&id)?;
            Ok(api::PodSandboxStatsResponse {
                stats: Some(api::PodSandboxStats {
                    attributes: Some(api::PodSandboxAttributes {
                        id,
                        metadata: status.metadata,
                        labels: status.labels,
                        annotations: status.annotations,
                    }),
                    linux: Some(api::LinuxPodSandboxStats::default()),
                    windows: None,
                }),
            })
        })
        .await
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<api::ListPodSandboxStatsRequest>,
    ) -> Reply<api::ListPodSandboxStatsResponse> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        req: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Reply<api::UpdateRuntimeConfigResponse> {
        self.serve("UpdateRuntimeConfig", req, |_| {
            Ok(api::UpdateRuntimeConfigResponse {})
        })
        .await
    }

    async fn status(&self, req: Request<api::StatusRequest>) -> Reply<api::StatusResponse> {
        self.serve("Status", req, |_| {
            let condition = |kind: &str| api::RuntimeCondition {
                r#type: kind.into(),
                status: true,
                reason: String::new(),
                message: String::new(),
            };
            Ok(api::StatusResponse {
                status: Some(api::RuntimeStatus {
                    conditions: vec![condition("RuntimeReady"), condition("NetworkReady")],
                }),
                ..Default::default()
            })
        })
        .await
    }

    async fn checkpoint_container(
        &self,
        _: Request<api::CheckpointContainerRequest>,
    ) -> Reply<api::CheckpointContainerResponse> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream =
        Pin<Box<dyn Stream<Item = Result<api::ContainerEventResponse, Status>> + Send>>;

    async fn get_container_events(
        &self,
        req: Request<api::GetEventsRequest>,
    ) -> Reply<Self::GetContainerEventsStream> {
        self.serve("GetContainerEvents", req, |_| {
            let (tx, rx) = tokio::sync::mpsc::channel(1024);
            let mut events = self.shared.events.subscribe();
            let mut epoch = self.shared.stream_epoch.subscribe();
            epoch.borrow_and_update();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = epoch.changed() => {
                            let _ = tx.send(Err(Status::unavailable("event stream dropped by the fake runtime"))).await;
                            break;
                        }
                        event = events.recv() => match event {
                            Ok(event) => {
                                if tx.send(Ok(event)).await.is_err() {
                                    break;
                                }
                            }
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                let _ = tx.send(Err(Status::data_loss(format!("{n} events lost")))).await;
                                break;
                            }
                            Err(broadcast::error::RecvError::Closed) => break,
                        },
                        () = tx.closed() => break,
                    }
                }
            });
            let stream: Self::GetContainerEventsStream = Box::pin(ReceiverStream::new(rx));
            Ok(stream)
        })
        .await
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<api::ListMetricDescriptorsRequest>,
    ) -> Reply<api::ListMetricDescriptorsResponse> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<api::ListPodSandboxMetricsRequest>,
    ) -> Reply<api::ListPodSandboxMetricsResponse> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        req: Request<api::RuntimeConfigRequest>,
    ) -> Reply<api::RuntimeConfigResponse> {
        self.serve("RuntimeConfig", req, |_| {
            let driver = if lock(&self.shared.state).systemd_cgroup {
                api::CgroupDriver::Systemd
            } else {
                api::CgroupDriver::Cgroupfs
            };
            Ok(api::RuntimeConfigResponse {
                linux: Some(api::LinuxRuntimeConfiguration {
                    cgroup_driver: driver as i32,
                }),
            })
        })
        .await
    }
}

fn stats(c: &super::state::Container) -> api::ContainerStats {
    let now = now_ns();
    let value = |v: u64| Some(api::UInt64Value { value: v });
    api::ContainerStats {
        attributes: Some(api::ContainerAttributes {
            id: c.id.clone(),
            metadata: c.config.metadata.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
        }),
        cpu: Some(api::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: value(0),
            usage_nano_cores: value(0),
        }),
        memory: Some(api::MemoryUsage {
            timestamp: now,
            working_set_bytes: value(1 << 20),
            usage_bytes: value(1 << 20),
            ..Default::default()
        }),
        writable_layer: None,
        swap: None,
    }
}
