//! `compute_pod_actions`: what SyncPod must do to move a pod's runtime state
//! toward its spec. Pure: spec + cached runtime status in, actions out
//! (upstream's `computePodActions`).
//!
//! Every intermediate state the kernel can reveal (a container `Created` but
//! not yet started, a short exec) is harmless here: actions depend only on the
//! newest instance of each container as CRI reports it.

use evlet_cri::{ContainerId, SandboxId};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::spec::container_hash;
use crate::pod;
use crate::probe::{PodProbes, ProbeKind, Verdict};
use crate::runtime::{PodStatus, State};

/// A container to start, by its place in the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `spec.initContainers[i]`.
    Init(usize),
    /// `spec.containers[i]`.
    App(usize),
}

/// A running container to stop, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// The instance.
    pub id: ContainerId,
    /// Its name in the spec.
    pub name: String,
    /// Why (the `Killing` event's message, upstream's words).
    pub reason: String,
    /// The probe that failed, if that is why (its `terminationGracePeriodSeconds` applies).
    pub probe: Option<ProbeKind>,
}

/// What SyncPod will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox first.
    pub kill_pod: bool,
    /// Run a new sandbox.
    pub create_sandbox: bool,
    /// The ready sandbox to start containers in (when not creating one).
    pub sandbox: Option<SandboxId>,
    /// Attempt number of the new sandbox.
    pub attempt: u32,
    /// Containers to start, in order (init containers before app containers).
    pub start: Vec<Target>,
    /// Containers to stop.
    pub kill: Vec<Kill>,
    /// A regular init container failed and `restartPolicy: Never`: the pod failed.
    pub init_failed: bool,
}

fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

fn succeeded(status: &PodStatus, c: &Container) -> bool {
    status
        .latest(&c.name)
        .is_some_and(|s| s.state == State::Exited && s.exit_code == 0)
}

/// The spec hash of each of a pod's containers (by name), computed once per
/// pod spec: hashing serializes the container, too costly for every sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecHashes(BTreeMap<String, String>);

impl SpecHashes {
    /// The hashes of `pod`'s containers and init containers.
    pub fn of(pod: &Pod) -> Self {
        Self(
            pod.spec
                .iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .map(|c| (c.name.clone(), container_hash(c)))
                .collect(),
        )
    }

    /// The hash of `c` (computed if it was not among them).
    pub fn get(&self, c: &Container) -> std::borrow::Cow<'_, str> {
        match self.0.get(&c.name) {
            Some(h) => std::borrow::Cow::Borrowed(h),
            None => std::borrow::Cow::Owned(container_hash(c)),
        }
    }
}

/// Computes the actions for `pod` given its runtime `status` (no probe verdicts).
pub fn compute(pod: &Pod, status: &PodStatus) -> PodActions {
    compute_with(pod, status, &SpecHashes::of(pod), &PodProbes::default())
}

/// [`compute`] with the pod's spec hashes known and the prober's verdicts.
pub fn compute_with(
    pod: &Pod,
    status: &PodStatus,
    hashes: &SpecHashes,
    probes: &PodProbes,
) -> PodActions {
    let mut actions = PodActions::default();
    let Some(spec) = &pod.spec else {
        return actions;
    };
    let policy = pod::restart_policy(pod);
    let ready: Vec<_> = status.sandboxes.iter().filter(|s| s.ready).collect();
    let sandbox_ok = ready.len() == 1 && status.sandboxes.first().is_some_and(|s| s.ready);

    if !sandbox_ok {
        actions.create_sandbox = true;
        actions.kill_pod = !status.sandboxes.is_empty() || status.any_running();
        actions.attempt = status.sandboxes.first().map_or(0, |s| s.attempt + 1);
        if policy == "Never" && !status.sandboxes.is_empty() && !status.containers.is_empty() {
            // The pod ran once and must not run again.
            actions.create_sandbox = false;
            return actions;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| !(policy == "OnFailure" && succeeded(status, c)))
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        match spec.init_containers.as_ref().filter(|i| !i.is_empty()) {
            Some(_) => actions.start.push(Target::Init(0)),
            None => actions.start.extend(to_start.into_iter().map(Target::App)),
        }
        return actions;
    }
    actions.sandbox = status.sandboxes.first().map(|s| s.id.clone());
    actions.kill.extend(stale_instances(spec, status));

    // Init containers, in order. A sidecar (restartPolicy: Always) is started
    // and holds back the next init container until it has started (running,
    // and past its startup probe if it has one); a regular one must exit 0
    // before the next starts. Once an app container exists the pod has been
    // initialized: only sidecars are kept running then.
    let initialized = spec
        .containers
        .iter()
        .any(|c| status.latest(&c.name).is_some());
    let mut inits_done = true;
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let latest = status.latest(&c.name);
        if pod::is_restartable_init(c) {
            let Some(running) = latest.filter(|s| s.state == State::Running) else {
                actions.start.push(Target::Init(i));
                if initialized {
                    continue;
                }
                inits_done = false;
                break;
            };
            let verdict = |kind| probes.get(running.id.as_str(), kind);
            if running.hash != *hashes.get(c) {
                actions.kill.push(kill(
                    latest,
                    c,
                    &format!("Init container {} definition changed", c.name),
                    None,
                ));
                actions.start.push(Target::Init(i));
                if !initialized {
                    inits_done = false;
                    break;
                }
                continue;
            }
            if c.startup_probe.is_some() && verdict(ProbeKind::Startup) != Some(Verdict::Success) {
                if verdict(ProbeKind::Startup) == Some(Verdict::Failure) {
                    let reason = format!("Init container {} failed startup probe", c.name);
                    actions
                        .kill
                        .push(kill(latest, c, &reason, Some(ProbeKind::Startup)));
                    actions.start.push(Target::Init(i));
                }
                if !initialized {
                    inits_done = false;
                    break;
                }
                continue;
            }
            if verdict(ProbeKind::Liveness) == Some(Verdict::Failure) {
                let reason = format!("Init container {} failed liveness probe", c.name);
                actions
                    .kill
                    .push(kill(latest, c, &reason, Some(ProbeKind::Liveness)));
                actions.start.push(Target::Init(i));
            }
            continue;
        }
        if initialized {
            continue;
        }
        match latest.map(|s| (s.state, s.exit_code)) {
            Some((State::Exited, 0)) => continue,
            Some((State::Running, _)) => {
                inits_done = false;
                break;
            }
            Some((State::Exited, _)) if policy == "Never" => {
                actions.init_failed = true;
                actions.kill_pod = true;
                return actions;
            }
            _ => {
                actions.start.push(Target::Init(i));
                inits_done = false;
                break;
            }
        }
    }
    if !inits_done {
        return actions;
    }

    let mut keep = 0;
    let restart = policy != "Never";
    for (i, c) in spec.containers.iter().enumerate() {
        let latest = status.latest(&c.name);
        match latest.map(|s| s.state) {
            None => actions.start.push(Target::App(i)),
            Some(State::Running) => {
                let id = latest.map_or("", |s| s.id.as_str());
                let (why, probe) = if latest.is_some_and(|s| s.hash != *hashes.get(c)) {
                    // A changed spec restarts the container whatever the policy.
                    actions
                        .kill
                        .push(kill(latest, c, "Container spec hash changed", None));
                    actions.start.push(Target::App(i));
                    continue;
                } else if probes.get(id, ProbeKind::Liveness) == Some(Verdict::Failure) {
                    ("liveness", ProbeKind::Liveness)
                } else if probes.get(id, ProbeKind::Startup) == Some(Verdict::Failure) {
                    ("startup", ProbeKind::Startup)
                } else {
                    keep += 1;
                    continue;
                };
                let mut reason = format!("Container {} failed {why} probe", c.name);
                if restart {
                    reason.push_str(", will be restarted");
                    actions.start.push(Target::App(i));
                }
                actions.kill.push(kill(latest, c, &reason, Some(probe)));
            }
            Some(State::Created | State::Unknown) => {
                actions.kill.push(kill(
                    latest,
                    c,
                    "Container is in an unknown or created-but-not-started state",
                    None,
                ));
                actions.start.push(Target::App(i));
            }
            Some(State::Exited) => {
                if latest.is_some_and(|s| should_restart(policy, s.exit_code)) {
                    actions.start.push(Target::App(i));
                }
            }
        }
    }
    if keep == 0 && !actions.start.iter().any(|t| matches!(t, Target::App(_))) {
        // Nothing left to run: the pod is done; stop its sidecars and sandbox.
        actions.kill_pod = true;
        actions.start.clear();
    }
    actions
}

/// Instances older than a container's newest one that still run: a start
/// that outlived its deadline and was tried again leaves one behind (the
/// runtime refuses to remove a container "in starting state"). One instance
/// per container name runs.
fn stale_instances<'a>(
    spec: &'a k8s_openapi::api::core::v1::PodSpec,
    status: &'a PodStatus,
) -> impl Iterator<Item = Kill> + 'a {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(move |c| {
            status
                .containers
                .iter()
                .filter(move |s| s.name == c.name)
                .skip(1)
                .filter(|s| s.state != State::Exited)
                .map(move |s| Kill {
                    id: s.id.clone(),
                    name: c.name.clone(),
                    reason: format!(
                        "Container {} has a newer instance; only the newest runs",
                        c.name
                    ),
                    probe: None,
                })
        })
}

fn kill(
    latest: Option<&crate::runtime::ContainerStatus>,
    c: &Container,
    reason: &str,
    probe: Option<ProbeKind>,
) -> Kill {
    Kill {
        id: latest
            .map(|s| s.id.clone())
            .unwrap_or_else(|| ContainerId::new("")),
        name: c.name.clone(),
        reason: reason.to_owned(),
        probe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodUid;
    use crate::runtime::{ContainerStatus, Kind, SandboxStatus};

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        let c = |n: &&str| serde_json::json!({"name": n, "image": "i:1"});
        let mut init: Vec<serde_json::Value> = inits.iter().map(c).collect();
        for i in &mut init {
            if i["name"].as_str().is_some_and(|n| n.starts_with("side")) {
                i["restartPolicy"] = "Always".into();
            }
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"restartPolicy": policy, "initContainers": init, "containers": apps.iter().map(c).collect::<Vec<_>>()}
        }))
        .expect("pod")
    }

    fn with_sandbox() -> PodStatus {
        let mut s = PodStatus::empty(PodUid::from("u"));
        s.sandboxes.push(SandboxStatus {
            id: SandboxId::new("s1"),
            ready: true,
            created_at: 1,
            attempt: 0,
            ip: Some("10.0.0.2".into()),
        });
        s
    }

    fn add(s: &mut PodStatus, p: &Pod, name: &str, state: State, exit_code: i32) {
        let spec = p.spec.as_ref().expect("spec");
        let c = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .expect("container");
        let n = s.containers.len() as i64;
        s.containers.insert(
            0,
            ContainerStatus {
                id: ContainerId::new(format!("{name}-{n}")),
                name: name.into(),
                kind: Kind::App,
                state,
                created_at: 100 + n,
                started_at: 0,
                finished_at: 0,
                exit_code,
                reason: String::new(),
                message: String::new(),
                image: "i:1".into(),
                image_ref: String::new(),
                hash: container_hash(c),
                restart_count: 0,
                grace_period: None,
                kernel: None,
            },
        );
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_its_first_init_container() {
        let p = pod("Always", &["init"], &["a", "b"]);
        let a = compute(&p, &PodStatus::empty(PodUid::from("u")));
        assert!(a.create_sandbox && !a.kill_pod);
        assert_eq!(a.start, [Target::Init(0)]);
        let p = pod("Always", &[], &["a", "b"]);
        assert_eq!(
            compute(&p, &PodStatus::empty(PodUid::from("u"))).start,
            [Target::App(0), Target::App(1)]
        );
    }

    #[test]
    fn an_older_instance_that_still_runs_is_stopped_and_the_newest_kept() {
        let p = pod("Always", &[], &["a"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "a", State::Exited, 1);
        add(&mut s, &p, "a", State::Running, 0);
        add(&mut s, &p, "a", State::Running, 0);
        let a = compute(&p, &s);
        assert!(a.start.is_empty() && !a.kill_pod, "{a:?}");
        let killed: Vec<&str> = a.kill.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(killed, ["a-1"], "only the older running instance");
        assert!(a.kill[0].reason.contains("newer instance"));
    }

    #[test]
    fn init_containers_run_strictly_in_order() {
        let p = pod("Always", &["one", "two"], &["app"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "one", State::Running, 0);
        assert!(
            compute(&p, &s).start.is_empty(),
            "wait for the running init container"
        );
        add(&mut s, &p, "one", State::Exited, 0);
        assert_eq!(compute(&p, &s).start, [Target::Init(1)]);
        add(&mut s, &p, "two", State::Exited, 0);
        assert_eq!(compute(&p, &s).start, [Target::App(0)]);
    }

    #[test]
    fn a_failed_init_container_restarts_or_fails_the_pod() {
        let p = pod("Always", &["one"], &["app"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "one", State::Exited, 1);
        assert_eq!(compute(&p, &s).start, [Target::Init(0)]);
        let never = pod("Never", &["one"], &["app"]);
        let a = compute(&never, &s);
        assert!(a.init_failed && a.kill_pod && a.start.is_empty());
    }

    #[test]
    fn a_sidecar_holds_the_next_init_container_until_it_runs() {
        let p = pod("Always", &["side", "one"], &["app"]);
        let s = with_sandbox();
        assert_eq!(compute(&p, &s).start, [Target::Init(0)]);
        let mut s = with_sandbox();
        add(&mut s, &p, "side", State::Running, 0);
        assert_eq!(compute(&p, &s).start, [Target::Init(1)]);
        add(&mut s, &p, "one", State::Exited, 0);
        assert_eq!(compute(&p, &s).start, [Target::App(0)]);
    }

    #[test]
    fn a_sidecar_with_a_startup_probe_holds_until_the_probe_passes() {
        let mut p = pod("Always", &["side", "one"], &["app"]);
        if let Some(init) = p.spec.as_mut().and_then(|s| s.init_containers.as_mut()) {
            init[0].startup_probe =
                serde_json::from_value(serde_json::json!({"exec": {"command": ["true"]}})).ok();
        }
        let mut s = with_sandbox();
        add(&mut s, &p, "side", State::Running, 0);
        let id = s.containers[0].id.as_str().to_owned();
        let mut probes = PodProbes::default();
        let hashes = SpecHashes::of(&p);
        assert!(
            compute_with(&p, &s, &hashes, &probes).start.is_empty(),
            "no verdict yet"
        );
        probes.set(&id, ProbeKind::Startup, Verdict::Success);
        assert_eq!(
            compute_with(&p, &s, &hashes, &probes).start,
            [Target::Init(1)]
        );
        probes.set(&id, ProbeKind::Startup, Verdict::Failure);
        let a = compute_with(&p, &s, &hashes, &probes);
        assert_eq!(a.start, [Target::Init(0)]);
        assert_eq!(a.kill[0].reason, "Init container side failed startup probe");
    }

    #[test]
    fn a_failed_liveness_probe_kills_and_restarts_under_the_policy() {
        for (policy, restarts) in [("Always", true), ("OnFailure", true), ("Never", false)] {
            let p = pod(policy, &[], &["app", "other"]);
            let mut s = with_sandbox();
            add(&mut s, &p, "other", State::Running, 0);
            add(&mut s, &p, "app", State::Running, 0);
            let id = s.containers[0].id.as_str().to_owned();
            let mut probes = PodProbes::default();
            probes.set(&id, ProbeKind::Liveness, Verdict::Failure);
            let a = compute_with(&p, &s, &SpecHashes::of(&p), &probes);
            let expected = if restarts {
                "Container app failed liveness probe, will be restarted"
            } else {
                "Container app failed liveness probe"
            };
            assert_eq!(
                (a.kill.len(), a.kill[0].reason.as_str(), a.kill[0].probe),
                (1, expected, Some(ProbeKind::Liveness)),
                "{policy}"
            );
            assert_eq!(a.start.contains(&Target::App(0)), restarts, "{policy}");
            probes.set(&id, ProbeKind::Liveness, Verdict::Success);
            assert!(
                compute_with(&p, &s, &SpecHashes::of(&p), &probes)
                    .kill
                    .is_empty(),
                "a passing probe kills nothing"
            );
        }
    }

    #[test]
    fn restart_policy_decides_which_exits_restart() {
        for (policy, code, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 2, false),
        ] {
            let p = pod(policy, &[], &["app", "other"]);
            let mut s = with_sandbox();
            add(&mut s, &p, "other", State::Running, 0);
            add(&mut s, &p, "app", State::Exited, code);
            let a = compute(&p, &s);
            assert_eq!(
                a.start.contains(&Target::App(0)),
                restart,
                "{policy} exit {code}"
            );
        }
    }

    #[test]
    fn a_finished_pod_is_stopped_and_not_recreated() {
        let p = pod("Never", &[], &["app"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "app", State::Exited, 0);
        let a = compute(&p, &s);
        assert!(a.kill_pod && a.start.is_empty());
        s.sandboxes[0].ready = false;
        let a = compute(&p, &s);
        assert!(
            !a.create_sandbox,
            "restartPolicy Never: the pod does not run again"
        );
    }

    #[test]
    fn a_dead_sandbox_is_recreated_with_the_next_attempt() {
        let p = pod("Always", &[], &["app"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "app", State::Running, 0);
        s.sandboxes[0].ready = false;
        let a = compute(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!((a.attempt, a.start.as_slice()), (1, &[Target::App(0)][..]));
    }

    #[test]
    fn running_containers_are_left_alone_and_created_ones_replaced() {
        let p = pod("Always", &[], &["app", "b"]);
        let mut s = with_sandbox();
        add(&mut s, &p, "app", State::Running, 0);
        add(&mut s, &p, "b", State::Created, 0);
        let a = compute(&p, &s);
        assert_eq!(a.start, [Target::App(1)]);
        assert_eq!(a.kill.len(), 1);
        assert!(!a.kill_pod && !a.create_sandbox);
    }
}
