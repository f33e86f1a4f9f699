//! `fsGroup`: a volume's files get the group and group permissions, as
//! upstream's `SetVolumeOwnership`. Every entry below the volume (children
//! first) is chowned to the group (owner kept), and gains `rw` for the group
//! (`r` for read-only volumes); directories also gain setgid and `x`. Bits are
//! only added, never taken away. With `fsGroupChangePolicy: OnRootMismatch`
//! nothing is done when the root already has the group, the bits and setgid.
//! Symlinks are chowned but not followed or chmodded.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

const RW: u32 = 0o660;
const RO: u32 = 0o440;
const EXEC: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Applies `fs_group` to everything at and below `dir`.
pub fn apply(dir: &Path, fs_group: u32, read_only: bool, on_root_mismatch: bool) {
    let mask = if read_only { RO } else { RW };
    if on_root_mismatch
        && let Ok(meta) = std::fs::metadata(dir)
        && meta.is_dir()
        && meta.gid() == fs_group
        && meta.mode() & (mask | EXEC) == (mask | EXEC)
        && meta.mode() & SETGID != 0
    {
        return;
    }
    walk(dir, fs_group, mask);
}

fn walk(path: &Path, gid: u32, mask: u32) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            walk(&entry.path(), gid, mask);
        }
    }
    if let Err(e) = std::os::unix::fs::lchown(path, None, Some(gid)) {
        tracing::warn!(path = %path.display(), error = %e, "fsGroup: cannot change the group");
    }
    if meta.file_type().is_symlink() {
        return;
    }
    let mut mode = meta.mode() & 0o7777 | mask;
    if meta.is_dir() {
        mode |= SETGID | EXEC;
    }
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        tracing::warn!(path = %path.display(), error = %e, "fsGroup: cannot change the mode");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_gain_the_group_and_its_bits_and_directories_setgid() {
        let dir = tempfile::tempdir().expect("tmp");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::write(sub.join("f"), "x").expect("file");
        std::fs::set_permissions(sub.join("f"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        // Our own group, so the test needs no privilege.
        let gid = std::fs::metadata(dir.path()).expect("meta").gid();
        apply(dir.path(), gid, false, false);
        let f = std::fs::metadata(sub.join("f")).expect("meta");
        assert_eq!(f.mode() & 0o7777, 0o660);
        let d = std::fs::metadata(&sub).expect("meta");
        assert_eq!(d.mode() & 0o2000, 0o2000, "setgid on directories");
        assert_eq!(d.mode() & 0o070, 0o070);
        let ro = tempfile::tempdir().expect("tmp");
        std::fs::write(ro.path().join("k"), "v").expect("file");
        std::fs::set_permissions(ro.path().join("k"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        apply(ro.path(), gid, true, false);
        let k = std::fs::metadata(ro.path().join("k")).expect("meta");
        assert_eq!(
            k.mode() & 0o777,
            0o640,
            "read-only volumes get r for the group"
        );
    }
}
