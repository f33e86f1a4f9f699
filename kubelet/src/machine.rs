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

/// The node's memory as the eviction manager and the stats summary see it
/// (upstream reads it from cAdvisor's root container).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMemory {
    /// `MemTotal`.
    pub capacity: u64,
    /// Memory in use: the root memory cgroup's `memory.usage_in_bytes` on
    /// cgroup v1, `MemTotal - MemFree` otherwise.
    pub usage: u64,
    /// `usage` minus inactive file pages (they can be reclaimed at once).
    pub working_set: u64,
}

impl NodeMemory {
    /// `memory.available`: capacity minus the working set.
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.working_set)
    }

    /// Reads it. On cgroup v1 from the root memory cgroup at `v1_root`, as
    /// upstream's cAdvisor does, so that a usage threshold armed on that
    /// cgroup means the same `memory.available`; else from `/proc/meminfo`.
    pub fn read(v1_root: Option<&std::path::Path>) -> Option<Self> {
        use procfs::Current as _;
        let meminfo = procfs::Meminfo::current().ok()?;
        let capacity = meminfo.mem_total;
        if let Some(root) = v1_root {
            let usage = std::fs::read_to_string(root.join("memory.usage_in_bytes"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            let inactive = std::fs::read_to_string(root.join("memory.stat"))
                .ok()
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        l.strip_prefix("total_inactive_file ")
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    })
                });
            if let (Some(usage), Some(inactive)) = (usage, inactive) {
                return Some(Self {
                    capacity,
                    usage,
                    working_set: usage.saturating_sub(inactive),
                });
            }
        }
        let usage = capacity.saturating_sub(meminfo.mem_free);
        Some(Self {
            capacity,
            usage,
            working_set: usage.saturating_sub(meminfo.inactive_file.unwrap_or(0)),
        })
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
