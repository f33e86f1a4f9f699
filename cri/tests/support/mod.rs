//! Shared harness of the `node_*` CRI tests: a [`Case`] owns a client, the node
//! environment, a unique name and a log directory, and cleans up after itself.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use evlet_cri::{ContainerId, Options, RuntimeClient, SandboxFilter, SandboxId, api};
use evlet_testkit::{NodeEnv, eventually, within};

pub const LABEL: &str = "evlet.test/case";

/// One test's world: a client, the node, a unique name and a log directory.
pub struct Case {
    pub client: RuntimeClient,
    pub node: NodeEnv,
    pub name: String,
    pub logs: tempfile::TempDir,
}

impl Case {
    pub fn sandbox_config(&self, pod: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: format!("{}-{pod}", self.name),
                uid: format!("uid-{}-{pod}", self.name),
                namespace: "evlet-test".into(),
                attempt: 0,
            }),
            hostname: pod.into(),
            log_directory: self.logs.path().join(pod).display().to_string(),
            labels: [
                (LABEL.to_owned(), self.name.clone()),
                ("pod".to_owned(), pod.to_owned()),
            ]
            .into(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/{}/{pod}", self.node.cgroup_root, self.name),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn container_config(&self, name: &str, script: &str) -> api::ContainerConfig {
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: self.node.test_image.clone(),
                ..Default::default()
            }),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            log_path: format!("{name}/0.log"),
            labels: [(LABEL.to_owned(), self.name.clone())].into(),
            ..Default::default()
        }
    }

    pub async fn sandbox(&self, pod: &str) -> SandboxId {
        within(
            Duration::from_secs(60),
            "RunPodSandbox",
            self.client.run_pod_sandbox(self.sandbox_config(pod), ""),
        )
        .await
        .expect("sandbox runs")
    }

    pub async fn start(
        &self,
        sandbox: &SandboxId,
        pod: &str,
        name: &str,
        script: &str,
    ) -> ContainerId {
        let id = self
            .client
            .create_container(
                sandbox,
                self.container_config(name, script),
                self.sandbox_config(pod),
            )
            .await
            .expect("container is created");
        self.client
            .start_container(&id)
            .await
            .expect("container starts");
        id
    }

    pub async fn wait_exited(&self, id: &ContainerId) -> api::ContainerStatus {
        eventually(Duration::from_secs(30), "container exit", || async {
            let status = self.client.container_status(id).await.expect("status");
            (status.state == api::ContainerState::ContainerExited as i32).then_some(status)
        })
        .await
    }

    /// Stops and removes every sandbox this case made, then its cgroups.
    pub async fn cleanup(&self) {
        let filter = SandboxFilter::new().label(LABEL, self.name.clone());
        if let Ok(sandboxes) = self.client.list_pod_sandbox(filter).await {
            for s in sandboxes {
                let id = SandboxId::new(s.id);
                let _ = self.client.stop_pod_sandbox(&id).await;
                let _ = self.client.remove_pod_sandbox(&id).await;
            }
        }
        self.node.remove_cgroups(&self.name);
    }
}

static CASES: AtomicU32 = AtomicU32::new(0);

/// Runs `body` against the node and cleans up whatever it made, even if it panics.
pub async fn case<F, Fut>(test: &str, body: F)
where
    F: FnOnce(std::sync::Arc<Case>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(node) = evlet_testkit::node(test) else {
        return;
    };
    let client = RuntimeClient::connect(&node.endpoint, Options::default()).expect("endpoint");
    let n = CASES.fetch_add(1, Ordering::Relaxed);
    let case = std::sync::Arc::new(Case {
        client,
        node,
        name: format!("cri{}-{n}", std::process::id()),
        logs: tempfile::tempdir().expect("log dir"),
    });
    let outcome = tokio::spawn(body(case.clone())).await;
    case.cleanup().await;
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}
