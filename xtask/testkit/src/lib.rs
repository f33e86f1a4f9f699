//! Support for evlet's tests.
//!
//! * [`node`] / [`require_root`]: the gate of privileged tests. Outside CI a test
//!   that lacks its environment prints a loud `SKIPPED` line and returns; under
//!   `CI=true` it panics, because a privileged test that skips in CI must fail
//!   the run. `cargo xtask test` provides the environment.
//! * [`within`]: an await under a deadline that panics with a diagnosis.
//! * [`upstream_kubelet`]: running upstream kubelet beside evlet without
//!   changing the host (the conformance runs and the benchmark's control).

pub mod upstream_kubelet;

use std::future::Future;
use std::time::Duration;

/// The private node a `node_*` test runs against (set by `cargo xtask test` / `node up`).
#[derive(Debug, Clone)]
pub struct NodeEnv {
    /// CRI endpoint (`unix:///...`).
    pub endpoint: String,
    /// containerd line (`1.6`, `1.7`, `2.1`).
    pub containerd_version: String,
    /// The node's directory.
    pub node_dir: String,
    /// Cgroup parent tests must put their pods under.
    pub cgroup_root: String,
    /// The sandbox image.
    pub pause_image: String,
    /// The workload image (static busybox + `memhog`).
    pub test_image: String,
}

impl NodeEnv {
    /// True if the node's containerd implements CRI `GetContainerEvents` (1.7+).
    pub fn has_container_events(&self) -> bool {
        self.containerd_version != "1.6"
    }
}

/// True when running under CI (`CI=true` or `CI=1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The slack a node test allows on top of a time the agent promises (a
/// grace period) for the runtime's own teardown and the PLEG's detection:
/// `host` on the host, `EVLET_E2E_SLACK_SECS` where the whole node is slower
/// (`cargo xtask vm-test`'s emulated guests).
pub fn slack(host: std::time::Duration) -> std::time::Duration {
    std::env::var("EVLET_E2E_SLACK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(host, std::time::Duration::from_secs)
}

fn skip(test: &str, why: &str) {
    if in_ci() {
        panic!("privileged test {test} cannot run in CI: {why}");
    }
    // Straight to the file descriptor: libtest captures `eprintln!`, and a
    // skip must be seen even when the test "passes".
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why} (run it with `cargo xtask test`) ***\n"
    );
}

/// True if `available`; otherwise skips `test` (a failure under `CI=true`)
/// saying `why`. For privileged tests that need something of the host
/// (kernel BTF, cgroup2) beyond root.
pub fn require(test: &str, available: bool, why: &str) -> bool {
    if !available {
        skip(test, why);
    }
    available
}

/// True if running as root; otherwise skips (or fails in CI) with a message naming `test`.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(test, "needs root");
    false
}

/// The node environment, or `None` after a loud skip (a panic in CI).
pub fn node(test: &str) -> Option<NodeEnv> {
    if !require_root(test) {
        return None;
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let Some(endpoint) = var("EVLET_CRI_ENDPOINT") else {
        skip(test, "no private node (EVLET_CRI_ENDPOINT is unset)");
        return None;
    };
    Some(NodeEnv {
        endpoint,
        containerd_version: var("EVLET_CONTAINERD_VERSION").unwrap_or_else(|| "1.6".into()),
        node_dir: var("EVLET_NODE_DIR").unwrap_or_default(),
        cgroup_root: var("EVLET_CGROUP_ROOT").unwrap_or_else(|| "/evlet-test".into()),
        pause_image: var("EVLET_PAUSE_IMAGE").unwrap_or_else(|| "registry.k8s.io/pause:3.9".into()),
        test_image: var("EVLET_TEST_IMAGE").unwrap_or_else(|| "evlet.local/test:v1".into()),
    })
}

/// Awaits `fut` for at most `limit`, panicking with `what` if it takes longer.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(limit, what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

impl NodeEnv {
    fn pid_file(&self) -> std::path::PathBuf {
        std::path::Path::new(&self.node_dir).join("containerd.pid")
    }

    /// Restarts the node's containerd in place (same command line and `PATH`), as
    /// a runtime upgrade or crash-restart does. Containers keep running in their shims.
    ///
    /// # Panics
    /// If the daemon cannot be found, stopped or started again.
    pub fn restart_containerd(&self) {
        use std::os::unix::process::CommandExt as _;
        let pid: i32 = std::fs::read_to_string(self.pid_file())
            .expect("node pid file")
            .trim()
            .parse()
            .expect("pid");
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).expect("containerd cmdline");
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let path = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                std::str::from_utf8(kv)
                    .ok()?
                    .strip_prefix("PATH=")
                    .map(str::to_owned)
            })
            .next()
            .unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        // A zombie (the daemon was this test's child, never reaped) is gone.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                .unwrap_or(false)
        };
        let wait_gone = |limit: Duration| {
            let until = std::time::Instant::now() + limit;
            while alive() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        // SAFETY: kill has no memory-safety preconditions; the pid is the node's daemon.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        wait_gone(Duration::from_secs(15));
        if alive() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            wait_gone(Duration::from_secs(5));
        }
        assert!(!alive(), "the old containerd (pid {pid}) is still running");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(std::path::Path::new(&self.node_dir).join("containerd.log"))
            .expect("containerd log");
        let mut cmd = std::process::Command::new(&args[0]);
        cmd.args(&args[1..])
            .env("PATH", path)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        // The daemon outlives this test (init reaps it); the handle only
        // checks that it is alive once its socket answers.
        let mut child = cmd.spawn().expect("containerd restarts");
        std::fs::write(self.pid_file(), format!("{}\n", child.id())).expect("pid file");
        let socket = self.endpoint.trim_start_matches("unix://").to_owned();
        let up = std::time::Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                std::time::Instant::now() < up,
                "containerd did not come back within 30 s"
            );
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "the new containerd exited during start-up (see containerd.log)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The old daemon is gone, so the socket is the new child's.
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "the new containerd answered and died (see containerd.log)"
        );
    }

    /// Removes the cgroup directories under `<cgroup_root>/<name>` in every hierarchy
    /// (after the runtime removed the containers in them).
    pub fn remove_cgroups(&self, name: &str) {
        let rel = format!("{}/{}", self.cgroup_root.trim_matches('/'), name);
        let mut bases: Vec<std::path::PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        bases.push("/sys/fs/cgroup".into());
        for base in bases {
            remove_tree(&base.join(&rel));
        }
    }
}

fn remove_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.filter_map(|e| e.ok()) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
