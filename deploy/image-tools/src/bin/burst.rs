//! `burst <n>`: fork `n` children, then let them all exit at the same moment.
//!
//! The children block on a pipe until the parent closes its end, so their exits
//! land in the kernel within a few milliseconds: the agent's tests use it to
//! overflow a deliberately tiny eBPF ring buffer however fast its reader is.

use std::io::Error;

fn main() {
    let n: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) => n,
        _ => {
            eprintln!("usage: burst <n>");
            std::process::exit(2);
        }
    };
    let mut gate = [0i32; 2];
    // SAFETY: `gate` has room for the two descriptors.
    if unsafe { libc::pipe(gate.as_mut_ptr()) } != 0 {
        fail("pipe");
    }
    let mut live = 0u32;
    for _ in 0..n {
        // SAFETY: the child only calls async-signal-safe functions.
        match unsafe { libc::fork() } {
            0 => unsafe {
                libc::close(gate[1]);
                let mut byte = 0u8;
                // Returns 0 (end of file) once the parent closes the write end.
                libc::read(gate[0], (&raw mut byte).cast(), 1);
                libc::_exit(0)
            },
            -1 => fail("fork"),
            _ => live += 1,
        }
    }
    // SAFETY: closing our own descriptor releases every child at once.
    unsafe { libc::close(gate[1]) };
    // SAFETY: plain waitpid on our own children.
    while live > 0 && unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) } > 0 {
        live -= 1;
    }
    println!("burst: {n} children exited together");
}

fn fail(call: &str) -> ! {
    eprintln!("burst: {call}: {}", Error::last_os_error());
    std::process::exit(1);
}
