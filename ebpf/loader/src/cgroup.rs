//! cgroup v2 helpers: where the unified hierarchy is mounted, and cgroup IDs.
//!
//! A cgroup v2 ID is the inode number of its directory in cgroup2fs (what
//! `bpf_get_current_cgroup_id()` returns and the cgroup tracepoints report).

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// The mount point of the cgroup v2 (unified) hierarchy: `/sys/fs/cgroup` on pure
/// v2 hosts, `/sys/fs/cgroup/unified` on v1 hybrids.
///
/// # Errors
/// [`Error::Io`] if `/proc/self/mountinfo` cannot be read; `Ok(None)` if no cgroup2 is mounted.
pub fn unified_mount() -> Result<Option<PathBuf>, Error> {
    let path = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Ok(text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    }))
}

/// The cgroup v2 ID of the directory `dir` (inside the unified mount).
///
/// # Errors
/// [`Error::Io`] if `dir` cannot be stat'ed.
pub fn id_of(dir: &Path) -> Result<u64, Error> {
    std::fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|e| Error::io(dir, e))
}

/// `dir` and every directory below it, with their cgroup IDs.
pub fn walk(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(id) = id_of(&d) {
            out.push((d.clone(), id));
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}
