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

fn container_status(
    spec: &Container,
    runtime: &PodStatus,
    waiting: Option<&Waiting>,
) -> V1ContainerStatus {
    let latest = runtime.latest(&spec.name);
    let mut state = match latest {
        Some(c) => state_of(c),
        None => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
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
    let running = latest.is_some_and(|c| c.state == State::Running);
    V1ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|c| format!("containerd://{}", c.id)),
        ready: running,
        started: Some(running),
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
    let init_statuses: Vec<V1ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_status(c, runtime, waiting(&c.name)))
        .collect();
    let inits_done = spec.init_containers.iter().flatten().all(|c| {
        let latest = runtime.latest(&c.name);
        if pod::is_restartable_init(c) {
            latest.is_some_and(|s| s.state == State::Running || s.started_at > 0)
        } else {
            latest.is_some_and(|s| s.state == State::Exited && s.exit_code == 0)
        }
    });
    let statuses: Vec<V1ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, runtime, waiting(&c.name)))
        .collect();
    let phase = phase(pod, runtime, inits_done, extra.failed);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let containers_ready = !terminal && statuses.iter().all(|s| s.ready);
    let sandbox_ready = runtime.sandboxes.first().is_some_and(|s| s.ready);
    let ip = runtime.ip().map(str::to_owned);
    let not_ready_reason = if terminal {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    V1PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers", sandbox_ready, None),
            condition(
                "Initialized",
                inits_done || terminal,
                Some("ContainersNotInitialized"),
            ),
            condition("Ready", containers_ready, Some(not_ready_reason)),
            condition("ContainersReady", containers_ready, Some(not_ready_reason)),
            condition("PodScheduled", true, None),
        ]),
        host_ip: extra.host_ip.map(str::to_owned),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: extra.start_time.clone(),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        container_statuses: Some(statuses),
        qos_class: Some(qos(pod).as_str().into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodUid;
    use crate::runtime::{Kind, SandboxStatus};
    use evlet_cri::{ContainerId, SandboxId};

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
            id: ContainerId::new(format!("{name}{created_at}")),
            name: name.into(),
            kind: Kind::App,
            state,
            created_at,
            started_at: created_at,
            finished_at: if state == State::Exited {
                created_at + 1
            } else {
                0
            },
            exit_code,
            reason: reason.into(),
            message: String::new(),
            image: "i".into(),
            image_ref: "sha256:x".into(),
            hash: String::new(),
            restart_count,
            kernel: None,
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
