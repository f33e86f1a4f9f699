//! The pod status as upstream computes it: phase, conditions, container
//! statuses (state, lastState, restartCount, reasons), IPs. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as V1ContainerStatus, Pod, PodCondition, PodIP,
    PodStatus as V1PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::clock::time_of as time;
use crate::pod;
use crate::probe::{PodProbes, ProbeKind, Verdict};
use crate::resources::qos;
use crate::runtime::{ContainerStatus, PodStatus, State};

/// Why a container is not running (becomes `state.waiting` in the pod status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// `CrashLoopBackOff`, `ErrImagePull`, `ImagePullBackOff`, `CreateContainerConfigError`, ...
    pub reason: String,
    /// Details.
    pub message: String,
}

/// Inputs beyond spec and runtime status.
#[derive(Debug, Clone, Default)]
pub struct Extra<'a> {
    /// Why containers are not running (from the last sync).
    pub waiting: Option<&'a BTreeMap<String, Waiting>>,
    /// When the agent first saw the pod (RFC 3339 `startTime`).
    pub start_time: Option<Time>,
    /// The node's IP.
    pub host_ip: Option<&'a str>,
    /// The pod failed for good (init container failure under `restartPolicy: Never`).
    pub failed: bool,
    /// A reason that rejected the pod (admission): the phase is Failed with it.
    pub rejected: Option<(&'a str, &'a str)>,
    /// The pod failed while running (`DeadlineExceeded`): the phase is Failed
    /// with this reason and message, the containers shown as they are.
    pub failure: Option<(&'a str, &'a str)>,
    /// The prober's verdicts (ready and started follow them).
    pub probes: Option<&'a PodProbes>,
    /// The status published before (conditions keep their
    /// `lastTransitionTime` while their status stays).
    pub previous: Option<&'a V1PodStatus>,
    /// Now (a changed condition's `lastTransitionTime`).
    pub now: Option<Time>,
}

fn terminated(c: &ContainerStatus) -> ContainerStateTerminated {
    let reason = if c.reason.is_empty() {
        if c.exit_code == 0 {
            "Completed".to_owned()
        } else {
            "Error".to_owned()
        }
    } else {
        c.reason.clone()
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: Some(c.message.clone()).filter(|m| !m.is_empty()),
        started_at: time(c.started_at),
        finished_at: time(c.finished_at),
        container_id: Some(format!("containerd://{}", c.id)),
        signal: None,
    }
}

fn state_of(c: &ContainerStatus) -> ContainerState {
    match c.state {
        State::Running => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(c.started_at),
            }),
            ..Default::default()
        },
        State::Exited => ContainerState {
            terminated: Some(terminated(c)),
            ..Default::default()
        },
        State::Created | State::Unknown => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        },
    }
}

/// Started and ready as upstream's prober manager sets them: started once
/// running and past its startup probe (if any), ready once started and past
/// its readiness probe (if any).
fn started_ready(
    spec: &Container,
    latest: Option<&ContainerStatus>,
    probes: Option<&PodProbes>,
) -> (bool, bool) {
    let Some(c) = latest.filter(|c| c.state == State::Running) else {
        return (false, false);
    };
    let passed = |kind: ProbeKind| {
        kind.of(spec).is_none()
            || probes.and_then(|p| p.get(c.id.as_str(), kind)) == Some(Verdict::Success)
    };
    let started = passed(ProbeKind::Startup);
    (started, started && passed(ProbeKind::Readiness))
}

/// The status named `name` among `statuses`.
fn before<'a>(
    statuses: Option<&'a Vec<V1ContainerStatus>>,
    name: &str,
) -> Option<&'a V1ContainerStatus> {
    statuses.and_then(|all| all.iter().find(|st| st.name == name))
}

/// A container of a pod with init containers that the runtime has not made
/// yet waits with `PodInitializing`, else `ContainerCreating`: upstream's
/// `convertToAPIContainerStatuses` default, for init and app containers alike.
fn default_waiting(spec: &k8s_openapi::api::core::v1::PodSpec) -> &'static str {
    if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
        "PodInitializing"
    } else {
        "ContainerCreating"
    }
}

fn container_status(
    spec: &Container,
    runtime: &PodStatus,
    waiting: Option<&Waiting>,
    probes: Option<&PodProbes>,
    run_to_completion: bool,
    previous: Option<&V1ContainerStatus>,
    default_waiting: &str,
) -> V1ContainerStatus {
    let latest = runtime.latest(&spec.name);
    // A container that terminated and is gone from the runtime since (the
    // container GC removed an evicted pod's containers) keeps the terminated
    // status it had, as upstream's `convertToAPIContainerStatuses` keeps it.
    if latest.is_none()
        && let Some(before) =
            previous.filter(|p| p.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    {
        return before.clone();
    }
    let mut state = match latest {
        Some(c) => state_of(c),
        None => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(default_waiting.into()),
                message: None,
            }),
            ..Default::default()
        },
    };
    let mut last_state = runtime.previous(&spec.name).map(|p| ContainerState {
        terminated: Some(terminated(p)),
        ..Default::default()
    });
    // A container waiting to restart shows Waiting(reason) with its last run as lastState.
    if let Some(w) = waiting {
        if let Some(c) = latest.filter(|c| c.state == State::Exited) {
            last_state = Some(ContainerState {
                terminated: Some(terminated(c)),
                ..Default::default()
            });
        }
        if latest.is_none_or(|c| c.state != State::Running) {
            state = ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(w.reason.clone()),
                    message: Some(w.message.clone()),
                }),
                ..Default::default()
            };
        }
    }
    let (started, mut ready) = started_ready(spec, latest, probes);
    if run_to_completion {
        // A regular init container is ready once it completed.
        ready = latest.is_some_and(|c| c.state == State::Exited && c.exit_code == 0);
    }
    V1ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|c| format!("containerd://{}", c.id)),
        ready,
        started: Some(started),
        restart_count: latest.map_or(0, |c| c.restart_count as i32),
        state: Some(state),
        last_state,
        ..Default::default()
    }
}

fn condition(kind: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason.map(str::to_owned) },
        ..Default::default()
    }
}

/// A False condition with upstream's reason and message.
fn not_ok(kind: &str, reason: &str, message: Option<String>) -> PodCondition {
    PodCondition {
        message,
        ..condition(kind, false, Some(reason))
    }
}

/// `containers with unready status: [a b]`, as upstream formats the names.
fn unready_message(names: &[&str]) -> Option<String> {
    (!names.is_empty()).then(|| format!("containers with unready status: [{}]", names.join(" ")))
}

/// Ready: the containers are ready and every readiness gate's condition is
/// True (upstream's `GeneratePodReadyCondition`). The gates' conditions are
/// set by others on the pod object (API-server mode).
fn ready_condition(pod: &Pod, containers_ready: &PodCondition) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        };
    }
    let current = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let messages: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .filter_map(|gate| {
            let kind = &gate.condition_type;
            match current.into_iter().flatten().find(|c| c.type_ == *kind) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {kind:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {kind:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    if messages.is_empty() {
        condition("Ready", true, None)
    } else {
        not_ok("Ready", "ReadinessGatesNotReady", Some(messages.join(", ")))
    }
}

/// Each condition keeps its previous `lastTransitionTime` while its status
/// is the same; a changed one gets `now`.
fn stamp(conditions: &mut [PodCondition], previous: Option<&V1PodStatus>, now: Option<&Time>) {
    let before = previous.and_then(|p| p.conditions.as_ref());
    for c in conditions {
        let kept = before
            .into_iter()
            .flatten()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
            .and_then(|p| p.last_transition_time.clone());
        c.last_transition_time = kept.or_else(|| now.cloned());
    }
}

/// Upstream's `getPhase` over the app containers (and init containers).
fn phase(pod: &Pod, runtime: &PodStatus, inits_done: bool, init_failed: bool) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "Pending";
    };
    let policy = pod::restart_policy(pod);
    if init_failed {
        return "Failed";
    }
    if !inits_done {
        return "Pending";
    }
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &spec.containers {
        match runtime.latest(&c.name).map(|s| (s.state, s.exit_code)) {
            Some((State::Running, _)) => running += 1,
            Some((State::Exited, code)) => {
                stopped += 1;
                if code == 0 {
                    succeeded += 1;
                }
            }
            _ => waiting += 1,
        }
    }
    let total = spec.containers.len();
    if waiting > 0 && running == 0 && stopped == 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == total {
        return match policy {
            "Always" => "Running",
            "OnFailure" if succeeded == total => "Succeeded",
            "OnFailure" => "Running",
            _ if succeeded == total => "Succeeded",
            _ => "Failed",
        };
    }
    // Some stopped, the others waiting to (re)start.
    "Running"
}

/// Computes `pod.status` from the spec and the runtime status.
pub fn compute(pod: &Pod, runtime: &PodStatus, extra: &Extra<'_>) -> V1PodStatus {
    if let Some((reason, message)) = extra.rejected {
        return V1PodStatus {
            phase: Some("Failed".into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            start_time: extra.start_time.clone(),
            ..Default::default()
        };
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let waiting = |name: &str| extra.waiting.and_then(|w| w.get(name));
    let previous_inits = extra
        .previous
        .and_then(|p| p.init_container_statuses.as_ref());
    let previous_apps = extra.previous.and_then(|p| p.container_statuses.as_ref());
    let init_statuses: Vec<V1ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let run_to_completion = !pod::is_restartable_init(c);
            container_status(
                c,
                runtime,
                waiting(&c.name),
                extra.probes,
                run_to_completion,
                before(previous_inits, &c.name),
                default_waiting(&spec),
            )
        })
        .collect();
    // Initialized once every init container completed (a sidecar: started),
    // or once an app container exists (an init container removed later does
    // not undo it).
    let app_seen = spec
        .containers
        .iter()
        .any(|c| runtime.latest(&c.name).is_some());
    let inits_done = app_seen
        || spec
            .init_containers
            .iter()
            .flatten()
            .zip(&init_statuses)
            .all(|(c, st)| {
                if pod::is_restartable_init(c) {
                    st.started == Some(true)
                } else {
                    st.ready
                }
            });
    let statuses: Vec<V1ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| {
            container_status(
                c,
                runtime,
                waiting(&c.name),
                extra.probes,
                false,
                before(previous_apps, &c.name),
                default_waiting(&spec),
            )
        })
        .collect();
    let phase = if extra.failure.is_some() {
        "Failed"
    } else {
        phase(pod, runtime, inits_done, extra.failed)
    };
    let terminal = phase == "Succeeded" || phase == "Failed";
    // Sidecars count toward readiness, as upstream.
    let unready: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .zip(&init_statuses)
        .filter(|(c, _)| pod::is_restartable_init(c))
        .map(|(_, s)| s)
        .chain(&statuses)
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let containers_ready = match (terminal, phase) {
        (true, "Succeeded") => not_ok("ContainersReady", "PodCompleted", None),
        (true, _) => not_ok("ContainersReady", "PodFailed", None),
        _ if unready.is_empty() => condition("ContainersReady", true, None),
        _ => not_ok(
            "ContainersReady",
            "ContainersNotReady",
            unready_message(&unready),
        ),
    };
    let ready = ready_condition(pod, &containers_ready);
    let sandbox_ready = runtime.sandboxes.first().is_some_and(|s| s.ready);
    // A pod on the host's network has the host's IP (upstream).
    let host_network = spec.host_network.unwrap_or(false);
    let ip = runtime.ip().map(str::to_owned).or_else(|| {
        (host_network && sandbox_ready)
            .then(|| extra.host_ip.map(str::to_owned))
            .flatten()
    });
    let incomplete: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .zip(&init_statuses)
        .filter(|(c, st)| {
            if pod::is_restartable_init(c) {
                st.started != Some(true)
            } else {
                !st.ready
            }
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    let initialized = if inits_done || terminal {
        condition("Initialized", true, None)
    } else {
        not_ok(
            "Initialized",
            "ContainersNotInitialized",
            Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
        )
    };
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready, None),
        initialized,
        ready,
        containers_ready,
        condition("PodScheduled", true, None),
    ];
    // A pod evicted for node pressure says the kubelet disrupted it (upstream's
    // DisruptionTarget); one evicted for its own local storage does not
    // (upstream passes no condition there). Pressure messages are upstream's
    // `The node was low on resource: ...`.
    if let Some(("Evicted", message)) = extra.failure
        && message.starts_with("The node was low on resource")
    {
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.to_owned()),
            ..Default::default()
        });
    }
    stamp(&mut conditions, extra.previous, extra.now.as_ref());
    V1PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: extra.host_ip.map(str::to_owned),
        host_ips: extra
            .host_ip
            .map(|ip| vec![k8s_openapi::api::core::v1::HostIP { ip: ip.to_owned() }]),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: extra.start_time.clone(),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        container_statuses: Some(statuses),
        qos_class: Some(qos(pod).as_str().into()),
        reason: extra.failure.map(|(r, _)| r.to_owned()),
        message: extra.failure.map(|(_, m)| m.to_owned()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodUid;
    use crate::runtime::SandboxStatus;
    use evlet_cri::SandboxId;

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"restartPolicy": policy, "initContainers": [{"name": "init", "image": "i"}], "containers": [{"name": "app", "image": "i"}]}
        }))
        .expect("pod")
    }

    fn instance(
        name: &str,
        state: State,
        exit_code: i32,
        reason: &str,
        restart_count: u32,
        created_at: i64,
    ) -> ContainerStatus {
        ContainerStatus {
            finished_at: if state == State::Exited {
                created_at + 1
            } else {
                0
            },
            exit_code,
            reason: reason.into(),
            image: "i".into(),
            image_ref: "sha256:x".into(),
            restart_count,
            ..ContainerStatus::test(name, created_at, state)
        }
    }

    fn runtime(containers: Vec<ContainerStatus>) -> PodStatus {
        let mut s = PodStatus::empty(PodUid::from("u"));
        s.sandboxes.push(SandboxStatus {
            id: SandboxId::new("s"),
            ready: true,
            created_at: 1,
            attempt: 0,
            ip: Some("10.88.0.5".into()),
        });
        s.containers = containers;
        s.containers
            .sort_by_key(|x| std::cmp::Reverse(x.created_at));
        s
    }

    fn cond(st: &V1PodStatus, kind: &str) -> String {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .map(|c| c.status.clone())
            .unwrap_or_default()
    }

    #[test]
    fn pending_until_init_is_done_then_running_and_ready() {
        let p = pod("Always");
        let st = compute(
            &p,
            &runtime(vec![instance("init", State::Running, 0, "", 0, 10)]),
            &Extra::default(),
        );
        assert_eq!(
            (st.phase.as_deref(), cond(&st, "Initialized").as_str()),
            (Some("Pending"), "False")
        );
        let rt = runtime(vec![
            instance("init", State::Exited, 0, "Completed", 0, 10),
            instance("app", State::Running, 0, "", 0, 20),
        ]);
        let st = compute(&p, &rt, &Extra::default());
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(
            (
                cond(&st, "Initialized").as_str(),
                cond(&st, "Ready").as_str(),
                cond(&st, "ContainersReady").as_str()
            ),
            ("True", "True", "True")
        );
        assert_eq!(st.pod_ip.as_deref(), Some("10.88.0.5"));
        assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn containers_of_a_pod_with_init_containers_wait_with_pod_initializing() {
        let waiting = |st: &[V1ContainerStatus]| {
            st[0]
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone())
        };
        let st = compute(&pod("Never"), &runtime(vec![]), &Extra::default());
        let inits = st.init_container_statuses.expect("init statuses");
        let apps = st.container_statuses.expect("statuses");
        assert_eq!(waiting(&inits).as_deref(), Some("PodInitializing"));
        assert_eq!(waiting(&apps).as_deref(), Some("PodInitializing"));
        // While the init container runs, the app container still waits so.
        let st = compute(
            &pod("Never"),
            &runtime(vec![instance("init", State::Running, 0, "", 0, 10)]),
            &Extra::default(),
        );
        let apps = st.container_statuses.expect("statuses");
        assert_eq!(waiting(&apps).as_deref(), Some("PodInitializing"));
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "app", "image": "i"}]}
        }))
        .expect("pod");
        let st = compute(&plain, &runtime(vec![]), &Extra::default());
        let apps = st.container_statuses.expect("statuses");
        assert_eq!(waiting(&apps).as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn ready_follows_the_readiness_probe_and_the_readiness_gates() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "readinessGates": [{"conditionType": "example.com/lb"}],
                "containers": [{"name": "app", "image": "i", "readinessProbe": {"exec": {"command": ["true"]}}}]
            }
        }))
        .expect("pod");
        let rt = runtime(vec![instance("app", State::Running, 0, "", 0, 20)]);
        let id = rt.containers[0].id.as_str().to_owned();
        let mut probes = PodProbes::default();
        let now = crate::clock::time_of(1_000_000_000_000_000_000);
        let st = compute(
            &p,
            &rt,
            &Extra {
                probes: Some(&probes),
                now: now.clone(),
                ..Default::default()
            },
        );
        let app = &st.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!((app.ready, app.started), (false, Some(true)));
        let containers_ready = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "ContainersReady")
            .expect("condition");
        assert_eq!(
            containers_ready.message.as_deref(),
            Some("containers with unready status: [app]")
        );
        assert_eq!(containers_ready.last_transition_time, now);

        probes.set(&id, ProbeKind::Readiness, Verdict::Success);
        let later = crate::clock::time_of(1_000_000_005_000_000_000);
        let extra = Extra {
            probes: Some(&probes),
            previous: Some(&st),
            now: later.clone(),
            ..Default::default()
        };
        let st2 = compute(&p, &rt, &extra);
        assert_eq!(cond(&st2, "ContainersReady"), "True");
        let ready = st2
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .expect("Ready")
            .clone();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ReadinessGatesNotReady"))
        );
        let scheduled = |s: &V1PodStatus| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled")
                .and_then(|c| c.last_transition_time.clone())
        };
        assert_eq!(
            scheduled(&st2),
            now,
            "an unchanged condition keeps its time"
        );

        p.status = Some(V1PodStatus {
            conditions: Some(vec![condition("example.com/lb", true, None)]),
            ..Default::default()
        });
        let st3 = compute(&p, &rt, &extra);
        assert_eq!(cond(&st3, "Ready"), "True");
    }

    #[test]
    fn a_restarted_container_shows_count_and_last_state() {
        let p = pod("Always");
        let rt = runtime(vec![
            instance("init", State::Exited, 0, "Completed", 0, 10),
            instance("app", State::Exited, 137, "OOMKilled", 0, 20),
            instance("app", State::Running, 0, "", 1, 30),
        ]);
        let st = compute(&p, &rt, &Extra::default());
        let app = &st.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(app.restart_count, 1);
        let last = app
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .expect("last state");
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (137, Some("OOMKilled"))
        );
        assert!(
            app.state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some()
        );
    }

    #[test]
    fn a_terminated_container_gone_from_the_runtime_keeps_its_status() {
        let p = pod("Always");
        let failure = Some(("Evicted", "The node was low on resource: memory. "));
        let killed = runtime(vec![
            instance("init", State::Exited, 0, "Completed", 0, 10),
            instance("app", State::Exited, 137, "Error", 2, 20),
        ]);
        let first = compute(
            &p,
            &killed,
            &Extra {
                failure,
                ..Default::default()
            },
        );
        // The container GC removed the evicted pod's containers.
        let mut gone = killed.clone();
        gone.containers.clear();
        let after = compute(
            &p,
            &gone,
            &Extra {
                failure,
                previous: Some(&first),
                ..Default::default()
            },
        );
        assert_eq!(after.container_statuses, first.container_statuses);
        assert_eq!(after.init_container_statuses, first.init_container_statuses);
        let app = &after.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            app.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(137)
        );
        assert_eq!(app.restart_count, 2);
        // Without a terminated status before, a missing container is waiting.
        let fresh = compute(&p, &gone, &Extra::default());
        let app = &fresh.container_statuses.as_ref().expect("statuses")[0];
        assert!(app.state.as_ref().is_some_and(|s| s.waiting.is_some()));
    }

    #[test]
    fn crash_loop_back_off_is_a_waiting_state_with_the_last_exit() {
        let p = pod("Always");
        let rt = runtime(vec![
            instance("init", State::Exited, 0, "", 0, 10),
            instance("app", State::Exited, 1, "Error", 3, 20),
        ]);
        let waiting: BTreeMap<String, Waiting> = [(
            "app".to_owned(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 40s".into(),
            },
        )]
        .into();
        let st = compute(
            &p,
            &rt,
            &Extra {
                waiting: Some(&waiting),
                ..Default::default()
            },
        );
        let app = &st.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            app.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );
        assert_eq!(
            app.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(1)
        );
        assert_eq!(app.restart_count, 3);
        assert_eq!(st.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn completed_pods_succeed_or_fail_by_policy_and_exit_code() {
        let done = |code| {
            runtime(vec![
                instance("init", State::Exited, 0, "", 0, 10),
                instance("app", State::Exited, code, "", 0, 20),
            ])
        };
        assert_eq!(
            compute(&pod("Never"), &done(0), &Extra::default())
                .phase
                .as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            compute(&pod("Never"), &done(2), &Extra::default())
                .phase
                .as_deref(),
            Some("Failed")
        );
        assert_eq!(
            compute(&pod("OnFailure"), &done(0), &Extra::default())
                .phase
                .as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            compute(&pod("Always"), &done(0), &Extra::default())
                .phase
                .as_deref(),
            Some("Running")
        );
        let st = compute(&pod("Never"), &done(0), &Extra::default());
        let app = &st.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            app.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.reason.as_deref()),
            Some("Completed")
        );
        assert_eq!(cond(&st, "Ready"), "False");
    }
}
