//! The `cri-events` hint source: CRI `GetContainerEvents` (containerd ≥ 1.7).
//!
//! As upstream converged on (k/k PR #139262), only `CONTAINER_STOPPED_EVENT`
//! is a hint; the payload is never trusted. The stream has no replay, so every
//! (re)connection triggers a full relist; reconnects back off up to 60 s.

use std::sync::Arc;
use std::time::Duration;

use evlet_cri::{ErrorKind, RuntimeClient, api};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::hints::{Hints, Reason};
use crate::backoff::Retry;
use crate::pod::{PodUid, labels};

/// Whether the runtime implements the call (probed once at start). containerd
/// answers an unsupported call at once, but sends a supported stream's headers
/// only with its first event, so no answer within a moment means "supported".
///
/// # Errors
/// The CRI error if the stream is refused (`Unsupported` on containerd 1.6).
pub async fn probe(client: &RuntimeClient) -> Result<(), evlet_cri::Error> {
    match tokio::time::timeout(Duration::from_secs(2), client.container_events()).await {
        Ok(result) => result.map(drop),
        Err(_) => Ok(()),
    }
}

fn uid_of(event: &api::ContainerEventResponse) -> Option<PodUid> {
    event
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| m.uid.clone())
        .or_else(|| {
            event
                .containers_statuses
                .iter()
                .find_map(|c| c.labels.get(labels::POD_UID).cloned())
        })
        .filter(|u| !u.is_empty())
        .map(PodUid)
}

fn monotonic_origin(created_at_ns: i64) -> Option<u64> {
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as i64;
    let age = wall_now.saturating_sub(created_at_ns).max(0) as u64;
    Some(evlet_ebpf::monotonic_ns().saturating_sub(age))
}

/// Follows the event stream until `cancel`, reconnecting after errors.
pub async fn run(client: RuntimeClient, hints: Arc<Hints>, cancel: CancellationToken) {
    let mut retry = Retry::new(Duration::from_secs(1), Duration::from_secs(60)).jitter(0.8, 1.2);
    loop {
        match client.container_events().await {
            Ok(mut stream) => {
                hints.full(Reason::StreamConnected, "");
                let connected = tokio::time::Instant::now();
                loop {
                    let item = tokio::select! {
                        () = cancel.cancelled() => return,
                        item = stream.next() => item,
                    };
                    match item {
                        Some(Ok(event))
                            if event.container_event_type
                                == api::ContainerEventType::ContainerStoppedEvent as i32 =>
                        {
                            match uid_of(&event) {
                                Some(uid) => hints.pod(uid, monotonic_origin(event.created_at)),
                                None => {
                                    hints.full(Reason::StreamEventWithoutPod, event.container_id)
                                }
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(err)) => {
                            tracing::warn!(%err, "CRI event stream broke; reconnecting");
                            break;
                        }
                        None => {
                            tracing::warn!("CRI event stream ended; reconnecting");
                            break;
                        }
                    }
                }
                // Healthy for a minute: start the backoff over (refactored KEP-3386).
                if connected.elapsed() > Duration::from_secs(60) {
                    retry.reset();
                }
            }
            Err(err) if err.kind == ErrorKind::Unsupported => {
                tracing::error!(%err, "the runtime has no CRI event stream; only the 1 s relist finds changes");
                return;
            }
            Err(err) => tracing::warn!(%err, "cannot open the CRI event stream; retrying"),
        }
        hints.full(Reason::StreamLost, "");
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(retry.next_delay()) => {}
        }
    }
}
