//! Pod sources and their merge.
//!
//! * [`manifest`]: static pod manifests (parse, name, default, validate).
//! * [`file`]: the manifest directory (inotify + periodic rescan).
//! * [`http`]: the manifest URL (periodic).
//! * [`config`]: `PodConfig`, the merge into ADD/UPDATE/REMOVE/RECONCILE.

pub mod config;
pub mod file;
pub mod http;
pub mod manifest;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::PodUid;

pub use config::{Op, PodConfig, PodUpdate, Source};
pub use manifest::ManifestError;

/// What a source tells the merger.
#[derive(Debug)]
pub enum SourceMessage {
    /// The source's complete current set of pods. A pod the source did
    /// not change is the very `Arc` it sent before (the merger needs no
    /// comparison to know it unchanged).
    Snapshot(Source, Vec<Arc<Pod>>),
    /// Pods added or changed (`upserts`) and removed since the last message.
    Changes {
        /// The source.
        source: Source,
        /// New or changed pods.
        upserts: Vec<Arc<Pod>>,
        /// Pods that are gone.
        removed: Vec<PodUid>,
    },
    /// A manifest the source rejected (already logged).
    Error(Source, ManifestError),
}
