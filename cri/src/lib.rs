//! evlet's Container Runtime Interface (CRI v1) client, and a fake runtime for tests.
//!
//! The agent talks to the container runtime only through this crate. It knows CRI
//! protobufs and nothing of Kubernetes objects.
//!
//! Map:
//! * [`client`]: [`RuntimeClient`], one async handle for `RuntimeService` and
//!   `ImageService` over a Unix socket, with per-call deadlines, retries of reads
//!   across runtime restarts, and a tracing span per call.
//! * [`error`]: the single [`Error`] type; failures are classified in one place.
//! * [`ids`]: [`SandboxId`] and [`ContainerId`] newtypes.
//! * [`filter`]: builders for list filters.
//! * [`retry`]: [`Retry`], the one retry policy of the client and the agent's loops.
//! * [`fake`]: (feature `fake`) an in-process runtime over a temp Unix socket with
//!   configurable latency and injectable faults.
//!
//! The generated protobuf types are re-exported as [`api`].

pub mod client;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod filter;
pub mod ids;
pub mod retry;

/// The generated CRI v1 types, clients and servers.
pub use k8s_cri::v1 as api;

pub use client::{ExecOutput, Observer, Options, RuntimeClient};
pub use error::{Error, ErrorKind};
pub use filter::{ContainerFilter, SandboxFilter};
pub use ids::{ContainerId, SandboxId};
pub use retry::Retry;
