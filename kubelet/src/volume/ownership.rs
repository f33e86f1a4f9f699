//! `fsGroup`: a volume's files get the group and group permissions, as
//! upstream's `SetVolumeOwnership` (`pkg/volume/volume_linux.go`). Every entry
//! below the volume (children first) is chowned to the group (owner kept),
//! and gains `rw` for the group (`r` for read-only volumes); directories also
//! gain setgid and `x`. Bits are only added, never taken away. With
//! `fsGroupChangePolicy: OnRootMismatch` nothing is done when the root
//! already has the group, the bits and setgid. Symlinks are chowned but not
//! followed or chmodded.
//!
//! A running pod can write into the volume while the walk runs, so nothing
//! here goes by path. The walk starts from a descriptor of the volume's root
//! and opens each entry relative to its parent's descriptor with `openat2`
//! (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_BENEATH`, `O_PATH |
//! O_NOFOLLOW`): a symlink is opened as the link itself and never followed,
//! an entry on another mount is skipped. Directories are then reopened
//! through their own descriptor (`"."`) and changed with `fchown`/`fchmod`;
//! other entries are changed through their `O_PATH` descriptor
//! (`fchownat(AT_EMPTY_PATH)`, and `chmod` of `/proc/self/fd/N`, which names
//! the opened inode, not a path a pod can swap). Swapping an entry for a
//! symlink between the listing and the change at worst changes the symlink.
//!
//! Upstream changes ownership when a volume is set up (mounted), not on every
//! sync: the callers run this at set-up only (an emptyDir once, when it is
//! made; a projected volume's new payload directory before it is published; a
//! local volume when it is bind-mounted).

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

const RW: u32 = 0o660;
const RO: u32 = 0o440;
const EXEC: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Directory levels the walk descends at most: each holds one descriptor
/// open. Upstream's path-based walk stops at `PATH_MAX` (4096 bytes, some
/// 2000 levels of one-letter names); 256 levels keep the agent's descriptors
/// for its other work.
pub const MAX_DEPTH: usize = 256;

/// Why `fsGroup` could not be applied to a volume at all.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// The volume's root could not be opened as a directory (without
    /// following a symlink).
    #[error("fsGroup: cannot open volume directory {path}: {source}")]
    Root {
        /// The volume's root.
        path: PathBuf,
        /// The `open` error.
        #[source]
        source: std::io::Error,
    },
    /// The group is not a valid group ID (`-1` means "no change" to chown).
    #[error("fsGroup: {gid} is not a valid group ID")]
    Group {
        /// The group.
        gid: u32,
    },
}

/// What a walk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    /// Entries changed (the root included).
    pub changed: u64,
    /// Entries left alone: on another mount, deeper than [`MAX_DEPTH`], or
    /// gone before they could be opened.
    pub skipped: u64,
    /// Changes the kernel refused (logged, as upstream logs and goes on).
    pub failed: u64,
    /// `OnRootMismatch` found the root as wanted: nothing was walked.
    pub root_matched: bool,
}

/// Applies `fs_group` to everything at and below `dir`, never following a
/// symlink and never leaving `dir`'s mount.
///
/// # Errors
/// [`OwnershipError`] when `dir` cannot be opened as a directory; a change
/// refused for one entry is logged and counted in [`Walked::failed`].
pub fn apply(
    dir: &Path,
    fs_group: u32,
    read_only: bool,
    on_root_mismatch: bool,
) -> Result<Walked, OwnershipError> {
    if fs_group == u32::MAX {
        return Err(OwnershipError::Group { gid: fs_group });
    }
    let root_error = |e: Errno| OwnershipError::Root {
        path: dir.to_owned(),
        source: e.into(),
    };
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(root_error)?;
    let mask = if read_only { RO } else { RW };
    let stat = rustix::fs::fstat(&root).map_err(root_error)?;
    if on_root_mismatch && root_matches(&stat, fs_group, mask) {
        return Ok(Walked {
            root_matched: true,
            ..Walked::default()
        });
    }
    let mut walk = Walk {
        root: dir,
        gid: Gid::from_raw(fs_group),
        mask,
        done: Walked::default(),
    };
    walk.run(root, stat).map_err(root_error)?;
    Ok(walk.done)
}

/// Upstream's `requiresPermissionChange`, negated: the root has the group,
/// the group bits and setgid.
fn root_matches(stat: &Stat, gid: u32, mask: u32) -> bool {
    let want = mask | EXEC;
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
        && stat.st_gid == gid
        && stat.st_mode & want == want
        && stat.st_mode & SETGID != 0
}

/// A directory being listed: its entries are changed before it.
struct Frame {
    /// The directory, opened for reading; also the descriptor it is changed through.
    entries: Dir,
    /// Its mode when it was opened.
    mode: u32,
}

/// What an entry turned out to be once opened.
enum Entry {
    /// A directory, opened for listing.
    Dir(OwnedFd, Stat),
    /// Anything else (a symlink included), as an `O_PATH` descriptor.
    Other(OwnedFd, Stat),
    /// Gone, or on another mount: left alone.
    Skipped,
}

struct Walk<'a> {
    /// The volume's root, for the log.
    root: &'a Path,
    gid: Gid,
    mask: u32,
    done: Walked,
}

impl Walk<'_> {
    /// Walks from the root's descriptor, children first, one descriptor per
    /// level of the directory being listed.
    fn run(&mut self, root: OwnedFd, stat: Stat) -> Result<(), Errno> {
        let mut stack = vec![Frame {
            entries: Dir::new(root)?,
            mode: stat.st_mode,
        }];
        while let Some(top) = stack.last_mut() {
            let entry = match top.entries.read() {
                None => {
                    if let Some(done) = stack.pop() {
                        self.change_dir(&done);
                    }
                    continue;
                }
                Some(Err(e)) => {
                    tracing::warn!(volume = %self.root.display(), error = %e, "fsGroup: cannot list a directory of the volume");
                    self.done.failed += 1;
                    if let Some(done) = stack.pop() {
                        self.change_dir(&done);
                    }
                    continue;
                }
                Some(Ok(entry)) => entry,
            };
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let Ok(parent) = top.entries.fd() else {
                continue;
            };
            match self.open(parent, name) {
                Entry::Dir(fd, stat) if stack.len() < MAX_DEPTH => match Dir::new(fd) {
                    Ok(entries) => stack.push(Frame {
                        entries,
                        mode: stat.st_mode,
                    }),
                    Err(_) => self.done.skipped += 1,
                },
                Entry::Dir(..) => {
                    tracing::warn!(volume = %self.root.display(), depth = MAX_DEPTH, "fsGroup: directories nested this deep are left alone");
                    self.done.skipped += 1;
                }
                Entry::Other(fd, stat) => self.change_other(&fd, &stat),
                Entry::Skipped => self.done.skipped += 1,
            }
        }
        Ok(())
    }

    /// Opens `name` beneath `parent` without following a symlink or
    /// crossing a mount; a directory is reopened for listing through its
    /// own descriptor, so it is the one that was opened.
    fn open(&mut self, parent: std::os::fd::BorrowedFd<'_>, name: &std::ffi::CStr) -> Entry {
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV | ResolveFlags::BENEATH;
        let path = match rustix::fs::openat2(
            parent,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        ) {
            Ok(fd) => fd,
            // Removed since the listing, or another mount (a bind mount the
            // pod's volume has inside it is not this volume's).
            Err(Errno::NOENT | Errno::XDEV) => return Entry::Skipped,
            Err(e) => {
                tracing::warn!(volume = %self.root.display(), entry = ?name, error = %e, "fsGroup: cannot open an entry of the volume");
                self.done.failed += 1;
                return Entry::Skipped;
            }
        };
        let Ok(stat) = rustix::fs::fstat(&path) else {
            return Entry::Skipped;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
            return Entry::Other(path, stat);
        }
        match rustix::fs::openat2(
            &path,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        ) {
            Ok(dir) => Entry::Dir(dir, stat),
            Err(e) => {
                tracing::warn!(volume = %self.root.display(), entry = ?name, error = %e, "fsGroup: cannot open a directory of the volume");
                self.done.failed += 1;
                Entry::Skipped
            }
        }
    }

    /// A directory: the group, the group's bits, `x` and setgid, through the
    /// descriptor it was listed with.
    fn change_dir(&mut self, frame: &Frame) {
        let Ok(fd) = frame.entries.fd() else {
            return;
        };
        let chown = rustix::fs::fchown(fd, None, Some(self.gid));
        let mode = frame.mode & 0o7777 | self.mask | SETGID | EXEC;
        let chmod = rustix::fs::fchmod(fd, Mode::from_raw_mode(mode));
        self.count(chown.and(chmod), "a directory");
    }

    /// A file, device, FIFO, socket or symlink: the group, and (not for a
    /// symlink, whose mode means nothing and whose chmod would reach its
    /// target) the group's bits, through the `O_PATH` descriptor.
    fn change_other(&mut self, fd: &OwnedFd, stat: &Stat) {
        let chown = rustix::fs::chownat(fd, c"", None, Some(self.gid), AtFlags::EMPTY_PATH);
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            self.count(chown, "a symlink");
            return;
        }
        // The mode read before the chown (which clears setuid and setgid),
        // as upstream chmods with the mode it read.
        let mode = stat.st_mode & 0o7777 | self.mask;
        let by_fd = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
        let chmod = rustix::fs::chmodat(
            CWD,
            by_fd.as_str(),
            Mode::from_raw_mode(mode),
            AtFlags::empty(),
        );
        self.count(chown.and(chmod), "a file");
    }

    fn count(&mut self, result: Result<(), Errno>, what: &str) {
        match result {
            Ok(()) => self.done.changed += 1,
            Err(e) => {
                tracing::warn!(volume = %self.root.display(), error = %e, "fsGroup: cannot change {what} of the volume");
                self.done.failed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn files_gain_the_group_and_its_bits_and_directories_setgid() {
        let dir = tempfile::tempdir().expect("tmp");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::write(sub.join("f"), "x").expect("file");
        chmod(&sub.join("f"), 0o600);
        // Our own group, so the test needs no privilege.
        let gid = std::fs::metadata(dir.path()).expect("meta").gid();
        let walked = apply(dir.path(), gid, false, false).expect("walked");
        assert_eq!((walked.changed, walked.failed), (3, 0), "{walked:?}");
        let f = std::fs::metadata(sub.join("f")).expect("meta");
        assert_eq!(f.mode() & 0o7777, 0o660);
        let d = std::fs::metadata(&sub).expect("meta");
        assert_eq!(d.mode() & 0o2000, 0o2000, "setgid on directories");
        assert_eq!(d.mode() & 0o070, 0o070);
        let ro = tempfile::tempdir().expect("tmp");
        std::fs::write(ro.path().join("k"), "v").expect("file");
        chmod(&ro.path().join("k"), 0o600);
        apply(ro.path(), gid, true, false).expect("walked");
        let k = std::fs::metadata(ro.path().join("k")).expect("meta");
        assert_eq!(
            k.mode() & 0o777,
            0o640,
            "read-only volumes get r for the group"
        );
    }

    #[test]
    fn symlinks_in_the_volume_are_never_followed() {
        let outside = tempfile::tempdir().expect("tmp");
        let target_dir = outside.path().join("dir");
        std::fs::create_dir(&target_dir).expect("mkdir");
        let target = target_dir.join("host-file");
        std::fs::write(&target, "x").expect("file");
        chmod(&target, 0o600);
        chmod(&target_dir, 0o700);
        let volume = tempfile::tempdir().expect("tmp");
        std::os::unix::fs::symlink(&target, volume.path().join("to-file")).expect("link");
        std::os::unix::fs::symlink(&target_dir, volume.path().join("to-dir")).expect("link");
        let gid = std::fs::metadata(volume.path()).expect("meta").gid();
        let walked = apply(volume.path(), gid, false, false).expect("walked");
        assert_eq!(walked.changed, 3, "the root and both links: {walked:?}");
        assert_eq!(
            std::fs::metadata(&target).expect("meta").mode() & 0o7777,
            0o600,
            "the target file keeps its mode"
        );
        assert_eq!(
            std::fs::metadata(&target_dir).expect("meta").mode() & 0o7777,
            0o700,
            "the target directory is not walked"
        );
    }

    #[test]
    fn a_symlinked_root_is_refused_and_a_matching_root_is_not_walked() {
        let outside = tempfile::tempdir().expect("tmp");
        let link = tempfile::tempdir().expect("tmp");
        let root = link.path().join("volume");
        std::os::unix::fs::symlink(outside.path(), &root).expect("link");
        let gid = std::fs::metadata(outside.path()).expect("meta").gid();
        assert!(matches!(
            apply(&root, gid, false, false),
            Err(OwnershipError::Root { .. })
        ));
        let volume = tempfile::tempdir().expect("tmp");
        std::fs::write(volume.path().join("f"), "x").expect("file");
        chmod(&volume.path().join("f"), 0o600);
        chmod(volume.path(), 0o2770);
        let walked = apply(volume.path(), gid, false, true).expect("walked");
        assert!(walked.root_matched, "{walked:?}");
        assert_eq!(
            std::fs::metadata(volume.path().join("f"))
                .expect("meta")
                .mode()
                & 0o777,
            0o600,
            "OnRootMismatch leaves the files alone"
        );
    }

    /// Flips `a` and `b` (a real entry and a symlink out of the volume) with
    /// `RENAME_EXCHANGE` until `stop`, so the name is always there and is
    /// now one, now the other.
    fn swapper(
        dir: PathBuf,
        pairs: Vec<(&'static str, &'static str)>,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<u64> {
        std::thread::spawn(move || {
            let mut flips = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (a, b) in &pairs {
                    let _ = rustix::fs::renameat_with(
                        CWD,
                        dir.join(a),
                        CWD,
                        dir.join(b),
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                    flips += 1;
                }
            }
            flips
        })
    }

    #[test]
    fn entries_swapped_for_symlinks_during_the_walk_never_change_their_targets() {
        let host = tempfile::tempdir().expect("tmp");
        let victim = host.path().join("victim");
        let victim_dir = host.path().join("victim-dir");
        std::fs::write(&victim, "x").expect("file");
        std::fs::create_dir(&victim_dir).expect("mkdir");
        std::fs::write(victim_dir.join("inner"), "x").expect("file");
        for (path, mode) in [
            (&victim, 0o600),
            (&victim_dir, 0o700),
            (&victim_dir.join("inner"), 0o600),
        ] {
            chmod(path, mode);
        }
        let volume = tempfile::tempdir().expect("tmp");
        let v = volume.path();
        std::fs::write(v.join("file"), "x").expect("file");
        std::fs::create_dir(v.join("dir")).expect("mkdir");
        std::os::unix::fs::symlink(&victim, v.join("file-link")).expect("link");
        std::os::unix::fs::symlink(&victim_dir, v.join("dir-link")).expect("link");
        let gid = std::fs::metadata(v).expect("meta").gid();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipping = swapper(
            v.to_owned(),
            vec![("file", "file-link"), ("dir", "dir-link")],
            std::sync::Arc::clone(&stop),
        );
        let started = std::time::Instant::now();
        let mut walks = 0;
        while started.elapsed() < std::time::Duration::from_secs(1) {
            let _ = apply(v, gid, false, false);
            walks += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flips = flipping.join().expect("swapper");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").mode() & 0o7777;
        assert_eq!(
            (
                mode(&victim),
                mode(&victim_dir),
                mode(&victim_dir.join("inner"))
            ),
            (0o600, 0o700, 0o600),
            "nothing outside the volume changed in {walks} walks against {flips} swaps"
        );
    }

    #[test]
    fn a_mount_inside_the_volume_is_left_alone() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: mounting a tmpfs inside a volume needs root");
            return;
        }
        let volume = tempfile::tempdir().expect("tmp");
        let inner = volume.path().join("other-mount");
        std::fs::create_dir(&inner).expect("mkdir");
        crate::volume::mount::tmpfs(&inner, Some(1 << 20)).expect("tmpfs");
        std::fs::write(inner.join("f"), "x").expect("file");
        chmod(&inner.join("f"), 0o600);
        let walked = apply(volume.path(), 4321, false, false);
        let f = std::fs::metadata(inner.join("f")).expect("meta");
        crate::volume::mount::unmount(&inner).expect("umount");
        let walked = walked.expect("walked");
        assert_eq!((f.gid(), f.mode() & 0o7777), (0, 0o600), "{walked:?}");
        assert_eq!(walked.skipped, 1, "the mount point is skipped: {walked:?}");
    }
}
