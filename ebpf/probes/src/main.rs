//! evlet's kernel programs: process exit/exec/fork, cgroup mkdir/rmdir and OOM
//! victims, filtered to watched (pod) cgroups, sent through one ring buffer.
//!
//! Hot hooks (exit, exec, task creation) exist twice: as a raw tracepoint (preferred:
//! no tracefs, cheaper) and as a classic tracepoint (fallback); both call the same
//! body, which reads everything from `current`. Cold hooks (cgroup mkdir/rmdir,
//! `oom:mark_victim`) are classic tracepoints only: their payload (path, IDs, RSS
//! counters) is formatted by the kernel there, and they fire rarely.
//!
//! Rust eBPF has no CO-RE, so struct offsets (`task_struct.exit_code`, ...) and
//! tracepoint field offsets are resolved by the loader from kernel BTF and tracefs
//! `format` files, and patched into the `Global`s below before load.
#![no_std]
#![no_main]

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
    bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
};
use aya_ebpf::macros::{map, raw_tracepoint, tracepoint};
use aya_ebpf::maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf};
use aya_ebpf::programs::{RawTracePointContext, TracePointContext};
use aya_ebpf::{EbpfContext, Global};
use aya_log_ebpf::debug;
use evlet_ebpf_common::{
    COMM_LEN, CgroupEvent, DEFAULT_RING_BYTES, Header, MAX_VICTIMS, MAX_WATCHED, OomEvent,
    PREFIX_LEN, ProcEvent, WatchPrefix, config, flag, kind,
};

#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map(name = "LOST")]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "WATCHED")]
static WATCHED: HashMap<u64, u32> = HashMap::with_max_entries(MAX_WATCHED, 0);
#[map(name = "PREFIX")]
static PREFIX: Array<WatchPrefix> = Array::with_max_entries(1, 0);
#[map(name = "VICTIMS")]
static VICTIMS: LruHashMap<u32, OomEvent> = LruHashMap::with_max_entries(MAX_VICTIMS, 0);

/// `evlet_ebpf_common::config` bits.
#[unsafe(no_mangle)]
static CONFIG_FLAGS: Global<u32> = Global::new(0);

// Kernel struct offsets from BTF.
#[unsafe(no_mangle)]
static TASK_EXIT_CODE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SIGNAL_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_THREAD_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_FLAGS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_GROUP_EXIT_CODE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static PID_LEVEL_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static PID_NUMBERS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static UPID_NR_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static UPID_SIZE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_TGID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_START_BOOTTIME_OFF: Global<u32> = Global::new(0);

// Classic tracepoint field offsets from tracefs `format` files (0: field absent).
#[unsafe(no_mangle)]
static EXEC_OLD_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static NEWTASK_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CG_ROOT_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CG_LEVEL_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CG_ID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CG_PATH_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_COMM_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_TOTAL_VM_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_ANON_RSS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_FILE_RSS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_SHMEM_RSS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_UID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_PGTABLES_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MV_OOM_SCORE_ADJ_OFF: Global<u32> = Global::new(0);

const CLONE_THREAD: u64 = 0x0001_0000;
/// `SIGNAL_GROUP_EXIT` (include/linux/sched/signal.h): a group exit or a
/// fatal signal is in progress, and `signal->group_exit_code` holds the status.
const SIGNAL_GROUP_EXIT: u32 = 0x0000_0004;
/// `MAX_PID_NS_LEVEL` (include/linux/pid_namespace.h).
const MAX_PID_NS_LEVEL: u32 = 32;

#[inline(always)]
fn count_lost() {
    if let Some(slot) = LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while we run.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn header(kind: u32, flags: u32, cgroup_id: u64) -> Header {
    let pid_tgid = bpf_get_current_pid_tgid();
    Header {
        kind,
        flags,
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        pid: pid_tgid as u32,
        tgid: (pid_tgid >> 32) as u32,
        cgroup_id,
    }
}

#[inline(always)]
fn current_cgroup() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

#[inline(always)]
fn is_watched(cgroup_id: u64) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { WATCHED.get(cgroup_id) }.is_some()
}

/// Reads a `T` at `base + off` from kernel memory.
#[inline(always)]
fn read_kernel<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel validates the address; a bad one yields Err.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// The PID-namespace flags of `task`'s thread group: `PID_NS` if it lives in
/// a PID namespace other than the initial one, and `NS_INIT` too if it is that
/// namespace's PID 1. Reads `group_leader->thread_pid->numbers[level].nr`: the
/// leader's `struct pid` stays attached until the whole group is released.
#[inline(always)]
fn pid_ns_flags(task: u64) -> u32 {
    let leader: u64 = read_kernel(task, TASK_GROUP_LEADER_OFF.load()).unwrap_or(0);
    let pid: u64 = read_kernel(leader, TASK_THREAD_PID_OFF.load()).unwrap_or(0);
    let level: u32 = read_kernel(pid, PID_LEVEL_OFF.load()).unwrap_or(0);
    if level == 0 || level > MAX_PID_NS_LEVEL {
        return 0;
    }
    let off = PID_NUMBERS_OFF.load() + level * UPID_SIZE.load() + UPID_NR_OFF.load();
    if read_kernel::<i32>(pid, off).unwrap_or(0) == 1 {
        flag::PID_NS | flag::NS_INIT
    } else {
        flag::PID_NS
    }
}

/// The wait status `wait4` gives the group's parent (`wait_task_zombie`):
/// after a group exit or a fatal signal the group's code, else the leader's.
/// (Since 5.19 `synchronize_group_exit` sets the group's code from the last
/// thread when threads end one by one; reading the flag covers both.)
#[inline(always)]
fn group_wait_status(task: u64, signal: u64) -> u32 {
    let flags: u32 = read_kernel(signal, SIGNAL_FLAGS_OFF.load()).unwrap_or(0);
    if flags & SIGNAL_GROUP_EXIT != 0 {
        return read_kernel(signal, SIGNAL_GROUP_EXIT_CODE_OFF.load()).unwrap_or(0);
    }
    let leader: u64 = read_kernel(task, TASK_GROUP_LEADER_OFF.load()).unwrap_or(0);
    read_kernel(leader, TASK_EXIT_CODE_OFF.load()).unwrap_or(0)
}

/// The `start_boottime` of `task`'s thread group leader: with the TGID, the
/// process's identity.
#[inline(always)]
fn group_start_ns(task: u64) -> u64 {
    let leader: u64 = read_kernel(task, TASK_GROUP_LEADER_OFF.load()).unwrap_or(0);
    read_kernel(leader, TASK_START_BOOTTIME_OFF.load()).unwrap_or(0)
}

fn send_proc(kind: u32, flags: u32, cgroup_id: u64, aux: u32, aux2: u32, start_ns: u64) {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        count_lost();
        return;
    };
    entry.write(ProcEvent {
        header: header(kind, flags, cgroup_id),
        aux,
        aux2,
        start_ns,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    });
    entry.submit(0);
}

/// Sends the OOM record of `tid` if `mark_victim` chose it. `current` is the victim
/// here, so the cgroup is the victim's (in `mark_victim` it is the allocator's).
#[inline(always)]
fn send_oom_if_victim(tid: u32, cgroup_id: u64) {
    // SAFETY: the record is copied out before any map update.
    let Some(marked) = (unsafe { VICTIMS.get(tid) }) else {
        return;
    };
    let mut record = *marked;
    let _ = VICTIMS.remove(tid);
    if record.comm[0] == 0 {
        // Kernels before 6.x give `mark_victim` only the PID (5.10 does):
        // the victim's command is current's here.
        record.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    }
    let flags = if is_watched(cgroup_id) {
        flag::WATCHED
    } else {
        0
    } | (record.header.flags & flag::OOM_HAS_RSS);
    record.header = header(kind::OOM_KILL, flags, cgroup_id);
    if EVENTS.output::<OomEvent>(&record, 0).is_err() {
        count_lost();
    }
}

fn on_exit() {
    let cgroup_id = current_cgroup();
    let tid = bpf_get_current_pid_tgid() as u32;
    send_oom_if_victim(tid, cgroup_id);
    if !is_watched(cgroup_id) {
        return;
    }
    // SAFETY: helper without preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    // `signal->live` is decremented in do_exit() before this tracepoint: 0 means
    // the last thread of the group is exiting (kernels < 6.16 have no `group_dead`).
    let signal: u64 = read_kernel(task, TASK_SIGNAL_OFF.load()).unwrap_or(0);
    let live: i32 = read_kernel(signal, SIGNAL_LIVE_OFF.load()).unwrap_or(0);
    let group_dead = live == 0;
    if !group_dead && CONFIG_FLAGS.load() & config::EMIT_THREAD_EXITS == 0 {
        return;
    }
    let (kind, status, flags, start) = if group_dead {
        (
            kind::EXIT,
            group_wait_status(task, signal),
            pid_ns_flags(task),
            group_start_ns(task),
        )
    } else {
        let code: u32 = read_kernel(task, TASK_EXIT_CODE_OFF.load()).unwrap_or(0);
        (kind::THREAD_EXIT, code, 0, 0)
    };
    send_proc(kind, flag::WATCHED | flags, cgroup_id, status, 0, start);
}

fn on_exec(old_pid: u32) {
    let cgroup_id = current_cgroup();
    if !is_watched(cgroup_id) {
        return;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: helper without preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let flags = flag::WATCHED
        | if old_pid != 0 && old_pid != tid {
            flag::THREAD_EXEC
        } else {
            0
        }
        | pid_ns_flags(task);
    send_proc(
        kind::EXEC,
        flags,
        cgroup_id,
        old_pid,
        0,
        group_start_ns(task),
    );
}

fn on_newtask(child_pid: u32, child_tgid: u32, clone_flags: u64) {
    if CONFIG_FLAGS.load() & config::EMIT_FORKS == 0 {
        return;
    }
    let cgroup_id = current_cgroup();
    if !is_watched(cgroup_id) {
        return;
    }
    let flags = flag::WATCHED
        | if clone_flags & CLONE_THREAD != 0 {
            flag::THREAD
        } else {
            0
        };
    send_proc(kind::FORK, flags, cgroup_id, child_pid, child_tgid, 0);
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn exit_raw(_ctx: RawTracePointContext) -> u32 {
    on_exit();
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn exit_tp(_ctx: TracePointContext) -> u32 {
    on_exit();
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn exec_raw(ctx: RawTracePointContext) -> u32 {
    // TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
    let old_pid: u64 = ctx.arg(1);
    on_exec(old_pid as u32);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn exec_tp(ctx: TracePointContext) -> u32 {
    let off = EXEC_OLD_PID_OFF.load();
    // SAFETY: offset from this kernel's format file.
    let old_pid: u32 = if off == 0 {
        0
    } else {
        unsafe { ctx.read_at(off as usize) }.unwrap_or(0)
    };
    on_exec(old_pid);
    0
}

#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn newtask_raw(ctx: RawTracePointContext) -> u32 {
    // TP_PROTO(struct task_struct *task, unsigned long clone_flags)
    let task: u64 = ctx.arg(0);
    let clone_flags: u64 = ctx.arg(1);
    let pid: u32 = read_kernel(task, TASK_PID_OFF.load()).unwrap_or(0);
    let tgid: u32 = read_kernel(task, TASK_TGID_OFF.load()).unwrap_or(0);
    on_newtask(pid, tgid, clone_flags);
    0
}

#[tracepoint(category = "task", name = "task_newtask")]
pub fn newtask_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from this kernel's format file.
    let pid: u32 = unsafe { ctx.read_at(NEWTASK_PID_OFF.load() as usize) }.unwrap_or(0);
    // SAFETY: as above.
    let clone_flags: u64 = unsafe { ctx.read_at(NEWTASK_FLAGS_OFF.load() as usize) }.unwrap_or(0);
    let tgid = if clone_flags & CLONE_THREAD != 0 {
        (bpf_get_current_pid_tgid() >> 32) as u32
    } else {
        pid
    };
    on_newtask(pid, tgid, clone_flags);
    0
}

#[inline(always)]
fn prefix_matches(path: &[u8]) -> bool {
    let Some(prefix) = PREFIX.get(0) else {
        return false;
    };
    let len = prefix.len as usize;
    if len == 0 || len > PREFIX_LEN {
        return false;
    }
    let prefix = &prefix.bytes;
    let mut i = 0;
    while i < PREFIX_LEN {
        if i >= len {
            return true;
        }
        if i >= path.len() || path[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

fn on_cgroup(ctx: &TracePointContext, kind: u32) {
    // SAFETY (all reads below): offsets from this kernel's format file.
    let root: i32 = unsafe { ctx.read_at(CG_ROOT_OFF.load() as usize) }.unwrap_or(-1);
    if root != 0 {
        // Only the default (v2) hierarchy: v1 hierarchies have IDs > 0.
        return;
    }
    let level: i32 = unsafe { ctx.read_at(CG_LEVEL_OFF.load() as usize) }.unwrap_or(0);
    let id: u64 = unsafe { ctx.read_at(CG_ID_OFF.load() as usize) }.unwrap_or(0);
    let loc: u32 = unsafe { ctx.read_at(CG_PATH_OFF.load() as usize) }.unwrap_or(0);
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        count_lost();
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at the reserved record; every field is written before submit.
    unsafe {
        let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
        let len = match bpf_probe_read_kernel_str_bytes(src, &mut (*ev).path) {
            Ok(bytes) => bytes.len() as u32,
            Err(_) => 0,
        };
        let watched_before = is_watched(id);
        let matches = prefix_matches(&(*ev).path);
        if !matches && !watched_before {
            entry.discard(0);
            return;
        }
        if kind == evlet_ebpf_common::kind::CGROUP_MKDIR {
            if WATCHED.insert(id, 1, 0).is_err() {
                count_lost();
            }
        } else {
            let _ = WATCHED.remove(id);
        }
        (*ev).header = header(kind, flag::WATCHED, id);
        (*ev).level = level as u32;
        (*ev).path_len = len;
    }
    entry.submit(0);
}

#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir_tp(ctx: TracePointContext) -> u32 {
    on_cgroup(&ctx, kind::CGROUP_MKDIR);
    0
}

#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir_tp(ctx: TracePointContext) -> u32 {
    on_cgroup(&ctx, kind::CGROUP_RMDIR);
    0
}

#[inline(always)]
fn field<T: Default>(ctx: &TracePointContext, off: u32) -> T {
    if off == 0 {
        return T::default();
    }
    // SAFETY: offset from this kernel's format file.
    unsafe { ctx.read_at(off as usize) }.unwrap_or_default()
}

/// Records the victim; the record is sent when the victim exits (see `send_oom_if_victim`).
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn mark_victim_tp(ctx: TracePointContext) -> u32 {
    let pid: i32 = field(&ctx, MV_PID_OFF.load());
    let mut record = OomEvent {
        // SAFETY: helper without preconditions.
        marked_ns: unsafe { bpf_ktime_get_ns() },
        total_vm_kb: field(&ctx, MV_TOTAL_VM_OFF.load()),
        anon_rss_kb: field(&ctx, MV_ANON_RSS_OFF.load()),
        file_rss_kb: field(&ctx, MV_FILE_RSS_OFF.load()),
        shmem_rss_kb: field(&ctx, MV_SHMEM_RSS_OFF.load()),
        pgtables_kb: field(&ctx, MV_PGTABLES_OFF.load()),
        uid: field(&ctx, MV_UID_OFF.load()),
        oom_score_adj: field::<i16>(&ctx, MV_OOM_SCORE_ADJ_OFF.load()) as i32,
        ..OomEvent::default()
    };
    if MV_ANON_RSS_OFF.load() != 0 {
        record.header.flags = flag::OOM_HAS_RSS;
    }
    let comm_off = MV_COMM_OFF.load();
    if comm_off != 0 {
        let loc: u32 = field(&ctx, comm_off);
        // SAFETY: the data_loc offset points inside this tracepoint record.
        unsafe {
            let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
            let _ = bpf_probe_read_kernel_str_bytes(src, &mut record.comm);
        }
    }
    debug!(&ctx, "evlet: oom victim marked, tid {}", pid);
    let _ = VICTIMS.insert(pid as u32, record, 0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
