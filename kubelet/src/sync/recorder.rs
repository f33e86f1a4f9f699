//! [`EventRecorder`]: where the syncer's Kubernetes events (Pulled, Created,
//! Started, Killing, BackOff, Failed) go. Declared here, by its consumer;
//! [`Diagnostics`] implements it (the local `/events` list, forwarded to the
//! API server's event recorder in API-server mode).

use std::fmt;

use crate::diagnostics::{Diagnostics, Event};

/// Records Kubernetes-style events.
pub trait EventRecorder: Send + Sync + fmt::Debug {
    /// Records `event`. Never blocks and never fails: a recorder that cannot
    /// keep up drops events, it does not slow the sync down.
    fn record(&self, event: Event);
}

impl EventRecorder for Diagnostics {
    fn record(&self, event: Event) {
        self.event(event);
    }
}
