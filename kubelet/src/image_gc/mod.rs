//! The image garbage collector (upstream's `realImageGCManager`): every
//! `period` it notes which images containers use, removes images unused for
//! longer than `imageMaximumGCAge`, and, when the image filesystem is at or
//! over `imageGCHighThresholdPercent`, removes unused images, least recently
//! used first, until it is down to `imageGCLowThresholdPercent`. The eviction
//! manager calls [`ImageGc::delete_unused`] before evicting pods for disk.
//!
//! Never removed: an image any container (running or exited) uses, one seen
//! for less than `imageMinimumGCAge`, one the runtime pins (containerd ≥ 1.7
//! pins its sandbox image), and the sandbox image itself (containerd 1.6 does
//! not pin it: its name is read from the runtime's config, or given with
//! `--pod-infra-container-image`).

pub mod policy;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use evlet_cri::{ContainerFilter, RuntimeClient};
use tokio_util::sync::CancellationToken;

use crate::diagnostics::{Event, EventRecorder};
use crate::metrics::Metrics;
use crate::stats::StatsProvider;
pub use policy::Policy;

/// Why a collection failed.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The runtime could not list images or containers.
    #[error("cannot list images or containers: {0}")]
    Runtime(#[from] evlet_cri::Error),
    /// The runtime reported no image filesystem.
    #[error("the runtime reports no image filesystem")]
    NoImageFs,
    /// The image filesystem's capacity is 0.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Fewer bytes were eligible than needed (upstream's message).
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnough {
        /// Bytes to free.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
    },
    /// Some removals failed.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}"
    )]
    Removal {
        /// Bytes to free.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
        /// The runtime's errors, joined.
        errors: String,
    },
}

/// What the image collector works with.
#[derive(Debug, Clone)]
pub struct Collaborators {
    /// Lists images and containers, removes images.
    pub runtime: RuntimeClient,
    /// The image filesystem's capacity and availability.
    pub stats: Arc<StatsProvider>,
    /// Where the node's events go (`FreeDiskSpaceFailed`, `ImageGCFailed`).
    pub recorder: Arc<dyn EventRecorder>,
    /// `kubelet_image_garbage_collected_total`.
    pub metrics: Arc<Metrics>,
    /// The node's name (the events' object).
    pub node_name: String,
    /// `--pod-infra-container-image`: never removed.
    pub pod_infra_image: Option<String>,
}

/// The image garbage collector.
#[derive(Debug)]
pub struct ImageGc {
    policy: Policy,
    c: Collaborators,
    /// The records; held for a whole collection so two never interleave.
    records: tokio::sync::Mutex<policy::Records>,
    /// When the collector started (the maximum age counts from it).
    began: Instant,
}

impl ImageGc {
    /// A collector with `policy` (checked by the configuration).
    pub fn new(policy: Policy, c: Collaborators) -> Self {
        Self {
            policy,
            c,
            records: tokio::sync::Mutex::default(),
            began: Instant::now(),
        }
    }

    /// Collects now and every period until `shutdown`; repeated failures
    /// become an `ImageGCFailed` event, as upstream's.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if !self.policy.enabled() {
            tracing::info!(
                "imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image garbage collection is off"
            );
            return;
        }
        let mut failed_before = false;
        let mut tick = crate::clock::Ticks::every(self.policy.period);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tick.tick() => {}
            }
            match self.collect().await {
                Ok(()) => failed_before = false,
                Err(e) => {
                    if failed_before {
                        tracing::error!(error = %e, "image garbage collection failed multiple times in a row");
                        self.node_event("ImageGCFailed", e.to_string());
                    } else {
                        tracing::warn!(error = %e, "image garbage collection failed once");
                    }
                    failed_before = true;
                }
            }
        }
    }

    /// One collection (upstream's `GarbageCollect`).
    ///
    /// # Errors
    /// [`GcError`]; `NotEnough` and `InvalidCapacity` are also node events.
    pub async fn collect(&self) -> Result<(), GcError> {
        let mut records = self.records.lock().await;
        let now = Instant::now();
        let order = self.detect(&mut records, now).await?;
        let order = self.free_old(&mut records, order, now).await;
        let fs = self.c.stats.image_fs().await.ok_or(GcError::NoImageFs)?;
        let capacity = fs.capacity_bytes.unwrap_or(0);
        let available = fs.available_bytes.unwrap_or(0);
        if capacity == 0 {
            let e = GcError::InvalidCapacity;
            self.node_event("InvalidDiskCapacity", e.to_string());
            return Err(e);
        }
        let Some(wanted) = self.policy.amount_to_free(capacity, available) else {
            return Ok(());
        };
        tracing::info!(
            usage = 100 - available.min(capacity) * 100 / capacity,
            high_threshold = self.policy.high_threshold_percent,
            amount_to_free = wanted,
            low_threshold = self.policy.low_threshold_percent,
            "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        let freed = self.free_space(&mut records, &order, wanted, now).await?;
        if freed < wanted {
            let e = GcError::NotEnough { wanted, freed };
            self.node_event("FreeDiskSpaceFailed", e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Removes every unused image old enough (the eviction manager's node-level
    /// reclaim for disk signals); returns the bytes freed.
    ///
    /// # Errors
    /// [`GcError`] when the runtime cannot list or some removals failed.
    pub async fn delete_unused(&self) -> Result<u64, GcError> {
        tracing::info!("attempting to delete unused images");
        let mut records = self.records.lock().await;
        let now = Instant::now();
        let order = self.detect(&mut records, now).await?;
        self.free_space(&mut records, &order, u64::MAX, now).await
    }

    /// Updates the records and returns the removable images in order.
    async fn detect(
        &self,
        records: &mut policy::Records,
        now: Instant,
    ) -> Result<Vec<policy::Candidate>, GcError> {
        let (images, containers, infra) = tokio::join!(
            self.c.runtime.list_images(None),
            self.c.runtime.list_containers(ContainerFilter::new()),
            self.sandbox_image(),
        );
        let (images, containers) = (images?, containers?);
        let protected: Vec<&str> = infra
            .iter()
            .chain(&self.c.pod_infra_image)
            .map(String::as_str)
            .collect();
        let in_use: HashSet<String> = containers
            .iter()
            .filter(|c| !c.image_ref.is_empty())
            .map(|c| c.image_ref.clone())
            .collect();
        let images: Vec<policy::Image> = images
            .into_iter()
            .map(|i| policy::Image {
                pinned: i.pinned
                    || protected.iter().any(|p| {
                        i.id == *p || i.repo_tags.iter().chain(&i.repo_digests).any(|t| t == p)
                    }),
                size: i.size,
                id: i.id,
            })
            .collect();
        records.detect(&images, &in_use, now);
        Ok(records.eviction_order(&in_use))
    }

    /// The runtime's sandbox image when its config names one (containerd's
    /// `sandboxImage`).
    async fn sandbox_image(&self) -> Option<String> {
        let status = self.c.runtime.status(true).await.ok()?;
        let config: serde_json::Value = serde_json::from_str(status.info.get("config")?).ok()?;
        config["sandboxImage"].as_str().map(str::to_owned)
    }

    /// Removes the images unused for longer than the maximum age; returns the rest.
    async fn free_old(
        &self,
        records: &mut policy::Records,
        order: Vec<policy::Candidate>,
        now: Instant,
    ) -> Vec<policy::Candidate> {
        let mut rest = Vec::with_capacity(order.len());
        for c in order {
            if policy::too_old(&c, &self.policy, now, self.began)
                && self.remove(records, &c, "age").await.is_ok()
            {
                continue;
            }
            rest.push(c);
        }
        rest
    }

    /// Removes images in `order` that are old enough until `wanted` bytes are freed.
    async fn free_space(
        &self,
        records: &mut policy::Records,
        order: &[policy::Candidate],
        wanted: u64,
        now: Instant,
    ) -> Result<u64, GcError> {
        let mut freed = 0_u64;
        let mut errors = Vec::new();
        for c in order {
            if !policy::old_enough(c, &self.policy, now) {
                continue;
            }
            match self.remove(records, c, "space").await {
                Ok(()) => freed = freed.saturating_add(c.record.size),
                Err(e) => errors.push(e.to_string()),
            }
            if freed >= wanted {
                break;
            }
        }
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(GcError::Removal {
                wanted,
                freed,
                errors: errors.join("; "),
            })
        }
    }

    async fn remove(
        &self,
        records: &mut policy::Records,
        c: &policy::Candidate,
        reason: &str,
    ) -> Result<(), evlet_cri::Error> {
        tracing::info!(image = %c.id, size = c.record.size, reason, "removing image to free bytes");
        self.c.runtime.remove_image(&c.id).await.inspect_err(|e| {
            tracing::warn!(image = %c.id, error = %e, "cannot remove image");
        })?;
        records.forget(&c.id);
        self.c
            .metrics
            .image_garbage_collected
            .with_label_values(&[reason])
            .inc();
        Ok(())
    }

    fn node_event(&self, reason: &str, message: String) {
        self.c.recorder.record(Event::about_node(
            &self.c.node_name,
            "Warning",
            reason,
            message,
        ));
    }
}
