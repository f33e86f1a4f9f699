//! Upstream's generic PLEG: a full relist every period (1 s).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::relist::Relister;

/// Upstream's `genericPlegRelistPeriod`.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// Relists every `period` until `cancel` (a slow relist delays the next one, as upstream's `wait.Until`).
pub async fn run(mut relister: Relister, period: Duration, cancel: CancellationToken) {
    loop {
        if let Err(err) = relister.relist_all().await {
            tracing::error!(%err, "GenericPLEG: unable to retrieve pods");
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
