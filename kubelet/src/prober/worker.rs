//! One probe of one container of one pod: upstream's `prober/worker.go` as a
//! state machine. [`Worker::step`] decides (pure: the pod as last observed in,
//! a decision and verdicts to record out), [`Worker::record`] counts results
//! against the thresholds; the task around them (in [`super`]) sleeps, probes
//! and sends the verdicts on.

use k8s_openapi::api::core::v1::{Container, Probe};

use crate::probe::{ProbeKind, Verdict};

/// What the prober last observed of a pod: what its workers probe.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Target {
    /// The pod's IP (HTTP, TCP and gRPC probes go there).
    pub ip: Option<String>,
    /// The pod is Succeeded or Failed: its workers stop.
    pub terminal: bool,
    /// The newest instance of each container, by name.
    pub containers: std::collections::BTreeMap<String, Instance>,
}

/// One container instance as the runtime last showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its runtime ID.
    pub id: String,
    /// Running now.
    pub running: bool,
    /// Exited (not merely created or unknown).
    pub terminated: bool,
    /// When it started (Unix ns; 0 if not yet).
    pub started_at: i64,
}

/// What the worker does at a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing this time (no status yet, on hold, initial delay, not started).
    Wait,
    /// Probe container instance `id`.
    Probe(String),
    /// The worker is done (the pod is terminal, or the container will not run again).
    Stop,
}

/// The probe's numbers with upstream's defaults (period 10 s, timeout 1 s,
/// success 1, failure 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds`.
    pub initial_delay: i64,
    /// `periodSeconds` (at least 1).
    pub period: u64,
    /// `timeoutSeconds` (at least 1).
    pub timeout: u64,
    /// `successThreshold` (at least 1).
    pub success_threshold: u32,
    /// `failureThreshold` (at least 1).
    pub failure_threshold: u32,
}

impl Timing {
    /// The timing of `p`, defaulted as the API server does.
    pub fn of(p: &Probe) -> Self {
        let positive = |v: Option<i32>, default: i32| v.filter(|v| *v > 0).unwrap_or(default);
        Self {
            initial_delay: i64::from(p.initial_delay_seconds.unwrap_or(0).max(0)),
            period: positive(p.period_seconds, 10) as u64,
            timeout: positive(p.timeout_seconds, 1) as u64,
            success_threshold: positive(p.success_threshold, 1) as u32,
            failure_threshold: positive(p.failure_threshold, 3) as u32,
        }
    }
}

/// The state of one probe worker.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Which probe.
    pub kind: ProbeKind,
    /// The container's name.
    pub container: String,
    /// Its numbers.
    pub timing: Timing,
    /// The container has a startup probe (liveness and readiness wait for it).
    pub has_startup: bool,
    /// The container runs again after it exits (restart policy, or a sidecar):
    /// keep probing across restarts.
    pub restarts: bool,
    /// The container instance probed now.
    id: Option<String>,
    /// Waiting for a new instance (after a liveness failure or a startup verdict).
    on_hold: bool,
    /// The last result and how many times in a row it came.
    last: Verdict,
    run: u32,
}

impl Worker {
    /// A worker for `kind` of container `c`.
    pub fn new(kind: ProbeKind, c: &Container, probe: &Probe, restarts: bool) -> Self {
        Self {
            kind,
            container: c.name.clone(),
            timing: Timing::of(probe),
            has_startup: c.startup_probe.is_some(),
            restarts,
            id: None,
            on_hold: false,
            // Upstream's zero value: a fresh worker has seen no run yet.
            last: Verdict::Success,
            run: 0,
        }
    }

    /// The verdict a new container instance starts with: not ready, alive, not started.
    pub fn initial(&self) -> Verdict {
        match self.kind {
            ProbeKind::Readiness => Verdict::Failure,
            ProbeKind::Liveness => Verdict::Success,
            ProbeKind::Startup => Verdict::Unknown,
        }
    }

    /// The instance this worker probes, if it has seen one.
    pub fn instance(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Decides what to do at a tick (upstream's `doProbe` before the probe).
    ///
    /// `target` is the pod as last observed (None: not observed yet), `now` the
    /// wall clock in Unix ns, `started` whether instance `id` passed its startup
    /// probe; `set` records a verdict about an instance (and forgets the one of
    /// a replaced instance when given `None`).
    pub fn step(
        &mut self,
        target: Option<&Target>,
        now: i64,
        started: impl Fn(&str) -> bool,
        set: &mut dyn FnMut(&str, Option<Verdict>),
    ) -> Step {
        let Some(target) = target else {
            return Step::Wait;
        };
        if target.terminal {
            return Step::Stop;
        }
        let Some(c) = target.containers.get(&self.container) else {
            return Step::Wait;
        };
        if self.id.as_deref() != Some(c.id.as_str()) {
            if let Some(old) = self.id.take() {
                set(&old, None);
            }
            self.id = Some(c.id.clone());
            set(&c.id, Some(self.initial()));
            self.on_hold = false;
        }
        if self.on_hold {
            return Step::Wait;
        }
        if !c.running {
            set(&c.id, Some(Verdict::Failure));
            return if c.terminated && !self.restarts {
                Step::Stop
            } else {
                Step::Wait
            };
        }
        if (now - c.started_at) / 1_000_000_000 < self.timing.initial_delay {
            return Step::Wait;
        }
        let is_started = !self.has_startup || started(&c.id);
        match self.kind {
            ProbeKind::Startup if is_started => Step::Wait,
            ProbeKind::Liveness | ProbeKind::Readiness if !is_started => Step::Wait,
            _ => Step::Probe(c.id.clone()),
        }
    }

    /// Counts a probe's result; the verdict to record once a threshold is met.
    pub fn record(&mut self, result: Verdict) -> Option<Verdict> {
        if self.last == result {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = result;
            self.run = 1;
        }
        let needed = match result {
            Verdict::Failure => self.timing.failure_threshold,
            _ => self.timing.success_threshold,
        };
        if self.run < needed {
            return None;
        }
        // A failed liveness probe restarts the container and a startup probe
        // is done either way: wait for the next instance (upstream #117153).
        if (self.kind == ProbeKind::Liveness && result == Verdict::Failure)
            || self.kind == ProbeKind::Startup
        {
            self.on_hold = true;
            self.run = 0;
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn container(yaml: &str) -> Container {
        serde_yaml::from_str(yaml).expect("container")
    }

    fn target(id: &str, running: bool, started_at: i64) -> Target {
        Target {
            ip: Some("10.0.0.2".into()),
            terminal: false,
            containers: [(
                "app".to_owned(),
                Instance {
                    id: id.into(),
                    running,
                    terminated: !running,
                    started_at,
                },
            )]
            .into(),
        }
    }

    fn worker(kind: ProbeKind, yaml: &str) -> Worker {
        let c = container(yaml);
        let probe = kind.of(&c).cloned().expect("probe");
        Worker::new(kind, &c, &probe, true)
    }

    #[test]
    fn a_new_instance_starts_not_ready_and_waits_out_the_initial_delay() {
        let mut w = worker(
            ProbeKind::Readiness,
            "{name: app, readinessProbe: {initialDelaySeconds: 5, tcpSocket: {port: 80}}}",
        );
        let mut sets = Vec::new();
        let mut set = |id: &str, v: Option<Verdict>| sets.push((id.to_owned(), v));
        assert_eq!(w.step(None, 0, |_| true, &mut set), Step::Wait);
        let t = target("c1", true, 100 * S);
        assert_eq!(w.step(Some(&t), 104 * S, |_| true, &mut set), Step::Wait);
        assert_eq!(
            w.step(Some(&t), 105 * S, |_| true, &mut set),
            Step::Probe("c1".into())
        );
        assert_eq!(sets, [("c1".to_owned(), Some(Verdict::Failure))]);
    }

    #[test]
    fn thresholds_count_runs_in_a_row() {
        let mut w = worker(
            ProbeKind::Readiness,
            "{name: app, readinessProbe: {successThreshold: 2, failureThreshold: 3, exec: {command: [x]}}}",
        );
        assert_eq!(w.record(Verdict::Success), None);
        assert_eq!(w.record(Verdict::Success), Some(Verdict::Success));
        assert_eq!(w.record(Verdict::Failure), None);
        assert_eq!(w.record(Verdict::Success), None, "a success breaks the run");
        assert_eq!(w.record(Verdict::Failure), None);
        assert_eq!(w.record(Verdict::Failure), None);
        assert_eq!(w.record(Verdict::Failure), Some(Verdict::Failure));
    }

    #[test]
    fn a_liveness_failure_holds_until_a_new_instance() {
        let mut w = worker(
            ProbeKind::Liveness,
            "{name: app, livenessProbe: {failureThreshold: 1, exec: {command: [x]}}}",
        );
        let mut set = |_: &str, _: Option<Verdict>| {};
        let t = target("c1", true, 0);
        assert_eq!(
            w.step(Some(&t), S, |_| true, &mut set),
            Step::Probe("c1".into())
        );
        assert_eq!(w.record(Verdict::Failure), Some(Verdict::Failure));
        assert_eq!(
            w.step(Some(&t), 2 * S, |_| true, &mut set),
            Step::Wait,
            "on hold"
        );
        let t = target("c2", true, 3 * S);
        assert_eq!(
            w.step(Some(&t), 4 * S, |_| true, &mut set),
            Step::Probe("c2".into())
        );
    }

    #[test]
    fn liveness_and_readiness_wait_for_the_startup_probe() {
        let yaml = "{name: app, startupProbe: {exec: {command: [x]}}, livenessProbe: {exec: {command: [x]}}}";
        let mut live = worker(ProbeKind::Liveness, yaml);
        let mut start = worker(ProbeKind::Startup, yaml);
        let mut set = |_: &str, _: Option<Verdict>| {};
        let t = target("c1", true, 0);
        assert_eq!(live.step(Some(&t), S, |_| false, &mut set), Step::Wait);
        assert_eq!(
            start.step(Some(&t), S, |_| false, &mut set),
            Step::Probe("c1".into())
        );
        assert_eq!(
            live.step(Some(&t), S, |_| true, &mut set),
            Step::Probe("c1".into())
        );
        assert_eq!(start.step(Some(&t), S, |_| true, &mut set), Step::Wait);
    }

    #[test]
    fn an_exited_container_is_not_ready_and_stops_the_worker_if_it_never_restarts() {
        let c = container("{name: app, readinessProbe: {exec: {command: [x]}}}");
        let probe = c.readiness_probe.clone().expect("probe");
        let mut w = Worker::new(ProbeKind::Readiness, &c, &probe, false);
        let mut sets = Vec::new();
        let mut set = |id: &str, v: Option<Verdict>| sets.push((id.to_owned(), v));
        let t = target("c1", false, 0);
        assert_eq!(w.step(Some(&t), S, |_| true, &mut set), Step::Stop);
        let mut terminal = target("c1", true, 0);
        terminal.terminal = true;
        assert_eq!(w.step(Some(&terminal), S, |_| true, &mut set), Step::Stop);
        assert_eq!(sets[1], ("c1".to_owned(), Some(Verdict::Failure)));
    }

    #[test]
    fn defaults_are_upstreams() {
        let t = Timing::of(&Probe::default());
        assert_eq!(
            (
                t.initial_delay,
                t.period,
                t.timeout,
                t.success_threshold,
                t.failure_threshold
            ),
            (0, 10, 1, 1, 3)
        );
    }
}
