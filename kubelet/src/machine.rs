//! [`Machine`]: what the node has (CPUs, memory, disk, PIDs), read from the
//! kernel. Standalone mode sizes pods with it; API-server mode also reports it
//! in the Node's capacity and pressure conditions.

/// What the node has, read from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// Online CPUs.
    pub cpus: u64,
    /// `MemTotal` in bytes.
    pub memory: u64,
    /// `MemAvailable` in bytes.
    pub memory_available: u64,
    /// Size of the root directory's filesystem in bytes.
    pub disk: u64,
    /// Bytes available to unprivileged users there.
    pub disk_available: u64,
    /// `kernel.pid_max`.
    pub pid_max: u64,
    /// Processes running now.
    pub pids: u64,
}

impl Machine {
    /// Reads the machine (procfs, statvfs). Missing values read as 0.
    pub fn read(root_dir: &std::path::Path) -> Self {
        use procfs::Current as _;
        let meminfo = procfs::Meminfo::current().ok();
        let (disk, disk_available) = statvfs(root_dir).unwrap_or((0, 0));
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            memory: meminfo.as_ref().map_or(0, |m| m.mem_total),
            memory_available: meminfo.as_ref().and_then(|m| m.mem_available).unwrap_or(0),
            disk,
            disk_available,
            pid_max: std::fs::read_to_string("/proc/sys/kernel/pid_max")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(32768),
            pids: procfs::LoadAverage::current().map_or(0, |l| u64::from(l.max)),
        }
    }
}

fn statvfs(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid C string and `st` a buffer of the right type.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Some((
        st.f_blocks.saturating_mul(frsize),
        st.f_bavail.saturating_mul(frsize),
    ))
}
