//! Running upstream kubelet on a shared machine without changing the host:
//! what the conformance runs (`cargo xtask conformance`) and the benchmark's
//! upstream rows (`cargo xtask bench`) both need.
//!
//! * At start upstream kubelet writes six sysctls (`vm.overcommit_memory=1`,
//!   `kernel.panic=10`, `kernel.panic_on_oops=1`, ...) unless
//!   `protectKernelDefaults`, which instead refuses to start when they differ.
//!   [`command`] runs it in a mount namespace of its own where those
//!   `/proc/sys` files are bind-mounted copies holding the values it wants
//!   ([`write_sysctls`]); with `protectKernelDefaults: true` it reads them,
//!   finds nothing to change, and writes nothing to the host's kernel. Its
//!   root directory is made a shared bind mount first ([`share_mount`]), so
//!   the volumes it mounts there propagate to the host, where containerd
//!   reads them.
//! * It adds `KUBE-FIREWALL` and canary chains to the host's iptables; the
//!   `PATH` [`command`] gives it leaves out `/usr/sbin`, so it finds no
//!   `iptables` and, as upstream logs, skips them ("they are for other
//!   components").

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The sysctls upstream kubelet wants (`setupKernelTunables`), as files to
/// bind over `/proc/sys` in its mount namespace.
pub const SYSCTLS: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Writes the files [`command`] binds over `/proc/sys` into `dir`.
///
/// # Errors
/// If `dir` or a file cannot be written.
pub fn write_sysctls(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, value) in SYSCTLS {
        std::fs::write(dir.join(name.replace('/', ".")), format!("{value}\n"))?;
    }
    Ok(())
}

/// The command that runs upstream `kubelet` with `args` in a mount namespace
/// where the kernel tunables read as it wants them (from `sysctl_dir`, see
/// [`write_sysctls`]) and without `/usr/sbin` on its `PATH`. The process it
/// starts becomes the kubelet itself (`unshare` and `sh` exec it).
pub fn command(kubelet: &Path, args: &[String], sysctl_dir: &Path) -> Command {
    let mut script = String::from("set -e; mount --make-rprivate /proc; ");
    for (name, _) in SYSCTLS {
        script.push_str(&format!(
            "mount --bind {}/{} /proc/sys/{name}; ",
            sysctl_dir.display(),
            name.replace('/', ".")
        ));
    }
    script.push_str("exec \"$0\" \"$@\"");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "unchanged",
        "--",
        "/bin/sh",
        "-c",
    ])
    .arg(script)
    .arg(kubelet)
    .args(args)
    .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    cmd
}

/// Makes `dir` a shared bind mount of itself (host side), so mounts made
/// under it in another mount namespace propagate here.
///
/// # Errors
/// If `mount` fails.
pub fn share_mount(dir: &Path) -> io::Result<()> {
    mount(Command::new("mount").arg("--bind").arg(dir).arg(dir))?;
    mount(Command::new("mount").arg("--make-shared").arg(dir))
}

fn mount(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
    Err(io::Error::other(format!(
        "mount {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Unmounts everything at or under `dir`, deepest first (lazily: a busy
/// mount goes when its last user does).
pub fn unmount_under(dir: &Path) {
    let mut mounts: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    for mount in mounts {
        let Ok(c) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: a valid NUL-terminated path; MNT_DETACH touches only this mount.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Makes the cgroup root `root` in every hierarchy (upstream kubelet
/// requires `cgroupRoot` to exist; evlet makes it itself).
///
/// # Errors
/// If a directory cannot be made, or no hierarchy is mounted.
pub fn ensure_cgroup_root(root: &str) -> io::Result<()> {
    let rel = root.trim_start_matches('/');
    let base = Path::new("/sys/fs/cgroup");
    let mut made = 0;
    for entry in std::fs::read_dir(base)?.filter_map(Result::ok) {
        let hierarchy = entry.path();
        if hierarchy.join("cgroup.procs").exists() {
            std::fs::create_dir_all(hierarchy.join(rel))?;
            made += 1;
        }
    }
    if base.join("cgroup.procs").exists() {
        std::fs::create_dir_all(base.join(rel))?;
        made += 1;
    }
    if made == 0 {
        return Err(io::Error::other(
            "no cgroup hierarchy found under /sys/fs/cgroup",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_runs_in_a_namespace_with_the_tunables_it_wants_and_no_sbin() {
        let cmd = command(
            Path::new("/b/kubelet"),
            &["--v=2".into()],
            Path::new("/s/sysctl"),
        );
        assert_eq!(cmd.get_program(), "unshare");
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(&args[..4], ["--mount", "--propagation", "unchanged", "--"]);
        let script = &args[6];
        assert!(script.starts_with("set -e; mount --make-rprivate /proc; "));
        assert!(script.contains(
            "mount --bind /s/sysctl/vm.overcommit_memory /proc/sys/vm/overcommit_memory;"
        ));
        assert!(script.contains("/proc/sys/kernel/panic_on_oops;"));
        assert!(script.ends_with("exec \"$0\" \"$@\""));
        assert_eq!(args[7], "/b/kubelet");
        assert_eq!(args[8], "--v=2");
        let path = cmd
            .get_envs()
            .find(|(k, _)| *k == "PATH")
            .and_then(|(_, v)| v)
            .expect("PATH");
        assert!(!path.to_string_lossy().contains("sbin"));
    }

    #[test]
    fn the_sysctl_files_hold_the_values_upstream_wants() {
        let dir = std::env::temp_dir().join(format!("testkit-sysctl-{}", std::process::id()));
        write_sysctls(&dir).expect("written");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("a file");
        assert_eq!(read("vm.overcommit_memory"), "1\n");
        assert_eq!(read("kernel.keys.root_maxbytes"), "25000000\n");
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
