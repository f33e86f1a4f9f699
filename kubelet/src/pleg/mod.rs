//! The Pod Lifecycle Event Generator.
//!
//! [`relist::Relister`] is the only writer of the pod cache: a full relist lists
//! every sandbox and container, diffs against the previous listing, re-reads the
//! pods that changed and emits [`PodLifecycleEvent`]s; a per-pod relist does the
//! same for one pod. [`generic`] drives it every second (upstream's algorithm);
//! the eBPF and CRI-event modes drive it from hints.

pub mod cgroup_map;
pub mod cri_events;
pub mod ebpf;
pub mod generic;
pub mod hinted;
pub mod hints;
pub mod kernel;
pub mod process;
pub mod relist;
pub mod restarts;

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::health::Unhealthy;
use crate::pod::PodUid;

/// Upstream's PLEG event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// A container started running.
    ContainerStarted,
    /// A container exited.
    ContainerDied,
    /// A container was removed.
    ContainerRemoved,
    /// Something changed that no single event describes.
    PodSync,
}

/// "Pod `uid` may have changed": all the sync loop needs to wake the pod's worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// The pod.
    pub uid: PodUid,
    /// What happened.
    pub kind: EventType,
    /// The container (or sandbox) ID it is about.
    pub data: String,
}

/// Upstream's relist health threshold.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// PLEG health: the authoritative (full) relist succeeded recently.
#[derive(Debug)]
pub struct Health {
    last: Mutex<Option<Instant>>,
    threshold: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
            threshold: RELIST_THRESHOLD,
        }
    }
}

impl Health {
    /// Health with a custom threshold (the eBPF mode's global relist is slower).
    pub fn with_threshold(threshold: Duration) -> Self {
        Self {
            last: Mutex::new(None),
            threshold,
        }
    }

    /// Records a successful full relist at `at`.
    pub fn record(&self, at: Instant) {
        *crate::lock::lock(&self.last) = Some(at);
    }

    /// `Ok` if a full relist succeeded within the threshold.
    ///
    /// # Errors
    /// Upstream's wording: "pleg has yet to be successful" or "pleg was last seen active ...".
    pub fn check(&self) -> Result<(), Unhealthy> {
        let last = *crate::lock::lock(&self.last);
        match last {
            None => Err(Unhealthy::PlegNotYet),
            Some(t) if t.elapsed() > self.threshold => Err(Unhealthy::PlegStale {
                ago: t.elapsed(),
                threshold: self.threshold,
            }),
            Some(_) => Ok(()),
        }
    }
}
