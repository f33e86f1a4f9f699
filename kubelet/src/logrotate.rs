//! Container log rotation, as upstream's `ContainerLogManager` does it:
//! every `containerLogMonitorInterval` the running containers' logs are
//! checked; one past `containerLogMaxSize` is renamed to
//! `<log>.<YYYYMMDD-HHMMSS>` and the runtime reopens its log
//! (`ReopenContainerLog`); older rotated files are gzipped and the oldest
//! removed so that at most `containerLogMaxFiles` files (the current one
//! included) stay. `kubectl logs` reads the current file only, as upstream.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use evlet_cri::{ContainerId, RuntimeClient};
use tokio_util::sync::CancellationToken;

/// The rotation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Rotate past this many bytes.
    pub max_size: u64,
    /// Files kept per container, the current one included (≥ 2).
    pub max_files: usize,
}

/// What to do with one log's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Files to delete (leftovers and the oldest rotated ones).
    pub remove: Vec<PathBuf>,
    /// Rotated files to gzip.
    pub compress: Vec<PathBuf>,
    /// The name the current file gets.
    pub rotate_to: PathBuf,
}

const GZ: &str = ".gz";
const TMP: &str = ".tmp";

/// The plan for `log` given the other files of its directory (pure):
/// upstream's cleanup of leftovers, removal of excess rotated files, and
/// compression of all rotated files but the newest.
pub fn plan(log: &Path, siblings: &[PathBuf], stamp: &str, max_files: usize) -> Plan {
    let base = log
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{base}.");
    let mut remove = Vec::new();
    let mut rotated: Vec<PathBuf> = Vec::new();
    for p in siblings {
        let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !name.starts_with(&prefix) {
            continue;
        }
        if name.ends_with(TMP) {
            remove.push(p.clone());
        } else if !name.ends_with(GZ)
            && siblings.iter().any(|q| {
                q.file_name()
                    .is_some_and(|n| n.to_string_lossy() == format!("{name}{GZ}"))
            })
        {
            // Compressed before a crash, original left behind.
            remove.push(p.clone());
        } else {
            rotated.push(p.clone());
        }
    }
    // The timestamp names sort in time order.
    rotated.sort();
    let keep = max_files.saturating_sub(2);
    let excess = rotated.len().saturating_sub(keep);
    remove.extend(rotated.drain(..excess));
    let compress = rotated
        .iter()
        .filter(|p| !p.to_string_lossy().ends_with(GZ))
        .cloned()
        .collect();
    Plan {
        remove,
        compress,
        rotate_to: log.with_file_name(format!("{base}.{stamp}")),
    }
}

fn gzip(path: &Path) -> std::io::Result<()> {
    let gz = PathBuf::from(format!("{}{GZ}", path.display()));
    let tmp = PathBuf::from(format!("{}{TMP}", gz.display()));
    let mut input = std::fs::File::open(path)?;
    let output = std::fs::File::create(&tmp)?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
    std::io::copy(&mut input, &mut encoder)?;
    encoder.finish()?;
    std::fs::rename(&tmp, &gz)?;
    std::fs::remove_file(path)
}

/// `YYYYMMDD-HHMMSS` of now (UTC), upstream's rotated-log suffix.
fn stamp() -> String {
    crate::clock::now().0.strftime("%Y%m%d-%H%M%S").to_string()
}

/// Rotates `log` of container `id` if it outgrew the policy.
///
/// # Errors
/// The IO or CRI error; the current file is put back if the runtime could not reopen.
pub async fn rotate_if_needed(
    runtime: &RuntimeClient,
    id: &ContainerId,
    log: &Path,
    policy: Policy,
) -> Result<bool, String> {
    let size = match std::fs::metadata(log) {
        Ok(m) => m.len(),
        Err(_) => return Ok(false),
    };
    if size < policy.max_size {
        return Ok(false);
    }
    let dir = log.parent().ok_or("log without a directory")?;
    let siblings: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let mut p = plan(log, &siblings, &stamp(), policy.max_files);
    if p.rotate_to.exists() {
        // Two rotations within a second: the next check does it.
        return Ok(false);
    }
    for f in &p.remove {
        let _ = std::fs::remove_file(f);
    }
    let compress = std::mem::take(&mut p.compress);
    tokio::task::spawn_blocking(move || {
        for f in compress {
            if let Err(e) = gzip(&f) {
                tracing::warn!(file = %f.display(), error = %e, "cannot compress a rotated log");
            }
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    std::fs::rename(log, &p.rotate_to).map_err(|e| e.to_string())?;
    if let Err(e) = runtime.reopen_container_log(id).await {
        // The runtime still writes the renamed file: give it its name back.
        let _ = std::fs::rename(&p.rotate_to, log);
        return Err(format!("failed to reopen container log: {e}"));
    }
    Ok(true)
}

/// Checks the running containers' logs every `interval` until `shutdown`.
///
/// Upstream lists the running containers (`ListContainers`) and asks for each
/// one's status on every check. Here `running` names them (the agent passes
/// its pod cache, which the PLEG keeps in line with the runtime, so a check
/// decodes nothing and costs the runtime nothing), and a container's log
/// path, which never changes, is asked once per container: a check costs a
/// `stat` per log.
pub async fn run(
    runtime: RuntimeClient,
    running: impl Fn() -> Vec<ContainerId>,
    policy: Policy,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = crate::clock::Ticks::every(interval);
    let mut paths: HashMap<ContainerId, PathBuf> = HashMap::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tick.tick() => {}
        }
        let running = running();
        let ids: HashSet<&ContainerId> = running.iter().collect();
        paths.retain(|id, _| ids.contains(id));
        for id in &running {
            let log = match paths.get(id) {
                Some(log) => log.clone(),
                None => {
                    let Ok(status) = runtime.container_status(id).await else {
                        continue;
                    };
                    let log = PathBuf::from(status.log_path);
                    paths.insert(id.clone(), log.clone());
                    log
                }
            };
            if log.as_os_str().is_empty() {
                continue;
            }
            match rotate_if_needed(&runtime, id, &log, policy).await {
                Ok(true) => {
                    tracing::debug!(container = %id.short(), log = %log.display(), "rotated the container's log")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(container = %id.short(), log = %log.display(), error = %e, "log rotation failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names
            .iter()
            .map(|n| PathBuf::from(format!("/l/{n}")))
            .collect()
    }

    #[test]
    fn old_files_are_compressed_the_oldest_removed_and_leftovers_cleaned() {
        let siblings = paths(&[
            "0.log",
            "0.log.20261124-010000.gz",
            "0.log.20261124-020000.gz",
            "0.log.20261124-030000",
            "0.log.20261124-040000",
            "0.log.20261124-050000.gz.tmp",
            "1.log.20261124-010000",
        ]);
        let p = plan(Path::new("/l/0.log"), &siblings, "20261124-060000", 5);
        assert_eq!(
            p.remove,
            paths(&["0.log.20261124-050000.gz.tmp", "0.log.20261124-010000.gz"]),
            "leftovers, then the oldest beyond max_files - 2 rotated"
        );
        assert_eq!(
            p.compress,
            paths(&["0.log.20261124-030000", "0.log.20261124-040000"])
        );
        assert_eq!(p.rotate_to, PathBuf::from("/l/0.log.20261124-060000"));
    }

    #[test]
    fn a_compressed_copy_supersedes_its_original() {
        let siblings = paths(&["0.log", "0.log.20261124-010000", "0.log.20261124-010000.gz"]);
        let p = plan(Path::new("/l/0.log"), &siblings, "20261124-020000", 2);
        assert_eq!(
            p.remove,
            paths(&["0.log.20261124-010000", "0.log.20261124-010000.gz"])
        );
        assert!(p.compress.is_empty());
    }

    #[test]
    fn gzip_replaces_the_file_with_its_compressed_copy() {
        use std::io::Read as _;
        let dir = tempfile::tempdir().expect("tmp");
        let f = dir.path().join("0.log.20261124-010000");
        std::fs::write(&f, "2026-11-24T01:00:00Z stdout F hello\n").expect("write");
        gzip(&f).expect("gzip");
        assert!(!f.exists());
        let gz = std::fs::File::open(dir.path().join("0.log.20261124-010000.gz")).expect("gz");
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_string(&mut text)
            .expect("gunzip");
        assert_eq!(text, "2026-11-24T01:00:00Z stdout F hello\n");
    }
}
