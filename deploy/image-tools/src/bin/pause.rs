//! The pod sandbox's infra process: sleep, reap zombies, exit 0 on SIGTERM/SIGINT.

extern "C" fn on_terminate(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) }
}

extern "C" fn on_child(_: libc::c_int) {
    // SAFETY: waitpid is async-signal-safe; WNOHANG keeps the handler from blocking.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

fn install(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: an all-zero sigaction is a valid starting value; the handler only
    // calls async-signal-safe functions.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

fn main() {
    install(libc::SIGTERM, on_terminate);
    install(libc::SIGINT, on_terminate);
    install(libc::SIGCHLD, on_child);
    loop {
        // SAFETY: pause has no preconditions; it returns after each handled signal.
        unsafe { libc::pause() };
    }
}
