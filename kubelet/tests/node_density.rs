//! Density: many pods started and deleted leave nothing of theirs behind —
//! no sandbox or container in the runtime, no pod cgroup in any hierarchy, no
//! mount of their containers, no pod directory — including pods deleted while
//! they are still starting.
//!
//! `EVLET_DENSITY_PODS` sets the count (default 500; `cargo xtask test` runs
//! it with fewer to stay in CI's time budget, see `xtask/src/test.rs`).

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use evlet::pod::labels;
use evlet_cri::api::{Container, PodSandbox};
use evlet_cri::{ContainerFilter, SandboxFilter};
use evlet_testkit::eventually;
use support::{IMAGE, World, e2e, running};

fn pods() -> usize {
    std::env::var("EVLET_DENSITY_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

fn sleeper(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [/bin/sleep, '86400']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n"
    )
}

/// Every sandbox and container in the runtime. A list call that fails is
/// retried for a minute: with hundreds of pods being torn down on two cores a
/// list can outlast the client's 15 s deadline, and that says nothing about
/// what the agent left behind.
async fn runtime_listing(w: &World) -> (Vec<PodSandbox>, Vec<Container>) {
    let started = std::time::Instant::now();
    loop {
        let listing = async {
            let sandboxes = w.client.list_pod_sandbox(SandboxFilter::new()).await?;
            let containers = w.client.list_containers(ContainerFilter::new()).await?;
            Ok::<_, evlet_cri::Error>((sandboxes, containers))
        };
        match listing.await {
            Ok(listing) => return listing,
            Err(err) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("listing the runtime's objects failed, retrying: {err}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => panic!("the runtime's objects cannot be listed for a minute: {err}"),
        }
    }
}

/// IDs of this test's sandboxes and containers still in the runtime.
async fn leftovers(w: &World) -> (Vec<String>, Vec<String>) {
    let ours = |labels: &std::collections::HashMap<String, String>| {
        labels
            .get(labels::POD_NAME)
            .is_some_and(|n| n.ends_with(&format!("-{}", w.name)))
    };
    let (sandboxes, containers) = runtime_listing(w).await;
    (
        sandboxes
            .into_iter()
            .filter(|s| ours(&s.labels))
            .map(|s| s.id)
            .collect(),
        containers
            .into_iter()
            .filter(|c| ours(&c.labels))
            .map(|c| c.id)
            .collect(),
    )
}

/// The cgroup hierarchies' roots: each v1 controller's mount, and the v2 one.
fn hierarchies() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    roots.push("/sys/fs/cgroup".into());
    roots
}

/// The agent's cgroup names for this test's node (its driver, its root).
fn names(w: &World) -> evlet::cm::Names {
    evlet::cm::Names::new(
        support::cgroup_driver(),
        &format!("{}/{}", w.node.cgroup_root, w.name),
    )
}

/// Pod cgroups under the test's cgroup root, in every hierarchy: the
/// directories in the pods' cgroup or a QoS tier that the agent's own naming
/// (either driver's) takes for a pod's.
fn pod_cgroups(w: &World) -> Vec<PathBuf> {
    let names = names(w);
    let mut found = Vec::new();
    for root in hierarchies() {
        for parent in names.pod_parents() {
            let dir = root.join(parent.trim_start_matches('/'));
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let leaf = entry.file_name().to_string_lossy().into_owned();
                if entry.file_type().is_ok_and(|t| t.is_dir())
                    && names.pod_uid_of(&parent, &leaf).is_some()
                {
                    found.push(entry.path());
                }
            }
        }
    }
    found
}

/// Mount points of runtime objects that no longer exist (a container's
/// rootfs, a sandbox's shm: paths under the node's directory with a 64-hex
/// ID component the runtime does not list), plus anything mounted under the
/// agent's root directory.
async fn stale_mounts(w: &World) -> Vec<String> {
    let (sandboxes, containers) = runtime_listing(w).await;
    let live: BTreeSet<String> = sandboxes
        .into_iter()
        .map(|s| s.id)
        .chain(containers.into_iter().map(|c| c.id))
        .collect();
    let root = w.root.path().display().to_string();
    let node = w.node.node_dir.clone();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .filter(|point| {
            point.starts_with(&root)
                || (!node.is_empty()
                    && point.starts_with(&node)
                    && point.split('/').any(|part| {
                        part.len() == 64
                            && part.bytes().all(|b| b.is_ascii_hexdigit())
                            && !live.contains(part)
                    }))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn many_pods_and_a_burst_deleted_while_starting_leave_nothing_behind() {
    // Hundreds of shims: not while another line's test moves the machine's
    // memory across an eviction threshold.
    let _memory = support::node_memory_lock(false).await;
    e2e(
        "many_pods_and_a_burst_deleted_while_starting_leave_nothing_behind",
        |w| async move {
            let n = pods();
            let burst = (n / 10).max(5);
            let agent = w.start().await;
            for i in 0..n {
                w.write(&format!("d{i}.yaml"), &sleeper(&format!("d{i}")));
            }
            let names: Vec<String> = (0..n).map(|i| w.pod_name(&format!("d{i}"))).collect();
            let limit = Duration::from_secs(120 + n as u64);
            eventually(limit, "every pod running", || async {
                names
                    .iter()
                    .all(|p| agent.status(p).is_some_and(|s| running(&s, "c")))
                    .then_some(())
            })
            .await;
            let (sandboxes, containers) = leftovers(&w).await;
            assert_eq!(
                (sandboxes.len(), containers.len()),
                (n, n),
                "one sandbox and one container per pod"
            );

            // A burst deleted while it starts: some sandboxes are being made,
            // some containers created and not yet started.
            for i in 0..burst {
                w.write(&format!("x{i}.yaml"), &sleeper(&format!("x{i}")));
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for i in 0..burst {
                w.remove(&format!("x{i}.yaml"));
            }
            for i in 0..n {
                w.remove(&format!("d{i}.yaml"));
            }
            eventually(
                Duration::from_secs(120 + n as u64),
                "the runtime holds nothing of the test's pods",
                || async {
                    let (s, c) = leftovers(&w).await;
                    if s.is_empty() && c.is_empty() {
                        return Some(());
                    }
                    // Whole-runtime lists are heavy while hundreds of pods go.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    None
                },
            )
            .await;
            // The agent removes the pods' cgroups and directories after the runtime objects.
            let pods_dir = w.root.path().join("pods");
            eventually(
                Duration::from_secs(30),
                "no pod cgroup and no pod directory left",
                || async {
                    let dirs = std::fs::read_dir(&pods_dir).map_or(0, |d| d.count());
                    (pod_cgroups(&w).is_empty() && dirs == 0).then_some(())
                },
            )
            .await;
            let mounts = stale_mounts(&w).await;
            assert!(mounts.is_empty(), "mounts left behind: {mounts:?}");
            agent.stop().await;
        },
    )
    .await;
}

/// The leak check above finds what it is meant to: a pod cgroup planted in
/// every hierarchy, in each of the three places a pod's cgroup can be.
#[tokio::test(flavor = "multi_thread")]
async fn the_leak_check_finds_a_planted_pod_cgroup_in_every_hierarchy() {
    e2e(
        "the_leak_check_finds_a_planted_pod_cgroup_in_every_hierarchy",
        |w| async move {
            assert!(pod_cgroups(&w).is_empty(), "a new node has no pod cgroup");
            let mut planted = Vec::new();
            for root in hierarchies()
                .into_iter()
                .filter(|r| r.join("cgroup.procs").exists())
            {
                for placement in names(&w).pod_placements("planted-0000") {
                    let dir = root.join(placement.trim_start_matches('/'));
                    std::fs::create_dir_all(&dir)
                        .unwrap_or_else(|e| panic!("plant {}: {e}", dir.display()));
                    planted.push(dir);
                }
            }
            assert!(!planted.is_empty(), "no cgroup hierarchy to plant in");
            let mut found = pod_cgroups(&w);
            found.sort();
            planted.sort();
            assert_eq!(found, planted, "the check finds every planted pod cgroup");
            // The world's clean-up removes them with the rest of its cgroups.
        },
    )
    .await;
}
