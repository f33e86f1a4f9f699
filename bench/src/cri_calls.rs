//! The CRI status calls a relist makes (PodSandboxStatus + ContainerStatus)
//! against the benchmark's real pods: calls/s and latency, one pair at a
//! time and 8 in flight. The cost model of the `generic` PLEG.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use evlet_cri::{ContainerFilter, ContainerId, RuntimeClient, SandboxId};

use crate::report::CriCalls;
use crate::{NODE, Summary};

/// PodSandboxStatus + ContainerStatus against the running pods of the
/// benchmark's node (`pods` of them, for the record), each way for `window`.
///
/// # Errors
/// If there are no such pods or a call fails.
pub async fn cri_calls(client: &RuntimeClient, pods: usize, window: Duration) -> Result<CriCalls> {
    let containers = client.list_containers(ContainerFilter::new()).await?;
    let pairs: Arc<Vec<(SandboxId, ContainerId)>> = Arc::new(
        containers
            .into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&format!("-{NODE}")))
            })
            .map(|c| (SandboxId::new(c.pod_sandbox_id), ContainerId::new(c.id)))
            .collect(),
    );
    if pairs.is_empty() {
        bail!("no bench containers to query");
    }
    let one = |client: RuntimeClient, pairs: Arc<Vec<(SandboxId, ContainerId)>>| async move {
        let mut lat = Vec::new();
        let start = Instant::now();
        while start.elapsed() < window {
            let (s, c) = &pairs[fastrand::usize(..pairs.len())];
            let t = Instant::now();
            client.pod_sandbox_status(s, false).await?;
            client.container_status(c).await?;
            lat.push(t.elapsed());
        }
        anyhow::Ok((lat, start.elapsed()))
    };
    let (lat, took) = one(client.clone(), Arc::clone(&pairs)).await?;
    let sequential = 2.0 * lat.len() as f64 / took.as_secs_f64();
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    for _ in 0..8 {
        set.spawn(one(client.clone(), Arc::clone(&pairs)));
    }
    let mut calls = 0;
    while let Some(r) = set.join_next().await {
        calls += 2 * r??.0.len();
    }
    Ok(CriCalls {
        pods,
        sequential_calls_per_s: sequential,
        pair_latency: Summary::of(&lat),
        concurrent8_calls_per_s: calls as f64 / start.elapsed().as_secs_f64(),
    })
}
