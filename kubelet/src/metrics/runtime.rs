//! `kubelet_runtime_operations_*`: every CRI call the client makes, counted and
//! timed under upstream's operation names (`instrumentedRuntimeService`).

use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec};

/// The runtime-operation metrics; the CRI client reports to them as its
/// [`evlet_cri::Observer`].
#[derive(Debug)]
pub struct RuntimeOperations {
    /// Calls by `operation_type`.
    pub total: IntCounterVec,
    /// Failed calls by `operation_type`.
    pub errors: IntCounterVec,
    /// Seconds by `operation_type`, failed calls included.
    pub duration: HistogramVec,
}

impl RuntimeOperations {
    /// Counts and times one call of the CRI method `call`.
    pub fn observe(&self, call: &'static str, elapsed: Duration, error: Option<&evlet_cri::Error>) {
        let op = [operation_type(call)];
        self.total.with_label_values(&op).inc();
        self.duration
            .with_label_values(&op)
            .observe(elapsed.as_secs_f64());
        if error.is_some() {
            self.errors.with_label_values(&op).inc();
        }
    }
}

/// The upstream name of the CRI method `call`'s operation.
pub fn operation_type(call: &str) -> &'static str {
    match call {
        "Version" => "version",
        "Status" => "status",
        "RuntimeConfig" => "runtime_config",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "UpdateContainerResources" => "update_container",
        "ReopenContainerLog" => "reopen_container_log",
        "ExecSync" => "exec_sync",
        "Exec" => "exec",
        "Attach" => "attach",
        "PortForward" => "port_forward",
        "ContainerStats" => "container_stats",
        "ListContainerStats" => "list_container_stats",
        "PodSandboxStats" => "podsandbox_stats",
        "ListPodSandboxStats" => "list_podsandbox_stats",
        "GetContainerEvents" => "get_container_events",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        _ => "other",
    }
}

/// The CRI client's observer: the agent's [`RuntimeOperations`].
#[derive(Debug, Clone)]
pub struct Observer(pub std::sync::Arc<super::Metrics>);

impl evlet_cri::Observer for Observer {
    fn observe(&self, call: &'static str, elapsed: Duration, error: Option<&evlet_cri::Error>) {
        self.0.runtime.observe(call, elapsed, error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_the_client_makes_has_an_upstream_name() {
        let client = include_str!("../../../cri/src/client.rs");
        let mut calls = 0;
        for pattern in ["self.read(\"", "self.mutate(\""] {
            for part in client.split(pattern).skip(1) {
                let name = part.split('"').next().unwrap_or_default();
                calls += 1;
                assert_ne!(operation_type(name), "other", "{name}");
            }
        }
        assert!(calls > 20, "found {calls} calls");
    }
}
