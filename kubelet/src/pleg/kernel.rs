//! [`KernelView`]: what the kernel's process and cgroup records mean for the
//! pods, apart from reading them (`pleg::ebpf` reads the ring buffer, tests
//! feed records by hand); [`Binder`]: the runtime's word on each container's
//! init, for the relister to give.
//!
//! Design invariant 1: the kernel's record of an exit decides a container's
//! end only for the process the runtime started as its init ([`CgroupMap::bind`]);
//! every other exit, and every cgroup removal, is a hint that CRI decides.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use evlet_ebpf::Exit;

use super::cgroup_map::{CgroupMap, ExitHint};
use super::hints::{ExitRecord, Hints, KernelExit};
use super::process::{Process, Processes};
use super::relist::Inits;
use crate::lock::lock;
use crate::pod::PodUid;

/// How many recent OOM victims are remembered until their group exits.
const OOM_VICTIMS: usize = 1024;

/// What one kernel record means for the pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meaning {
    /// Nothing (noise, a nested cgroup, not a pod's cgroup).
    Nothing,
    /// The record came from a cgroup the map does not know: look it up, or
    /// relist everything.
    Unknown,
    /// The pod may have changed (CLOCK_MONOTONIC ns of the record).
    Pod(PodUid, u64),
    /// A container's (or sandbox's) init exited, or its cgroup went.
    Exit {
        /// The pod.
        uid: PodUid,
        /// The container (or sandbox) ID.
        container: String,
        /// The kernel's report: with a record only for the runtime's init.
        exit: KernelExit,
        /// The process that exited (`None` for a cgroup removal).
        pid: Option<u32>,
    },
}

/// The kernel's records, interpreted against the cgroup map.
#[derive(Debug)]
pub struct KernelView {
    map: Arc<Mutex<CgroupMap>>,
    /// Processes (TGIDs) the OOM killer chose whose exit has not come yet: a
    /// victim's OOM record precedes its process's exit record.
    oom_victims: VecDeque<u32>,
    /// Wall clock minus CLOCK_MONOTONIC, measured once: the kernel's exit
    /// times become wall times consistently.
    wall_offset_ns: i64,
    /// `USER_HZ`: the records' process starts are compared in clock ticks.
    ticks_per_second: u64,
}

impl KernelView {
    /// A view over `map`, with process starts in `ticks_per_second` ticks.
    pub fn new(map: Arc<Mutex<CgroupMap>>, ticks_per_second: u64) -> Self {
        let mono = i64::try_from(evlet_ebpf::monotonic_ns()).unwrap_or(0);
        Self {
            map,
            oom_victims: VecDeque::new(),
            wall_offset_ns: crate::clock::unix_ns() - mono,
            ticks_per_second,
        }
    }

    /// The map the view reads.
    pub fn map(&self) -> &Arc<Mutex<CgroupMap>> {
        &self.map
    }

    /// A cgroup was made at `path`.
    pub fn mkdir(&self, id: u64, path: &str) {
        lock(&self.map).insert(id, path);
    }

    /// A cgroup went at `at_ns`: the end of the container whose own cgroup it
    /// was (its exit, if any, came before); a nested one's says nothing.
    pub fn rmdir(&self, id: u64, at_ns: u64) -> Meaning {
        match lock(&self.map).remove(id) {
            Some(owner) if !owner.nested => match owner.container {
                Some(container) => Meaning::Exit {
                    uid: owner.uid,
                    container,
                    exit: KernelExit {
                        at: at_ns,
                        record: None,
                    },
                    pid: None,
                },
                None => Meaning::Nothing,
            },
            _ => Meaning::Nothing,
        }
    }

    /// A process exec'd in cgroup `id`; false if the cgroup is unknown.
    pub fn exec(&self, id: u64, tgid: u32, pid_ns: bool) -> bool {
        let mut map = lock(&self.map);
        if map.get(id).is_none() {
            return false;
        }
        map.exec(id, tgid, pid_ns);
        true
    }

    /// The OOM killer chose process `tgid`.
    pub fn oom_victim(&mut self, tgid: u32) {
        if self.oom_victims.len() == OOM_VICTIMS {
            self.oom_victims.pop_front();
        }
        self.oom_victims.push_back(tgid);
    }

    /// Was `tgid` an OOM victim? (Forgets it: a TGID is reused later.)
    fn take_oom(&mut self, tgid: u32) -> bool {
        match self.oom_victims.iter().position(|t| *t == tgid) {
            Some(i) => {
                self.oom_victims.remove(i);
                true
            }
            None => false,
        }
    }

    /// What a process's exit means.
    pub fn exit(&mut self, e: &Exit) -> Meaning {
        let id = e.origin.cgroup_id;
        let process = Process::from_kernel(e.origin.tgid, e.start_ns, self.ticks_per_second);
        let hint = {
            let map = lock(&self.map);
            if map.get(id).is_none() {
                return Meaning::Unknown;
            }
            map.exit_hint(id, process)
        };
        tracing::debug!(tgid = e.origin.tgid, cgroup = id, ?hint, "process exit");
        match hint {
            Some(ExitHint::Init {
                uid,
                container,
                exact,
            }) => {
                let oom = self.take_oom(e.origin.tgid);
                Meaning::Exit {
                    uid,
                    container,
                    exit: KernelExit {
                        at: e.origin.ktime_ns,
                        record: exact.then(|| ExitRecord {
                            exit_code: e.runtime_exit_code(),
                            finished_unix_ns: i64::try_from(e.origin.ktime_ns).unwrap_or(i64::MAX)
                                + self.wall_offset_ns,
                            oom,
                            process,
                        }),
                    },
                    pid: Some(e.origin.tgid),
                }
            }
            Some(ExitHint::BeforeInit(uid)) => Meaning::Pod(uid, e.origin.ktime_ns),
            None => Meaning::Nothing,
        }
    }
}

/// Hands a meaning to the dispatcher.
pub fn hint(hints: &Hints, meaning: Meaning) {
    match meaning {
        Meaning::Pod(uid, at) => hints.pod(uid, Some(at)),
        Meaning::Exit {
            uid,
            container,
            exit,
            ..
        } => hints.exit(uid, container, exit),
        Meaning::Nothing | Meaning::Unknown => {}
    }
}

/// The relister's way to give the runtime's init of each running container
/// to the map: the PID it reports, with that process's start.
#[derive(Debug, Clone)]
pub struct Binder {
    map: Arc<Mutex<CgroupMap>>,
    processes: Arc<dyn Processes>,
}

impl Binder {
    /// Binds into `map`, reading process starts from `processes`.
    pub fn new(map: Arc<Mutex<CgroupMap>>, processes: Arc<dyn Processes>) -> Self {
        Self { map, processes }
    }
}

impl Inits for Binder {
    fn wants(&self, container: &str) -> bool {
        lock(&self.map).wants(container)
    }

    fn bind(&self, container: &str, pid: Option<u32>) {
        // A PID whose process is gone (or a zombie) names nothing: its exit
        // has come or is coming, and stays a presumption's.
        let init = pid.and_then(|pid| {
            self.processes
                .live(pid)
                .map(|start_ticks| Process { pid, start_ticks })
        });
        lock(&self.map).bind(container, init);
    }

    fn retain(&self, present: &HashSet<&str>) {
        lock(&self.map).retain_inits(present);
    }
}
