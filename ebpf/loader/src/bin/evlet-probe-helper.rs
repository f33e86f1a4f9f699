//! Test helper for the probe tests: processes of known shapes.
//!
//! * `exit <code>`: exit with `code`.
//! * `thread-exit`: a second thread exits; the process lives until stdin closes, then exits 0.
//! * `leader-first <code>`: the main thread exits first (raw `exit`); the other
//!   thread exits the process with `code` 300 ms later.
//! * `hog <MiB>`: touch `MiB` of memory, then sleep (an OOM victim under a limit).
//! * `burst <n>`: fork `n` children that `_exit(0)` at once, one after another.
//! * `pidns-init <code>`: a child in a new PID namespace (its PID 1) execs
//!   `exit <code>`; the helper exits with the child's status.
//! * `leader-status <code>`: the main thread ends with status `code` (raw
//!   `exit`, no group exit); the other thread ends with status 0 300 ms later.
//!   The process's wait status is the leader's before Linux 5.19, the last
//!   thread's since.

use std::io::Read as _;
use std::time::Duration;

fn arg(n: usize) -> i64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("exit") => std::process::exit(arg(2) as i32),
        Some("thread-exit") => {
            let t = std::thread::spawn(|| ());
            let _ = t.join();
            println!("thread exited");
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        }
        Some("leader-first") => {
            let code = arg(2) as i32;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::process::exit(code);
            });
            // The raw exit syscall (not exit_group) ends only the main thread, without
            // unwinding; the spawned thread keeps the process alive.
            // SAFETY: nothing runs on this thread afterwards.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned");
        }
        Some("hog") => {
            let mib = arg(2) as usize;
            let mut held = Vec::with_capacity(mib);
            for _ in 0..mib {
                let mut chunk = vec![0u8; 1 << 20];
                for b in chunk.iter_mut().step_by(4096) {
                    *b = 1;
                }
                held.push(std::hint::black_box(chunk));
            }
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        Some("burst") => {
            for _ in 0..arg(2) {
                // SAFETY: the child only calls _exit.
                match unsafe { libc::fork() } {
                    0 => unsafe { libc::_exit(0) },
                    pid if pid > 0 => {
                        // SAFETY: waits for the child just forked.
                        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                    }
                    _ => std::process::exit(2),
                }
            }
        }
        Some("pidns-init") => {
            let code = arg(2).to_string();
            // SAFETY: plain syscalls; the child only execs or _exits.
            unsafe {
                if libc::unshare(libc::CLONE_NEWPID) != 0 {
                    std::process::exit(3);
                }
                match libc::fork() {
                    0 => {
                        use std::os::unix::process::CommandExt as _;
                        let err = std::process::Command::new("/proc/self/exe")
                            .args(["exit", &code])
                            .exec();
                        eprintln!("exec: {err}");
                        libc::_exit(4);
                    }
                    pid if pid > 0 => {
                        let mut status = 0;
                        libc::waitpid(pid, &mut status, 0);
                        std::process::exit(libc::WEXITSTATUS(status));
                    }
                    _ => std::process::exit(2),
                }
            }
        }
        Some("leader-status") => {
            let code = arg(2);
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: ends only this thread; nothing runs on it afterwards.
                unsafe { libc::syscall(libc::SYS_exit, 0) };
            });
            // SAFETY: ends only the main thread, without unwinding.
            unsafe { libc::syscall(libc::SYS_exit, code) };
            unreachable!("SYS_exit returned");
        }
        _ => {
            eprintln!(
                "usage: evlet-probe-helper exit|thread-exit|leader-first|leader-status|pidns-init|hog|burst [n]"
            );
            std::process::exit(2);
        }
    }
}
