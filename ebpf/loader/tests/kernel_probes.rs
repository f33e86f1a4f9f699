//! The probes on the host kernel, with asserted values. Needs root (run by
//! `cargo xtask test`; in CI a missing privilege fails instead of skipping).
//!
//! Every test loads its own probes (own maps) and works in its own cgroup tree
//! `<cgroup2>/evlet-ktest-<pid>-<n>`, removed afterwards. "No event" is asserted
//! with a marker: a later process in a watched cgroup whose exit must arrive
//! first-in-line after anything the earlier one would have produced.

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use evlet_ebpf::{AttachKind, AttachMode, Config, Event, EventReader, Probes, cgroup};
use evlet_testkit::within;

/// The helper binary; `EVLET_PROBE_HELPER` overrides the build path (the VM matrix
/// puts it elsewhere).
fn helper() -> String {
    std::env::var("EVLET_PROBE_HELPER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_evlet-probe-helper").to_owned())
}
static N: AtomicU32 = AtomicU32::new(0);

/// A cgroup tree for one test, removed (after killing what is left in it) on drop.
struct Tree {
    /// cgroup2 mount.
    mount: PathBuf,
    /// Path relative to the mount, e.g. `/evlet-ktest-1-0`.
    rel: String,
    /// v1 memory cgroup (hybrid hosts only), for the OOM test.
    memory_v1: Option<PathBuf>,
}

impl Tree {
    fn new() -> Self {
        let mount = cgroup::unified_mount()
            .expect("mountinfo")
            .expect("a cgroup2 mount");
        let rel = format!(
            "/evlet-ktest-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        std::fs::create_dir(mount.join(&rel[1..])).expect("test cgroup root");
        Self {
            mount,
            rel,
            memory_v1: None,
        }
    }

    /// The prefix that makes the kernel watch children of this tree.
    fn prefix(&self) -> String {
        format!("{}/", self.rel)
    }

    fn path(&self, child: &str) -> PathBuf {
        self.mount.join(&self.rel[1..]).join(child)
    }

    fn mkdir(&self, child: &str) -> (PathBuf, u64) {
        let path = self.path(child);
        std::fs::create_dir(&path).expect("mkdir cgroup");
        let id = std::fs::metadata(&path).expect("stat cgroup").ino();
        (path, id)
    }

    fn pure_v2(&self) -> bool {
        self.mount == Path::new("/sys/fs/cgroup")
    }

    /// A cgroup with a memory limit that processes started in `v2` also join.
    fn limit_memory(&mut self, v2: &Path, bytes: u64) -> Vec<PathBuf> {
        if self.pure_v2() {
            let root = self.mount.join(&self.rel[1..]);
            std::fs::write(root.join("cgroup.subtree_control"), "+memory")
                .expect("enable memory controller");
            std::fs::write(v2.join("memory.max"), bytes.to_string()).expect("memory.max");
            let _ = std::fs::write(v2.join("memory.swap.max"), "0");
            return vec![v2.to_path_buf()];
        }
        let v1 = PathBuf::from("/sys/fs/cgroup/memory").join(&self.rel[1..]);
        std::fs::create_dir_all(&v1).expect("v1 memory cgroup");
        std::fs::write(v1.join("memory.limit_in_bytes"), bytes.to_string())
            .expect("memory.limit_in_bytes");
        self.memory_v1 = Some(v1.clone());
        vec![v2.to_path_buf(), v1]
    }
}

fn kill_and_remove(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        {
            kill_and_remove(&e.path());
        }
    }
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            break;
        }
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kills only processes this test put in its own cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for Tree {
    fn drop(&mut self) {
        kill_and_remove(&self.mount.join(&self.rel[1..]));
        if let Some(v1) = &self.memory_v1 {
            kill_and_remove(v1);
        }
    }
}

/// Starts the helper with `args` inside `cgroups` (joined before exec).
fn spawn_in(cgroups: &[PathBuf], args: &[&str]) -> Child {
    let procs: Vec<std::ffi::CString> = cgroups
        .iter()
        .map(|c| {
            std::ffi::CString::new(c.join("cgroup.procs").into_os_string().into_encoded_bytes())
                .expect("path")
        })
        .collect();
    let mut cmd = Command::new(helper());
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::null());
    // SAFETY: the closure only makes async-signal-safe syscalls on pre-built buffers.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            Ok(())
        });
    }
    cmd.spawn().expect("helper starts")
}

fn load(tree: &Tree, config: Config) -> Option<(Probes, EventReader)> {
    if !evlet_testkit::require_root("kernel_probes") {
        return None;
    }
    let mut probes = Probes::load(&Config {
        watch_prefix: Some(tree.prefix()),
        ..config
    })
    .expect("probes load");
    let reader = probes
        .take_events()
        .expect("reader")
        .expect("ring buffer registers");
    Some((probes, reader))
}

/// Events until `done` says so (inclusive), within 30 s.
async fn until(
    reader: &mut EventReader,
    what: &str,
    mut done: impl FnMut(&Event) -> bool,
) -> Vec<Event> {
    within(Duration::from_secs(30), what, async {
        let mut seen = Vec::new();
        while let Some(event) = reader.next().await {
            let stop = done(&event);
            seen.push(event);
            if stop {
                return seen;
            }
        }
        panic!("event stream ended");
    })
    .await
}

fn is_exit_of(event: &Event, tgid: u32) -> bool {
    matches!(event, Event::Exit(e) if e.origin.tgid == tgid)
}

/// Runs a marker process in `watched` and returns every event up to its exit.
async fn through_marker(reader: &mut EventReader, watched: &Path) -> Vec<Event> {
    let mut marker = spawn_in(&[watched.to_path_buf()], &["exit", "0"]);
    let pid = marker.id();
    let _ = marker.wait();
    until(reader, "the marker's exit", |e| is_exit_of(e, pid)).await
}

async fn exit_code_is_reported(mode: AttachMode, expect: AttachKind) {
    let tree = Tree::new();
    let Some((probes, mut reader)) = load(
        &tree,
        Config {
            attach: mode,
            ..Config::default()
        },
    ) else {
        return;
    };
    assert!(
        probes
            .hooks()
            .iter()
            .filter(|h| h.tracepoint.starts_with("sched"))
            .all(|h| h.kind == expect)
    );
    let (cg, id) = tree.mkdir("app");
    assert!(
        probes.is_watched(id),
        "the kernel watched the new cgroup from its mkdir"
    );
    let mut child = spawn_in(&[cg], &["exit", "3"]);
    let pid = child.id();
    assert_eq!(child.wait().expect("wait").code(), Some(3));
    let events = until(&mut reader, "the exit event", |e| is_exit_of(e, pid)).await;
    let exits: Vec<_> = events.iter().filter(|e| is_exit_of(e, pid)).collect();
    assert_eq!(exits.len(), 1, "{events:#?}");
    let Event::Exit(exit) = exits[0] else {
        unreachable!()
    };
    assert_eq!(
        (exit.origin.tgid, exit.origin.cgroup_id, exit.exit_code()),
        (pid, id, Some(3))
    );
    assert!(exit.origin.watched);
    let exec_start = events.iter().find_map(|e| match e {
        Event::Exec {
            origin, start_ns, ..
        } if origin.tgid == pid => Some(*start_ns),
        _ => None,
    });
    assert!(
        exec_start.is_some(),
        "the helper's exec was seen too: {events:#?}"
    );
    assert_eq!(
        exec_start,
        Some(exit.start_ns),
        "exec and exit name the same process start"
    );
    let mut boot = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `boot` is a valid out-pointer; CLOCK_BOOTTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut boot) };
    let boot_ns = boot.tv_sec as u64 * 1_000_000_000 + boot.tv_nsec as u64;
    assert!(
        exit.start_ns > 0 && exit.start_ns <= boot_ns && boot_ns - exit.start_ns < 60_000_000_000,
        "the start is the process's start_boottime: {} (now {boot_ns})",
        exit.start_ns
    );
    assert_eq!(reader.lost().expect("lost counter"), 0);
}

#[tokio::test]
async fn watched_exit_with_code_3_gives_one_exit_event_raw() {
    exit_code_is_reported(AttachMode::Auto, AttachKind::RawTracepoint).await;
}

#[tokio::test]
async fn watched_exit_with_code_3_gives_one_exit_event_classic() {
    exit_code_is_reported(AttachMode::Classic, AttachKind::Tracepoint).await;
}

#[tokio::test]
async fn a_thread_exit_is_not_a_process_exit() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, _) = tree.mkdir("threads");
    let mut child = spawn_in(std::slice::from_ref(&cg), &["thread-exit"]);
    let pid = child.id();
    // The helper's second thread has exited once it prints; stdin keeps it alive.
    std::thread::sleep(Duration::from_millis(300));
    let before = through_marker(&mut reader, &cg).await;
    assert!(
        !before.iter().any(|e| is_exit_of(e, pid)),
        "no exit event while the process lives: {before:#?}"
    );
    drop(child.stdin.take());
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    let after = until(&mut reader, "the process exit", |e| is_exit_of(e, pid)).await;
    assert_eq!(after.iter().filter(|e| is_exit_of(e, pid)).count(), 1);
}

#[tokio::test]
async fn a_leader_exiting_first_reports_once_when_the_last_thread_exits() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, id) = tree.mkdir("leader");
    let mut child = spawn_in(&[cg], &["leader-first", "5"]);
    let pid = child.id();
    assert_eq!(child.wait().expect("wait").code(), Some(5));
    let events = until(&mut reader, "the group exit", |e| is_exit_of(e, pid)).await;
    let exits: Vec<_> = events.iter().filter(|e| is_exit_of(e, pid)).collect();
    assert_eq!(exits.len(), 1);
    let Event::Exit(exit) = exits[0] else {
        unreachable!()
    };
    assert_eq!((exit.exit_code(), exit.origin.cgroup_id), (Some(5), id));
    assert_ne!(
        exit.origin.pid, pid,
        "the last thread to exit is not the leader"
    );
}

/// A container's init is PID 1 of its own PID namespace: its exec and its
/// exit say so, and nothing else's do.
#[tokio::test]
async fn a_namespace_init_is_flagged_in_its_exec_and_exit() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, _) = tree.mkdir("pidns");
    let mut child = spawn_in(&[cg], &["pidns-init", "6"]);
    let pid = child.id();
    assert_eq!(child.wait().expect("wait").code(), Some(6));
    let events = until(&mut reader, "the helper's exit", |e| is_exit_of(e, pid)).await;
    let init_exits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Exit(x) if x.ns_init => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(init_exits.len(), 1, "{events:#?}");
    assert_ne!(init_exits[0].origin.tgid, pid, "the child, not the helper");
    assert_eq!(init_exits[0].runtime_exit_code(), 6);
    assert!(
        events.iter().any(
            |e| matches!(e, Event::Exec { origin, ns_init: true, .. } if origin.tgid == init_exits[0].origin.tgid)
        ),
        "the init's exec is flagged: {events:#?}"
    );
    let helper = events.iter().find_map(|e| match e {
        Event::Exit(x) if x.origin.tgid == pid => Some(x),
        _ => None,
    });
    assert_eq!(
        helper.map(|x| (x.ns_init, x.pid_ns)),
        Some((false, false)),
        "the helper lives in the initial PID namespace"
    );
    assert!(
        init_exits[0].pid_ns,
        "the child lives in its own PID namespace"
    );
}

/// Without a group exit the kernels differ: before 5.19 `wait4` gives the
/// leader's status (7 here), since 5.19 (`synchronize_group_exit`) the last
/// thread's (0). The exit record says what `wait4` says, on every kernel.
#[tokio::test]
async fn the_exit_record_has_the_status_wait4_gives_when_threads_end_one_by_one() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, _) = tree.mkdir("status");
    let mut child = spawn_in(&[cg], &["leader-status", "7"]);
    let pid = child.id();
    let waited = child.wait().expect("wait").code();
    assert!(matches!(waited, Some(0 | 7)), "{waited:?}");
    let events = until(&mut reader, "the group exit", |e| is_exit_of(e, pid)).await;
    let exit = events.iter().find_map(|e| match e {
        Event::Exit(x) if x.origin.tgid == pid => Some(x),
        _ => None,
    });
    assert_eq!(exit.map(evlet_ebpf::Exit::exit_code), Some(waited));
}

/// A SIGKILL is reported as the signal, 137 as runtimes say.
#[tokio::test]
async fn a_killed_process_reports_its_signal() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, _) = tree.mkdir("killed");
    let mut child = spawn_in(&[cg], &["hog", "1"]);
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(100));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let events = until(&mut reader, "the exit", |e| is_exit_of(e, pid)).await;
    let exit = events.iter().find_map(|e| match e {
        Event::Exit(x) if x.origin.tgid == pid => Some(x),
        _ => None,
    });
    assert_eq!(
        exit.map(|x| (x.signal(), x.runtime_exit_code())),
        Some((Some(9), 137))
    );
}

#[tokio::test]
async fn processes_outside_watched_cgroups_give_no_event() {
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (watched, _) = tree.mkdir("watched");
    // A sibling of the test root: not under the watched prefix.
    let outside = tree.mount.join(format!("{}-outside", &tree.rel[1..]));
    std::fs::create_dir(&outside).expect("outside cgroup");
    let mut child = spawn_in(std::slice::from_ref(&outside), &["exit", "3"]);
    let pid = child.id();
    let _ = child.wait();
    let events = through_marker(&mut reader, &watched).await;
    let _ = std::fs::remove_dir(&outside);
    assert!(
        !events.iter().any(|e| e.origin().tgid == pid),
        "{events:#?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::CgroupMkdir(c) if c.path.ends_with("-outside"))),
        "mkdir outside the prefix is not reported"
    );
}

#[tokio::test]
async fn cgroup_mkdir_and_rmdir_report_the_directory_inode() {
    let tree = Tree::new();
    let Some((probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (path, id) = tree.mkdir("pod1");
    let rel = format!("{}/pod1", tree.rel);
    let events = until(&mut reader, "mkdir event", |e| {
        matches!(e, Event::CgroupMkdir(_))
    })
    .await;
    let Some(Event::CgroupMkdir(mkdir)) = events.last() else {
        unreachable!()
    };
    assert_eq!(
        (mkdir.origin.cgroup_id, mkdir.path.as_str()),
        (id, rel.as_str())
    );
    assert_eq!(mkdir.level as usize, rel.matches('/').count());
    std::fs::remove_dir(&path).expect("rmdir");
    let events = until(&mut reader, "rmdir event", |e| {
        matches!(e, Event::CgroupRmdir(_))
    })
    .await;
    let Some(Event::CgroupRmdir(rmdir)) = events.last() else {
        unreachable!()
    };
    assert_eq!(
        (rmdir.origin.cgroup_id, rmdir.path.as_str()),
        (id, rel.as_str())
    );
    assert!(
        !probes.is_watched(id),
        "rmdir took the cgroup out of the watched set"
    );
}

#[tokio::test]
async fn an_oom_kill_gives_exactly_one_event_for_the_victims_cgroup() {
    let mut tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, id) = tree.mkdir("hog");
    let cgroups = tree.limit_memory(&cg, 32 << 20);
    let mut child = spawn_in(&cgroups, &["hog", "256"]);
    let pid = child.id();
    let status = within(Duration::from_secs(60), "the OOM kill", async {
        tokio::task::spawn_blocking(move || child.wait()).await
    })
    .await
    .expect("join")
    .expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let events = until(&mut reader, "the victim's exit", |e| is_exit_of(e, pid)).await;
    let ooms: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::OomKill(o) => Some(o),
            _ => None,
        })
        .collect();
    assert_eq!(ooms.len(), 1, "{events:#?}");
    let oom = ooms[0];
    assert_eq!((oom.origin.tgid, oom.origin.cgroup_id), (pid, id));
    assert!(oom.origin.watched);
    assert!(oom.marked_ns <= oom.origin.ktime_ns);
    // Every kernel: from `mark_victim` where it has the field, else from the
    // victim's exit (5.10's `mark_victim` carries only the PID).
    assert_eq!(oom.comm, "evlet-probe-hel");
    if let Some(rss) = oom.rss {
        assert!(
            rss.anon_rss_kb > 16 << 10,
            "the victim held most of its 32 MiB limit: {rss:?}"
        );
    }
}

/// Processes in the burst test: 50 000 on the host; `EVLET_PROBE_BURST`
/// sets fewer where processes are slow to make (the emulated kernel matrix),
/// but never so few that their exit records fit the ring buffer unread.
fn burst() -> u32 {
    let n = std::env::var("EVLET_PROBE_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    // One exit record each: 64 bytes with the ring buffer's header.
    let record = std::mem::size_of::<evlet_ebpf_common::ProcEvent>() as u64 + 8;
    assert!(
        u64::from(n) * record > u64::from(evlet_ebpf_common::DEFAULT_RING_BYTES),
        "a burst of {n} fits the ring buffer unread: the test would prove nothing"
    );
    n
}

#[tokio::test]
async fn a_burst_of_short_processes_overfilling_the_ring_loses_nothing_at_the_default_size() {
    let n = burst();
    let tree = Tree::new();
    let Some((_probes, mut reader)) = load(&tree, Config::default()) else {
        return;
    };
    let (cg, id) = tree.mkdir("burst");
    let mut child = spawn_in(&[cg], &["burst", &n.to_string()]);
    let pid = child.id();
    let mut exits = 0u32;
    let events = within(Duration::from_secs(300), "the burst's exits", async {
        let mut n = 0usize;
        while let Some(event) = reader.next().await {
            n += 1;
            if let Event::Exit(e) = &event {
                assert_eq!(e.origin.cgroup_id, id);
                exits += 1;
                if e.origin.tgid == pid {
                    return n;
                }
            }
        }
        n
    })
    .await;
    let _ = child.wait();
    assert_eq!(
        exits,
        n + 1,
        "every child and the helper itself ({events} events)"
    );
    assert_eq!(reader.lost().expect("lost counter"), 0);
}

#[tokio::test]
async fn a_tiny_ring_buffer_overflows_and_counts_the_loss() {
    let tree = Tree::new();
    let Some((_probes, reader)) = load(
        &tree,
        Config {
            ring_bytes: 4096,
            ..Config::default()
        },
    ) else {
        return;
    };
    let (cg, _) = tree.mkdir("burst");
    // Nobody reads while 2 000 exits (56-byte records) go into 4 KiB.
    let mut child = spawn_in(&[cg], &["burst", "2000"]);
    let _ = child.wait();
    let lost = reader.lost().expect("lost counter");
    assert!(
        lost > 1000,
        "most of 2 000 records could not be reserved, lost {lost}"
    );
}
