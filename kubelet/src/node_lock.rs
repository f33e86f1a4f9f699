//! One agent per node: an exclusive `flock` on a file under the root dir,
//! taken before the agent touches the runtime (upstream's `--lock-file`).
//!
//! The holder writes its PID into the file, so a second agent can say who
//! holds it. With `--exit-on-lock-contention` the holder watches the file and
//! exits when another process opens it, as upstream does to hand a node over
//! to a new kubelet.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use notify::Watcher as _;
use tokio_util::sync::CancellationToken;

/// Why the node lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another agent holds the lock file {path} (pid {holder}): only one agent may run per node"
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The PID the holder wrote, or `unknown`.
        holder: String,
    },
    /// The file could not be opened, locked or written.
    #[error("unable to acquire file lock on {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process exits).
#[derive(Debug)]
pub struct NodeLock {
    path: PathBuf,
    // Holds the flock for as long as it lives.
    _file: File,
}

impl NodeLock {
    /// Takes the lock on `path` (created if missing) without waiting.
    pub fn acquire(path: &Path) -> Result<Self, LockError> {
        Self::take(path, false)
    }

    /// Takes the lock on `path`, waiting while another agent holds it: the
    /// newcomer's side of a hand-over (`--exit-on-lock-contention`, where the
    /// holder exits when it sees this open the file).
    pub fn acquire_waiting(path: &Path) -> Result<Self, LockError> {
        Self::take(path, true)
    }

    fn take(path: &Path, wait: bool) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let mode = if wait {
            libc::LOCK_EX
        } else {
            libc::LOCK_EX | libc::LOCK_NB
        };
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(file.as_raw_fd(), mode) };
        if locked != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(err));
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = text.trim();
            return Err(LockError::Held {
                path: path.to_path_buf(),
                holder: if holder.is_empty() {
                    "unknown".into()
                } else {
                    holder.to_owned()
                },
            });
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self {
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Cancels `contended` when another process opens the lock file (upstream's
    /// `--exit-on-lock-contention`). The returned watcher must be kept alive.
    pub fn watch_contention(
        &self,
        contended: CancellationToken,
    ) -> Result<notify::RecommendedWatcher, LockError> {
        let path = self.path.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            use notify::event::{AccessKind, EventKind};
            let opened = match &res {
                Ok(e) => {
                    matches!(e.kind, EventKind::Access(AccessKind::Open(_))) || e.kind.is_remove()
                }
                Err(_) => false,
            };
            if opened {
                contended.cancel();
            }
        })
        .map_err(|e| LockError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        watcher
            .watch(&self.path, notify::RecursiveMode::NonRecursive)
            .map_err(|e| LockError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(e),
            })?;
        Ok(watcher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_the_first_is_released_on_drop() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub/evlet.lock");
        let first = NodeLock::acquire(&path).expect("first");
        let err = NodeLock::acquire(&path).expect_err("second must fail");
        let text = err.to_string();
        assert!(
            text.contains(&format!("(pid {})", std::process::id())),
            "{text}"
        );
        assert!(text.contains("evlet.lock"), "{text}");
        drop(first);
        NodeLock::acquire(&path).expect("free again after drop");
    }

    #[test]
    fn a_waiting_newcomer_gets_the_lock_when_the_holder_lets_go() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("evlet.lock");
        let first = NodeLock::acquire(&path).expect("first");
        let waiter = std::thread::spawn({
            let path = path.clone();
            move || NodeLock::acquire_waiting(&path).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!waiter.is_finished(), "it waits while the lock is held");
        drop(first);
        waiter
            .join()
            .expect("thread")
            .expect("taken after the hand-over");
    }

    #[tokio::test]
    async fn opening_the_lock_file_signals_contention() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("evlet.lock");
        let lock = NodeLock::acquire(&path).expect("lock");
        let contended = CancellationToken::new();
        let _watcher = lock.watch_contention(contended.clone()).expect("watch");
        assert!(!contended.is_cancelled());
        let _ = NodeLock::acquire(&path);
        tokio::time::timeout(std::time::Duration::from_secs(5), contended.cancelled())
            .await
            .expect("contention seen within 5 s");
    }
}
