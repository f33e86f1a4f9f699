//! [`Process`]: which process the kernel or the runtime means, and
//! [`Processes`]: whether it still lives.
//!
//! A PID alone is not a process: PIDs are reused. The kernel's records and
//! `/proc/<pid>/stat` both carry the process's start (`start_boottime`), so a
//! PID and its start name one process for the machine's uptime.

use std::fmt::Debug;

/// One process: its PID in the initial PID namespace and its start in clock
/// ticks since boot (`/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Process {
    /// The PID (TGID) in the initial PID namespace.
    pub pid: u32,
    /// Its start, clock ticks since boot.
    pub start_ticks: u64,
}

impl Process {
    /// The process with `pid` that started `start_ns` after boot (the
    /// kernel's `start_boottime`), with `ticks_per_second` clock ticks
    /// (`USER_HZ`), truncated as the kernel's `nsec_to_clock_t` does.
    pub fn from_kernel(pid: u32, start_ns: u64, ticks_per_second: u64) -> Self {
        Self {
            pid,
            start_ticks: start_ns / (1_000_000_000 / ticks_per_second.clamp(1, 1_000_000_000)),
        }
    }

    /// Does this very process still live (not exited, not a zombie)?
    pub fn alive(&self, processes: &dyn Processes) -> bool {
        processes.live(self.pid) == Some(self.start_ticks)
    }
}

/// Which processes live: `/proc` ([`ProcFs`]), or a fake runtime's table in tests.
pub trait Processes: Send + Sync + Debug {
    /// The start (ticks since boot) of `pid` if a process with that PID lives
    /// and is not exiting: `None` for no such process, a zombie, or one in
    /// its exit.
    fn live(&self, pid: u32) -> Option<u64>;

    /// Clock ticks per second of the starts [`Processes::live`] gives.
    fn ticks_per_second(&self) -> u64;
}

/// The machine's processes, read from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcFs;

/// `PF_EXITING` (include/linux/sched.h): set at the start of `do_exit`,
/// before the exit tracepoint fires.
const PF_EXITING: u32 = 0x0000_0004;

impl Processes for ProcFs {
    fn live(&self, pid: u32) -> Option<u64> {
        let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
            .ok()?
            .stat()
            .ok()?;
        let dead = matches!(stat.state, 'Z' | 'X' | 'x') || stat.flags & PF_EXITING != 0;
        (!dead).then_some(stat.starttime)
    }

    fn ticks_per_second(&self) -> u64 {
        procfs::ticks_per_second()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_start_is_counted_in_clock_ticks_as_proc_shows_it() {
        assert_eq!(Process::from_kernel(7, 1_234_567_890, 100).start_ticks, 123);
        assert_eq!(Process::from_kernel(7, 1_239_999_999, 100).start_ticks, 123);
        assert_eq!(
            Process::from_kernel(7, 5_000_000_000, 0).start_ticks,
            5,
            "no division by zero: seconds"
        );
    }

    #[test]
    fn this_process_lives_and_a_reused_pid_is_another_process() {
        let me = std::process::id();
        let start = ProcFs.live(me).expect("the test process lives");
        let this = Process {
            pid: me,
            start_ticks: start,
        };
        assert!(this.alive(&ProcFs));
        let earlier = Process {
            pid: me,
            start_ticks: start.wrapping_sub(1),
        };
        assert!(!earlier.alive(&ProcFs), "same PID, another start");
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ProcFs.live(pid).is_some() {
            assert!(std::time::Instant::now() < deadline, "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            procfs::process::Process::new(pid as i32).is_ok(),
            "still in /proc as a zombie"
        );
        child.wait().expect("reap");
        assert_eq!(ProcFs.live(pid), None);
    }
}
