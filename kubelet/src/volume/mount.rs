//! The mount table and the mounts the volume manager makes: tmpfs for
//! memory-backed volumes, bind mounts for subPaths and local volumes, and
//! their removal. Through `rustix` (no hand-written syscalls).

use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// Mount points at or below `dir`, deepest first (the order to unmount them),
/// from `/proc/self/mountinfo`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Is `path` a mount point (in this mount namespace)?
pub fn is_mount_point(path: &Path) -> bool {
    mounts_under(path).iter().any(|p| p == path)
}

/// The filesystem type mounted at `path`, if it is a mount point.
pub fn fs_type(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = unescape(left.split(' ').nth(4)?);
        (Path::new(&point) == path).then(|| right.split(' ').next().map(str::to_owned))?
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\NNN` octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v as char);
            i += 4;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// Mounts a tmpfs of `size` bytes (None: the kernel's default) at `dir`.
///
/// # Errors
/// The mount error.
pub fn tmpfs(dir: &Path, size: Option<u64>) -> std::io::Result<()> {
    let data = std::ffi::CString::new(size.map(|s| format!("size={s}")).unwrap_or_default())
        .map_err(std::io::Error::other)?;
    rustix::mount::mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NODEV | MountFlags::NOSUID,
        Some(data.as_c_str()),
    )
    .map_err(std::io::Error::from)
}

/// Bind-mounts `source` at `target` (for a descriptor's `/proc/self/fd/N`,
/// the file it refers to).
///
/// # Errors
/// The mount error.
pub fn bind(source: &Path, target: &Path) -> std::io::Result<()> {
    rustix::mount::mount_bind(source, target).map_err(std::io::Error::from)
}

/// Unmounts `path`; a busy mount is detached lazily (it goes once unused).
///
/// # Errors
/// The unmount error (a path that is not mounted is not an error).
pub fn unmount(path: &Path) -> std::io::Result<()> {
    match rustix::mount::unmount(path, UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::INVAL) => Ok(()),
        Err(rustix::io::Errno::BUSY) => {
            rustix::mount::unmount(path, UnmountFlags::DETACH).map_err(std::io::Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_mount_points_read_back() {
        assert_eq!(unescape(r"/var/lib/a\040b"), "/var/lib/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn the_root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
        assert!(!mounts_under(Path::new("/")).is_empty());
    }
}
