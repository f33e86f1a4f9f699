//! `RuntimeService` of the fake runtime: each RPC enters (latency, faults, count),
//! advances scripted containers, then applies a [`State`](super::state::State) transition.

use std::pin::Pin;

use tokio::sync::broadcast;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::state::now_ns;
use super::{FakeRuntime, lock};
use crate::api::{self, runtime_service_server::RuntimeService};
use crate::ids::ContainerId;

type Reply<T> = Result<Response<T>, Status>;

fn unimplemented<T>(call: &str) -> Reply<T> {
    Err(Status::unimplemented(format!(
        "the fake runtime does not implement {call}"
    )))
}

impl FakeRuntime {
    async fn begin(&self, call: &'static str) -> Result<(), Status> {
        self.enter(call).await?;
        self.tick();
        Ok(())
    }
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self, _: Request<api::VersionRequest>) -> Reply<api::VersionResponse> {
        self.begin("Version").await?;
        Ok(Response::new(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "evlet-fake".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<api::RunPodSandboxRequest>,
    ) -> Reply<api::RunPodSandboxResponse> {
        self.begin("RunPodSandbox").await?;
        let config = req
            .into_inner()
            .config
            .ok_or_else(|| Status::invalid_argument("no config"))?;
        let id = lock(&self.shared.state).run_sandbox(config)?;
        Ok(Response::new(api::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<api::StopPodSandboxRequest>,
    ) -> Reply<api::StopPodSandboxResponse> {
        self.begin("StopPodSandbox").await?;
        let id = req.into_inner().pod_sandbox_id;
        self.apply(|s| Ok(((), s.stop_sandbox(&id)?)))?;
        Ok(Response::new(api::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<api::RemovePodSandboxRequest>,
    ) -> Reply<api::RemovePodSandboxResponse> {
        self.begin("RemovePodSandbox").await?;
        let id = req.into_inner().pod_sandbox_id;
        self.apply(|s| Ok(((), s.remove_sandbox(&id)?)))?;
        Ok(Response::new(api::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<api::PodSandboxStatusRequest>,
    ) -> Reply<api::PodSandboxStatusResponse> {
        self.begin("PodSandboxStatus").await?;
        let status = lock(&self.shared.state).sandbox_status(&req.into_inner().pod_sandbox_id)?;
        Ok(Response::new(api::PodSandboxStatusResponse {
            status: Some(status),
            info: Default::default(),
            containers_statuses: vec![],
            timestamp: now_ns(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<api::ListPodSandboxRequest>,
    ) -> Reply<api::ListPodSandboxResponse> {
        self.begin("ListPodSandbox").await?;
        let filter = req.into_inner().filter;
        let items = lock(&self.shared.state).list_sandboxes(filter.as_ref());
        Ok(Response::new(api::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        req: Request<api::CreateContainerRequest>,
    ) -> Reply<api::CreateContainerResponse> {
        self.begin("CreateContainer").await?;
        let req = req.into_inner();
        let config = req
            .config
            .ok_or_else(|| Status::invalid_argument("no config"))?;
        let id = self.apply(|s| s.create_container(&req.pod_sandbox_id, config))?;
        Ok(Response::new(api::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        req: Request<api::StartContainerRequest>,
    ) -> Reply<api::StartContainerResponse> {
        self.begin("StartContainer").await?;
        let id = req.into_inner().container_id;
        self.apply(|s| Ok(((), s.start_container(&id)?)))?;
        Ok(Response::new(api::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        req: Request<api::StopContainerRequest>,
    ) -> Reply<api::StopContainerResponse> {
        self.begin("StopContainer").await?;
        let req = req.into_inner();
        self.apply(|s| Ok(((), s.stop_container(&req.container_id, req.timeout)?)))?;
        Ok(Response::new(api::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        req: Request<api::RemoveContainerRequest>,
    ) -> Reply<api::RemoveContainerResponse> {
        self.begin("RemoveContainer").await?;
        let id = req.into_inner().container_id;
        self.apply(|s| Ok(((), s.remove_container(&id)?)))?;
        Ok(Response::new(api::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        req: Request<api::ListContainersRequest>,
    ) -> Reply<api::ListContainersResponse> {
        self.begin("ListContainers").await?;
        let filter = req.into_inner().filter;
        let containers = lock(&self.shared.state).list_containers(filter.as_ref());
        Ok(Response::new(api::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        req: Request<api::ContainerStatusRequest>,
    ) -> Reply<api::ContainerStatusResponse> {
        self.begin("ContainerStatus").await?;
        let status = lock(&self.shared.state).container_status(&req.into_inner().container_id)?;
        Ok(Response::new(api::ContainerStatusResponse {
            status: Some(status),
            info: Default::default(),
        }))
    }

    async fn update_container_resources(
        &self,
        req: Request<api::UpdateContainerResourcesRequest>,
    ) -> Reply<api::UpdateContainerResourcesResponse> {
        self.begin("UpdateContainerResources").await?;
        lock(&self.shared.state).container_status(&req.into_inner().container_id)?;
        Ok(Response::new(api::UpdateContainerResourcesResponse {}))
    }

    async fn reopen_container_log(
        &self,
        req: Request<api::ReopenContainerLogRequest>,
    ) -> Reply<api::ReopenContainerLogResponse> {
        self.begin("ReopenContainerLog").await?;
        lock(&self.shared.state).require_running(&req.into_inner().container_id)?;
        Ok(Response::new(api::ReopenContainerLogResponse {}))
    }

    async fn exec_sync(&self, req: Request<api::ExecSyncRequest>) -> Reply<api::ExecSyncResponse> {
        self.begin("ExecSync").await?;
        let req = req.into_inner();
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
        Ok(Response::new(api::ExecSyncResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
        }))
    }

    async fn exec(&self, req: Request<api::ExecRequest>) -> Reply<api::ExecResponse> {
        self.begin("Exec").await?;
        let id = req.into_inner().container_id;
        lock(&self.shared.state).require_running(&id)?;
        Ok(Response::new(api::ExecResponse {
            url: format!("http://fake.invalid/exec/{id}"),
        }))
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
        self.begin("ContainerStats").await?;
        let id = req.into_inner().container_id;
        let state = lock(&self.shared.state);
        let c = state
            .containers
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("container \"{id}\" not found")))?;
        Ok(Response::new(api::ContainerStatsResponse {
            stats: Some(stats(c)),
        }))
    }

    async fn list_container_stats(
        &self,
        req: Request<api::ListContainerStatsRequest>,
    ) -> Reply<api::ListContainerStatsResponse> {
        self.begin("ListContainerStats").await?;
        let filter = req.into_inner().filter.unwrap_or_default();
        let state = lock(&self.shared.state);
        let stats = state
            .containers
            .values()
            .filter(|c| {
                (filter.id.is_empty() || c.id == filter.id)
                    && (filter.pod_sandbox_id.is_empty() || c.sandbox_id == filter.pod_sandbox_id)
            })
            .map(stats)
            .collect();
        Ok(Response::new(api::ListContainerStatsResponse { stats }))
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<api::PodSandboxStatsRequest>,
    ) -> Reply<api::PodSandboxStatsResponse> {
        self.begin("PodSandboxStats").await?;
        let id = req.into_inner().pod_sandbox_id;
        let status = lock(&self.shared.state).sandbox_status(&id)?;
        Ok(Response::new(api::PodSandboxStatsResponse {
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
        }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<api::ListPodSandboxStatsRequest>,
    ) -> Reply<api::ListPodSandboxStatsResponse> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Reply<api::UpdateRuntimeConfigResponse> {
        self.begin("UpdateRuntimeConfig").await?;
        Ok(Response::new(api::UpdateRuntimeConfigResponse {}))
    }

    async fn status(&self, _: Request<api::StatusRequest>) -> Reply<api::StatusResponse> {
        self.begin("Status").await?;
        let condition = |kind: &str| api::RuntimeCondition {
            r#type: kind.into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        Ok(Response::new(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![condition("RuntimeReady"), condition("NetworkReady")],
            }),
            ..Default::default()
        }))
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
        _: Request<api::GetEventsRequest>,
    ) -> Reply<Self::GetContainerEventsStream> {
        self.begin("GetContainerEvents").await?;
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
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
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
        _: Request<api::RuntimeConfigRequest>,
    ) -> Reply<api::RuntimeConfigResponse> {
        self.begin("RuntimeConfig").await?;
        Ok(Response::new(api::RuntimeConfigResponse {
            linux: Some(api::LinuxRuntimeConfiguration {
                cgroup_driver: api::CgroupDriver::Cgroupfs as i32,
            }),
        }))
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
