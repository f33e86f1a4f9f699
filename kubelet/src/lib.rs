//! evlet: a Kubernetes node agent whose PLEG is driven by eBPF.
//!
//! Map (data flows top to bottom):
//! * [`config`]: KubeletConfiguration-style YAML plus flags.
//! * [`source`]: pod sources (static manifest directory, manifest URL) and their
//!   merge into ADD/UPDATE/REMOVE/RECONCILE ([`source::PodConfig`]).
//! * [`validation`]: pod spec checks naming the field; [`quantity`]: resource quantities.
//! * [`agent`]: wiring; [`sync_loop`]: upstream's `syncLoop`.
//! * [`workers`]: one task per pod (sync → terminating → terminated).
//! * [`sync`]: SyncPod over CRI: actions (pure), configs (pure), the executor.
//! * [`volume`]: the volume manager (emptyDir, hostPath, configMap, secret,
//!   downwardAPI, projected, local claims; safe subPaths; fsGroup).
//! * [`downward`]: the downward API's fields and resources; [`dns`]: a pod's
//!   resolver config, names and managed `/etc/hosts`.
//! * [`backoff`]: CrashLoopBackOff and image pull backoff.
//! * [`status`]: the pod status as upstream computes it (pure).
//! * [`pleg`]: the relister (single writer of [`cache`]) and PLEG modes.
//! * [`eviction`]: the eviction manager (node pressure conditions, evicting
//!   pods when memory, disk or PIDs run low; kernel memory notifications).
//! * [`image_gc`]: the image garbage collector (disk thresholds, maximum age);
//!   [`container_gc`]: which dead containers go (per container, node-wide).
//! * [`prober`]: liveness, readiness and startup probes; [`probe`]: the checks
//!   themselves (exec, HTTP, TCP, gRPC), shared with lifecycle hooks.
//! * [`runtime`]: the CRI seen as pods; [`logs`]: the CRI log format.
//! * [`server`], [`metrics`]: `/healthz`, `/pods`, `/metrics`.
//! * [`cm`]: the pods' cgroup tree (node allocatable, QoS tiers, pod limits).
//! * [`pod`]: identity, labels, defaulting; [`cgroups`]: pod cgroup cleanup;
//!   [`vars`]: `$(VAR)` expansion.
//! * [`api`]: API-server mode (node, lease, pod watch, status manager, mirror pods).
//! * [`certificate`]: TLS bootstrap and rotation of the client and serving certificates.
//! * [`diagnostics`]: the kernel's OOM records and Kubernetes-style events.
//! * [`heap`]: glibc's arenas, and trimming the heap after bursts of work.

pub mod agent;
pub mod api;
pub mod backoff;
pub mod cache;
pub mod certificate;
pub mod cgroups;
pub mod clock;
pub mod cm;
pub mod config;
pub mod container_gc;
pub mod credentials;
pub mod diagnostics;
pub mod dns;
pub mod downward;
pub mod envvars;
pub mod eviction;
pub mod health;
pub mod heap;
pub mod image_gc;
pub mod lock;
pub mod logrotate;
pub mod logs;
pub mod machine;
pub mod metrics;
pub mod node_lock;
pub mod node_selector;
pub mod pleg;
pub mod pod;
pub mod probe;
pub mod prober;
pub mod quantity;
pub mod resources;
pub mod runtime;
pub mod server;
pub mod source;
pub mod stats;
pub mod status;
pub mod sync;
pub mod sync_loop;
pub mod sysctls;
pub mod validation;
pub mod vars;
pub mod volume;
pub mod workers;
