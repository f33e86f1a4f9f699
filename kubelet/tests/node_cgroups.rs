//! The pods' cgroup tree on the real kernel and containerd, in API-server
//! mode: with `kubeReserved` and `systemReserved`, the Node's allocatable is
//! capacity minus them and the hard eviction threshold, `kubepods` is limited
//! to capacity minus the reservations, and each pod's cgroup carries the
//! limits its spec asks for, with its containers inside it. The same test
//! runs on the hybrid hosts (cgroup v1 files) and in `cargo xtask vm-test`'s
//! guests on pure cgroup v2 (the v2 files, and the containers' group OOM
//! kill that upstream asks for there).
//!
//! The API-mode test joins the real control plane when `EVLET_E2E_CLUSTER`
//! names one (the scheduler places its pods; a RuntimeClass gives one its
//! overhead), else the mock: the qemu guests have no control plane.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::path::PathBuf;
use std::time::Duration;

use cluster::{Api, Backend, api_e2e};
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::{IMAGE, World, e2e};

fn api_pod(api: &Api, w: &World, name: &str, resources: Value) -> Value {
    api.pod(
        w,
        name,
        json!({"terminationGracePeriodSeconds": 1,
               "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                               "resources": resources}]}),
    )
}

/// A pod's UID.
fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("uid").to_owned()
}

/// The host's cgroup files: v1 controllers (hybrid hosts) or pure v2.
#[derive(Debug)]
enum Cgroups {
    V1,
    V2(PathBuf),
}

impl Cgroups {
    fn detect() -> Self {
        if evlet::cgroups::v1_controller_root("memory").is_some() {
            Self::V1
        } else {
            Self::V2(evlet::cgroups::v2_root().expect("a pure cgroup v2 hierarchy"))
        }
    }

    /// A file of the cgroup `path`: `controller` names the v1 hierarchy.
    fn read(&self, controller: &str, path: &str, file: &str) -> String {
        let root = match self {
            Self::V1 => evlet::cgroups::v1_controller_root(controller).expect("a v1 controller"),
            Self::V2(root) => root.clone(),
        };
        let p = root.join(path.trim_start_matches('/')).join(file);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_owned()
    }

    /// The directory of the cgroup `path` (in the memory hierarchy on v1).
    fn dir(&self, path: &str) -> PathBuf {
        let root = match self {
            Self::V1 => evlet::cgroups::v1_controller_root("memory").expect("a v1 controller"),
            Self::V2(root) => root.clone(),
        };
        root.join(path.trim_start_matches('/'))
    }

    /// Whether the cgroup `path` exists (in the memory hierarchy on v1).
    fn exists(&self, path: &str) -> bool {
        self.dir(path).is_dir()
    }

    /// Makes the cgroup `path` (in the memory hierarchy on v1).
    fn make(&self, path: &str) {
        let dir = self.dir(path);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }

    /// Moves the process `pid` into a new cgroup `stray` below `path` (in
    /// the memory hierarchy on v1), as a container's would be: on v2 a
    /// cgroup that passes controllers down holds no processes itself.
    fn enter(&self, path: &str, pid: u32) {
        let stray = format!("{path}/stray");
        self.make(&stray);
        let procs = self.dir(&stray).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    }

    /// The memory limit (`memory.limit_in_bytes`, `memory.max`).
    fn memory(&self, path: &str) -> String {
        match self {
            Self::V1 => self.read("memory", path, "memory.limit_in_bytes"),
            Self::V2(_) => self.read("memory", path, "memory.max"),
        }
    }

    /// The CPU weight, as v1 shares; on v2 `cpu.weight`, which the test
    /// expects converted from shares as upstream kubelet converts them.
    fn shares(&self, path: &str) -> String {
        self.read("cpu", path, self.shares_file())
    }

    fn shares_file(&self) -> &'static str {
        match self {
            Self::V1 => "cpu.shares",
            Self::V2(_) => "cpu.weight",
        }
    }

    /// What the agent writes for `shares` (its own cgroups: pods, QoS tiers).
    fn expect_shares(&self, shares: i64) -> String {
        match self {
            Self::V1 => shares.to_string(),
            Self::V2(_) => {
                evlet::cm::limits::shares_to_weight(u64::try_from(shares).expect("shares"))
                    .to_string()
            }
        }
    }

    /// What the runtime may write for `shares` in a container's cgroup on v2:
    /// runc ≥ 1.3 converts as upstream kubelet does, older ones linearly
    /// (`1 + (shares - 2) * 9999 / 262142`; upstream's own node tests accept
    /// both).
    fn runtime_shares(&self, shares: i64) -> Vec<String> {
        match self {
            Self::V1 => vec![shares.to_string()],
            Self::V2(_) => vec![
                self.expect_shares(shares),
                (1 + (shares - 2) * 9999 / 262_142).to_string(),
            ],
        }
    }

    /// The CPU limit as `quota period` (v1: `-1` for none; v2: `max`).
    fn quota(&self, path: &str) -> String {
        match self {
            Self::V1 => format!(
                "{} {}",
                self.read("cpu", path, "cpu.cfs_quota_us"),
                self.read("cpu", path, "cpu.cfs_period_us")
            ),
            Self::V2(_) => self.read("cpu", path, "cpu.max"),
        }
    }

    fn expect_no_quota(&self) -> &'static str {
        match self {
            Self::V1 => "-1 100000",
            Self::V2(_) => "max 100000",
        }
    }
}

/// The path of upstream's cgroup name `parts` under the cgroup root `root`,
/// as the node's driver spells it: cgroupfs joins the parts with `/`; systemd
/// nests one slice per prefix, named by the parts so far joined with `-` (a
/// `-` inside a part becomes `_`): `kubepods-burstable-pod<uid>.slice`.
fn cgroup_path(root: &str, parts: &[&str]) -> String {
    let all: Vec<String> = root
        .split('/')
        .filter(|p| !p.is_empty())
        .chain(parts.iter().copied())
        .map(str::to_owned)
        .collect();
    match support::cgroup_driver() {
        evlet::cm::Driver::Cgroupfs => format!("/{}", all.join("/")),
        evlet::cm::Driver::Systemd => (1..=all.len())
            .map(|n| {
                let name: Vec<String> = all[..n].iter().map(|p| p.replace('-', "_")).collect();
                format!("/{}.slice", name.join("-"))
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn node_allocatable_and_pod_cgroups_carry_the_limits_of_the_specs() {
    api_e2e(
        "node_allocatable_and_pod_cgroups_carry_the_limits_of_the_specs",
        Backend::RealOrMock,
        |w, api| async move {
            let ns = api.ns();
            let mut config = w.config();
            config.api = Some(api.agent_client().await);
            let reserved = |pairs: &[(&str, &str)]| {
                evlet::cm::allocatable::parse_reserved(
                    "test",
                    &pairs
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                )
                .expect("valid")
            };
            config.reservations = evlet::cm::allocatable::Reservations {
                kube: reserved(&[("cpu", "100m"), ("memory", "256Mi")]),
                system: reserved(&[("memory", "256Mi")]),
                enforce_pods: true,
            };
            config.pod_pids_limit = 512;
            let root = config.cgroup_root.clone();
            let path = |parts: &[&str]| cgroup_path(&root, parts);
            let kubepods = path(&["kubepods"]);
            let cg = Cgroups::detect();
            let agent = w.start_with(config.clone()).await;
            let machine = evlet::machine::Machine::read(w.root.path());
            let cpus = i64::try_from(machine.cpus).expect("cpus");
            let memory = i64::try_from(machine.memory).expect("memory");

            // kubepods: capacity minus the reservations (no eviction threshold).
            assert_eq!(
                cg.memory(&kubepods),
                // The kernel keeps whole pages.
                ((memory - (512 << 20)) / 4096 * 4096).to_string()
            );
            assert_eq!(
                cg.shares(&kubepods),
                cg.expect_shares((cpus * 1000 - 100) * 1024 / 1000)
            );
            assert_eq!(
                cg.shares(&path(&["kubepods", "besteffort"])),
                cg.expect_shares(2)
            );

            // The Node's allocatable: also minus the hard memory threshold (100Mi).
            let node = eventually(Duration::from_secs(20), "the Node", || async {
                api.get("nodes", "", &w.name)
                    .await
                    .filter(|n| !n["status"]["allocatable"].is_null())
            })
            .await;
            assert_eq!(
                node["status"]["allocatable"]["memory"],
                format!("{}Ki", (memory - (612 << 20)) / 1024),
                "{:#}",
                node["status"]
            );
            assert_eq!(
                node["status"]["allocatable"]["cpu"],
                format!("{}m", cpus * 1000 - 100)
            );
            assert_eq!(
                node["status"]["capacity"]["cpu"],
                cpus.to_string(),
                "capacity stays"
            );

            // With a RuntimeClass's overhead (the API server copies it into
            // the spec): it adds to the pod cgroup's requests and limits.
            let overhead = json!({"cpu": "50m", "memory": "32Mi"});
            let mut guaranteed = api_pod(
                &api,
                &w,
                "guaranteed",
                json!({"limits": {"cpu": "200m", "memory": "64Mi"}}),
            );
            if api.is_real() {
                let class = format!("overhead-{}", w.name);
                api.create(
                    "runtimeclasses",
                    "",
                    json!({"metadata": {"name": class},
                    "handler": "runc", "overhead": {"podFixed": overhead}}),
                )
                .await;
                guaranteed["spec"]["runtimeClassName"] = json!(class);
            } else {
                guaranteed["spec"]["overhead"] = overhead;
            }
            let guaranteed = uid(&api.create("pods", ns, guaranteed).await);
            let burstable = api_pod(
                &api,
                &w,
                "burstable",
                json!({"requests": {"cpu": "100m"}, "limits": {"memory": "128Mi"}}),
            );
            let burstable = uid(&api.create("pods", ns, burstable).await);
            let besteffort = api_pod(&api, &w, "besteffort", json!({}));
            let besteffort = uid(&api.create("pods", ns, besteffort).await);
            for name in ["guaranteed", "burstable", "besteffort"] {
                let pod = w.pod_name(name);
                agent
                    .wait_status(&pod, "running", Duration::from_secs(30), |s| {
                        support::running(s, "app").then_some(())
                    })
                    .await;
            }
            let g = path(&["kubepods", &format!("pod{guaranteed}")]);
            assert_eq!(cg.shares(&g), cg.expect_shares(256));
            assert_eq!(cg.quota(&g), "25000 100000");
            assert_eq!(cg.memory(&g), (96 << 20).to_string());
            assert_eq!(cg.read("pids", &g, "pids.max"), "512");
            let b = path(&["kubepods", "burstable", &format!("pod{burstable}")]);
            assert_eq!(cg.shares(&b), cg.expect_shares(102));
            assert_eq!(cg.quota(&b), cg.expect_no_quota(), "no CPU limit declared");
            assert_eq!(cg.memory(&b), (128 << 20).to_string());
            let e = path(&["kubepods", "besteffort", &format!("pod{besteffort}")]);
            assert_eq!(cg.shares(&e), cg.expect_shares(2));
            assert_eq!(cg.read("pids", &e, "pids.max"), "512");
            // The burstable tier follows its pods' requests (housekeeping, 2 s).
            eventually(Duration::from_secs(10), "burstable tier shares", || async {
                (cg.shares(&path(&["kubepods", "burstable"])) == cg.expect_shares(102))
                    .then_some(())
            })
            .await;
            // The container runs inside its pod's cgroup.
            let (_, pid) = support::init_pid(&w, &agent, &w.pod_name("burstable"), "app").await;
            let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
            let memory_line = cgroups
                .lines()
                .find(|l| {
                    let controllers = l.split(':').nth(1);
                    match cg {
                        Cgroups::V1 => {
                            controllers.is_some_and(|c| c.split(',').any(|c| c == "memory"))
                        }
                        Cgroups::V2(_) => controllers == Some(""),
                    }
                })
                .expect("memory line");
            assert!(memory_line.contains(&format!("{b}/")), "{memory_line}");
            // On v2 an OOM kill takes the container's every process, as
            // upstream asks the runtime (`memory.oom.group`); v1 has no such file.
            if let Cgroups::V2(_) = cg {
                let container = memory_line.splitn(3, ':').nth(2).expect("path");
                assert_eq!(cg.read("memory", container, "memory.oom.group"), "1");
            }
            // The summary counts the pod's processes there (the pause process
            // and sleep), which PID pressure ranks by.
            let views: Vec<_> = agent
                .handles
                .workers
                .views()
                .into_iter()
                .filter(|v| v.pod.metadata.name.as_deref() == Some(&w.pod_name("burstable")))
                .collect();
            let summary = agent
                .handles
                .served
                .stats
                .summary(&views, true)
                .await
                .expect("summary");
            assert_eq!(
                summary.pods[0].process_stats.and_then(|p| p.process_count),
                Some(2),
                "{:?}",
                summary.pods[0].process_stats
            );
            // A pod that completed keeps neither its cgroup nor its volumes
            // (upstream's SyncTerminatedPod), while it stays Succeeded.
            let mut done = api_pod(&api, &w, "done", json!({"requests": {"cpu": "10m"}}));
            done["spec"]["restartPolicy"] = json!("Never");
            done["spec"]["containers"][0]["command"] = json!(["true"]);
            done["spec"]["containers"][0]["volumeMounts"] =
                json!([{"name": "scratch", "mountPath": "/scratch"}]);
            done["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
            let done = uid(&api.create("pods", ns, done).await);
            let d = path(&["kubepods", "burstable", &format!("pod{done}")]);
            let done_dir = w.root.path().join("pods").join(&done);
            agent
                .wait_status(
                    &w.pod_name("done"),
                    "Succeeded",
                    Duration::from_secs(30),
                    |s| (s.phase.as_deref() == Some("Succeeded")).then_some(()),
                )
                .await;
            eventually(
                Duration::from_secs(20),
                "the completed pod's cgroup and directory removed",
                || async { (!cg.exists(&d) && !done_dir.exists()).then_some(()) },
            )
            .await;
            // The burstable tier's shares leave it once the QoS cgroups are
            // brought in line (every minute; not waited for here).
            api.delete_pod(ns, &w.pod_name("done"), Some(0)).await;
            // An orphan's cgroup goes too: the burstable pod, deleted while
            // the agent is down, is found in the runtime with no spec to tell
            // its QoS class.
            agent.stop().await;
            api.delete_pod(ns, &w.pod_name("burstable"), Some(0)).await;
            // A pod cgroup of a pod the runtime no longer has either (as
            // after a node's runtime state was wiped) goes too, as upstream's
            // cleanupOrphanedPodCgroups removes it. With the systemd driver
            // only systemd makes slices: there the orphan slice is not faked.
            let gone = path(&["kubepods", "besteffort", "pod0f1e2d3c-gone"]);
            if support::cgroup_driver() == evlet::cm::Driver::Cgroupfs {
                cg.make(&gone);
            }
            let agent = w.start_with(config).await;
            eventually(
                Duration::from_secs(60),
                "the orphan's cgroup removed",
                || async { (!cg.exists(&b)).then_some(()) },
            )
            .await;
            eventually(
                Duration::from_secs(20),
                "the cgroup of a pod the runtime does not have removed",
                || async { (!cg.exists(&gone)).then_some(()) },
            )
            .await;
            assert!(cg.exists(&g), "the guaranteed pod's cgroup stays");
            // A process left in a deleted pod's cgroup is killed and the
            // cgroup goes all the same (upstream's pod container manager).
            let stray = Stray::spawn();
            cg.enter(&g, stray.pid());
            for name in ["guaranteed", "besteffort"] {
                api.delete_pod(ns, &w.pod_name(name), Some(0)).await;
            }
            let killed = eventually(
                Duration::from_secs(30),
                "the stray process killed",
                || async { stray.exited() },
            )
            .await;
            eventually(
                Duration::from_secs(30),
                "the deleted pod's cgroup removed",
                || async { (!cg.exists(&g)).then_some(()) },
            )
            .await;
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&killed),
                Some(libc::SIGKILL),
                "{killed}"
            );
            agent.stop().await;
        },
    )
    .await;
}

/// A `sleep` the test started, killed and reaped when dropped, so a failed
/// test leaves none behind.
struct Stray(std::sync::Mutex<std::process::Child>);

impl Stray {
    fn spawn() -> Self {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        Self(std::sync::Mutex::new(child))
    }

    fn pid(&self) -> u32 {
        self.0.lock().expect("child").id()
    }

    /// How it ended, once it has.
    fn exited(&self) -> Option<std::process::ExitStatus> {
        self.0.lock().expect("child").try_wait().expect("wait")
    }
}

impl Drop for Stray {
    fn drop(&mut self) {
        if let Ok(child) = self.0.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The cgroup `pid` is in for the memory controller (v1) or the unified
/// hierarchy (v2), relative to the hierarchy's root.
fn cgroup_of(cg: &Cgroups, pid: u32) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let line = cgroups
        .lines()
        .find(|l| {
            let controllers = l.split(':').nth(1);
            match cg {
                Cgroups::V1 => controllers.is_some_and(|c| c.split(',').any(|c| c == "memory")),
                Cgroups::V2(_) => controllers == Some(""),
            }
        })
        .expect("memory line");
    line.splitn(3, ':').nth(2).expect("path").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pods_own_resources_limit_its_cgroup_and_the_containers_without_limits() {
    e2e(
        "a_pods_own_resources_limit_its_cgroup_and_the_containers_without_limits",
        |w| async move {
            let config = w.config();
            let root = config.cgroup_root.clone();
            let cg = Cgroups::detect();
            let agent = w.start_with(config).await;
            // Pod-level requests and limits (upstream's PodLevelResources):
            // `a` sets nothing and runs with the pod's limits, which the
            // downward API shows it; `b` keeps its own.
            w.write(
                "own.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: own}}\nspec:\n  terminationGracePeriodSeconds: 1\n  resources:\n    requests: {{cpu: 250m, memory: 64Mi}}\n    limits: {{cpu: 500m, memory: 128Mi}}\n  containers:\n  - name: a\n    image: {IMAGE}\n    command: [sleep, '3600']\n    env:\n    - name: MEMORY_LIMIT\n      valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}\n  - name: b\n    image: {IMAGE}\n    command: [sleep, '3600']\n    resources: {{limits: {{cpu: 100m, memory: 32Mi}}}}\n"
                ),
            );
            let pod = w.pod_name("own");
            let status = agent
                .wait_status(&pod, "running", Duration::from_secs(30), |s| {
                    (support::running(s, "a") && support::running(s, "b")).then(|| s.clone())
                })
                .await;
            assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
            let (_, a) = support::init_pid(&w, &agent, &pod, "a").await;
            let (_, b) = support::init_pid(&w, &agent, &pod, "b").await;
            let container_a = cgroup_of(&cg, a);
            let container_b = cgroup_of(&cg, b);
            let pod_cgroup = container_a
                .rsplit_once('/')
                .map(|(parent, _)| parent.to_owned())
                .expect("a pod cgroup above the container's");
            assert!(
                pod_cgroup.starts_with(&cgroup_path(&root, &["kubepods", "burstable"])),
                "{pod_cgroup}"
            );
            // The pod's cgroup: shares from its request, its limits.
            assert_eq!(cg.shares(&pod_cgroup), cg.expect_shares(256));
            assert_eq!(cg.quota(&pod_cgroup), "50000 100000");
            assert_eq!(cg.memory(&pod_cgroup), (128 << 20).to_string());
            // a: the pod's limits, and (upstream's rule for a container that
            // requests no CPU) shares from its CPU limit.
            assert_eq!(cg.memory(&container_a), (128 << 20).to_string());
            assert_eq!(cg.quota(&container_a), "50000 100000");
            let weight = cg.shares(&container_a);
            assert!(
                cg.runtime_shares(512).contains(&weight),
                "{weight}, not one of {:?}",
                cg.runtime_shares(512)
            );
            let environ = std::fs::read(format!("/proc/{a}/environ")).expect("environ");
            assert!(
                environ
                    .split(|b| *b == 0)
                    .any(|v| v == b"MEMORY_LIMIT=128"),
                "{}",
                String::from_utf8_lossy(&environ)
            );
            // b: its own.
            assert_eq!(cg.memory(&container_b), (32 << 20).to_string());
            assert_eq!(cg.quota(&container_b), "10000 100000");
            w.remove("own.yaml");
            agent.stop().await;
        },
    )
    .await;
}
