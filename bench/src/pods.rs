//! The PLEG modes benchmark's static pods: their names and manifests, how
//! a manifest lands in the agent's manifest directory, and their removal.

use std::path::Path;

use anyhow::Result;
use evlet_cri::{RuntimeClient, SandboxFilter, SandboxId};

use crate::NODE;

/// The app container of every bench pod.
pub const APP: &str = "app";

/// The name evlet gives the static pod of manifest `b<i>.yaml`.
pub fn pod_name(i: usize) -> String {
    format!("b{i}-{NODE}")
}

/// Manifest `b<i>.yaml`: one container that sleeps, restarted when killed.
pub fn manifest(i: usize, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: b{i}}}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: {APP}\n    image: {image}\n    command: [/bin/sleep, '86400']\n"
    )
}

/// Writes `yaml` as `dir/name` in one rename, so the agent never reads half
/// a manifest.
///
/// # Errors
/// If the file cannot be written or renamed.
pub fn write_manifest(dir: &Path, name: &str, yaml: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

/// Stops and removes every sandbox of the benchmark's node (the agent's
/// pods and the floor's), 8 at a time.
///
/// # Errors
/// A CRI failure that [`crate::remove_sandbox`]'s retries did not outlast.
pub async fn cleanup(client: &RuntimeClient) -> Result<()> {
    let sandboxes = client.list_pod_sandbox(SandboxFilter::new()).await?;
    let ids: Vec<SandboxId> = sandboxes
        .into_iter()
        .filter(|s| {
            s.labels
                .get("io.kubernetes.pod.name")
                .is_some_and(|n| n.ends_with(&format!("-{NODE}")))
        })
        .map(|s| SandboxId::new(s.id))
        .collect();
    for chunk in ids.chunks(8) {
        let mut set = tokio::task::JoinSet::new();
        for id in chunk {
            let (client, id) = (client.clone(), id.clone());
            set.spawn(async move { crate::remove_sandbox(&client, &id).await });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
    }
    Ok(())
}
