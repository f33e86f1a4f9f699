//! SyncPod and termination over CRI.
//!
//! * [`actions`]: what to do (pure).
//! * [`spec`]: pod spec → CRI sandbox and container configs (pure).
//! * [`env`]: environment and the downward API (pure).
//! * [`security`]: security contexts, pod over container (pure).
//! * [`objects`]: what the syncer needs from outside (ConfigMaps and
//!   Secrets), as a trait its constructor takes; events go to a
//!   [`crate::diagnostics::EventRecorder`].
//! * [`lifecycle`]: postStart and preStop hooks (exec, httpGet, sleep).
//! * [`terminate`]: preStop, SIGTERM, SIGKILL (sidecars last, in reverse
//!   order), removal, container GC.
//! * [`syncer`]: [`Syncer`] carries the actions out (images, sandboxes,
//!   containers, backoff) and terminates pods (preStop, SIGTERM, SIGKILL, removal).

pub mod actions;
pub mod env;
pub mod lifecycle;
pub mod objects;
pub mod security;
pub mod spec;
pub mod syncer;
pub mod terminate;

pub use syncer::{SyncError, SyncOutcome, Syncer};
