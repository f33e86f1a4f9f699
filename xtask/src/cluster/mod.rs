//! `cargo xtask cluster up|down|status|build [--version 1.34|1.37]`: a real
//! upstream control plane on loopback for evlet to join.
//!
//! The programs (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kubectl) are built with `go build` from the small Go module
//! of each pinned release under `upstream/v1.X/` (see `build`); nothing of
//! upstream's source is in the repository, the Go module proxy supplies it.
//!
//! Everything a cluster owns lives under one directory,
//! `/var/lib/evlet-cluster/<version>` unless `EVLET_CLUSTER_DIR` says
//! otherwise (then `$EVLET_CLUSTER_DIR/<version>`): `pki/`, the kubeconfigs,
//! etcd's data, a log and pid file per component, and the apiserver's audit
//! log of every node's requests (`audit.log`, which evlet's tests read). Each
//! version has its own block of ports ([`Ports`]), so two clusters can run at
//! once. `down` stops exactly the processes `up` recorded, by PID, and checks
//! nothing is left.
//!
//! A kubelet joins with `bootstrap.kubeconfig` (a bootstrap token, the CA and
//! the apiserver URL, `https://127.0.0.1:<port>`); its client CSR is approved
//! and signed by the controller manager. `cluster.env` in the directory names
//! these files for scripts and tests (`EVLET_CLUSTER_*`).
//!
//! Environment: `EVLET_CLUSTER_DIR` (state), `EVLET_TOOLS_DIR` (binaries),
//! `EVLET_CLUSTER_ADVERTISE_ADDRESS` (default: the first global IPv4 address),
//! `EVLET_CLUSTER_BIND_ADDRESS` (default 127.0.0.1; `0.0.0.0` lets pods reach
//! the `kubernetes` Service, whose endpoint is the advertise address).

mod bootstrap;
mod build;
mod components;
mod pki;
mod process;

use std::fmt;
use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use self::components::Component;
use crate::paths;

/// Options of `cargo xtask cluster`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// What to do with the cluster.
    #[command(subcommand)]
    pub action: Action,
    /// Upstream release: 1.34 (evlet's own minor) or 1.37 (the newest served).
    #[arg(long, default_value = "1.34", global = true)]
    pub version: Version,
}

/// The cluster actions.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Action {
    /// Build the programs, make the PKI, start the control plane (idempotent).
    Up,
    /// Stop exactly the processes `up` started; the directory (PKI, etcd data)
    /// stays unless `--purge`.
    Down {
        /// Also remove the cluster directory (a new CA, token and empty etcd next time).
        #[arg(long)]
        purge: bool,
    },
    /// Print which components run and where the cluster's files are.
    Status,
    /// Only build the control-plane programs (skipped when their stamps match).
    Build {
        /// Also build these programs of the module: kubelet, e2e.test, ginkgo,
        /// agnhost, sample-device-plugin (comma-separated).
        #[arg(long, value_delimiter = ',')]
        with: Vec<String>,
    },
}

/// Runs `cargo xtask cluster <action>`.
pub fn run(options: &Options) -> Result<()> {
    let cluster = Cluster::new(options.version);
    match &options.action {
        Action::Up => cluster.up(),
        Action::Down { purge } => cluster.down(*purge),
        Action::Status => cluster.status(),
        Action::Build { with } => {
            let mut binaries = build::CONTROL_PLANE.to_vec();
            for name in with {
                binaries.push(build::by_name(name)?);
            }
            build::build(options.version, &binaries).map(|_| ())
        }
    }
}

/// A pinned upstream release with a Go module under `upstream/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Kubernetes v1.34.4: the minor evlet implements.
    V1_34,
    /// Kubernetes v1.37.2: the newest release the module proxy serves.
    V1_37,
}

impl Version {
    /// The exact `k8s.io/kubernetes` release in the module's go.mod.
    pub fn release(self) -> &'static str {
        match self {
            Version::V1_34 => "v1.34.4",
            Version::V1_37 => "v1.37.2",
        }
    }

    /// The minor version number.
    pub fn minor(self) -> u16 {
        match self {
            Version::V1_34 => 34,
            Version::V1_37 => 37,
        }
    }

    /// The ports of this version's cluster.
    pub fn ports(self) -> Ports {
        Ports::for_minor(self.minor())
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim_start_matches('v') {
            "1.34" => Ok(Version::V1_34),
            "1.37" => Ok(Version::V1_37),
            other => Err(format!(
                "unknown cluster version {other:?}: use 1.34 or 1.37"
            )),
        }
    }
}

/// The loopback ports of one cluster: a block of ten from `16000 + minor*10`
/// (1.34: 16340–16349), below Linux's ephemeral range (32768+) and away from
/// the components' defaults (2379/2380, 6443, 10257, 10259) that other software
/// on a developer's machine may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// etcd's client URL (plain HTTP on 127.0.0.1).
    pub etcd_client: u16,
    /// etcd's peer URL (a single member, still needs one).
    pub etcd_peer: u16,
    /// kube-apiserver's secure port.
    pub apiserver: u16,
    /// kube-controller-manager's secure (health, metrics) port.
    pub controller_manager: u16,
    /// kube-scheduler's secure (health, metrics) port.
    pub scheduler: u16,
}

impl Ports {
    /// The block of `minor`.
    pub fn for_minor(minor: u16) -> Self {
        let base = 16000 + minor * 10;
        Self {
            etcd_client: base + 1,
            etcd_peer: base + 2,
            apiserver: base + 3,
            controller_manager: base + 7,
            scheduler: base + 9,
        }
    }
}

/// One cluster: its version, directory and the addresses it uses.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The upstream release it runs.
    pub version: Version,
    /// The directory holding everything it owns.
    pub dir: PathBuf,
}

impl Cluster {
    /// The cluster of `version`, under `EVLET_CLUSTER_DIR` or `/var/lib/evlet-cluster`.
    pub fn new(version: Version) -> Self {
        let base = std::env::var_os("EVLET_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib/evlet-cluster"));
        Self {
            version,
            dir: base.join(version.to_string()),
        }
    }

    /// The apiserver URL clients use (loopback).
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.version.ports().apiserver)
    }

    /// The cluster's PKI directory (`ca.crt` is the CA every client trusts).
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// The kubeconfig of user `evlet-admin` (group `system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The kubeconfig a kubelet joins with (bootstrap token).
    pub fn bootstrap_kubeconfig(&self) -> PathBuf {
        self.dir.join("bootstrap.kubeconfig")
    }

    /// The environment file `up` writes (`EVLET_CLUSTER_*=...` lines).
    pub fn env_file(&self) -> PathBuf {
        self.dir.join("cluster.env")
    }

    /// Variables describing the cluster to scripts, tests and a joining kubelet.
    fn env(&self, layout: &components::Layout) -> Vec<(&'static str, String)> {
        vec![
            ("EVLET_CLUSTER_VERSION", self.version.release().to_string()),
            ("EVLET_CLUSTER_SERVER", self.server()),
            ("EVLET_CLUSTER_STATE_DIR", self.dir.display().to_string()),
            (
                "EVLET_CLUSTER_CA",
                self.pki().join(pki::CA_CRT).display().to_string(),
            ),
            (
                "EVLET_CLUSTER_ADMIN_KUBECONFIG",
                self.admin_kubeconfig().display().to_string(),
            ),
            (
                "EVLET_CLUSTER_BOOTSTRAP_KUBECONFIG",
                self.bootstrap_kubeconfig().display().to_string(),
            ),
            (
                "EVLET_CLUSTER_KUBECTL",
                layout.kubectl().display().to_string(),
            ),
            ("EVLET_CLUSTER_BIN", layout.bin.display().to_string()),
            (
                "EVLET_CLUSTER_AUDIT_LOG",
                layout.audit_log().display().to_string(),
            ),
        ]
    }

    /// Starts the cluster (idempotent): build, PKI, components, bootstrap objects.
    pub fn up(&self) -> Result<()> {
        let started = Instant::now();
        let bins = build::build(self.version, build::CONTROL_PLANE)?;
        fs::create_dir_all(&self.dir).with_context(|| {
            format!(
                "cannot create the cluster directory {}: point EVLET_CLUSTER_DIR at a writable \
                 directory",
                self.dir.display()
            )
        })?;
        let advertise = advertise_address()?;
        let pki = pki::ensure(&self.pki(), &pki::Inputs::new(advertise))?;
        let layout = components::Layout {
            dir: self.dir.clone(),
            pki: self.pki(),
            bin: bins,
            ports: self.version.ports(),
            advertise,
            bind: bind_address()?,
        };
        bootstrap::write_kubeconfigs(self, &pki)?;
        layout.write_audit_policy()?;
        let mut fresh = false;
        for component in Component::ALL {
            if let Some(pid) = process::find(&layout, component) {
                let note = if process::runs_replaced_binary(pid) {
                    " on an older build: `cluster down` and `up` to restart it"
                } else {
                    ""
                };
                println!(
                    "cluster {}: {component} already up (pid {pid}){note}",
                    self.version
                );
                continue;
            }
            fresh = true;
            let pid = process::start(&layout, component)?;
            println!(
                "cluster {}: started {component} (pid {pid}, log {})",
                self.version,
                layout.log(component).display()
            );
            process::wait_ready(&layout, component, self)?;
        }
        bootstrap::apply(self, &layout)?;
        bootstrap::wait_for_default_namespace_objects(self, &layout)?;
        let env_file = self.env_file();
        fs::write(&env_file, env_lines(&self.env(&layout)))
            .with_context(|| format!("cannot write {}", env_file.display()))?;
        for component in Component::ALL {
            if process::running(&layout, component).is_none() {
                bail!(
                    "cluster {}: {component} exited after start-up; last log lines:\n{}",
                    self.version,
                    process::tail(&layout.log(component), 20)
                );
            }
        }
        println!(
            "cluster {}: {} in {:.1?}; apiserver {}, admin kubeconfig {}, bootstrap kubeconfig {} \
             (all in {})",
            self.version,
            if fresh { "up" } else { "already up" },
            started.elapsed(),
            self.server(),
            self.admin_kubeconfig().display(),
            self.bootstrap_kubeconfig().display(),
            env_file.display()
        );
        Ok(())
    }

    /// Stops every component `up` started (by PID), then checks nothing is
    /// left; with `purge`, removes the cluster directory too.
    pub fn down(&self, purge: bool) -> Result<()> {
        let layout = self.layout_for_status();
        // Reverse start order: clients of the apiserver first, etcd last.
        for component in Component::ALL.iter().rev().copied() {
            let mut pids: Vec<i32> = process::running(&layout, component).into_iter().collect();
            for pid in process::all_running(&layout, component) {
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
            if pids.is_empty() {
                println!("cluster {}: {component} was not running", self.version);
            }
            for pid in pids {
                process::stop(pid, process::STOP_TIMEOUT);
                println!("cluster {}: stopped {component} (pid {pid})", self.version);
            }
            let _ = fs::remove_file(layout.pid_file(component));
        }
        // Not the pid files (removed above): every process on the machine.
        let left: Vec<String> = Component::ALL
            .iter()
            .flat_map(|&c| {
                process::all_running(&layout, c)
                    .into_iter()
                    .map(move |pid| format!("{c} (pid {pid})"))
            })
            .collect();
        if !left.is_empty() {
            bail!(
                "cluster {} is down but still running:\n  {}",
                self.version,
                left.join("\n  ")
            );
        }
        if purge && self.dir.exists() {
            fs::remove_dir_all(&self.dir).with_context(|| {
                format!("cannot remove the cluster directory {}", self.dir.display())
            })?;
            println!(
                "cluster {}: down, nothing left running, {} removed",
                self.version,
                self.dir.display()
            );
        } else {
            println!(
                "cluster {}: down, nothing left running (state kept in {})",
                self.version,
                self.dir.display()
            );
        }
        Ok(())
    }

    /// Prints which components run.
    pub fn status(&self) -> Result<()> {
        let layout = self.layout_for_status();
        let mut up = 0;
        for component in Component::ALL {
            let stray = process::all_running(&layout, component).first().copied();
            match (process::running(&layout, component), stray) {
                (Some(pid), _) => {
                    up += 1;
                    println!("cluster {}: {component} running (pid {pid})", self.version);
                }
                (None, Some(pid)) => {
                    up += 1;
                    println!(
                        "cluster {}: {component} running (pid {pid}, not in its pid file; \
                         `up` records it, `down` stops it)",
                        self.version
                    );
                }
                (None, None) => println!("cluster {}: {component} not running", self.version),
            }
        }
        let state = match up {
            0 => "down",
            n if n == Component::ALL.len() => "up",
            _ => "partly up (run `cargo xtask cluster up` or `down`)",
        };
        println!(
            "cluster {}: {state}; apiserver {}, directory {}, admin kubeconfig {}",
            self.version,
            self.server(),
            self.dir.display(),
            self.admin_kubeconfig().display()
        );
        Ok(())
    }

    /// True if none of the components runs (`up` would start them all).
    pub fn is_down(&self) -> bool {
        let layout = self.layout_for_status();
        Component::ALL
            .iter()
            .all(|&c| process::all_running(&layout, c).is_empty())
    }

    /// A layout good enough to find and stop processes (no build, no address look-up).
    fn layout_for_status(&self) -> components::Layout {
        components::Layout {
            dir: self.dir.clone(),
            pki: self.pki(),
            bin: build::bin_dir(self.version),
            ports: self.version.ports(),
            advertise: Ipv4Addr::UNSPECIFIED,
            bind: Ipv4Addr::LOCALHOST,
        }
    }
}

/// The address the apiserver advertises: `EVLET_CLUSTER_ADVERTISE_ADDRESS`, or
/// the first non-loopback IPv4 address of the machine. It cannot be loopback:
/// the `kubernetes` Endpoints reject 127.0.0.0/8 (kubernetes/kubernetes#29374).
fn advertise_address() -> Result<Ipv4Addr> {
    if let Ok(s) = std::env::var("EVLET_CLUSTER_ADVERTISE_ADDRESS") {
        return s.parse().with_context(|| {
            format!("EVLET_CLUSTER_ADVERTISE_ADDRESS={s:?} is not an IPv4 address")
        });
    }
    let out =
        crate::sh::output(std::process::Command::new("ip").args(["-o", "-4", "addr", "show"]))?;
    first_non_loopback(&out).context(
        "no non-loopback IPv4 address on this machine, and the apiserver's advertise address \
         cannot be loopback (kubernetes/kubernetes#29374): set EVLET_CLUSTER_ADVERTISE_ADDRESS",
    )
}

/// The first global, non-loopback IPv4 address in `ip -o -4 addr show` output.
fn first_non_loopback(ip_output: &str) -> Option<Ipv4Addr> {
    ip_output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "inet")?;
        let addr: Ipv4Addr = words.next()?.split('/').next()?.parse().ok()?;
        (!addr.is_loopback() && !addr.is_link_local() && !addr.is_unspecified()).then_some(addr)
    })
}

/// The apiserver's bind address: 127.0.0.1, or `EVLET_CLUSTER_BIND_ADDRESS`
/// (e.g. `0.0.0.0`, so pods reach the `kubernetes` Service at the advertise address).
fn bind_address() -> Result<Ipv4Addr> {
    match std::env::var("EVLET_CLUSTER_BIND_ADDRESS") {
        Ok(s) => s
            .parse()
            .with_context(|| format!("EVLET_CLUSTER_BIND_ADDRESS={s:?} is not an IPv4 address")),
        Err(_) => Ok(Ipv4Addr::LOCALHOST),
    }
}

/// `KEY=value` lines.
fn env_lines(vars: &[(&str, String)]) -> String {
    vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// Upstream kubelet of `version`, built from its module when stale (the
/// benchmark's control).
///
/// # Errors
/// If the build fails.
pub fn kubelet(version: Version) -> Result<PathBuf> {
    Ok(build::build(version, &[build::by_name("kubelet")?])?.join("kubelet"))
}

/// The repository's `upstream/v1.X` Go module of `version`.
pub fn module_dir(version: Version) -> PathBuf {
    paths::repo()
        .join("upstream")
        .join(format!("v1.{}", version.minor()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_or_without_a_v_and_reject_others() {
        assert_eq!("1.34".parse::<Version>(), Ok(Version::V1_34));
        assert_eq!("v1.37".parse::<Version>(), Ok(Version::V1_37));
        assert!("1.35".parse::<Version>().is_err());
        assert_eq!(Version::V1_37.to_string(), "1.37");
    }

    #[test]
    fn the_two_versions_have_disjoint_ports_off_the_common_defaults() {
        let a = Version::V1_34.ports();
        let b = Version::V1_37.ports();
        let all = |p: Ports| {
            vec![
                p.etcd_client,
                p.etcd_peer,
                p.apiserver,
                p.controller_manager,
                p.scheduler,
            ]
        };
        for port in all(a) {
            assert!(!all(b).contains(&port), "{port} is in both blocks");
            assert!(![2379, 2380, 6443, 8080, 10257, 10259].contains(&port));
            assert!(port < 32768, "{port} is in the ephemeral range");
        }
        assert_eq!(a.apiserver, 16343);
    }

    #[test]
    fn the_advertise_address_is_the_first_global_ipv4() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n";
        assert_eq!(first_non_loopback(out), Some(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(
            first_non_loopback("1: lo    inet 127.0.0.1/8 scope host lo"),
            None
        );
    }

    #[test]
    fn each_version_has_its_module_under_upstream() {
        for v in [Version::V1_34, Version::V1_37] {
            let go_mod = fs::read_to_string(module_dir(v).join("go.mod")).expect("go.mod");
            assert!(
                go_mod.contains(&format!("k8s.io/kubernetes {}", v.release())),
                "upstream/v1.{} pins {}",
                v.minor(),
                v.release()
            );
        }
    }
}
