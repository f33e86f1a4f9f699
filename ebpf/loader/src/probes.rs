//! [`Probes`]: loads the embedded programs, resolves what is kernel-specific,
//! attaches them, and owns the maps user space drives.

use std::path::Path;
use std::sync::Arc;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};
use evlet_ebpf_common::{
    AttachKind, DEFAULT_RING_BYTES, EVENTS_MAP, LOST_MAP, PREFIX_LEN, PREFIX_MAP, WATCHED_MAP,
    WatchPrefix, config,
};

use crate::btf::KernelBtf;
use crate::error::Error;
use crate::reader::EventReader;
use crate::tracefs::{self, Format};
use crate::{cgroup, log::TracingLog};

/// The compiled kernel programs, built by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/evlet-probes"));

/// Which attach points to use for the hot hooks (exit, exec, task creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Raw tracepoints, falling back to classic tracepoints per hook.
    #[default]
    Auto,
    /// Classic tracepoints only (what kernels without raw tracepoints get).
    Classic,
}

/// How to load the probes.
#[derive(Debug, Clone)]
pub struct Config {
    /// Ring-buffer size in bytes: a power of two and a multiple of the page size.
    pub ring_bytes: u32,
    /// cgroup paths (relative to the cgroup2 mount) starting with this prefix are
    /// watched from their mkdir on, in the kernel (no race with fast containers).
    pub watch_prefix: Option<String>,
    /// Also report task creation (fork/clone).
    pub emit_forks: bool,
    /// Also report exits of threads that are not the last of their process.
    pub emit_thread_exits: bool,
    /// Raw or classic tracepoints for the hot hooks.
    pub attach: AttachMode,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ring_bytes: DEFAULT_RING_BYTES,
            watch_prefix: None,
            emit_forks: false,
            emit_thread_exits: false,
            attach: AttachMode::Auto,
        }
    }
}

/// A hook and where it ended up attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// The tracepoint (`sched_process_exit`, ...).
    pub tracepoint: &'static str,
    /// Raw or classic.
    pub kind: AttachKind,
}

/// Loaded and attached probes. Dropping this detaches and unloads everything.
pub struct Probes {
    /// Owns programs and links; dropping it detaches.
    ebpf: Ebpf,
    watched: HashMap<MapData, u64, u32>,
    lost: Arc<PerCpuArray<MapData, u64>>,
    events: Option<RingBuf<MapData>>,
    /// Kernel ID of the ring buffer, to open it again after a reader died.
    events_id: u32,
    hooks: Vec<Hook>,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

/// Raises `RLIMIT_MEMLOCK`: kernels before 5.11 charge BPF maps against it.
///
/// Without `CAP_SYS_RESOURCE` only the soft limit can rise, up to the hard one;
/// newer kernels charge the memory cgroup instead, so a low limit is only worth
/// a warning.
fn raise_memlock() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to an rlimit for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0
        && limit.rlim_cur == libc::RLIM_INFINITY
    {
        return;
    }
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } == 0 {
        return;
    }
    let err = std::io::Error::last_os_error();
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above; raising the soft limit to the hard one needs no privilege.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    if limit.rlim_max != libc::RLIM_INFINITY {
        tracing::debug!(%err, hard_limit = limit.rlim_max, "RLIMIT_MEMLOCK stays limited; map creation may fail on kernels < 5.11");
    }
}

/// Kernel-specific numbers patched into the object before load.
struct Offsets {
    globals: Vec<(&'static str, u32)>,
}

impl Offsets {
    fn resolve(tracefs: &Path) -> Result<Self, Error> {
        let btf = KernelBtf::load()?;
        let mut globals = vec![
            (
                "TASK_EXIT_CODE_OFF",
                btf.member_offset("task_struct", "exit_code")?,
            ),
            (
                "TASK_SIGNAL_OFF",
                btf.member_offset("task_struct", "signal")?,
            ),
            ("TASK_PID_OFF", btf.member_offset("task_struct", "pid")?),
            ("TASK_TGID_OFF", btf.member_offset("task_struct", "tgid")?),
            (
                "TASK_START_BOOTTIME_OFF",
                btf.member_offset("task_struct", "start_boottime")?,
            ),
            // atomic_t live: its `counter` is at offset 0 of the atomic_t.
            (
                "SIGNAL_LIVE_OFF",
                btf.member_offset("signal_struct", "live")?,
            ),
            (
                "SIGNAL_FLAGS_OFF",
                btf.member_offset("signal_struct", "flags")?,
            ),
            (
                "SIGNAL_GROUP_EXIT_CODE_OFF",
                btf.member_offset("signal_struct", "group_exit_code")?,
            ),
            (
                "TASK_GROUP_LEADER_OFF",
                btf.member_offset("task_struct", "group_leader")?,
            ),
            (
                "TASK_THREAD_PID_OFF",
                btf.member_offset("task_struct", "thread_pid")?,
            ),
            ("PID_LEVEL_OFF", btf.member_offset("pid", "level")?),
            ("PID_NUMBERS_OFF", btf.member_offset("pid", "numbers")?),
            ("UPID_NR_OFF", btf.member_offset("upid", "nr")?),
            ("UPID_SIZE", btf.struct_size("upid")?),
        ];
        let exec = Format::read(tracefs, "sched", "sched_process_exec")?;
        globals.push(("EXEC_OLD_PID_OFF", exec.require("old_pid")?));
        let newtask = Format::read(tracefs, "task", "task_newtask")?;
        globals.push(("NEWTASK_PID_OFF", newtask.require("pid")?));
        globals.push(("NEWTASK_FLAGS_OFF", newtask.require("clone_flags")?));
        let mkdir = Format::read(tracefs, "cgroup", "cgroup_mkdir")?;
        let rmdir = Format::read(tracefs, "cgroup", "cgroup_rmdir")?;
        for field in ["root", "level", "id", "path"] {
            if mkdir.get(field) != rmdir.get(field) {
                return Err(Error::TracepointField {
                    tracepoint: "cgroup/cgroup_rmdir (differs from cgroup_mkdir)".into(),
                    field: "path",
                    path: rmdir.path.clone(),
                });
            }
        }
        globals.push(("CG_ROOT_OFF", mkdir.require("root")?));
        globals.push(("CG_LEVEL_OFF", mkdir.require("level")?));
        globals.push(("CG_ID_OFF", mkdir.require("id")?));
        globals.push(("CG_PATH_OFF", mkdir.require("path")?));
        let victim = Format::read(tracefs, "oom", "mark_victim")?;
        globals.push(("MV_PID_OFF", victim.require("pid")?));
        for (global, field) in [
            ("MV_COMM_OFF", "comm"),
            ("MV_TOTAL_VM_OFF", "total_vm"),
            ("MV_ANON_RSS_OFF", "anon_rss"),
            ("MV_FILE_RSS_OFF", "file_rss"),
            ("MV_SHMEM_RSS_OFF", "shmem_rss"),
            ("MV_UID_OFF", "uid"),
            ("MV_PGTABLES_OFF", "pgtables"),
            ("MV_OOM_SCORE_ADJ_OFF", "oom_score_adj"),
        ] {
            globals.push((global, victim.optional(field)));
        }
        Ok(Self { globals })
    }
}

impl Probes {
    /// Loads and attaches the probes.
    ///
    /// # Errors
    /// Any [`Error`]: no BTF, no tracefs, a missing tracepoint field, a verifier
    /// refusal (the message carries the verifier log), or an attach failure.
    pub fn load(config: &Config) -> Result<Self, Error> {
        // aya would round a wrong size up to a page without a word: refuse it.
        // SAFETY: sysconf has no preconditions.
        let page = u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if !config.ring_bytes.is_power_of_two() || !config.ring_bytes.is_multiple_of(page) {
            return Err(Error::RingSize(config.ring_bytes));
        }
        raise_memlock();
        let tracefs = tracefs::find_or_mount()?;
        let offsets = Offsets::resolve(&tracefs)?;
        let mut flags = 0;
        if config.emit_forks {
            flags |= config::EMIT_FORKS;
        }
        if config.emit_thread_exits {
            flags |= config::EMIT_THREAD_EXITS;
        }
        let mut loader = EbpfLoader::new();
        // The programs carry no CO-RE relocations (kernel offsets come in as
        // the globals above), so aya needs no parsed kernel BTF: parsing
        // vmlinux's left the agent's heap about 6 MiB larger for good.
        loader.btf(None);
        loader.map_max_entries(EVENTS_MAP, config.ring_bytes);
        loader.override_global("CONFIG_FLAGS", &flags, true);
        for (name, value) in &offsets.globals {
            loader.override_global(name, value, true);
        }
        let mut ebpf = loader.load(OBJECT).map_err(Error::Object)?;

        if let Some(prefix) = &config.watch_prefix {
            set_prefix(&mut ebpf, prefix)?;
        }
        let mut hooks = Vec::new();
        for (raw, classic, category, name) in [
            ("exit_raw", "exit_tp", "sched", "sched_process_exit"),
            ("exec_raw", "exec_tp", "sched", "sched_process_exec"),
            ("newtask_raw", "newtask_tp", "task", "task_newtask"),
        ] {
            hooks.push(attach_hot(
                &mut ebpf,
                config.attach,
                raw,
                classic,
                category,
                name,
            )?);
        }
        for (program, category, name) in [
            ("cgroup_mkdir_tp", "cgroup", "cgroup_mkdir"),
            ("cgroup_rmdir_tp", "cgroup", "cgroup_rmdir"),
            ("mark_victim_tp", "oom", "mark_victim"),
        ] {
            attach_classic(&mut ebpf, program, category, name)?;
            hooks.push(Hook {
                tracepoint: name,
                kind: AttachKind::Tracepoint,
            });
        }

        let watched = HashMap::try_from(
            ebpf.take_map(WATCHED_MAP)
                .ok_or(Error::MissingMap(WATCHED_MAP))?,
        )
        .map_err(|source| Error::Map {
            map: WATCHED_MAP,
            source,
        })?;
        let lost =
            PerCpuArray::try_from(ebpf.take_map(LOST_MAP).ok_or(Error::MissingMap(LOST_MAP))?)
                .map_err(|source| Error::Map {
                    map: LOST_MAP,
                    source,
                })?;
        let events_map = ebpf
            .take_map(EVENTS_MAP)
            .ok_or(Error::MissingMap(EVENTS_MAP))?;
        let events_id = match &events_map {
            aya::maps::Map::RingBuf(data) => {
                data.info().map(|i| i.id()).map_err(|source| Error::Map {
                    map: EVENTS_MAP,
                    source,
                })?
            }
            _ => 0,
        };
        let events = RingBuf::try_from(events_map).map_err(|source| Error::Map {
            map: EVENTS_MAP,
            source,
        })?;
        tracing::info!(
            ?hooks,
            ring_bytes = config.ring_bytes,
            "eBPF probes attached"
        );
        Ok(Self {
            ebpf,
            watched,
            lost: Arc::new(lost),
            events: Some(events),
            events_id,
            hooks,
        })
    }

    /// Where each hook is attached.
    pub fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// Takes the event reader (once). Needs a tokio runtime with IO enabled.
    ///
    /// # Errors
    /// If the ring buffer cannot be registered with the runtime.
    pub fn take_events(&mut self) -> Option<std::io::Result<EventReader>> {
        let ring = self.events.take()?;
        Some(EventReader::new(ring, Arc::clone(&self.lost)))
    }

    /// Opens the ring buffer again (a new reader after the previous one was
    /// dropped, e.g. its task died). Records produced meanwhile are still there,
    /// unless the buffer filled up (then the loss counter says so).
    ///
    /// # Errors
    /// If the map cannot be opened or registered with the runtime.
    pub fn reopen_events(&self) -> Result<EventReader, Error> {
        let data = MapData::from_id(self.events_id).map_err(|source| Error::Map {
            map: EVENTS_MAP,
            source,
        })?;
        let ring =
            RingBuf::try_from(aya::maps::Map::RingBuf(data)).map_err(|source| Error::Map {
                map: EVENTS_MAP,
                source,
            })?;
        EventReader::new(ring, Arc::clone(&self.lost)).map_err(|e| Error::io(EVENTS_MAP, e))
    }

    /// Starts forwarding the programs' `aya-log` records to `tracing`.
    ///
    /// # Errors
    /// If the log map is missing or cannot be registered with the runtime.
    pub fn spawn_log_forwarder(&mut self) -> Result<tokio::task::JoinHandle<()>, Error> {
        let logger = aya_log::EbpfLogger::init_with_logger(&mut self.ebpf, TracingLog)
            .map_err(|e| Error::Btf(format!("aya-log: {e}")))?;
        // SAFETY: the logger owns its ring buffer's fd, which stays open and the
        // same for as long as the AsyncFd (its owner) lives.
        let mut fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        }
        .map_err(|e| Error::io("AYA_LOGS", e.into()))?;
        Ok(tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    return;
                };
                let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    guard.get_inner_mut().flush()
                }));
                if flushed.is_err() {
                    tracing::warn!("dropped a malformed eBPF log record");
                }
                guard.clear_ready();
            }
        }))
    }

    /// Ring-buffer reservations that failed (events lost), summed over CPUs.
    ///
    /// # Errors
    /// If the counter map cannot be read.
    pub fn lost(&self) -> Result<u64, Error> {
        crate::reader::read_lost(&self.lost)
    }

    /// Adds a cgroup ID to the watched set.
    ///
    /// # Errors
    /// If the map is full.
    pub fn watch(&mut self, cgroup_id: u64) -> Result<(), Error> {
        self.watched
            .insert(cgroup_id, 1, 0)
            .map_err(|source| Error::Map {
                map: WATCHED_MAP,
                source,
            })
    }

    /// Removes a cgroup ID from the watched set (absent is fine).
    pub fn unwatch(&mut self, cgroup_id: u64) {
        let _ = self.watched.remove(&cgroup_id);
    }

    /// Is this cgroup ID watched?
    pub fn is_watched(&self, cgroup_id: u64) -> bool {
        self.watched.get(&cgroup_id, 0).is_ok()
    }

    /// Watches `dir` (relative to the cgroup2 mount) and every cgroup below it,
    /// e.g. at start for pods that already run. Returns how many were added.
    ///
    /// # Errors
    /// If no cgroup2 is mounted or the map is full.
    pub fn watch_tree(&mut self, dir: &str) -> Result<usize, Error> {
        let mount = cgroup::unified_mount()?
            .ok_or_else(|| Error::io("cgroup2", std::io::ErrorKind::NotFound.into()))?;
        let root = mount.join(dir.trim_start_matches('/'));
        let found = cgroup::walk(&root);
        for (_, id) in &found {
            self.watch(*id)?;
        }
        Ok(found.len())
    }
}

fn set_prefix(ebpf: &mut Ebpf, prefix: &str) -> Result<(), Error> {
    if prefix.len() > PREFIX_LEN {
        return Err(Error::PrefixTooLong {
            prefix: prefix.to_owned(),
            max: PREFIX_LEN,
        });
    }
    let mut value = WatchPrefix {
        len: prefix.len() as u32,
        ..WatchPrefix::default()
    };
    value.bytes[..prefix.len()].copy_from_slice(prefix.as_bytes());
    let map = ebpf
        .map_mut(PREFIX_MAP)
        .ok_or(Error::MissingMap(PREFIX_MAP))?;
    let mut array: Array<_, WatchPrefix> = Array::try_from(map).map_err(|source| Error::Map {
        map: PREFIX_MAP,
        source,
    })?;
    array.set(0, value, 0).map_err(|source| Error::Map {
        map: PREFIX_MAP,
        source,
    })
}

fn attach_classic(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    name: &'static str,
) -> Result<(), Error> {
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(Error::MissingProgram(program))?
        .try_into()
        .map_err(|source| Error::Program { program, source })?;
    prog.load()
        .map_err(|source| Error::Program { program, source })?;
    prog.attach(category, name)
        .map_err(|source| Error::Attach {
            program,
            hook: name,
            source,
        })?;
    Ok(())
}

fn attach_raw(ebpf: &mut Ebpf, program: &'static str, name: &'static str) -> Result<(), Error> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(program)
        .ok_or(Error::MissingProgram(program))?
        .try_into()
        .map_err(|source| Error::Program { program, source })?;
    prog.load()
        .map_err(|source| Error::Program { program, source })?;
    prog.attach(name).map_err(|source| Error::Attach {
        program,
        hook: name,
        source,
    })?;
    Ok(())
}

fn attach_hot(
    ebpf: &mut Ebpf,
    mode: AttachMode,
    raw: &'static str,
    classic: &'static str,
    category: &str,
    name: &'static str,
) -> Result<Hook, Error> {
    if mode == AttachMode::Auto {
        match attach_raw(ebpf, raw, name) {
            Ok(()) => {
                return Ok(Hook {
                    tracepoint: name,
                    kind: AttachKind::RawTracepoint,
                });
            }
            Err(err) => {
                tracing::warn!(%err, "raw tracepoint {name} unavailable; using the classic tracepoint")
            }
        }
    }
    attach_classic(ebpf, classic, category, name)?;
    Ok(Hook {
        tracepoint: name,
        kind: AttachKind::Tracepoint,
    })
}
