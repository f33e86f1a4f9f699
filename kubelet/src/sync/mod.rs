//! SyncPod and termination over CRI.
//!
//! * [`actions`]: what to do (pure).
//! * [`spec`]: pod spec → CRI sandbox and container configs (pure).
//! * [`env`]: environment and the downward API (pure).
//! * [`objects`], [`recorder`]: what the syncer needs from outside (ConfigMaps
//!   and Secrets, an event recorder), as traits its constructor takes.
//! * [`volumes`]: the volume directories a pod needs (IO).
//! * [`terminate`]: preStop, SIGTERM, SIGKILL, removal, container GC.
//! * [`syncer`]: [`Syncer`] carries the actions out (images, sandboxes,
//!   containers, backoff) and terminates pods (preStop, SIGTERM, SIGKILL, removal).

pub mod actions;
pub mod env;
pub mod objects;
pub mod recorder;
pub mod spec;
pub mod syncer;
pub mod terminate;
pub mod volumes;

pub use syncer::{SyncOutcome, Syncer};
