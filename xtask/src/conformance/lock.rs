//! The node lock: `/tmp/evlet-node-<version>.lock`, held (`flock`) by
//! whoever uses that containerd node, so two runs never share it.
//!
//! The lock is taken on a descriptor opened close-on-exec, so the daemons
//! this command starts (a kubelet, containerd) never hold it. A caller that
//! already holds it for us (`flock -o /tmp/evlet-node-1.7.lock cargo xtask
//! conformance`) is found in `/proc/locks`: the holder is one of our
//! ancestors, so we go on instead of waiting for ourselves.

use std::fs::{self, File};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::containerd::Version;

/// A held node lock; released when dropped.
#[derive(Debug)]
pub struct NodeLock {
    /// The open lock file (`None` when an ancestor holds the lock for us).
    _file: Option<File>,
    /// Its path, for messages.
    pub path: PathBuf,
}

/// The lock file of the node of `version`.
pub fn path(version: Version) -> PathBuf {
    PathBuf::from(format!("/tmp/evlet-node-{version}.lock"))
}

/// Takes the lock of the node of `version`, waiting for another holder.
///
/// # Errors
/// If the file cannot be opened or `flock` fails other than by contention.
pub fn acquire(version: Version) -> Result<NodeLock> {
    let path = path(version);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the node lock {}", path.display()))?;
    if try_flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
        return Ok(NodeLock {
            _file: Some(file),
            path,
        });
    }
    let inode = fs::metadata(&path)?.ino();
    let holders = holders(
        &fs::read_to_string("/proc/locks").unwrap_or_default(),
        inode,
    );
    if holders.iter().any(|&pid| is_ancestor(pid)) {
        eprintln!(
            "conformance: {} is held by our caller (pid {holders:?}); going on",
            path.display()
        );
        return Ok(NodeLock { _file: None, path });
    }
    eprintln!(
        "conformance: waiting for {} (held by pid {holders:?}: another run uses the containerd \
         {version} node)",
        path.display()
    );
    if !try_flock(&file, libc::LOCK_EX)? {
        bail!("flock {} failed", path.display());
    }
    Ok(NodeLock {
        _file: Some(file),
        path,
    })
}

fn try_flock(file: &File, op: libc::c_int) -> Result<bool> {
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(err).context("flock"),
        }
    }
}

/// PIDs holding a `FLOCK` on inode `inode`, from `/proc/locks` text.
pub fn holders(locks: &str, inode: u64) -> Vec<i32> {
    locks
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
            if f.get(1) != Some(&"FLOCK") || f.get(2) == Some(&"->") {
                return None;
            }
            let pid: i32 = f.get(4)?.parse().ok()?;
            let ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
            (ino == inode).then_some(pid)
        })
        .collect()
}

/// Whether `pid` is this process or one of its ancestors.
fn is_ancestor(pid: i32) -> bool {
    let mut cur = std::process::id() as i32;
    for _ in 0..64 {
        if cur == pid {
            return true;
        }
        let Some(parent) = fs::read_to_string(format!("/proc/{cur}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
            })
        else {
            return false;
        };
        if parent <= 1 {
            return false;
        }
        cur = parent;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_read_from_proc_locks_by_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 00:1e:1234 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 77 00:1e:1234 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 99 fd:00:999 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 98 00:1e:1234 0 EOF\n";
        assert_eq!(holders(text, 1234), vec![4242]);
        assert_eq!(holders(text, 999), vec![99]);
        assert!(holders(text, 5).is_empty());
    }

    #[test]
    fn this_process_is_its_own_ancestor_and_init_is_not_ours() {
        assert!(is_ancestor(std::process::id() as i32));
        assert!(!is_ancestor(1));
    }
}
