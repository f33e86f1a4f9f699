//! Running external programs with errors that say what ran and how it failed.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::paths;

/// A cargo command in the repository with the project's tools on `PATH`.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(paths::repo())
        .env("PATH", paths::path_with_tools())
        .args(args);
    cmd
}

/// Renders a command line the way a user would type it.
pub fn display(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        out.push(' ');
        out.push_str(&shell_quote(arg));
    }
    out
}

fn shell_quote(arg: &OsStr) -> String {
    let s = arg.to_string_lossy();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Runs `cmd` with inherited stdio, echoing it first.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| {
        format!("cannot start `{line}` (is it installed? run `cargo xtask setup`)")
    })?;
    if !status.success() {
        bail!("`{line}` failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; on failure the error carries stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| {
        format!("cannot start `{line}` (is it installed? run `cargo xtask setup`)")
    })?;
    if !out.status.success() {
        bail!(
            "`{line}` failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed non-UTF-8 output"))
}

/// Fails with a message naming `what` unless the process runs as root.
pub fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "`cargo xtask {what}` needs root (it installs packages, mounts tracefs and runs \
             containerd): re-run it as root, e.g. `sudo -E env PATH=$PATH cargo xtask {what}`"
        );
    }
    Ok(())
}

/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Makes `cmd` a daemon of its own: a new session (it outlives this command
/// and a Ctrl-C of it), and none of this process's inherited descriptors
/// beyond stdio (a lock the caller holds, say `flock lock cargo xtask node
/// up`, must not be held by containerd for its whole life).
pub fn detach(cmd: &mut Command) {
    // SAFETY: setsid and close_range are async-signal-safe system calls with
    // no preconditions; an old kernel's ENOSYS/EINVAL leaves the descriptors
    // as they were.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            libc::setsid();
            libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
}
