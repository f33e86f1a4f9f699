//! The kernel telling the eviction manager that memory changed, so it
//! evaluates at once instead of at its next 10 s pass (the hint + safety
//! pattern of the PLEG: the timer stays as the safety net).
//!
//! - cgroup v1: a memory threshold on the root memory cgroup
//!   (`cgroup.event_control` with an eventfd on `memory.usage_in_bytes`, the
//!   mechanism of upstream's `kernelMemcgNotification`). The kernel checks it
//!   as pages are charged anywhere below the root and signals the eventfd when
//!   usage crosses the threshold, either way.
//! - every kernel with PSI: a trigger on `/proc/pressure/memory`, which fires
//!   when tasks stall on memory; on pure cgroup v2 it is the only kernel
//!   signal (v2 has no usage thresholds).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A usage threshold on a v1 memory cgroup; dropping it removes it.
#[derive(Debug)]
pub struct MemcgThreshold {
    event: AsyncFd<OwnedFd>,
    /// Kept open: the kernel's event holds this file.
    _usage: File,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative return is a new fd we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl MemcgThreshold {
    /// Arms a threshold at `bytes` of `memory.usage_in_bytes` of the v1 memory
    /// cgroup at `cgroup`.
    ///
    /// # Errors
    /// The failing file or syscall's error (no v1 memory cgroup there, or the
    /// kernel refused the event).
    pub fn arm(cgroup: &Path, bytes: u64) -> io::Result<Self> {
        let usage = File::open(cgroup.join("memory.usage_in_bytes"))?;
        let event = eventfd()?;
        std::fs::write(
            cgroup.join("cgroup.event_control"),
            format!("{} {} {bytes}", event.as_raw_fd(), usage.as_raw_fd()),
        )?;
        Ok(Self {
            // SAFETY: `event` is an open eventfd owned by the AsyncFd from now on;
            // nothing closes or replaces it while the AsyncFd lives.
            event: unsafe { AsyncFd::register_with_interest(event, Interest::READABLE) }
                .map_err(io::Error::from)?,
            _usage: usage,
        })
    }

    /// Waits until usage crossed the threshold.
    ///
    /// # Cancel safety
    /// Cancel-safe: a crossing not yet read stays in the eventfd.
    pub async fn crossed(&self) -> io::Result<()> {
        loop {
            let mut guard = self.event.readable().await?;
            let read = guard.try_io(|fd| {
                let mut buf = [0_u8; 8];
                // SAFETY: `buf` is 8 writable bytes, the size of an eventfd counter.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

/// A PSI trigger; dropping it removes it.
#[derive(Debug)]
pub struct PsiTrigger {
    file: AsyncFd<File>,
}

impl PsiTrigger {
    /// Arms `trigger` (`some 150000 2000000`) on the pressure file at `path`.
    ///
    /// # Errors
    /// The open or write error (no PSI in this kernel, or a trigger it refuses).
    pub fn arm(path: &Path, trigger: &str) -> io::Result<Self> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        file.write_all(format!("{trigger}\0").as_bytes())?;
        Ok(Self {
            // SAFETY: `file` is open and owned by the AsyncFd from now on;
            // nothing closes or replaces its descriptor while the AsyncFd lives.
            file: unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }
                .map_err(io::Error::from)?,
        })
    }

    /// Waits for the next stall event.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn fired(&self) -> io::Result<()> {
        let mut guard = self.file.ready(Interest::PRIORITY).await?;
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_v1_root_threshold_fires_when_usage_crosses_it() {
        let Some(crate::cgroups::MemoryHierarchy::V1(root)) = crate::cgroups::memory_hierarchy()
        else {
            return;
        };
        if !nix_is_root() {
            // A privileged test that cannot run fails in CI instead of skipping.
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "needs root to arm a memory cgroup threshold"
            );
            return;
        }
        let usage: u64 = std::fs::read_to_string(root.join("memory.usage_in_bytes"))
            .expect("usage")
            .trim()
            .parse()
            .expect("number");
        // 64 MiB above today's usage; then allocate and touch 128 MiB.
        let t = MemcgThreshold::arm(&root, usage + (64 << 20)).expect("armed");
        let hog = std::thread::spawn(|| {
            let mut v = vec![0_u8; 128 << 20];
            for i in (0..v.len()).step_by(4096) {
                v[i] = 1;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            std::hint::black_box(v);
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), t.crossed())
            .await
            .expect("the kernel signalled the crossing within 5 s")
            .expect("read");
        hog.join().expect("hog");
    }

    fn nix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
