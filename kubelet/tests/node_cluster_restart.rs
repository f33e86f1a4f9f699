//! The real control plane's etcd restarted under a running agent: pods keep
//! running, nothing is restarted or started twice, an exit seen while etcd is
//! away reaches the API once it is back, the Lease resumes and the pod watch
//! carries new pods again.
//!
//! The test stops the etcd `cargo xtask cluster up` started (by the PID in
//! `<cluster dir>/etcd.pid`, checked against its command line) and starts it
//! again with the same command line, log and pid file, so `cluster down`
//! still finds it. It takes the whole control plane away, so `cargo xtask
//! test` runs it alone, after the other node suites (`SERIAL_SUITES`).

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{Backend, api_e2e};
use evlet_cri::{ContainerFilter, SandboxFilter};
use evlet_testkit::eventually;
use serde_json::json;
use support::IMAGE;

/// How long etcd stays away: past the Lease's 40 s duration, so the node
/// lifecycle controller may judge the node while it cannot renew.
const OUTAGE: Duration = Duration::from_secs(60);

/// The cluster's etcd, stopped; started again by [`StoppedEtcd::start`] or,
/// if the test fails first, when dropped.
struct StoppedEtcd {
    args: Vec<String>,
    cwd: PathBuf,
    dir: PathBuf,
    started: bool,
}

impl StoppedEtcd {
    /// Stops the etcd of the cluster in `dir` (SIGTERM, SIGKILL after 15 s).
    fn stop(dir: &Path) -> Self {
        let pid_file = dir.join("etcd.pid");
        let pid: i32 = fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let raw = fs::read(format!("/proc/{pid}/cmdline")).expect("etcd's command line");
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let inside = format!("={}/", dir.display());
        assert!(
            args.first()
                .and_then(|a| Path::new(a).file_name())
                .is_some_and(|n| n == "etcd")
                && args.iter().any(|a| a.contains(&inside)),
            "pid {pid} of {} is not this cluster's etcd: {args:?}",
            pid_file.display()
        );
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).expect("etcd's directory");
        // SAFETY: kill(2) with a PID checked above to be the cluster's etcd.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "stop etcd");
        let asked = Instant::now();
        while alive(pid) {
            if asked.elapsed() > Duration::from_secs(15) {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            args,
            cwd,
            dir: dir.to_owned(),
            started: false,
        }
    }

    /// Starts etcd again as `cluster up` did: detached, appending to its
    /// log, its PID in the pid file.
    fn start(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd's log");
        let mut child = Command::new(&self.args[0])
            .args(&self.args[1..])
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start etcd again");
        fs::write(self.dir.join("etcd.pid"), format!("{}\n", child.id())).expect("etcd.pid");
        // Reaped here should it exit while the test runs; it outlives the
        // test otherwise, as `cluster up`'s did.
        std::thread::spawn(move || child.wait());
    }
}

impl Drop for StoppedEtcd {
    fn drop(&mut self) {
        self.start();
    }
}

/// Whether `pid` runs (a zombie, waiting for a reaper, does not).
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_restart_keeps_pods_running_and_the_node_resumes() {
    api_e2e(
        "an_etcd_restart_keeps_pods_running_and_the_node_resumes",
        Backend::Real,
        |w, api| async move {
            let dir = cluster::ClusterEnv::from_env()
                .expect("the real cluster")
                .state_dir;
            let agent = api.start(&w, w.config()).await;
            let ns = api.ns().to_owned();
            let keep = w.pod_name("keep");
            let short = w.pod_name("short");
            api.create(
                "pods",
                &ns,
                api.pod(&w, "keep", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            )
            .await;
            api.create(
                "pods",
                &ns,
                api.pod(
                    &w,
                    "short",
                    json!({
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": IMAGE,
                                        "command": ["/bin/sh", "-c", "sleep 15; exit 3"]}]
                    }),
                ),
            )
            .await;
            api.wait_phase(&keep, "Running", Duration::from_secs(60))
                .await;
            api.wait_phase(&short, "Running", Duration::from_secs(60))
                .await;
            let keep_id = agent.running_id(&keep, "main").await;
            let renewed = |lease: Option<serde_json::Value>| {
                lease.and_then(|l| l["spec"]["renewTime"].as_str().map(str::to_owned))
            };
            let lease_before = renewed(api.get("leases", "kube-node-lease", &w.name).await)
                .expect("the node's lease");

            let mut etcd = StoppedEtcd::stop(&dir);
            let down = Instant::now();
            // The agent sees the exit while the control plane cannot store it.
            agent
                .wait_status(&short, "short Failed locally", OUTAGE, |s| {
                    (s.phase.as_deref() == Some("Failed")).then_some(())
                })
                .await;
            tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
            assert_eq!(
                agent.running_id(&keep, "main").await,
                keep_id,
                "keep runs on through the outage"
            );
            etcd.start();

            let failed = api
                .wait_phase(&short, "Failed", Duration::from_secs(90))
                .await;
            assert_eq!(
                failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3,
                "{failed:#}"
            );
            eventually(
                Duration::from_secs(60),
                "the lease renewed after etcd came back",
                || async {
                    renewed(api.get("leases", "kube-node-lease", &w.name).await)
                        .filter(|t| *t != lease_before)
                },
            )
            .await;
            eventually(Duration::from_secs(60), "the node Ready", || async {
                let node = api.get("nodes", "", &w.name).await?;
                (apiserver::condition(&node, "Ready")?["status"] == "True").then_some(())
            })
            .await;
            // The pod watch carries new pods again.
            api.create(
                "pods",
                &ns,
                api.pod(&w, "after", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            )
            .await;
            api.wait_phase(&w.pod_name("after"), "Running", Duration::from_secs(90))
                .await;

            // Ready in the API, whatever the node lifecycle controller marked
            // while the node could not report.
            eventually(Duration::from_secs(60), "keep Ready in the API", || async {
                let pod = api.get("pods", &ns, &keep).await?;
                (apiserver::condition(&pod, "Ready")?["status"] == "True").then_some(())
            })
            .await;
            let kept = api.get("pods", &ns, &keep).await.expect("keep");
            assert_eq!(kept["status"]["phase"], "Running", "{kept:#}");
            assert_eq!(
                kept["status"]["containerStatuses"][0]["restartCount"], 0,
                "{kept:#}"
            );
            assert_eq!(
                agent.running_id(&keep, "main").await,
                keep_id,
                "never restarted"
            );
            // One sandbox and one container per pod: nothing started twice.
            for pod in [&keep, &short] {
                let sandboxes = w
                    .client
                    .list_pod_sandbox(
                        SandboxFilter::new().label(evlet::pod::labels::POD_NAME, pod.clone()),
                    )
                    .await
                    .expect("sandboxes");
                assert_eq!(sandboxes.len(), 1, "{pod}: {sandboxes:?}");
                let containers = w
                    .client
                    .list_containers(
                        ContainerFilter::new().label(evlet::pod::labels::POD_NAME, pod.clone()),
                    )
                    .await
                    .expect("containers");
                assert_eq!(containers.len(), 1, "{pod}: {containers:?}");
            }
            agent.stop().await;
        },
    )
    .await;
}
