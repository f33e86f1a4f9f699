//! The kubelet under test: evlet or upstream kubelet, set up the same way and
//! joined to the cluster as one node named `conf-<kind>`.
//!
//! Both read one `KubeletConfiguration` ([`config`]): the node's containerd
//! socket, the cgroupfs driver under the node's cgroup root, the secured port
//! 10350 with a certificate signed by the cluster CA, x509 + webhook
//! authentication, webhook authorization, eviction thresholds low enough for
//! a shared disk, and image GC off (the suite's images exist only on this
//! node). Ports are off upstream's defaults so another kubelet on the
//! machine does not collide. CNI is the node's containerd's; neither kubelet
//! configures the network.
//!
//! Upstream kubelet changes the host where evlet does not (sysctls,
//! iptables); it runs the way `evlet_testkit::upstream_kubelet` describes,
//! which changes neither.

use std::fmt;
use std::fs;
use std::io::Read as _;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::json;

use evlet_testkit::upstream_kubelet;
pub use evlet_testkit::upstream_kubelet::unmount_under;

use super::certs;
use crate::node::Node;
use crate::sh;

/// The secured kubelet port of the conformance node.
pub const PORT: u16 = 10350;
/// The read-only port (evlet's `/healthz`, `/pods`).
pub const READ_ONLY_PORT: u16 = 10355;
/// Upstream's healthz port.
pub const HEALTHZ_PORT: u16 = 10348;

/// Which kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// evlet, built from this checkout.
    Evlet,
    /// Upstream kubelet of the pinned release.
    Upstream,
}

impl Kind {
    /// Both, in the order a run uses them.
    pub const BOTH: [Kind; 2] = [Kind::Evlet, Kind::Upstream];

    /// Short name: `evlet`, `upstream`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Evlet => "evlet",
            Kind::Upstream => "upstream",
        }
    }

    /// The Node's name: `conf-evlet`, `conf-upstream`.
    pub fn node_name(self) -> String {
        format!("conf-{}", self.name())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--kubelet evlet|upstream|both`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// evlet only.
    Evlet,
    /// Upstream kubelet only.
    Upstream,
    /// evlet, then upstream kubelet, same selection.
    Both,
}

impl Which {
    /// The kubelets to run, in order.
    pub fn kinds(self) -> Vec<Kind> {
        match self {
            Which::Evlet => vec![Kind::Evlet],
            Which::Upstream => vec![Kind::Upstream],
            Which::Both => Kind::BOTH.to_vec(),
        }
    }
}

impl FromStr for Which {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "evlet" => Ok(Which::Evlet),
            "upstream" => Ok(Which::Upstream),
            "both" => Ok(Which::Both),
            other => Err(format!(
                "unknown kubelet {other:?}: use evlet, upstream or both"
            )),
        }
    }
}

/// Everything one kubelet's run needs on disk.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Which kubelet.
    pub kind: Kind,
    /// Its Node's name.
    pub node_name: String,
    /// The node's IP (`--node-ip`, the API server reaches the kubelet there).
    pub ip: Ipv4Addr,
    /// `/var/lib/evlet-conformance/<kind>`: everything the kubelet writes.
    pub state: PathBuf,
    /// The kubeconfig and certificates.
    pub identity: certs::Identity,
    /// The `KubeletConfiguration` file.
    pub config: PathBuf,
    /// The kubelet's log.
    pub log: PathBuf,
}

impl Setup {
    /// `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.state.join("root")
    }

    /// `podLogsDir`.
    pub fn pod_logs(&self) -> PathBuf {
        self.state.join("pod-logs")
    }
}

/// The base of every conformance kubelet's state.
pub fn state_base() -> PathBuf {
    PathBuf::from("/var/lib/evlet-conformance")
}

/// Prepares a fresh state directory, identity and config for `kind`.
///
/// # Errors
/// If a leftover mount cannot be removed or a file cannot be written.
pub fn prepare(
    kind: Kind,
    node: &Node,
    cluster: &crate::cluster::Cluster,
    ip: Ipv4Addr,
    log: PathBuf,
) -> Result<Setup> {
    let state = state_base().join(kind.name());
    // A previous run's state (an aborted run's mounts too) goes first.
    unmount_under(&state);
    if state.exists() {
        fs::remove_dir_all(&state)
            .with_context(|| format!("cannot remove the old state {}", state.display()))?;
    }
    fs::create_dir_all(state.join("root"))?;
    fs::create_dir_all(state.join("pod-logs"))?;
    let node_name = kind.node_name();
    let identity = certs::mint(
        &state.join("pki"),
        &cluster.pki(),
        &cluster.server(),
        &node_name,
        ip,
    )?;
    let setup = Setup {
        kind,
        node_name,
        ip,
        config: state.join("config.json"),
        state,
        identity,
        log,
    };
    fs::write(
        &setup.config,
        serde_json::to_vec_pretty(&config(&setup, node))?,
    )
    .with_context(|| format!("cannot write {}", setup.config.display()))?;
    if kind == Kind::Upstream {
        upstream_kubelet::write_sysctls(&setup.state.join("sysctl"))?;
    }
    Ok(setup)
}

/// The `KubeletConfiguration` both kubelets read (only upstream's fields;
/// evlet logs the ones it does not read).
pub fn config(setup: &Setup, node: &Node) -> serde_json::Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": node.endpoint(),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root(),
        "port": PORT,
        "readOnlyPort": READ_ONLY_PORT,
        "healthzPort": HEALTHZ_PORT,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": setup.identity.serving_crt,
        "tlsPrivateKeyFile": setup.identity.serving_key,
        "authentication": {
            "x509": { "clientCAFile": setup.identity.ca_crt },
            "webhook": { "enabled": true, "cacheTTL": "2m0s" },
            "anonymous": { "enabled": false },
        },
        "authorization": { "mode": "Webhook" },
        // The shared disk is ~80 % full: upstream's 10 % nodefs threshold
        // would put the node under DiskPressure before the first pod.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        // The suite's images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": setup.pod_logs(),
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": false,
        "protectKernelDefaults": true,
    })
}

/// A started kubelet.
#[derive(Debug)]
pub struct Running {
    /// The process (the kubelet itself: `unshare` and `sh` exec it).
    pub child: Child,
    /// What it runs with.
    pub setup: Setup,
}

/// Starts the kubelet of `setup` (a daemon of its own session, logging to
/// `setup.log`).
///
/// # Errors
/// If the shared root mount or the process cannot be made.
pub fn start(setup: &Setup, binary: &Path) -> Result<Running> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&setup.log)
        .with_context(|| format!("cannot open {}", setup.log.display()))?;
    let mut args = vec![
        format!("--config={}", setup.config.display()),
        format!("--kubeconfig={}", setup.identity.kubeconfig.display()),
        format!("--hostname-override={}", setup.node_name),
        format!("--node-ip={}", setup.ip),
        format!("--root-dir={}", setup.root_dir().display()),
    ];
    let mut cmd = match setup.kind {
        Kind::Evlet => {
            let mut cmd = Command::new(binary);
            cmd.args(&args);
            cmd
        }
        Kind::Upstream => {
            upstream_kubelet::share_mount(&setup.root_dir())?;
            args.push(format!("--cert-dir={}", setup.state.join("pki").display()));
            args.push("--v=2".into());
            upstream_kubelet::command(binary, &args, &setup.state.join("sysctl"))
        }
    };
    cmd.env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .current_dir(&setup.state);
    sh::detach(&mut cmd);
    eprintln!("conformance: $ {}", sh::display(&cmd));
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    eprintln!(
        "conformance: started {} as node {} (pid {}, log {})",
        setup.kind,
        setup.node_name,
        child.id(),
        setup.log.display()
    );
    Ok(Running {
        child,
        setup: setup.clone(),
    })
}

impl Running {
    /// Fails if the kubelet exited, with the tail of its log.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.setup.kind,
                self.setup.log.display(),
                tail(&self.setup.log, 30)
            );
        }
        Ok(())
    }

    /// SIGTERM, 30 s, SIGKILL; by the PID this process started.
    pub fn stop(mut self) -> Result<()> {
        let pid = self.child.id() as i32;
        if self.child.try_wait()?.is_none() {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    eprintln!("conformance: {} outlived SIGTERM; SIGKILL", self.setup.kind);
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    self.child.wait()?;
                    break;
                }
                sleep(Duration::from_millis(100));
            }
        }
        eprintln!("conformance: stopped {} (pid {pid})", self.setup.kind);
        Ok(())
    }

    /// evlet's `/healthz` on its read-only port (names the PLEG mode).
    pub fn healthz(&self) -> Option<String> {
        let mut stream = TcpStream::connect_timeout(
            &([127, 0, 0, 1], READ_ONLY_PORT).into(),
            Duration::from_secs(2),
        )
        .ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        std::io::Write::write_all(
            &mut stream,
            b"GET /healthz?verbose HTTP/1.0\r\nHost: localhost\r\n\r\n",
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.trim().to_string())
    }
}

/// Removes `/var/log/containers` links into `pod_logs` (both kubelets make them).
pub fn remove_log_links(pod_logs: &Path) {
    let Ok(entries) = fs::read_dir("/var/log/containers") else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        if fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(pod_logs)) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Makes the node's cgroup root in every hierarchy (upstream kubelet
/// requires `cgroupRoot` to exist; evlet makes it itself).
pub fn ensure_cgroup_root(root: &str) -> Result<()> {
    upstream_kubelet::ensure_cgroup_root(root)
        .with_context(|| format!("cannot create the cgroup root {root}"))
}

/// The first global IPv4 address (what the cluster advertises too).
pub fn node_ip() -> Result<Ipv4Addr> {
    let out = sh::output(Command::new("ip").args(["-o", "-4", "addr", "show"]))?;
    out.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            let addr: Ipv4Addr = words.next()?.split('/').next()?.parse().ok()?;
            (!addr.is_loopback() && !addr.is_link_local()).then_some(addr)
        })
        .context("no global IPv4 address for the node")
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_parses_and_orders_evlet_first() {
        assert_eq!(
            "both".parse::<Which>().expect("both").kinds(),
            Kind::BOTH.to_vec()
        );
        assert_eq!(
            "upstream".parse::<Which>().expect("u").kinds(),
            vec![Kind::Upstream]
        );
        assert!("kubelet".parse::<Which>().is_err());
        assert_eq!(Kind::Evlet.node_name(), "conf-evlet");
    }
}
