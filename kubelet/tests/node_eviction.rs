//! The eviction manager end to end, on the real kernel and containerd, in
//! API-server mode (static pods are critical: upstream never evicts them).
//!
//! A memory hog in a Burstable pod drives the node's `memory.available` below
//! an `evictionHard` placed 2 GiB under what was available when the agent
//! started. A sampler in this test reads the same numbers the agent reads
//! (the root memory cgroup) every millisecond and notes when they crossed the
//! threshold; the Evicted event's time is the agent's decision. The test runs
//! once with the kernel's memory notification and once with the 10 s timer
//! alone, and prints both latencies side by side.
//!
//! A BestEffort pod is evicted before a Guaranteed one that uses more memory
//! but stays within its request (upstream ranks by usage over requests first).
//!
//! An emptyDir written past its `sizeLimit`, and a container writing past its
//! `limits.ephemeral-storage`, evict their pods, and only them.
//!
//! The agent joins the real control plane (`support/cluster.rs`): the
//! scheduler places the pods, and the node lifecycle controller taints the
//! node while it reports MemoryPressure.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use cluster::{Api, Backend, api_e2e};
use evlet::machine::NodeMemory;
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::{IMAGE, World};

/// How far below the available memory at the start the threshold sits, and
/// how much the Guaranteed hog takes (well past it; other tests on the machine
/// move memory by less than the margin).
const MARGIN: u64 = 2 << 30;
const HOG_MIB: u64 = 3 << 10;
/// How far past the threshold the Burstable hog takes the node, sized from
/// what is available when it starts.
const PAST_MIB: u64 = 1 << 10;

fn available() -> u64 {
    NodeMemory::read(evlet::cgroups::memcg_v1_root().as_deref())
        .expect("node memory")
        .available()
}

/// Notes when `memory.available` first went below `threshold` (Unix ns).
struct Sampler {
    crossed: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(threshold: u64) -> Self {
        let crossed = Arc::new(AtomicI64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (crossed, stop) = (Arc::clone(&crossed), Arc::clone(&stop));
            move || {
                let root = evlet::cgroups::memcg_v1_root();
                while !stop.load(Ordering::Relaxed) {
                    let now = evlet::clock::unix_ns();
                    if let Some(m) = NodeMemory::read(root.as_deref())
                        && m.available() < threshold
                    {
                        let _ =
                            crossed.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Self {
            crossed,
            stop,
            thread: Some(thread),
        }
    }

    fn crossed_at(&self) -> Option<i64> {
        Some(self.crossed.load(Ordering::Relaxed)).filter(|t| *t != 0)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn sleeper(resources: Value) -> Value {
    json!({"containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                           "resources": resources}],
           "terminationGracePeriodSeconds": 30})
}

/// The pod's running containers (`pod` as the API names it).
async fn running(w: &World, pod: &str) -> usize {
    w.client
        .list_containers(
            evlet_cri::ContainerFilter::new()
                .label(evlet::pod::labels::POD_NAME, pod.to_owned())
                .state(evlet_cri::api::ContainerState::ContainerRunning),
        )
        .await
        .expect("list")
        .len()
}

/// The agent's configuration with `evictionHard`'s `memory.available` at
/// `threshold` (the kernel's notification as `kernel` says, else the default).
fn memory_config(w: &World, threshold: u64, kernel: Option<bool>) -> evlet::config::Config {
    let mut config = w.config();
    config.eviction = evlet::eviction::thresholds::parse(&evlet::eviction::thresholds::Config {
        hard: Some(
            [(
                "memory.available".to_owned(),
                format!("{}Ki", threshold >> 10),
            )]
            .into(),
        ),
        kernel_notification: kernel,
        ..Default::default()
    })
    .expect("valid thresholds");
    config
}

/// One run: the agent, a Guaranteed and a BestEffort sleeper, then the hog.
/// Returns the time from the crossing to the eviction decision.
/// Each round is a new agent of the same node: what it leaves in the API is
/// deleted at its end.
async fn hog_is_evicted(w: &Arc<World>, api: &Api, round: &str, kernel: bool) -> Duration {
    let ns = api.ns();
    let threshold = available().saturating_sub(MARGIN);
    let agent = api
        .start(w, memory_config(w, threshold, Some(kernel)))
        .await;
    let guaranteed = format!("guaranteed{round}");
    let besteffort = format!("besteffort{round}");
    let hog = format!("hog{round}");
    api.create(
        "pods",
        ns,
        api.pod(
            w,
            &guaranteed,
            sleeper(json!({"requests": {"memory": "64Mi", "cpu": "100m"},
                           "limits": {"memory": "64Mi", "cpu": "100m"}})),
        ),
    )
    .await;
    api.create("pods", ns, api.pod(w, &besteffort, sleeper(json!({}))))
        .await;
    for p in [&guaranteed, &besteffort] {
        // The node's memory-pressure taint of the round before goes once
        // this agent reports no pressure; the scheduler places them then.
        api.wait_phase(&w.pod_name(p), "Running", Duration::from_secs(60))
            .await;
    }
    let sampler = Sampler::start(threshold);
    // Sized now: memory another test held when the threshold was set may have
    // been freed since.
    let hog_mib = (available().saturating_sub(threshold) >> 20) + PAST_MIB;
    api.create(
        "pods",
        ns,
        api.pod(
            w,
            &hog,
            json!({"containers": [{"name": "hog", "image": IMAGE,
                                   "command": ["/bin/memhog", hog_mib.to_string()],
                                   "resources": {"requests": {"memory": "64Mi"},
                                                 "limits": {"memory": format!("{}Mi", hog_mib + 512)}}}]}),
        ),
    ).await;
    let hog_name = w.pod_name(&hog);
    let failed = api
        .wait_phase(&hog_name, "Failed", Duration::from_secs(60))
        .await;
    assert_eq!(failed["status"]["reason"], "Evicted", "{failed:#}");
    let message = failed["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: memory. Threshold quantity: {}, available: ",
            // Canonical, as upstream's Quantity prints it: 16959Mi, not 17366016Ki.
            evlet::eviction::rank::quantity(((threshold >> 10) << 10) as i64, true)
        )) && message.contains("Container hog was using ")
            && message.ends_with(", request is 64Mi, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = failed["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
        .unwrap_or_else(|| panic!("no DisruptionTarget: {failed:#}"));
    assert_eq!(disruption["reason"], "TerminationByKubelet");
    // The decision: the Evicted event's time.
    let event = agent
        .handles
        .diagnostics
        .events()
        .into_iter()
        .find(|e| e.reason == "Evicted" && e.pod == hog_name)
        .expect("an Evicted event");
    assert_eq!(event.kind, "Warning");
    let decided: k8s_openapi::jiff::Timestamp = event.time.parse().expect("event time");
    let crossed = sampler.crossed_at().expect("the sampler saw the crossing");
    let latency = decided.as_nanosecond() - i128::from(crossed);
    drop(sampler);
    // `/debug/eviction` names the pass that evicted and what woke it.
    // The diagnostics are on the node-local socket (and the secured port), not the read-only port.
    let socket = agent
        .handles
        .local_socket
        .clone()
        .expect("the local socket");
    let (code, body) = evlet::server::local::Client::new(socket)
        .get("/debug/eviction")
        .await
        .expect("/debug/eviction");
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(code, 200);
    let journal: Value = serde_json::from_str(&body).expect("JSON");
    let acted = journal["acting"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|p| p["evicted"] == format!("{ns}/{hog_name}"))
        })
        .unwrap_or_else(|| panic!("no acting pass evicted the hog: {journal:#}"));
    assert_eq!(acted["signal"], "memory.available");
    if kernel {
        assert_eq!(acted["trigger"], "memcg", "{journal:#}");
        assert_eq!(journal["kernel"]["memcgThresholds"], 1, "{journal:#}");
    } else {
        assert_eq!(acted["trigger"], "timer", "{journal:#}");
        assert_eq!(journal["kernel"]["memcgThresholds"], 0, "{journal:#}");
    }
    // The hog's container is stopped; the others run on, not evicted.
    eventually(
        Duration::from_secs(30),
        "the hog's container stopped",
        || async {
            let (_, containers) = w.runtime_objects(&hog).await;
            (!containers.is_empty() && running(w, &hog_name).await == 0).then_some(())
        },
    )
    .await;
    for p in [&guaranteed, &besteffort] {
        let pod = api.get("pods", ns, &w.pod_name(p)).await.expect("pod");
        assert_eq!(pod["status"]["phase"], "Running", "{p} was not evicted");
    }
    // The node reports MemoryPressure; a BestEffort pod is refused while it lasts.
    eventually(
        Duration::from_secs(20),
        "MemoryPressure on the node",
        || async {
            let node = api.get("nodes", "", &w.name).await?;
            node["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| {
                    c["type"] == "MemoryPressure"
                        && c["status"] == "True"
                        && c["reason"] == "KubeletHasInsufficientMemory"
                })
                .then_some(())
        },
    )
    .await;
    // ... and the matching NoSchedule taint (the condition's, as the node
    // lifecycle controller sets it).
    eventually(
        Duration::from_secs(20),
        "the memory-pressure taint",
        || async {
            let node = api.get("nodes", "", &w.name).await?;
            node["spec"]["taints"]
                .as_array()?
                .iter()
                .any(|t| {
                    t["key"] == "node.kubernetes.io/memory-pressure" && t["effect"] == "NoSchedule"
                })
                .then_some(())
        },
    )
    .await;
    // Bound past the scheduler, which keeps pods off the tainted node: the
    // kubelet's own refusal is under test.
    let late = format!("late{round}");
    api.create("pods", ns, api.bound_pod(w, &late, sleeper(json!({}))))
        .await;
    let refused = api
        .wait_phase(&w.pod_name(&late), "Failed", Duration::from_secs(30))
        .await;
    assert_eq!(refused["status"]["reason"], "Evicted");
    assert_eq!(
        refused["status"]["message"],
        "The node had condition: [MemoryPressure]. "
    );
    for p in [&guaranteed, &besteffort, &hog, &late] {
        api.delete_pod(ns, &w.pod_name(p), Some(0)).await;
    }
    agent.stop().await;
    Duration::from_nanos(u64::try_from(latency.max(0)).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_hog_is_evicted_when_memory_available_crosses_the_threshold() {
    let _memory = support::node_memory_lock(true).await;
    api_e2e(
        "a_memory_hog_is_evicted_when_memory_available_crosses_the_threshold",
        Backend::Real,
        |w, api| async move {
            let kernel = hog_is_evicted(&w, &api, "k", true).await;
            let timer = hog_is_evicted(&w, &api, "t", false).await;
            eprintln!(
                "eviction decided after memory.available crossed the threshold: \
                 kernel notification {kernel:?}, 10 s timer {timer:?}"
            );
            assert!(
                kernel < Duration::from_secs(1),
                "the kernel's notification took {kernel:?}"
            );
            assert!(
                timer <= Duration::from_secs(12),
                "the timer took {timer:?} (its period is 10 s)"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_besteffort_pod_is_evicted_before_a_guaranteed_one_that_uses_more() {
    let _memory = support::node_memory_lock(true).await;
    api_e2e(
        "a_besteffort_pod_is_evicted_before_a_guaranteed_one_that_uses_more",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            let threshold = available().saturating_sub(MARGIN);
            let agent = api.start(&w, memory_config(&w, threshold, None)).await;
            api.create(
                "pods",
                ns,
                api.pod(&w, "besteffort", sleeper(json!({}))),
            ).await;
            let besteffort = w.pod_name("besteffort");
            api.wait_phase(&besteffort, "Running", Duration::from_secs(30)).await;
            // The Guaranteed pod takes the node past the threshold, within its
            // own request: upstream ranks pods whose usage exceeds their
            // requests first (a BestEffort pod's request is 0), however much
            // more the others use.
            let request = format!("{}Mi", HOG_MIB + 512);
            api.create(
                "pods",
                ns,
                api.pod(
                    &w,
                    "guaranteed",
                    json!({"containers": [{"name": "hog", "image": IMAGE,
                                           "command": ["/bin/memhog", HOG_MIB.to_string()],
                                           "resources": {"requests": {"memory": request, "cpu": "100m"},
                                                         "limits": {"memory": request, "cpu": "100m"}}}],
                           "terminationGracePeriodSeconds": 1}),
                ),
            ).await;
            let guaranteed = w.pod_name("guaranteed");
            let failed = api.wait_phase(&besteffort, "Failed", Duration::from_secs(60)).await;
            assert_eq!(failed["status"]["reason"], "Evicted", "{failed:#}");
            let message = failed["status"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("Container app was using ")
                    && message.ends_with(", request is 0, has larger consumption of memory. "),
                "{message}"
            );
            // The first eviction was the BestEffort pod's.
            let evicted: Vec<String> = agent
                .handles
                .diagnostics
                .events()
                .into_iter()
                .filter(|e| e.reason == "Evicted")
                .map(|e| e.pod)
                .collect();
            assert_eq!(evicted.first(), Some(&besteffort), "{evicted:?}");
            api.delete_pod(ns, &guaranteed, Some(0)).await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_storage_over_its_limits_evicts_its_pod_only() {
    api_e2e(
        "local_storage_over_its_limits_evicts_its_pod_only",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            let mut config = w.config();
            // The container GC every 2 s (upstream: every minute).
            config.container_gc.period = Duration::from_secs(2);
            let agent = api.start(&w, config).await;
            let filler = |mib: u32| {
                json!({
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c",
                            format!("dd if=/dev/zero of=/cache/fill bs=1048576 count={mib} && exec sleep 3600")],
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}],
                    "terminationGracePeriodSeconds": 30
                })
            };
            // A container writing 20 MiB to its writable layer past its 10Mi
            // limit. Its neighbour's 100Mi keeps the pod within the sum of its
            // containers' limits (upstream checks that first), so the
            // container's own limit is what evicts.
            let layer = json!({
                "containers": [
                    {"name": "app", "image": IMAGE,
                     "command": ["sh", "-c",
                         "dd if=/dev/zero of=/fill bs=1048576 count=20 && exec sleep 3600"],
                     "resources": {"limits": {"ephemeral-storage": "10Mi"}}},
                    {"name": "side", "image": IMAGE, "command": ["sleep", "3600"],
                     "resources": {"limits": {"ephemeral-storage": "100Mi"}}}],
                "terminationGracePeriodSeconds": 30
            });
            api.create("pods", ns, api.pod(&w, "over", filler(20))).await;
            api.create("pods", ns, api.pod(&w, "layer", layer)).await;
            let mut under = filler(5);
            under["containers"][0]["resources"] = json!({"limits": {"ephemeral-storage": "50Mi"}});
            api.create("pods", ns, api.pod(&w, "under", under)).await;
            let over = w.pod_name("over");
            // One pass every 10 s: the pod is Failed within two of them.
            let failed = api.wait_phase(&over, "Failed", Duration::from_secs(45)).await;
            assert_eq!(failed["status"]["reason"], "Evicted", "{failed:#}");
            assert_eq!(
                failed["status"]["message"],
                "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". "
            );
            // Upstream gives a local storage eviction no DisruptionTarget.
            let disrupted = failed["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "DisruptionTarget"));
            assert!(!disrupted, "{failed:#}");
            assert!(
                agent
                    .handles
                    .diagnostics
                    .events()
                    .iter()
                    .any(|e| e.reason == "Evicted" && e.pod == over && e.kind == "Warning"),
                "an Evicted event"
            );
            // As upstream, the evicted pod keeps nothing on the node: its
            // emptyDir's content goes with its volumes, and the container GC
            // removes its containers and sandbox, while its status keeps the
            // container's terminated state.
            let uid = failed["metadata"]["uid"].as_str().expect("uid").to_owned();
            let pod_dir = w.root.path().join("pods").join(&uid);
            eventually(
                Duration::from_secs(10),
                "the evicted pod's volumes removed",
                || async { (!pod_dir.exists()).then_some(()) },
            )
            .await;
            eventually(
                Duration::from_secs(20),
                "the evicted pod's containers and sandbox removed",
                || async {
                    let (sandboxes, containers) = w.runtime_objects("over").await;
                    (sandboxes.is_empty() && containers.is_empty()).then_some(())
                },
            )
            .await;
            // A status computed after the removal (a changed pod makes the
            // worker compute one) still shows it.
            api.modify("pods", ns, &over, |pod| {
                pod["metadata"]["labels"] = json!({"touched": "after-gc"});
            })
            .await;
            let recomputed = eventually(
                Duration::from_secs(10),
                "a status computed for the changed pod",
                || async {
                    agent.handles.workers.views().into_iter().find_map(|v| {
                        let labels = v.pod.metadata.labels.as_ref()?;
                        (v.pod.metadata.name.as_deref() == Some(over.as_str())
                            && labels.get("touched").map(String::as_str) == Some("after-gc"))
                        .then_some(v.status)
                    })
                },
            )
            .await;
            assert_eq!(recomputed.phase.as_deref(), Some("Failed"));
            let app = support::container(&recomputed, "app").expect("app's status");
            assert!(
                app.state.as_ref().is_some_and(|s| s.terminated.is_some()),
                "the terminated state stays: {app:?}"
            );
            let patched = api.get("pods", ns, &over).await.expect("pod");
            assert!(
                patched["status"]["containerStatuses"][0]["state"]["terminated"].is_object(),
                "the terminated state stays: {patched:#}"
            );
            // The writable layer's usage comes from the runtime's snapshot
            // statistics (containerd refreshes them every 10 s).
            let layer = api.wait_phase(&w.pod_name("layer"), "Failed", Duration::from_secs(60)).await;
            assert_eq!(layer["status"]["reason"], "Evicted", "{layer:#}");
            assert_eq!(
                layer["status"]["message"],
                "Container app exceeded its local ephemeral storage limit \"10Mi\". "
            );
            let under = api
                .get("pods", ns, &w.pod_name("under"))
                .await
                .expect("pod");
            assert_eq!(under["status"]["phase"], "Running", "{under:#}");
            let (_, _, metrics) = support::http_get(agent.handles.address.expect("the read-only port"), "/metrics").await;
            assert!(
                metrics
                    .lines()
                    .any(|l| l == "kubelet_evictions{eviction_signal=\"emptydirfs.limit\"} 1"),
                "kubelet_evictions counts it"
            );
            assert!(
                metrics.lines().any(
                    |l| l == "kubelet_evictions{eviction_signal=\"ephemeralcontainerfs.limit\"} 1"
                ),
                "and the container's"
            );
            api.delete_pod(ns, &w.pod_name("under"), Some(0)).await;
            agent.stop().await;
        },
    )
    .await;
}
