//! `cargo xtask node up|down|status`: a private containerd for development and tests.
//!
//! Everything a node owns lives under one directory (`/var/lib/evlet-node/<version>`
//! unless `EVLET_NODE_DIR` says otherwise): config, socket, pid file, log, the
//! daemon's root and state, CNI config and IPAM data, and network namespaces
//! (`netns_mounts_under_state_dir`). Its bridge is `evlet<tag>`; its pods' cgroups
//! go under `/evlet-node-<tag>`. `down` stops exactly what `up` started (by PID)
//! and then checks that nothing of the node is left.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::containerd::{self, Binaries, Version};
use crate::{image, sh};

/// How long `up` waits for the CRI plugin to serve while containerd logs nothing new.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `up` waits at most while containerd keeps logging progress
/// (loading a large store takes longer than `START_TIMEOUT`).
const START_LIMIT: Duration = Duration::from_secs(180);
/// How many times a containerd that dies silently during start-up is started.
const START_ATTEMPTS: u32 = 3;
/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The bridge of a node of `version`.
fn bridge(version: Version) -> String {
    format!("evlet{}", version.tag())
}

/// The configuration of a node's containerd whose directory is `dir` (also
/// the agent guests', see `guest`); runc's cgroups through systemd with
/// `systemd_cgroup` (the systemd guest's), else through cgroupfs.
pub fn containerd_config(dir: &Path, systemd_cgroup: bool) -> String {
    let d = dir.display();
    // Version 2 config: 1.6 and 1.7 read it natively, 2.x migrates it on load.
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This VM refuses negative oom_score_adj; without this sandboxes fail to start.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd_cgroup}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/net.d"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
        pause = image::PAUSE_IMAGE,
    )
}

/// The CNI network of a node of `version` whose directory is `dir`: its own
/// bridge and subnet, `host-local` addresses kept under `dir`.
pub fn cni_config(version: Version, dir: &Path) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("evlet-{}", version.tag()),
        "plugins": [{
            "type": "bridge",
            "bridge": bridge(version),
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": format!("10.2{}.0.0/16", version.tag()) }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": format!("{}/cni/ipam", dir.display()),
            },
        }, { "type": "loopback" }],
    })
}

/// A private node of one containerd version.
#[derive(Debug, Clone)]
pub struct Node {
    /// The containerd line this node runs.
    pub version: Version,
    /// The directory holding everything the node owns.
    pub dir: PathBuf,
}

impl Node {
    /// The node for `version`, under `EVLET_NODE_DIR` or `/var/lib/evlet-node/<version>`.
    pub fn new(version: Version) -> Self {
        let base = std::env::var_os("EVLET_NODE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib/evlet-node"));
        Self {
            version,
            dir: base.join(version.to_string()),
        }
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The CRI endpoint in the form kubelets take (`unix:///...`).
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// The cgroup parent pods of this node should use.
    pub fn cgroup_root(&self) -> String {
        format!("/evlet-node-{}", self.version.tag())
    }

    fn bridge(&self) -> String {
        bridge(self.version)
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("containerd.pid")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    /// The environment file clients source (`EVLET_CRI_ENDPOINT`, ...).
    pub fn env_file(&self) -> PathBuf {
        self.dir.join("node.env")
    }

    /// The daemon's PID if it is running (and really is this node's containerd).
    pub fn pid(&self) -> Option<i32> {
        let pid: i32 = fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let config = self.config();
        let ours = String::from_utf8_lossy(&cmdline).contains(&*config.to_string_lossy());
        ours.then_some(pid)
    }

    /// Environment variables describing the node to tests and to evlet.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("EVLET_CRI_ENDPOINT".into(), self.endpoint()),
            ("EVLET_CONTAINERD_VERSION".into(), self.version.to_string()),
            ("EVLET_NODE_DIR".into(), self.dir.display().to_string()),
            ("EVLET_CGROUP_ROOT".into(), self.cgroup_root()),
            ("EVLET_PAUSE_IMAGE".into(), image::PAUSE_IMAGE.into()),
            ("EVLET_TEST_IMAGE".into(), image::TEST_IMAGE.into()),
            ("EVLET_SPARE_IMAGE".into(), image::SPARE_IMAGE.into()),
            (
                "EVLET_SPARE_IMAGE_ARCHIVE".into(),
                image::dir().join(image::SPARE_FILE).display().to_string(),
            ),
            (
                "EVLET_CTR".into(),
                containerd::binaries(self.version)
                    .map(|b| b.ctr.display().to_string())
                    .unwrap_or_default(),
            ),
        ]
    }

    /// Starts the node (idempotent) and makes sure the local images are imported.
    pub fn up(&self) -> Result<()> {
        sh::require_root("node up")?;
        let bins = containerd::binaries(self.version)?;
        fs::create_dir_all(&self.dir).with_context(|| {
            format!(
                "cannot create the node directory {} (it holds the CRI socket): check that its \
                 parent is writable, or point EVLET_NODE_DIR at a writable directory",
                self.dir.display()
            )
        })?;
        probe_writable(&self.dir)?;
        if let Some(pid) = self.pid() {
            eprintln!("node {}: already up (containerd pid {pid})", self.version);
        } else {
            self.forget_dead_runtime_state()?;
            self.write_config()?;
            self.start(&bins)?;
        }
        self.import_images(&bins)?;
        let env: String = self
            .env()
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        fs::write(self.env_file(), env)?;
        eprintln!(
            "node {}: up; CRI endpoint {} (environment in {})",
            self.version,
            self.endpoint(),
            self.env_file().display()
        );
        Ok(())
    }

    /// A node whose containerd and shims are all gone (the machine restarted,
    /// or they were killed) keeps its task state under `state/`, which on a
    /// real host lives on `/run` and is cleared by the reboot. Left in place,
    /// containerd spends its start-up "cleaning up dead shim" for every task
    /// (minutes after a 500-pod run). Clear it as a reboot would; the store
    /// under `root/` (images, container records) stays.
    fn forget_dead_runtime_state(&self) -> Result<()> {
        let state = self.dir.join("state");
        if !state.is_dir() || !self.shims().is_empty() {
            return Ok(());
        }
        let empty = fs::read_dir(&state).map_or(true, |mut d| d.next().is_none());
        if empty {
            return Ok(());
        }
        eprintln!(
            "node {}: containerd and its shims are gone; clearing their runtime state in {} \
             (as a reboot clears /run)",
            self.version,
            state.display()
        );
        for mount in self.mounts().iter().filter(|m| m.starts_with(&state)) {
            unmount(mount);
        }
        fs::remove_dir_all(&state).with_context(|| format!("cannot remove {}", state.display()))
    }

    fn write_config(&self) -> Result<()> {
        for sub in ["root", "state", "cni/net.d", "cni/ipam", "log"] {
            fs::create_dir_all(self.dir.join(sub))?;
        }
        fs::write(self.config(), containerd_config(&self.dir, false))?;
        fs::write(
            self.dir.join("cni/net.d/10-evlet.conflist"),
            serde_json::to_vec_pretty(&cni_config(self.version, &self.dir))?,
        )?;
        Ok(())
    }

    /// Starts containerd and waits until it serves CRI. A daemon that dies
    /// before it wrote a single log line (seen once in CI, cause unknown: the
    /// exit status is now reported) is started again, at most `START_ATTEMPTS`
    /// times in all; one that dies after logging is reported at once.
    fn start(&self, bins: &Binaries) -> Result<()> {
        let log_path = self.dir.join("containerd.log");
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.start_once(bins, &log_path)? {
                Started::Serving => return Ok(()),
                Started::Died(status) => {
                    let log = tail(&log_path, 20);
                    if !log.trim().is_empty() || attempt == START_ATTEMPTS {
                        bail!(
                            "containerd {} exited during start-up ({status}, attempt {attempt} \
                             of {START_ATTEMPTS}); last log lines:\n{log}",
                            self.version
                        );
                    }
                    eprintln!(
                        "node {}: containerd exited during start-up ({status}) without \
                         logging anything; starting it again",
                        self.version
                    );
                }
            }
        }
    }

    fn start_once(&self, bins: &Binaries, log_path: &Path) -> Result<Started> {
        let log = fs::File::create(log_path)?;
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bins.bin_dir.display()
        );
        let mut cmd = Command::new(&bins.containerd);
        cmd.arg("--config")
            .arg(self.config())
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        crate::sh::detach(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bins.containerd.display()))?;
        let pid = child.id();
        fs::write(self.pid_file(), format!("{pid}\n"))?;
        eprintln!(
            "node {}: started containerd (pid {pid}, log {})",
            self.version,
            log_path.display()
        );
        let started = Instant::now();
        let mut deadline = started + START_TIMEOUT;
        let mut logged = 0;
        loop {
            // The child handle, not /proc, says whether it exited, and how.
            if let Some(status) = child.try_wait()? {
                return Ok(Started::Died(status));
            }
            if self.socket().exists() && cri_ready(bins, &self.socket()) {
                return Ok(Started::Serving);
            }
            // Progress (a growing log) extends the wait, up to START_LIMIT.
            let len = fs::metadata(log_path).map(|m| m.len()).unwrap_or(0);
            if len != logged {
                logged = len;
                deadline = (Instant::now() + START_TIMEOUT).min(started + START_LIMIT);
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd {} did not serve CRI ({:?} since start, {START_TIMEOUT:?} \
                     without a new log line, at most {START_LIMIT:?}); last log lines:\n{}",
                    self.version,
                    started.elapsed(),
                    tail(log_path, 20)
                );
            }
            sleep(Duration::from_millis(100));
        }
    }

    fn ctr(&self, bins: &Binaries) -> Command {
        let mut cmd = Command::new(&bins.ctr);
        cmd.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"]);
        cmd
    }

    fn import_images(&self, bins: &Binaries) -> Result<()> {
        let present = sh::output(self.ctr(bins).args(["images", "ls", "-q"]))?;
        let images = image::build_all()?;
        for (name, path) in images {
            if present.lines().any(|l| l.trim() == name) {
                continue;
            }
            sh::output(self.ctr(bins).args(["images", "import"]).arg(&path)).with_context(
                || format!("cannot import {name} into containerd {}", self.version),
            )?;
            eprintln!("node {}: imported {name}", self.version);
        }
        Ok(())
    }

    /// Stops the node and removes everything it owns, then checks nothing is left.
    pub fn down(&self) -> Result<()> {
        sh::require_root("node down")?;
        if let Some(pid) = self.pid() {
            if let Ok(bins) = containerd::binaries(self.version) {
                self.remove_containers(&bins);
            }
            stop_pid(pid, STOP_TIMEOUT);
            eprintln!("node {}: stopped containerd (pid {pid})", self.version);
        }
        // One the pid file does not name (an `up` whose file went astray).
        for pid in self.daemons() {
            stop_pid(pid, STOP_TIMEOUT);
            eprintln!(
                "node {}: stopped stray containerd (pid {pid})",
                self.version
            );
        }
        for pid in self.shims() {
            stop_pid(pid, Duration::from_secs(2));
            eprintln!("node {}: killed leftover shim (pid {pid})", self.version);
        }
        for mount in self.mounts() {
            unmount(&mount);
        }
        if link_exists(&self.bridge()) {
            let _ = sh::output(Command::new("ip").args(["link", "del", &self.bridge()]));
        }
        remove_cgroup_tree(&self.cgroup_root());
        for sub in [
            "root",
            "state",
            "cni",
            "opt",
            "containerd.pid",
            "node.env",
            "containerd.sock",
            "containerd.sock.ttrpc",
        ] {
            let path = self.dir.join(sub);
            if path.is_dir() {
                fs::remove_dir_all(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            } else if path.exists() {
                fs::remove_file(&path)?;
            }
        }
        let left = self.leftovers();
        if !left.is_empty() {
            bail!(
                "node {} is down but left behind:\n  {}",
                self.version,
                left.join("\n  ")
            );
        }
        eprintln!("node {}: down, nothing left behind", self.version);
        Ok(())
    }

    /// Kills and deletes every task and container through containerd itself.
    fn remove_containers(&self, bins: &Binaries) {
        let ids = sh::output(self.ctr(bins).args(["containers", "ls", "-q"])).unwrap_or_default();
        for id in ids.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let _ = sh::output(
                self.ctr(bins)
                    .args(["tasks", "kill", "--signal", "SIGKILL", id]),
            );
            let _ = sh::output(self.ctr(bins).args(["tasks", "delete", "--force", id]));
            let _ = sh::output(self.ctr(bins).args(["containers", "delete", id]));
        }
    }

    /// Every containerd running with this node's config, whatever the pid
    /// file says.
    fn daemons(&self) -> Vec<i32> {
        let config = self.config().display().to_string();
        pids_where(|cmdline| {
            cmdline.first().is_some_and(|a| a.ends_with("containerd"))
                && cmdline.iter().any(|a| a == &config)
        })
    }

    /// Shim processes serving this node (their command line names its socket).
    fn shims(&self) -> Vec<i32> {
        let socket = self.socket().display().to_string();
        pids_where(|cmdline| {
            cmdline.iter().any(|a| a.contains("containerd-shim"))
                && cmdline
                    .iter()
                    .any(|a| a == &socket || a.starts_with(&format!("{socket}.")))
        })
    }

    /// Mount points under the node directory, deepest first.
    fn mounts(&self) -> Vec<PathBuf> {
        let mut mounts: Vec<PathBuf> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|p| PathBuf::from(p.replace("\\040", " ")))
            .filter(|p| p.starts_with(&self.dir))
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        mounts.dedup();
        mounts
    }

    /// What of the node still exists; empty after a clean `down`.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left: Vec<String> = self
            .daemons()
            .iter()
            .map(|pid| format!("containerd (pid {pid})"))
            .collect();
        left.extend(self.shims().iter().map(|pid| format!("shim (pid {pid})")));
        left.extend(
            self.mounts()
                .iter()
                .map(|m| format!("mount {}", m.display())),
        );
        let netns = self.dir.join("state/netns");
        if let Ok(entries) = fs::read_dir(&netns) {
            left.extend(
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| format!("netns {}", e.path().display())),
            );
        }
        if link_exists(&self.bridge()) {
            left.push(format!("bridge {}", self.bridge()));
        }
        left.extend(
            cgroup_dirs(&self.cgroup_root())
                .iter()
                .map(|d| format!("cgroup {}", d.display())),
        );
        left
    }

    /// Prints whether the node is up and what it holds.
    pub fn status(&self) -> Result<()> {
        match self.pid() {
            None => println!("node {}: down ({})", self.version, self.dir.display()),
            Some(pid) => {
                let bins = containerd::binaries(self.version)?;
                let count = |what: &str| {
                    sh::output(self.ctr(&bins).args([what, "ls", "-q"]))
                        .map(|o| o.lines().filter(|l| !l.trim().is_empty()).count())
                        .unwrap_or(0)
                };
                println!(
                    "node {}: up (containerd pid {pid}), endpoint {}, {} containers, {} tasks, {} images",
                    self.version,
                    self.endpoint(),
                    count("containers"),
                    count("tasks"),
                    count("images"),
                );
            }
        }
        Ok(())
    }
}

fn probe_writable(dir: &Path) -> Result<()> {
    let probe = dir.join(".write-probe");
    fs::write(&probe, b"").with_context(|| {
        format!(
            "the node directory {} is not writable (it holds the CRI socket): fix its permissions \
             or point EVLET_NODE_DIR at a writable directory",
            dir.display()
        )
    })?;
    let _ = fs::remove_file(probe);
    Ok(())
}

/// How one start of containerd ended.
enum Started {
    Serving,
    Died(std::process::ExitStatus),
}

fn cri_ready(bins: &Binaries, socket: &Path) -> bool {
    Command::new(&bins.ctr)
        .arg("--address")
        .arg(socket)
        .args(["plugins", "ls"])
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout).lines().any(|l| {
                l.contains("io.containerd.grpc.v1")
                    && l.contains(" cri ")
                    && l.trim_end().ends_with("ok")
            })
        })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Every process and its command line.
/// The PIDs of the processes whose command line `wanted` accepts.
fn pids_where(wanted: impl Fn(&[String]) -> bool) -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|(_, cmdline)| wanted(cmdline))
        .map(|(pid, _)| pid)
        .collect()
}

fn processes() -> Vec<(i32, Vec<String>)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// SIGTERM, wait up to `grace`, then SIGKILL.
fn stop_pid(pid: i32, grace: Duration) {
    let alive = || Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
    // SAFETY: kill has no memory-safety preconditions; `pid` was started by this node.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while alive() && Instant::now() < deadline {
        sleep(Duration::from_millis(50));
    }
    if alive() {
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

fn unmount(path: &Path) {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path; MNT_DETACH cannot harm other mounts.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The cgroup directories of `root` in every mounted hierarchy, deepest first.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else {
        return dirs;
    };
    let mut bases: Vec<PathBuf> = hierarchies
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    bases.push(PathBuf::from("/sys/fs/cgroup"));
    for base in bases {
        let top = base.join(root.trim_start_matches('/'));
        collect_dirs(&top, &mut dirs);
    }
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    dirs
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(|e| e.ok()) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

/// Kills whatever still runs in the node's cgroups (a container created but
/// never started keeps its `runc init` there after its shim is gone), then
/// removes them. Everything under the node's cgroup root was started by the
/// node's containerd.
fn remove_cgroup_tree(root: &str) {
    kill_cgroup_tree(root);
    for dir in cgroup_dirs(root) {
        let _ = fs::remove_dir(&dir);
    }
}

/// cgroup v2: `cgroup.kill` on the top (kernel 5.14+). v1: freeze the subtree,
/// SIGKILL every member, thaw (a frozen task dies when thawed), so nothing
/// forks away between reading the members and killing them. Repeated until
/// the tree is empty, for at most two seconds.
fn kill_cgroup_tree(root: &str) {
    let rel = root.trim_start_matches('/');
    for top in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] {
        let kill = Path::new(top).join(rel).join("cgroup.kill");
        if kill.exists() {
            let _ = fs::write(&kill, "1");
        }
    }
    let freezer = Path::new("/sys/fs/cgroup/freezer").join(rel);
    let frozen = freezer.join("freezer.state").exists()
        && fs::write(freezer.join("freezer.state"), "FROZEN").is_ok();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        // A process is a member in every v1 hierarchy: kill each once.
        let members: std::collections::BTreeSet<i32> = cgroup_dirs(root)
            .iter()
            .flat_map(|d| {
                fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        for &pid in &members {
            // SAFETY: kill(2) with a PID read from this node's own cgroups.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if frozen {
            let _ = fs::write(freezer.join("freezer.state"), "THAWED");
        }
        if members.is_empty() || Instant::now() > deadline {
            if !members.is_empty() {
                eprintln!(
                    "node: {} processes outlived SIGKILL in {root}",
                    members.len()
                );
            }
            return;
        }
        sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process left in the node's cgroups (a `runc init` whose shim is gone)
    /// is killed and the tree removed; here a forking shell in a nested cgroup.
    #[test]
    fn down_kills_what_is_left_in_the_cgroups_and_removes_them() {
        if !evlet_testkit::require_root("down_kills_what_is_left_in_the_cgroups_and_removes_them") {
            return;
        }
        let root = format!("/evlet-xtask-test-{}", std::process::id());
        let mut child = Command::new("sh")
            .args(["-c", "while true; do sleep 60 & wait; done"])
            .spawn()
            .expect("sh");
        let pid = child.id();
        let mut joined = 0;
        for top in [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup/freezer",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup",
        ] {
            let base = Path::new(top);
            if !base.join("cgroup.procs").exists() {
                continue;
            }
            let dir = base.join(root.trim_start_matches('/')).join("pod/ctr");
            if fs::create_dir_all(&dir).is_ok()
                && fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok()
            {
                joined += 1;
            }
        }
        assert!(joined > 0, "the shell joined the test's cgroups");
        std::thread::sleep(Duration::from_millis(200));
        remove_cgroup_tree(&root);
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the shell in the node's cgroups outlived `down`");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "the shell was killed: {status}");
        assert_eq!(
            cgroup_dirs(&root),
            Vec::<PathBuf>::new(),
            "the tree is gone"
        );
    }
}
