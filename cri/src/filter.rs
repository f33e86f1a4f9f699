//! Builders for the list filters of `ListPodSandbox`, `ListContainers` and stats calls.

use std::collections::HashMap;

use crate::api;
use crate::ids::{ContainerId, SandboxId};

/// Declares a filter type with the builder methods every filter has: `new`,
/// `id`, `state` and `label` (as `ids.rs` declares the ID types).
macro_rules! filter_type {
    (
        $(#[$doc:meta])*
        $filter:ident { id: $id:ty, state: $state:ty $(, $field:ident: $field_ty:ty)* },
        $one:literal, $many:literal, $state_note:literal
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default)]
        pub struct $filter {
            id: Option<$id>,
            $($field: Option<$field_ty>,)*
            state: Option<$state>,
            labels: HashMap<String, String>,
        }

        impl $filter {
            #[doc = concat!("Matches every ", $one, ".")]
            pub fn new() -> Self {
                Self::default()
            }

            #[doc = concat!("Only the ", $one, " with this ID.")]
            pub fn id(mut self, id: &$id) -> Self {
                self.id = Some(id.clone());
                self
            }

            #[doc = concat!("Only ", $many, " in this state", $state_note, ".")]
            pub fn state(mut self, state: $state) -> Self {
                self.state = Some(state);
                self
            }

            #[doc = concat!("Only ", $many, " carrying this label (all given labels must match).")]
            pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
                self.labels.insert(key.into(), value.into());
                self
            }
        }
    };
}

filter_type!(
    /// Filter for [`RuntimeClient::list_pod_sandbox`](crate::RuntimeClient::list_pod_sandbox).
    /// An empty filter lists every sandbox.
    SandboxFilter { id: SandboxId, state: api::PodSandboxState },
    "sandbox", "sandboxes", ""
);

impl SandboxFilter {
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

filter_type!(
    /// Filter for [`RuntimeClient::list_containers`](crate::RuntimeClient::list_containers)
    /// and the container stats calls. An empty filter lists every container.
    ContainerFilter { id: ContainerId, state: api::ContainerState, sandbox: SandboxId },
    "container", "containers", " (ignored by stats calls)"
);

impl ContainerFilter {
    /// Only containers of this sandbox.
    pub fn sandbox(mut self, id: &SandboxId) -> Self {
        self.sandbox = Some(id.clone());
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

    /// The same filter for the stats calls, which cannot filter by state.
    pub(crate) fn into_stats_api(self) -> Option<api::ContainerStatsFilter> {
        let filter = Self {
            state: None,
            ..self
        }
        .into_api()?;
        Some(api::ContainerStatsFilter {
            id: filter.id,
            pod_sandbox_id: filter.pod_sandbox_id,
            label_selector: filter.label_selector,
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
