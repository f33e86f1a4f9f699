//! `subPath` and `subPathExpr`, resolved so that nothing a pod controls can
//! reach outside its volume. The path is checked (relative, no `..`), the
//! missing directories are made one component at a time beneath the volume,
//! and the final path is opened with `openat2(RESOLVE_BENEATH)` from the
//! volume's root: a symlink a container planted that leads out of the volume
//! (absolute, or through `..`) fails the open. What is bind-mounted for the
//! container is that open descriptor (`/proc/self/fd/N`), at
//! `<pod>/volume-subpaths/<volume>/<container>/<index>`, so the path cannot be
//! swapped between the check and the mount (upstream's `doSafeOpen` and
//! `doBindSubPath`, with the kernel doing the walk).

use std::collections::BTreeMap;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::mount;

/// The directory of a pod's subPath bind mounts.
pub const DIR: &str = "volume-subpaths";

/// Why a subPath could not be prepared (CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubPathError {
    /// The subPath is absolute.
    #[error("error SubPath `{0}` must not be an absolute path")]
    Absolute(String),
    /// The subPath has a `..` element.
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    Backsteps(String),
    /// `subPathExpr` names variables the container does not have (or has empty).
    #[error("missing value for {0}")]
    MissingVars(String),
    /// The path could not be made or opened beneath the volume (a symlink out
    /// of it included).
    #[error(
        "failed to prepare subPath for volumeMount {mount:?} of container {container:?}: {detail}"
    )]
    Prepare {
        /// The volume mount's name.
        mount: String,
        /// The container.
        container: String,
        /// What failed, for the log.
        detail: String,
    },
}

/// `subPathExpr` expanded from the container's env: every `$(VAR)` must have
/// a non-empty value (upstream's `ExpandContainerVolumeMounts`).
///
/// # Errors
/// [`SubPathError::MissingVars`] listing the missing names.
pub fn expand(expr: &str, env: &BTreeMap<String, String>) -> Result<String, SubPathError> {
    let mut missing = std::collections::BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("$(") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let name = &after[..end];
        if !(i > 0 && rest.as_bytes()[i - 1] == b'$') && env.get(name).is_none_or(String::is_empty)
        {
            missing.insert(name.to_owned());
        }
        rest = &after[end + 1..];
    }
    if !missing.is_empty() {
        return Err(SubPathError::MissingVars(
            missing.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    Ok(crate::vars::expand(expr, env))
}

/// Checks a subPath as upstream's kubelet does before using it.
///
/// # Errors
/// [`SubPathError::Absolute`] or [`SubPathError::Backsteps`].
pub fn check(sub: &str) -> Result<(), SubPathError> {
    if sub.starts_with('/') {
        return Err(SubPathError::Absolute(sub.to_owned()));
    }
    if sub.split('/').any(|p| p == "..") {
        return Err(SubPathError::Backsteps(sub.to_owned()));
    }
    Ok(())
}

/// One subPath mount to prepare.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The pod's directory (`<root>/pods/<uid>`).
    pub pod_dir: &'a Path,
    /// The volume's name.
    pub volume: &'a str,
    /// The volume's host path.
    pub volume_path: &'a Path,
    /// The container's name.
    pub container: &'a str,
    /// The mount's index in the container's `volumeMounts`.
    pub index: usize,
    /// The mount's name (for errors).
    pub mount: &'a str,
    /// The checked subPath.
    pub sub: &'a str,
}

/// Makes the subPath's missing directories beneath the volume (with the
/// volume root's mode), opens it there, and bind-mounts it at its place under
/// `volume-subpaths`; returns that place, the host path CRI mounts.
///
/// # Errors
/// [`SubPathError::Prepare`] if a component leaves the volume, or a mount fails.
pub fn prepare(r: &Request<'_>) -> Result<PathBuf, SubPathError> {
    let failed = |detail: String| SubPathError::Prepare {
        mount: r.mount.to_owned(),
        container: r.container.to_owned(),
        detail,
    };
    let root = rustix::fs::open(
        r.volume_path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        failed(format!(
            "cannot open volume {}: {e}",
            r.volume_path.display()
        ))
    })?;
    let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let sub = r.sub.trim_matches('/');
    // Missing directories, one component at a time, never leaving the volume.
    if !sub.is_empty() {
        let mode = std::fs::metadata(r.volume_path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .unwrap_or(0o755);
        let mut prefix = String::new();
        for part in sub.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            match rustix::fs::openat2(
                &root,
                prefix.as_str(),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                beneath,
            ) {
                Ok(_) => continue,
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(failed(format!("{prefix}: {e}"))),
            }
            let parent = match prefix.rsplit_once('/') {
                Some((p, _)) => rustix::fs::openat2(
                    &root,
                    p,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    beneath,
                )
                .map_err(|e| failed(format!("{p}: {e}")))?,
                None => rustix::fs::openat(
                    &root,
                    ".",
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| failed(format!(".: {e}")))?,
            };
            match rustix::fs::mkdirat(&parent, part, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(failed(format!("cannot create directory {prefix}: {e}"))),
            }
            let made = rustix::fs::openat2(
                &root,
                prefix.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                beneath,
            )
            .map_err(|e| failed(format!("{prefix}: {e}")))?;
            rustix::fs::fchmod(&made, Mode::from_raw_mode(mode))
                .map_err(|e| failed(format!("chmod {prefix}: {e}")))?;
        }
    }
    let target_path = if sub.is_empty() { "." } else { sub };
    let fd = rustix::fs::openat2(
        &root,
        target_path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        beneath,
    )
    .map_err(|e| match e {
        rustix::io::Errno::XDEV => failed(format!(
            "subpath {sub:?} is not within volume path {}",
            r.volume_path.display()
        )),
        e => failed(format!("error opening subpath {sub}: {e}")),
    })?;
    let is_dir = rustix::fs::fstat(&fd)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .map_err(|e| failed(format!("stat {sub}: {e}")))?;
    let target = r
        .pod_dir
        .join(DIR)
        .join(r.volume)
        .join(r.container)
        .join(r.index.to_string());
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if mount::is_mount_point(&target) {
        // The container ran before: keep the mount if it is the same file,
        // else replace it (what the path names may have changed since).
        let same = std::fs::metadata(&target)
            .ok()
            .zip(std::fs::metadata(&source).ok())
            .is_some_and(|(a, b)| {
                use std::os::unix::fs::MetadataExt as _;
                a.dev() == b.dev() && a.ino() == b.ino()
            });
        if same {
            return Ok(target);
        }
        mount::unmount(&target)
            .map_err(|e| failed(format!("unmount {}: {e}", target.display())))?;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| failed(format!("mkdir {}: {e}", parent.display())))?;
    }
    if is_dir {
        match std::fs::create_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(format!("mkdir {}: {e}", target.display()))),
        }
    } else if std::fs::symlink_metadata(&target).is_err() {
        std::fs::write(&target, b"")
            .map_err(|e| failed(format!("create {}: {e}", target.display())))?;
    }
    mount::bind(&source, &target)
        .map_err(|e| failed(format!("error mounting {}: {e}", target.display())))?;
    Ok(target)
}

/// Unmounts every subPath mount of the pod and removes their directories.
///
/// # Errors
/// The first mount that could not be removed (the directory stays then).
pub fn clean(pod_dir: &Path) -> std::io::Result<()> {
    let dir = pod_dir.join(DIR);
    for point in mount::mounts_under(&dir) {
        mount::unmount(&point)?;
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_volume_are_refused_by_name() {
        assert_eq!(check("a/b"), Ok(()));
        assert_eq!(
            check("/etc").expect_err("absolute").to_string(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            check("a/../../etc").expect_err("up").to_string(),
            "unable to provision SubPath `a/../../etc`: must not contain '..'"
        );
    }

    #[test]
    fn sub_path_expr_needs_every_variable() {
        let env: BTreeMap<String, String> = [
            ("POD".to_owned(), "web-0".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]
        .into();
        assert_eq!(expand("logs/$(POD)", &env), Ok("logs/web-0".into()));
        assert_eq!(
            expand("$(NOPE)/$(EMPTY)/$(POD)", &env),
            Err(SubPathError::MissingVars("EMPTY, NOPE".into()))
        );
        assert_eq!(expand("$$(NOPE)", &env), Ok("$(NOPE)".into()));
    }
}
