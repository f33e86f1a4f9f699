//! Builders for the list filters of `ListPodSandbox`, `ListContainers` and stats calls.

use std::collections::HashMap;

use crate::api;
use crate::ids::{ContainerId, SandboxId};

/// Filter for [`RuntimeClient::list_pod_sandbox`](crate::RuntimeClient::list_pod_sandbox).
/// An empty filter lists every sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    id: Option<SandboxId>,
    state: Option<api::PodSandboxState>,
    labels: HashMap<String, String>,
}

impl SandboxFilter {
    /// Matches every sandbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the sandbox with this ID.
    pub fn id(mut self, id: &SandboxId) -> Self {
        self.id = Some(id.clone());
        self
    }

    /// Only sandboxes in this state.
    pub fn state(mut self, state: api::PodSandboxState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only sandboxes carrying this label (all given labels must match).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub(crate) fn into_api(self) -> Option<api::PodSandboxFilter> {
        if self.id.is_none() && self.state.is_none() && self.labels.is_empty() {
            return None;
        }
        Some(api::PodSandboxFilter {
            id: self.id.map(|id| id.to_string()).unwrap_or_default(),
            state: self
                .state
                .map(|s| api::PodSandboxStateValue { state: s as i32 }),
            label_selector: self.labels,
        })
    }
}

/// Filter for [`RuntimeClient::list_containers`](crate::RuntimeClient::list_containers)
/// and the container stats calls. An empty filter lists every container.
#[derive(Debug, Clone, Default)]
pub struct ContainerFilter {
    id: Option<ContainerId>,
    sandbox: Option<SandboxId>,
    state: Option<api::ContainerState>,
    labels: HashMap<String, String>,
}

impl ContainerFilter {
    /// Matches every container.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the container with this ID.
    pub fn id(mut self, id: &ContainerId) -> Self {
        self.id = Some(id.clone());
        self
    }

    /// Only containers of this sandbox.
    pub fn sandbox(mut self, id: &SandboxId) -> Self {
        self.sandbox = Some(id.clone());
        self
    }

    /// Only containers in this state (ignored by stats calls).
    pub fn state(mut self, state: api::ContainerState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only containers carrying this label (all given labels must match).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub(crate) fn into_api(self) -> Option<api::ContainerFilter> {
        if self.id.is_none()
            && self.sandbox.is_none()
            && self.state.is_none()
            && self.labels.is_empty()
        {
            return None;
        }
        Some(api::ContainerFilter {
            id: self.id.map(|id| id.to_string()).unwrap_or_default(),
            pod_sandbox_id: self.sandbox.map(|id| id.to_string()).unwrap_or_default(),
            state: self
                .state
                .map(|s| api::ContainerStateValue { state: s as i32 }),
            label_selector: self.labels,
        })
    }

    pub(crate) fn into_stats_api(self) -> Option<api::ContainerStatsFilter> {
        if self.id.is_none() && self.sandbox.is_none() && self.labels.is_empty() {
            return None;
        }
        Some(api::ContainerStatsFilter {
            id: self.id.map(|id| id.to_string()).unwrap_or_default(),
            pod_sandbox_id: self.sandbox.map(|id| id.to_string()).unwrap_or_default(),
            label_selector: self.labels,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_filters_are_sent_as_none() {
        assert!(SandboxFilter::new().into_api().is_none());
        assert!(ContainerFilter::new().into_api().is_none());
        assert!(ContainerFilter::new().into_stats_api().is_none());
    }

    #[test]
    fn container_filter_carries_every_field() {
        let f = ContainerFilter::new()
            .sandbox(&SandboxId::new("s1"))
            .state(api::ContainerState::ContainerRunning)
            .label("app", "web")
            .into_api()
            .expect("non-empty filter");
        assert_eq!(f.pod_sandbox_id, "s1");
        assert_eq!(
            f.state.map(|s| s.state),
            Some(api::ContainerState::ContainerRunning as i32)
        );
        assert_eq!(f.label_selector.get("app").map(String::as_str), Some("web"));
    }
}
