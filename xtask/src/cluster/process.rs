//! Starting, finding, waiting for and stopping the cluster's processes.
//!
//! `up` starts each component detached (its own session), with stdout and
//! stderr appended to `<dir>/<component>.log`, and records its PID in
//! `<dir>/<component>.pid`. A process counts as the component only while
//! `/proc/<pid>/cmdline` runs the component's program with a flag pointing
//! inside the cluster directory ([`is_component`]), so a recycled PID of
//! another program is never signalled.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Cluster;
use super::components::{Component, Layout};

/// How long `down` waits after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// How long `up` waits for a component to become ready.
fn ready_timeout(c: Component) -> Duration {
    match c {
        // The first start of an apiserver creates its bootstrap RBAC and
        // priority classes; on two busy cores that takes a while.
        Component::KubeApiserver => Duration::from_secs(240),
        _ => Duration::from_secs(90),
    }
}

/// The PID of `c` recorded by `up`, if it runs and really is this cluster's `c`.
pub fn running(layout: &Layout, c: Component) -> Option<i32> {
    let pid: i32 = fs::read_to_string(layout.pid_file(c))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let ours = cmdline(pid).is_some_and(|args| is_component(&args, layout, c));
    (ours && !is_zombie(pid)).then_some(pid)
}

/// Every live process that is this cluster's `c`, recorded or not (a pid
/// file lost to a crash between spawn and write leaves such a stray).
pub fn all_running(layout: &Layout, c: Component) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| cmdline(pid).is_some_and(|args| is_component(&args, layout, c)))
        .filter(|&pid| !is_zombie(pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// This cluster's `c` even without a (valid) pid file: the recorded one, or
/// else a stray whose PID is then recorded, so `up` does not start a second.
pub fn find(layout: &Layout, c: Component) -> Option<i32> {
    if let Some(pid) = running(layout, c) {
        return Some(pid);
    }
    let pid = *all_running(layout, c).first()?;
    fs::write(layout.pid_file(c), format!("{pid}\n")).ok()?;
    Some(pid)
}

/// Whether `pid` runs a binary that has since been replaced (a rebuild
/// renames a new file over it, so `/proc/<pid>/exe` reads "... (deleted)").
pub fn runs_replaced_binary(pid: i32) -> bool {
    fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|exe| exe.to_string_lossy().ends_with(" (deleted)"))
}

/// Whether the command line `args` is this cluster's `c`: the program is `c`'s
/// (by file name, so a moved tools directory still matches) and a flag's value
/// is a path inside the cluster directory.
pub fn is_component(args: &[String], layout: &Layout, c: Component) -> bool {
    let program = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|name| name == c.name());
    let inside = format!("={}/", layout.dir.display());
    program && args.iter().skip(1).any(|a| a.contains(&inside))
}

fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Starts `c` detached, logging to its log file, and records its PID.
pub fn start(layout: &Layout, c: Component) -> Result<i32> {
    let log_path = layout.log(c);
    let mut log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open the log {}", log_path.display()))?;
    writeln!(log, "---- evlet cluster: starting {c} ----")?;
    let binary = layout.binary(c);
    let mut cmd = Command::new(&binary);
    cmd.args(c.args(layout))
        .current_dir(&layout.dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    crate::sh::detach(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {c} ({})", binary.display()))?;
    let pid = child.id() as i32;
    let pid_file = layout.pid_file(c);
    fs::write(&pid_file, format!("{pid}\n"))
        .with_context(|| format!("cannot write the pid file {}", pid_file.display()))?;
    Ok(pid)
}

/// Waits until `c` serves: etcd's `/health`, the apiserver's `/readyz`, the
/// controller manager's and scheduler's `/healthz`.
pub fn wait_ready(layout: &Layout, c: Component, cluster: &Cluster) -> Result<()> {
    let started = Instant::now();
    let timeout = ready_timeout(c);
    loop {
        let ready = match c {
            Component::Etcd => etcd_healthy(layout.ports.etcd_client),
            Component::KubeApiserver => {
                kubectl_raw(layout, Some(&cluster.admin_kubeconfig()), None, "/readyz")
            }
            Component::KubeControllerManager => kubectl_raw(
                layout,
                None,
                Some(layout.ports.controller_manager),
                "/healthz",
            ),
            Component::KubeScheduler => {
                kubectl_raw(layout, None, Some(layout.ports.scheduler), "/healthz")
            }
        };
        if ready {
            println!(
                "cluster {}: {c} ready after {:.1}s",
                cluster.version,
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if running(layout, c).is_none() {
            bail!(
                "{c} exited during start-up; last lines of {}:\n{}",
                layout.log(c).display(),
                tail(&layout.log(c), 30)
            );
        }
        if started.elapsed() > timeout {
            bail!(
                "{c} was not ready within {timeout:?}; last lines of {}:\n{}",
                layout.log(c).display(),
                tail(&layout.log(c), 30)
            );
        }
        sleep(Duration::from_millis(500));
    }
}

/// etcd answers `GET /health` on its plain-HTTP loopback client port.
fn etcd_healthy(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.contains(r#""health":"true""#)
}

/// `kubectl get --raw <path>` prints `ok`: through `kubeconfig`, or to a
/// loopback component on `port` (which serves a self-signed certificate of its
/// own) as the admin client certificate, so kubectl does not prompt for a user.
fn kubectl_raw(layout: &Layout, kubeconfig: Option<&Path>, port: Option<u16>, path: &str) -> bool {
    let mut cmd = Command::new(layout.kubectl());
    match (kubeconfig, port) {
        (Some(kc), _) => {
            cmd.arg("--kubeconfig").arg(kc);
        }
        (None, Some(port)) => {
            cmd.args(["--kubeconfig", "/dev/null", "--insecure-skip-tls-verify"])
                .arg(format!(
                    "--client-certificate={}",
                    layout.pki.join("admin.crt").display()
                ))
                .arg(format!(
                    "--client-key={}",
                    layout.pki.join("admin.key").display()
                ))
                .arg(format!("--server=https://127.0.0.1:{port}"));
        }
        (None, None) => return false,
    }
    cmd.args(["--request-timeout=5s", "get", "--raw", path])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    cmd.output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok")
}

/// SIGTERM, wait up to `grace`, then SIGKILL; `pid` came from [`running`].
pub fn stop(pid: i32, grace: Duration) {
    let alive = || Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` was recorded by
    // `up` and checked against the component's command line by `running`.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while alive() && Instant::now() < deadline {
        sleep(Duration::from_millis(50));
    }
    if alive() {
        eprintln!("cluster: pid {pid} outlived SIGTERM for {grace:?}; sending SIGKILL");
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive() && Instant::now() < deadline {
            sleep(Duration::from_millis(20));
        }
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::path::PathBuf;

    use super::*;
    use crate::cluster::Ports;

    fn layout(dir: &Path) -> Layout {
        Layout {
            dir: dir.to_path_buf(),
            pki: dir.join("pki"),
            bin: PathBuf::from("/nonexistent/bin"),
            ports: Ports::for_minor(34),
            advertise: Ipv4Addr::UNSPECIFIED,
            bind: Ipv4Addr::LOCALHOST,
        }
    }

    #[test]
    fn a_pid_file_pointing_at_another_program_is_not_the_component() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = layout(dir.path());
        // Our own PID: alive, but not an etcd of this cluster.
        fs::write(
            layout.pid_file(Component::Etcd),
            std::process::id().to_string(),
        )
        .expect("pid");
        assert_eq!(running(&layout, Component::Etcd), None);
        fs::write(layout.pid_file(Component::Etcd), "not a pid").expect("pid");
        assert_eq!(running(&layout, Component::Etcd), None);
        assert_eq!(all_running(&layout, Component::Etcd), Vec::<i32>::new());
    }

    #[test]
    fn a_component_is_its_program_with_a_flag_inside_the_cluster_dir() {
        let l = layout(Path::new("/var/lib/evlet-cluster/1.34"));
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let etcd = args(&["/x/bin/etcd", "--data-dir=/var/lib/evlet-cluster/1.34/etcd"]);
        assert!(is_component(&etcd, &l, Component::Etcd));
        assert!(!is_component(&etcd, &l, Component::KubeApiserver));
        let other_cluster = args(&["/x/bin/etcd", "--data-dir=/var/lib/evlet-cluster/1.37/etcd"]);
        assert!(!is_component(&other_cluster, &l, Component::Etcd));
        let prefix = args(&[
            "/x/bin/etcd",
            "--data-dir=/var/lib/evlet-cluster/1.345/etcd",
        ]);
        assert!(!is_component(&prefix, &l, Component::Etcd));
        let system_etcd = args(&["/usr/bin/etcd", "--data-dir=/var/lib/etcd"]);
        assert!(!is_component(&system_etcd, &l, Component::Etcd));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("x.log");
        fs::write(&log, "a\nb\nc\n").expect("log");
        assert_eq!(tail(&log, 2), "b\nc");
        assert_eq!(tail(&dir.path().join("missing"), 2), "");
    }
}
