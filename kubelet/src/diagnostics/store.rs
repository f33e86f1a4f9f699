//! Durable diagnostics: OOM records and pod timelines under
//! `<root-dir>/diag`, so they survive an agent restart. Bounded by what
//! memory keeps (`KEEP` records, `timeline::KEEP_PODS` timelines of
//! `timeline::KEEP_ENTRIES` entries). The OOM records' file is replaced
//! atomically; a timeline is rewritten in place (see [`save_pod`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::OomRecord;
use super::timeline::PodTimeline;

const OOMS: &str = "oom.json";
const PODS: &str = "pods";

/// The file of a pod's timeline: its UID when that is a plain file name,
/// else a hash of it (no UID can name a path outside the directory).
fn pod_file(dir: &Path, uid: &str) -> PathBuf {
    let plain = !uid.is_empty()
        && uid.len() <= 128
        && uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let name = if plain {
        uid.to_owned()
    } else {
        hex::encode(sha2::Sha256::digest(uid.as_bytes()))
    };
    dir.join(PODS).join(format!("{name}.json"))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

/// Writes every OOM record.
pub fn save_ooms(dir: &Path, ooms: &[OomRecord]) -> std::io::Result<()> {
    write_atomically(&dir.join(OOMS), &serde_json::to_vec(ooms)?)
}

/// Writes one pod's timeline, over its file in place: the flush rewrites
/// every changed timeline every 2 s, and replacing each by a new file would
/// allocate one inode and free another per pod per flush. On ext4 every new
/// inode's allocation checks each inode freed in the last minute, so at
/// hundreds of starting pods that churn made each file the node makes (the
/// runtime's too) cost more. A write torn by a crash leaves a file that no
/// longer parses, which [`load`] drops with a warning: a timeline is a
/// diagnostic, not state.
pub fn save_pod(dir: &Path, pod: &PodTimeline) -> std::io::Result<()> {
    write_in_place(&pod_file(dir, &pod.uid), &serde_json::to_vec(pod)?)
}

fn write_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.write_all(bytes)?;
    f.set_len(bytes.len() as u64)
}

/// Removes one pod's timeline.
pub fn remove_pod(dir: &Path, uid: &str) {
    let _ = std::fs::remove_file(pod_file(dir, uid));
}

/// What an earlier run left: OOM records and pod timelines. Unreadable files
/// are skipped with a warning (they are diagnostics, not state).
pub fn load(dir: &Path) -> (Vec<OomRecord>, Vec<PodTimeline>) {
    let ooms = match std::fs::read(dir.join(OOMS)) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(file = %dir.join(OOMS).display(), error = %e, "cannot read the OOM records of the last run");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    };
    let mut pods = Vec::new();
    for entry in std::fs::read_dir(dir.join(PODS))
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<PodTimeline>(&b).map_err(|e| e.to_string()))
        {
            Ok(p) => pods.push(p),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "dropping an unreadable pod timeline");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    (ooms, pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_never_names_a_path_outside_the_directory() {
        let dir = Path::new("/d");
        assert_eq!(pod_file(dir, "1234-ab"), Path::new("/d/pods/1234-ab.json"));
        for bad in ["../../etc/passwd", "", "a/b", ".."] {
            let f = pod_file(dir, bad);
            assert_eq!(f.parent(), Some(Path::new("/d/pods")), "{bad}");
        }
    }

    #[test]
    fn timelines_and_records_come_back() {
        let dir = tempfile::tempdir().expect("dir");
        let pod = PodTimeline {
            uid: "u1".into(),
            name: "p".into(),
            ..Default::default()
        };
        save_pod(dir.path(), &pod).expect("save");
        std::fs::write(dir.path().join("pods/broken.json"), "{").expect("write");
        let (ooms, pods) = load(dir.path());
        assert!(ooms.is_empty());
        assert_eq!(pods, [pod]);
        assert!(!dir.path().join("pods/broken.json").exists());
        remove_pod(dir.path(), "u1");
        assert!(load(dir.path()).1.is_empty());
    }

    #[test]
    fn a_timeline_is_rewritten_in_its_own_file() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let long = PodTimeline {
            uid: "u1".into(),
            name: "a-long-name-for-the-first-write".into(),
            ..Default::default()
        };
        save_pod(dir.path(), &long).expect("save");
        let file = pod_file(dir.path(), "u1");
        let inode = std::fs::metadata(&file).expect("stat").ino();
        let short = PodTimeline {
            name: "p".into(),
            ..long
        };
        save_pod(dir.path(), &short).expect("save");
        assert_eq!(std::fs::metadata(&file).expect("stat").ino(), inode);
        assert_eq!(load(dir.path()).1, [short]);
    }
}
