//! Plain data shared by evlet's kernel programs and user space.
//!
//! Every record in the ring buffer starts with a [`Header`]; its `kind` says which
//! record it is ([`ProcEvent`], [`CgroupEvent`] or [`OomEvent`]). All types are
//! `#[repr(C)]` with explicit padding fields, so kernel and user space agree on
//! every byte and no uninitialised padding is copied out of the kernel.
#![no_std]

/// Name of the ring buffer map.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU array counting ring-buffer reservations that failed.
pub const LOST_MAP: &str = "LOST";
/// Name of the hash map of watched cgroup v2 IDs (`u64 -> u32` flags).
pub const WATCHED_MAP: &str = "WATCHED";
/// Name of the one-entry array holding the [`WatchPrefix`].
pub const PREFIX_MAP: &str = "PREFIX";
/// Name of the LRU hash of OOM victims marked but not yet exited (`tid -> OomEvent`).
pub const VICTIMS_MAP: &str = "VICTIMS";

/// Default ring-buffer size in bytes (a power of two, multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 1 << 20;
/// Capacity of [`WATCHED_MAP`].
pub const MAX_WATCHED: u32 = 65_536;
/// Capacity of [`VICTIMS_MAP`].
pub const MAX_VICTIMS: u32 = 1024;
/// Length of the cgroup-path prefix that marks watched cgroups.
pub const PREFIX_LEN: usize = 64;
/// Bytes of cgroup path carried by a [`CgroupEvent`].
pub const PATH_LEN: usize = 256;
/// `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

/// Record kinds.
pub mod kind {
    /// A thread group exited (its last thread): [`ProcEvent`](super::ProcEvent).
    pub const EXIT: u32 = 1;
    /// A thread (not the last of its group) exited; only with [`config::EMIT_THREAD_EXITS`](super::config::EMIT_THREAD_EXITS).
    pub const THREAD_EXIT: u32 = 2;
    /// A task exec'd: [`ProcEvent`](super::ProcEvent).
    pub const EXEC: u32 = 3;
    /// A task was created (fork or thread): [`ProcEvent`](super::ProcEvent); only with
    /// [`config::EMIT_FORKS`](super::config::EMIT_FORKS).
    pub const FORK: u32 = 4;
    /// A cgroup directory was made: [`CgroupEvent`](super::CgroupEvent).
    pub const CGROUP_MKDIR: u32 = 5;
    /// A cgroup directory was removed: [`CgroupEvent`](super::CgroupEvent).
    pub const CGROUP_RMDIR: u32 = 6;
    /// An OOM victim exited: [`OomEvent`](super::OomEvent), attributed to the victim's cgroup.
    pub const OOM_KILL: u32 = 7;
}

/// Bits of [`Header::flags`].
pub mod flag {
    /// The task's cgroup is in the watched set (OOM records are sent either way).
    pub const WATCHED: u32 = 1 << 0;
    /// FORK: the new task is a thread (`CLONE_THREAD`).
    pub const THREAD: u32 = 1 << 1;
    /// EXEC: a non-leader thread exec'd (its old TID is in `ProcEvent::aux`).
    pub const THREAD_EXEC: u32 = 1 << 2;
    /// OOM_KILL: the tracepoint carried RSS fields (kernels with the extended `mark_victim`).
    pub const OOM_HAS_RSS: u32 = 1 << 3;
    /// EXIT, EXEC: the process is PID 1 of a PID namespace other than the
    /// initial one: a container's (or a pod sandbox's) init, certainly.
    pub const NS_INIT: u32 = 1 << 4;
    /// EXIT, EXEC: the process lives in a PID namespace other than the
    /// initial one (a container's process; runc's set-up stages do not).
    pub const PID_NS: u32 = 1 << 5;
}

/// Bits of the `CONFIG_FLAGS` global set at load time.
pub mod config {
    /// Also send [`kind::THREAD_EXIT`](super::kind::THREAD_EXIT) records.
    pub const EMIT_THREAD_EXITS: u32 = 1 << 0;
    /// Also send [`kind::FORK`](super::kind::FORK) records.
    pub const EMIT_FORKS: u32 = 1 << 1;
}

/// Which attach point a hook ended up on (reported by the loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachKind {
    /// `raw_tracepoint/...`
    RawTracepoint,
    /// `tracepoint/<category>/<name>` (needs tracefs)
    Tracepoint,
}

/// Common prefix of every record.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// One of [`kind`].
    pub kind: u32,
    /// Bits of [`flag`].
    pub flags: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds when the kernel saw it.
    pub ktime_ns: u64,
    /// The acting task's TID (init PID namespace).
    pub pid: u32,
    /// The acting task's TGID, i.e. its process ID (init PID namespace).
    pub tgid: u32,
    /// cgroup v2 ID: of the task for process records, of the directory for cgroup records.
    pub cgroup_id: u64,
}

/// Exit, exec and fork records.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// Common fields.
    pub header: Header,
    /// EXIT: the wait status as `wait4` reports it (bits 8–15 exit status, low
    /// 7 bits signal): the group's exit code after a group exit or a fatal
    /// signal, else the leader's `exit_code`.
    /// FORK: the child's TID. EXEC: the old TID.
    pub aux: u32,
    /// FORK: the child's TGID. Otherwise 0.
    pub aux2: u32,
    /// EXIT, EXEC: the thread group leader's `start_boottime` (ns since boot,
    /// suspend included): with the TGID, the process's identity (a reused PID
    /// has another start). `/proc/<pid>/stat` field 22 is this in clock ticks.
    /// Otherwise 0.
    pub start_ns: u64,
    /// `current->comm`.
    pub comm: [u8; COMM_LEN],
}

/// cgroup mkdir/rmdir records (default hierarchy only).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupEvent {
    /// Common fields; `cgroup_id` is the directory's ID (its inode number in cgroup2fs).
    pub header: Header,
    /// Depth below the hierarchy root (the root is 0).
    pub level: u32,
    /// Bytes of `path` used (without NUL).
    pub path_len: u32,
    /// Path relative to the cgroup2 mount, NUL-padded (truncated to [`PATH_LEN`]).
    pub path: [u8; PATH_LEN],
}

/// An OOM kill: recorded at `oom:mark_victim`, sent when the victim exits (where
/// `current` is the victim, so its cgroup is right).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomEvent {
    /// Common fields: the victim's TID, TGID and cgroup; `ktime_ns` of its exit.
    pub header: Header,
    /// When `mark_victim` fired.
    pub marked_ns: u64,
    /// Victim's `total_vm` in KiB (0 if the kernel's tracepoint lacks it).
    pub total_vm_kb: u64,
    /// Anonymous RSS in KiB.
    pub anon_rss_kb: u64,
    /// File RSS in KiB.
    pub file_rss_kb: u64,
    /// Shared-memory RSS in KiB.
    pub shmem_rss_kb: u64,
    /// Page-table KiB.
    pub pgtables_kb: u64,
    /// The victim's UID.
    pub uid: u32,
    /// The victim's `oom_score_adj`.
    pub oom_score_adj: i32,
    /// The victim's command name.
    pub comm: [u8; COMM_LEN],
}

impl Default for CgroupEvent {
    fn default() -> Self {
        Self {
            header: Header::default(),
            level: 0,
            path_len: 0,
            path: [0; PATH_LEN],
        }
    }
}

impl Default for OomEvent {
    fn default() -> Self {
        Self {
            header: Header::default(),
            marked_ns: 0,
            total_vm_kb: 0,
            anon_rss_kb: 0,
            file_rss_kb: 0,
            shmem_rss_kb: 0,
            pgtables_kb: 0,
            uid: 0,
            oom_score_adj: 0,
            comm: [0; COMM_LEN],
        }
    }
}

/// cgroup paths (relative to the cgroup2 mount) starting with `bytes[..len]` are
/// watched from their mkdir on. `len == 0`: none are.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchPrefix {
    /// Bytes of `bytes` used.
    pub len: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The prefix, e.g. `/kubepods/`.
    pub bytes: [u8; PREFIX_LEN],
}

impl Default for WatchPrefix {
    fn default() -> Self {
        Self {
            len: 0,
            _pad: 0,
            bytes: [0; PREFIX_LEN],
        }
    }
}

// No implicit padding: sizes are the sums of the fields.
const _: () = assert!(core::mem::size_of::<Header>() == 32);
const _: () = assert!(core::mem::size_of::<ProcEvent>() == 32 + 8 + 8 + COMM_LEN);
const _: () = assert!(core::mem::size_of::<CgroupEvent>() == 32 + 8 + PATH_LEN);
const _: () = assert!(core::mem::size_of::<OomEvent>() == 32 + 6 * 8 + 8 + COMM_LEN);
const _: () = assert!(core::mem::size_of::<WatchPrefix>() == 8 + PREFIX_LEN);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are `#[repr(C)]` plain integers/arrays with no padding (asserted above),
    // so every bit pattern is valid.
    unsafe impl aya::Pod for super::Header {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CgroupEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::OomEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::WatchPrefix {}
}
