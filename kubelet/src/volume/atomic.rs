//! The atomic writer of projected files (configMap, secret, downwardAPI,
//! projected volumes), as upstream's `AtomicWriter`: every version of the
//! payload is written into a fresh timestamped directory, `..data` is swapped
//! to it with one `rename` of a symlink, and the user-visible names are
//! symlinks through `..data`. A reader never sees a half-written set.
//!
//! ```text
//! <volume>/..2026_11_24_05_00_00.123456789/   the payload (files, subdirs)
//! <volume>/..data -> ..2026_11_24_05_00_00.123456789
//! <volume>/key    -> ..data/key                 (first path component only)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Component, Path, PathBuf};

const DATA_DIR: &str = "..data";
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_PATH: usize = 4096;
const MAX_FILE_NAME: usize = 255;

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Contents.
    pub data: Vec<u8>,
    /// Permission bits (exactly these, whatever the umask).
    pub mode: u32,
}

/// A path of a payload that upstream would not write, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid path: {0}")]
pub struct InvalidPath(pub String);

/// Checks a payload path as upstream's `validatePath`: relative, no `..`
/// element, not starting with `..`, within the length limits.
///
/// # Errors
/// [`InvalidPath`] saying which rule it breaks.
pub fn validate_path(p: &str) -> Result<(), InvalidPath> {
    if p.is_empty() {
        return Err(InvalidPath(format!("must not be empty: {p:?}")));
    }
    if p.starts_with('/') {
        return Err(InvalidPath(format!("must be relative path: {p}")));
    }
    if p.len() > MAX_PATH {
        return Err(InvalidPath(format!(
            "must be less than or equal to {MAX_PATH} characters"
        )));
    }
    let items: Vec<&str> = p.split('/').collect();
    for item in &items {
        if *item == ".." {
            return Err(InvalidPath(format!("must not contain '..': {p}")));
        }
        if item.len() > MAX_FILE_NAME {
            return Err(InvalidPath(format!(
                "filenames must be less than or equal to {MAX_FILE_NAME} characters"
            )));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(InvalidPath(format!("must not start with '..': {p}")));
    }
    Ok(())
}

/// `path` with `.` elements and repeated slashes removed (Go's `filepath.Clean`
/// for a relative path without `..`).
fn clean(p: &str) -> String {
    Path::new(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A payload path was rejected.
    #[error(transparent)]
    Path(#[from] InvalidPath),
    /// A filesystem operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    move |source| WriteError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Every file path below `dir`, relative to it.
fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&entry.path(), &rel, out);
        }
        out.insert(rel);
    }
}

/// Writes `payload` into `target` (which must exist) atomically; `set_perms`
/// runs on the new timestamped directory before it goes live (fsGroup).
/// Files no longer in the payload disappear with the old directory. Returns
/// whether anything changed.
///
/// # Errors
/// [`WriteError`] naming the path and the operation.
pub fn write(
    target: &Path,
    payload: &BTreeMap<String, File>,
    set_perms: &dyn Fn(&Path),
) -> Result<bool, WriteError> {
    let mut clean_payload = BTreeMap::new();
    for (path, file) in payload {
        validate_path(path)?;
        clean_payload.insert(clean(path), file);
    }
    let data_link = target.join(DATA_DIR);
    let old_ts = std::fs::read_link(&data_link)
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    // What the old version has that the new one does not.
    let mut to_remove = BTreeSet::new();
    let mut changed = old_ts.is_none();
    if let Some(old) = &old_ts {
        walk(&target.join(old), "", &mut to_remove);
        for path in clean_payload.keys() {
            let mut prefix = String::new();
            for part in path.split('/') {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                to_remove.remove(&prefix);
            }
            let current = std::fs::read(target.join(old).join(path)).ok();
            if current.as_deref() != Some(clean_payload[path].data.as_slice()) {
                changed = true;
            }
        }
        changed |= !to_remove.is_empty();
    }
    if changed {
        let now = crate::clock::unix_ns();
        let ts_name = format!(
            "..{}.{:09}",
            timestamp(now / 1_000_000_000),
            fastrand::u32(..1_000_000_000)
        );
        let ts_dir = target.join(&ts_name);
        std::fs::create_dir(&ts_dir).map_err(io("mkdir", &ts_dir))?;
        std::fs::set_permissions(&ts_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &ts_dir))?;
        for (path, file) in &clean_payload {
            let full = ts_dir.join(path);
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).map_err(io("mkdir", parent))?;
            }
            std::fs::write(&full, &file.data).map_err(io("write", &full))?;
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode & 0o7777))
                .map_err(io("chmod", &full))?;
        }
        set_perms(&ts_dir);
        let tmp_link = target.join(NEW_DATA_DIR);
        let _ = std::fs::remove_file(&tmp_link);
        if let Err(e) = symlink(&ts_name, &tmp_link) {
            let _ = std::fs::remove_dir_all(&ts_dir);
            return Err(io("symlink", &tmp_link)(e));
        }
        // The swap: readers see the old set or the new one, never a mix.
        std::fs::rename(&tmp_link, &data_link).map_err(io("rename", &data_link))?;
    }
    // User-visible names: a link per first path component (recreated if lost).
    for path in clean_payload.keys() {
        let first = path.split('/').next().unwrap_or(path);
        let visible = target.join(first);
        if std::fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new(DATA_DIR).join(first), &visible).map_err(io("symlink", &visible))?;
        }
    }
    if changed {
        for path in to_remove.iter().filter(|p| !p.contains('/')) {
            let visible = target.join(path);
            if let Err(e) = std::fs::remove_file(&visible)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %visible.display(), error = %e, "cannot prune an old user-visible path");
            }
        }
        if let Some(old) = old_ts {
            let _ = std::fs::remove_dir_all(target.join(old));
        }
    }
    Ok(changed)
}

/// `2006_01_02_15_04_05` (UTC) of a Unix time.
fn timestamp(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y_%m_%d_%H_%M_%S").to_string())
        .unwrap_or_else(|_| "1970_01_01_00_00_00".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str)]) -> BTreeMap<String, File> {
        items
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    File {
                        data: v.as_bytes().to_vec(),
                        mode: 0o644,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn paths_are_checked_as_upstream() {
        assert!(validate_path("a/b.txt").is_ok());
        assert_eq!(
            validate_path("/etc/passwd").expect_err("absolute").0,
            "must be relative path: /etc/passwd"
        );
        assert_eq!(
            validate_path("a/../../x").expect_err("up").0,
            "must not contain '..': a/../../x"
        );
        assert_eq!(
            validate_path("..data").expect_err("reserved").0,
            "must not start with '..': ..data"
        );
        assert!(validate_path("").is_err());
    }

    #[test]
    fn a_new_version_replaces_the_old_one_through_the_data_link() {
        let dir = tempfile::tempdir().expect("tmp");
        let t = dir.path();
        let none = |_: &Path| {};
        assert!(write(t, &payload(&[("a", "1"), ("sub/b", "2")]), &none).expect("write"));
        assert_eq!(std::fs::read_to_string(t.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(t.join("sub/b")).expect("b"), "2");
        assert_eq!(
            std::fs::read_link(t.join("a")).expect("link"),
            Path::new("..data/a")
        );
        let first = std::fs::read_link(t.join("..data")).expect("data");
        assert!(!write(t, &payload(&[("a", "1"), ("sub/b", "2")]), &none).expect("same"));
        assert_eq!(
            std::fs::read_link(t.join("..data")).expect("data"),
            first,
            "unchanged"
        );
        assert!(write(t, &payload(&[("a", "3")]), &none).expect("write"));
        assert_eq!(std::fs::read_to_string(t.join("a")).expect("a"), "3");
        assert!(!t.join("sub").exists(), "a removed key disappears");
        assert!(!t.join(&first).exists(), "the old version is gone");
        let entries: Vec<String> = std::fs::read_dir(t)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            entries.len(),
            3,
            "a, ..data and one timestamped dir: {entries:?}"
        );
    }

    #[test]
    fn modes_are_exact_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut p = payload(&[("secret", "s")]);
        p.get_mut("secret").expect("file").mode = 0o400;
        write(dir.path(), &p, &|_| {}).expect("write");
        let mode = std::fs::metadata(dir.path().join("secret"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }
}
