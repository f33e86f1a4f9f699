//! Typed events decoded from ring-buffer records.

use evlet_ebpf_common::{CgroupEvent, Header, OomEvent, ProcEvent, flag, kind};

/// Process identity and timing shared by every event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// CLOCK_MONOTONIC nanoseconds when the kernel saw it (see [`monotonic_ns`]).
    pub ktime_ns: u64,
    /// Thread ID (init PID namespace).
    pub pid: u32,
    /// Process ID (init PID namespace).
    pub tgid: u32,
    /// cgroup v2 ID (of the task; for cgroup events, of the directory).
    pub cgroup_id: u64,
    /// The task's cgroup is watched.
    pub watched: bool,
}

/// A process (thread group) or thread exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Who and when.
    pub origin: Origin,
    /// The wait status `wait4` gives the process's parent.
    pub wait_status: u32,
    /// The process was PID 1 of its own PID namespace (a container's init).
    pub ns_init: bool,
    /// The process lived in a PID namespace other than the initial one.
    pub pid_ns: bool,
    /// The process's start (`start_boottime`, ns since boot; 0 for a thread
    /// exit): with the TGID, which process this was.
    pub start_ns: u64,
    /// Command name.
    pub comm: String,
}

impl Exit {
    /// The exit code as container runtimes report it: `128 + signal` for a
    /// process killed by a signal, else its exit status (as containerd's shim).
    pub fn runtime_exit_code(&self) -> i32 {
        match (self.signal(), self.exit_code()) {
            (Some(sig), _) => 128 + sig,
            (None, Some(code)) => code,
            (None, None) => 255,
        }
    }

    /// The exit status if the task exited normally (`WIFEXITED`).
    pub fn exit_code(&self) -> Option<i32> {
        (self.wait_status & 0x7f == 0).then_some(((self.wait_status >> 8) & 0xff) as i32)
    }

    /// The terminating signal if the task was killed (`WIFSIGNALED`).
    pub fn signal(&self) -> Option<i32> {
        let sig = (self.wait_status & 0x7f) as i32;
        (sig != 0 && sig != 0x7f).then_some(sig)
    }
}

/// A cgroup directory appeared or disappeared (cgroup v2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupChange {
    /// When; `origin.cgroup_id` is the directory's ID (= its inode number).
    pub origin: Origin,
    /// Depth below the cgroup2 root.
    pub level: u32,
    /// Path relative to the cgroup2 mount.
    pub path: String,
}

/// An OOM kill, attributed to the victim's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    /// The victim (TID, TGID, cgroup) and the time it exited.
    pub origin: Origin,
    /// When `mark_victim` chose it.
    pub marked_ns: u64,
    /// The victim's command name.
    pub comm: String,
    /// RSS at the kill, if the kernel's tracepoint carries it (6.8+, and some backports).
    pub rss: Option<OomRss>,
    /// The victim's UID.
    pub uid: u32,
    /// The victim's `oom_score_adj`.
    pub oom_score_adj: i32,
}

/// Memory figures of an OOM victim, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomRss {
    /// Total virtual memory.
    pub total_vm_kb: u64,
    /// Anonymous resident memory.
    pub anon_rss_kb: u64,
    /// File-backed resident memory.
    pub file_rss_kb: u64,
    /// Shared-memory resident memory.
    pub shmem_rss_kb: u64,
    /// Page tables.
    pub pgtables_kb: u64,
}

/// A decoded kernel event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The last thread of a process exited.
    Exit(Exit),
    /// A thread (not the last) exited; only if enabled.
    ThreadExit(Exit),
    /// A task exec'd.
    Exec {
        /// Who and when.
        origin: Origin,
        /// The TID before exec (differs from `origin.pid` when a non-leader thread exec'd).
        old_pid: u32,
        /// The process is PID 1 of its own PID namespace (a container's init).
        ns_init: bool,
        /// The process lives in a PID namespace other than the initial one.
        pid_ns: bool,
        /// The process's start (`start_boottime`, ns since boot).
        start_ns: u64,
        /// Command name after exec.
        comm: String,
    },
    /// A task was created; only if enabled.
    Fork {
        /// The parent and when.
        origin: Origin,
        /// The child's TID.
        child_pid: u32,
        /// The child's TGID.
        child_tgid: u32,
        /// The child is a thread.
        thread: bool,
    },
    /// A watched cgroup directory was created.
    CgroupMkdir(CgroupChange),
    /// A watched cgroup directory was removed.
    CgroupRmdir(CgroupChange),
    /// An OOM victim exited.
    OomKill(OomKill),
}

impl Event {
    /// Who and when.
    pub fn origin(&self) -> &Origin {
        match self {
            Event::Exit(e) | Event::ThreadExit(e) => &e.origin,
            Event::Exec { origin, .. } | Event::Fork { origin, .. } => origin,
            Event::CgroupMkdir(c) | Event::CgroupRmdir(c) => &c.origin,
            Event::OomKill(o) => &o.origin,
        }
    }
}

fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a plain `#[repr(C)]` record valid for any bits;
    // read_unaligned copes with the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn origin(h: &Header) -> Origin {
    Origin {
        ktime_ns: h.ktime_ns,
        pid: h.pid,
        tgid: h.tgid,
        cgroup_id: h.cgroup_id,
        watched: h.flags & flag::WATCHED != 0,
    }
}

/// Decodes one ring-buffer record; `None` for a short or unknown record.
pub fn decode(bytes: &[u8]) -> Option<Event> {
    let header: Header = read(bytes)?;
    match header.kind {
        kind::EXIT | kind::THREAD_EXIT | kind::EXEC | kind::FORK => {
            let p: ProcEvent = read(bytes)?;
            let origin = origin(&p.header);
            Some(match header.kind {
                kind::EXIT => Event::Exit(Exit {
                    origin,
                    wait_status: p.aux,
                    ns_init: p.header.flags & flag::NS_INIT != 0,
                    pid_ns: p.header.flags & flag::PID_NS != 0,
                    start_ns: p.start_ns,
                    comm: text(&p.comm),
                }),
                kind::THREAD_EXIT => Event::ThreadExit(Exit {
                    origin,
                    wait_status: p.aux,
                    ns_init: false,
                    pid_ns: false,
                    start_ns: 0,
                    comm: text(&p.comm),
                }),
                kind::EXEC => Event::Exec {
                    origin,
                    old_pid: p.aux,
                    ns_init: p.header.flags & flag::NS_INIT != 0,
                    pid_ns: p.header.flags & flag::PID_NS != 0,
                    start_ns: p.start_ns,
                    comm: text(&p.comm),
                },
                _ => Event::Fork {
                    origin,
                    child_pid: p.aux,
                    child_tgid: p.aux2,
                    thread: p.header.flags & flag::THREAD != 0,
                },
            })
        }
        kind::CGROUP_MKDIR | kind::CGROUP_RMDIR => {
            let c: CgroupEvent = read(bytes)?;
            let len = (c.path_len as usize).min(c.path.len());
            let change = CgroupChange {
                origin: origin(&c.header),
                level: c.level,
                path: text(&c.path[..len]),
            };
            Some(if header.kind == kind::CGROUP_MKDIR {
                Event::CgroupMkdir(change)
            } else {
                Event::CgroupRmdir(change)
            })
        }
        kind::OOM_KILL => {
            let o: OomEvent = read(bytes)?;
            let rss = (o.header.flags & flag::OOM_HAS_RSS != 0).then_some(OomRss {
                total_vm_kb: o.total_vm_kb,
                anon_rss_kb: o.anon_rss_kb,
                file_rss_kb: o.file_rss_kb,
                shmem_rss_kb: o.shmem_rss_kb,
                pgtables_kb: o.pgtables_kb,
            });
            Some(Event::OomKill(OomKill {
                origin: origin(&o.header),
                marked_ns: o.marked_ns,
                comm: text(&o.comm),
                rss,
                uid: o.uid,
                oom_score_adj: o.oom_score_adj,
            }))
        }
        _ => None,
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of [`Origin::ktime_ns`].
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: test-only view of a plain record as bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn exit_records_decode_with_code_and_signal() {
        let mut p = ProcEvent {
            aux: 3 << 8,
            ..Default::default()
        };
        p.header.kind = kind::EXIT;
        p.header.tgid = 42;
        p.comm[..2].copy_from_slice(b"sh");
        let Some(Event::Exit(e)) = decode(&bytes(&p)) else {
            panic!("exit expected")
        };
        assert_eq!(
            (e.origin.tgid, e.exit_code(), e.signal(), e.comm.as_str()),
            (42, Some(3), None, "sh")
        );
        assert_eq!((e.runtime_exit_code(), e.ns_init), (3, false));
        p.aux = 9;
        p.header.flags = flag::NS_INIT;
        let Some(Event::Exit(e)) = decode(&bytes(&p)) else {
            panic!("exit expected")
        };
        assert_eq!((e.exit_code(), e.signal()), (None, Some(9)));
        assert_eq!((e.runtime_exit_code(), e.ns_init), (137, true));
        p.aux = 0x80 | 11;
        let Some(Event::Exit(e)) = decode(&bytes(&p)) else {
            panic!("exit expected")
        };
        assert_eq!(e.runtime_exit_code(), 139, "a core dump keeps its signal");
    }

    #[test]
    fn short_and_unknown_records_are_rejected() {
        assert_eq!(decode(&[0u8; 8]), None);
        let h = Header {
            kind: 99,
            ..Header::default()
        };
        assert_eq!(decode(&bytes(&h)), None);
        let mut p = ProcEvent::default();
        p.header.kind = kind::EXIT;
        assert_eq!(decode(&bytes(&p)[..40]), None);
    }

    #[test]
    fn cgroup_paths_are_cut_at_their_length() {
        let mut c = CgroupEvent::default();
        c.header.kind = kind::CGROUP_MKDIR;
        c.path[..6].copy_from_slice(b"/a/b/c");
        c.path_len = 4;
        let Some(Event::CgroupMkdir(change)) = decode(&bytes(&c)) else {
            panic!("mkdir expected")
        };
        assert_eq!(change.path, "/a/b");
    }
}
