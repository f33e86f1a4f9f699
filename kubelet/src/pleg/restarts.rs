//! Runtime restarts as a hint: a new process behind the runtime's socket may
//! have lost, reaped or created anything while it was away, and nothing of
//! that reaches the hinted PLEG by itself (invariant 6). The CRI client notes
//! the PID of each connection's peer; a change asks for a full relist. The
//! runtime health check calls the runtime every 5 s, so a restart is seen
//! within about that long even on a quiet node.

use std::sync::Arc;

use evlet_cri::RuntimeClient;
use tokio_util::sync::CancellationToken;

use super::hints::{Hints, Reason};

/// Watches `client`'s runtime PID until `cancel`.
pub async fn run(client: RuntimeClient, hints: Arc<Hints>, cancel: CancellationToken) {
    let mut pid = client.runtime_pid();
    let mut known = *pid.borrow_and_update();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = pid.changed() => if changed.is_err() { return },
        }
        let now = *pid.borrow_and_update();
        if let (Some(old), Some(new)) = (known, now)
            && old != new
        {
            tracing::warn!(
                old,
                new,
                "the container runtime restarted; relisting everything"
            );
            hints.full(Reason::RuntimeRestarted, format!("pid {old} -> {new}"));
        }
        known = now.or(known);
    }
}
