//! The CRI client survives a containerd restart. Its own test binary, because
//! restarting the daemon disturbs every other test running at the time.

mod support;

use std::time::Duration;

use evlet_cri::api;
use evlet_testkit::{eventually, within};
use support::case;

#[tokio::test(flavor = "multi_thread")]
async fn client_reconnects_after_containerd_restarts() {
    case(
        "client_reconnects_after_containerd_restarts",
        |c| async move {
            let sandbox = c.sandbox("restart").await;
            let id = c.start(&sandbox, "restart", "app", "sleep 3600").await;
            c.client.version().await.expect("before restart");
            let node = c.node.clone();
            tokio::task::spawn_blocking(move || node.restart_containerd())
                .await
                .expect("restart");
            // The same client (no reconnect by the caller) waits for the CRI plugin
            // to finish restoring its state...
            eventually(Duration::from_secs(60), "CRI to serve again", || async {
                c.client.status(false).await.ok()
            })
            .await;
            // ...and then the next call about a container succeeds.
            let status = within(
                Duration::from_secs(60),
                "a call after restart",
                c.client.container_status(&id),
            )
            .await
            .expect("the first call after the restart succeeds");
            assert_eq!(
                status.state,
                api::ContainerState::ContainerRunning as i32,
                "container survived the restart"
            );
        },
    )
    .await;
}
