//! Container kills against the agent under test: SIGKILL of a container's
//! init (the ground truth) → the agent's status, its PLEG event, the
//! runtime's own report of the exit, and the replacement.
//!
//! Paced as the floor's kills are ([`crate::schedule::kill_gap`] after each,
//! once the round's [`crate::schedule::quiet_before_kills`] has passed).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use evlet_cri::{ContainerFilter, ContainerId, RuntimeClient, api};

use crate::pods::{APP, pod_name};
use crate::report::Run;
use crate::schedule::kill_gap;
use crate::watch::{Waits, first_container, first_entry, poll_pod, slow_timeline};
use crate::{Agent, AgentKind, Summary, pleg_events};

/// How long one kill may take to show (status, runtime, replacement): 15 s
/// for evlet; a minute for upstream kubelet, whose Evented PLEG was seen to
/// make the replacement 12–15 s after the kill, a figure to measure rather
/// than to cut off.
fn limit(kind: AgentKind) -> Duration {
    match kind {
        AgentKind::Evlet => Duration::from_secs(15),
        AgentKind::Upstream => Duration::from_secs(60),
    }
}

/// Kills the app container of `count` × 2 random distinct pods of the `pods`
/// running; returns (container ID, kill wall time) of the observed ones for
/// [`kill_events`] and records the rest in `run`.
///
/// The kills alternate between *observed* ones (the pod is polled every 1 ms
/// in `/pods`, until the status shows the kill and then until the replacement
/// runs, and its container over CRI: kill → status, → CRI exited,
/// → replacement running) and *unobserved* ones, where nothing polls while
/// the agent replaces the container: kill → replacement started is then read
/// from the agent's timeline, as the floor times it (a 1 ms CRI poll loads
/// the runtime while it creates and starts the replacement; the floor has none).
///
/// Of the observed kills, those where CRI reported the exit before the
/// agent's status showed it are also the runtime's exit lag with the agent
/// not yet at work on the replacement ([`Run::runtime_exit_lag`]).
///
/// # Errors
/// If the agent's endpoint or the runtime fails outright; a kill that does
/// not show is an error in `run.errors`.
pub async fn kills(
    agent: &Agent,
    client: &RuntimeClient,
    pods: usize,
    count: usize,
    run: &mut Run,
) -> Result<Vec<(String, SystemTime)>> {
    let limit = limit(agent.kind);
    let mut order: Vec<usize> = (0..pods).collect();
    fastrand::shuffle(&mut order);
    let mut killed = Vec::new();
    let mut to_status = Vec::new();
    let mut to_runtime = Vec::new();
    let mut unloaded = Vec::new();
    let mut to_replacement = Vec::new();
    let mut to_started = Vec::new();
    let mut to_published = Vec::new();
    for (k, i) in order.into_iter().take(count * 2).enumerate() {
        let name = pod_name(i);
        let Some((id, pid)) = app_container(agent, client, &name, run).await? else {
            continue;
        };
        if k % 2 == 1 {
            match unobserved_kill(agent, client, &name, &id, pid, limit).await {
                Ok(took) => to_started.push(took),
                Err(e) => run.errors.push(format!("{name}: {e:#}")),
            }
            tokio::time::sleep(kill_gap()).await;
            continue;
        }
        let delay0 = Waits::now(agent.pid);
        let wall = SystemTime::now();
        let sent = Instant::now();
        if crate::sigkill(pid).is_err() {
            run.errors.push(format!("{name}: kill {pid} failed"));
            continue;
        }
        let cid = ContainerId::new(id.clone());
        // The kill shows as the old container terminated, or (once the
        // replacement runs) as its last state.
        let in_status = poll_pod(&agent.http, &name, agent.http.poll_every(), limit, |p| {
            let c = first_container(p);
            (c["state"]["terminated"].is_object()
                && c["containerID"].as_str().is_some_and(|s| s.ends_with(&id)))
                || c["lastState"]["terminated"]["containerID"]
                    .as_str()
                    .is_some_and(|s| s.ends_with(&id))
        });
        let replaced = poll_pod(&agent.http, &name, agent.http.poll_every(), limit, |p| {
            let c = first_container(p);
            c["state"]["running"].is_object()
                && c["containerID"].as_str().is_some_and(|s| !s.ends_with(&id))
        });
        // The floor any CRI-based agent has: when the runtime itself reports the exit.
        let in_runtime = async {
            while sent.elapsed() < limit {
                if let Ok(c) = client.container_status(&cid).await
                    && c.state == api::ContainerState::ContainerExited as i32
                {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            None
        };
        // The replacement is polled once the status has shown the kill, so that
        // the bench's own requests to the agent do not double while it is timed.
        let in_agent = async {
            let seen = in_status.await;
            let waited = delay0.since(agent.pid);
            (seen, waited, replaced.await)
        };
        let ((seen, waited, replacement), runtime) = tokio::join!(in_agent, in_runtime);
        if let Some(at) = seen {
            slow_timeline(agent, &name, "kill", wall, at - sent, waited, run).await;
        }
        if let Some(d) = published(agent, &name, wall).await {
            to_published.push(d);
        }
        match replacement {
            Some(at) => to_replacement.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: no replacement running after {limit:?}")),
        }
        match seen {
            Some(at) => to_status.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: kill not in status after {limit:?}")),
        }
        match runtime {
            Some(at) => to_runtime.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: CRI never reported the exit")),
        }
        unloaded.extend(exit_lag_before_agent(sent, seen, runtime));
        killed.push((id, wall));
        tokio::time::sleep(kill_gap()).await;
    }
    run.kill_to_status = Summary::of(&to_status);
    run.kill_to_runtime = Summary::of(&to_runtime);
    run.runtime_exit_lag = Summary::of(&unloaded);
    run.kill_to_replacement = Summary::of(&to_replacement);
    run.kill_to_started = Summary::of(&to_started);
    run.kill_to_published = Summary::of(&to_published);
    Ok(killed)
}

/// Kill (at `wall`) → the agent published the pod's status with the killed
/// container terminated, from its timeline: the agent's own part of kill →
/// status, without the observer's poll and its waits for a CPU. `None`
/// where the agent keeps no timeline (upstream kubelet) or has no such entry.
async fn published(agent: &Agent, name: &str, wall: SystemTime) -> Option<Duration> {
    let from = wall.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_nanos();
    let timeline = agent.http.timeline(name).await.ok()??;
    let ns = first_entry(&timeline, "status", from, |w| w.contains("terminated"))?;
    let took = u128::from(ns).checked_sub(from)?;
    Some(Duration::from_nanos(u64::try_from(took).ok()?))
}

/// Kill (`sent`) → CRI reported the exit (`runtime`), when the runtime
/// reported it no later than the agent's status showed the kill (`seen`):
/// the agent had not yet begun replacing the container, so nothing of its
/// own loaded the runtime but its steady work (`generic`'s relist). `None`
/// when the agent was first (as `ebpf` is), or either never came.
pub fn exit_lag_before_agent(
    sent: Instant,
    seen: Option<Instant>,
    runtime: Option<Instant>,
) -> Option<Duration> {
    let runtime = runtime?;
    (runtime <= seen?).then(|| runtime.saturating_duration_since(sent))
}

/// The ID and init PID of `name`'s app container (None, with the error
/// recorded, when the pod or its container cannot be found).
async fn app_container(
    agent: &Agent,
    client: &RuntimeClient,
    name: &str,
    run: &mut Run,
) -> Result<Option<(String, u32)>> {
    let Some(pod) = agent.http.pod(name).await? else {
        run.errors.push(format!("{name}: not in /pods"));
        return Ok(None);
    };
    let Some(id) = first_container(&pod)["containerID"]
        .as_str()
        .map(|s| s.trim_start_matches("containerd://").to_owned())
    else {
        run.errors.push(format!("{name}: no container ID"));
        return Ok(None);
    };
    let Some(pid) = client.container_pid(&ContainerId::new(id.clone())).await? else {
        run.errors.push(format!("{name}: no init pid"));
        return Ok(None);
    };
    Ok(Some((id, pid)))
}

/// SIGKILL of `name`'s container `id` (init `pid`) with nothing polling the
/// agent or the runtime; then the time from the kill to the agent's
/// `StartContainer` of the replacement returning (what the floor times:
/// kill → create and start returned): from the pod's timeline where the
/// agent keeps one (evlet), else from the replacement's start time as the
/// runtime recorded it, read every 250 ms over CRI.
async fn unobserved_kill(
    agent: &Agent,
    client: &RuntimeClient,
    name: &str,
    id: &str,
    pid: u32,
    limit: Duration,
) -> Result<Duration> {
    let wall = SystemTime::now();
    let sent = Instant::now();
    crate::sigkill(pid).with_context(|| format!("kill {pid}"))?;
    let from = wall.duration_since(SystemTime::UNIX_EPOCH)?.as_nanos();
    let short = id.get(..12).unwrap_or(id);
    loop {
        // Well after an ebpf replacement; a generic one is read a few polls later.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let started = match agent.kind {
            // Timelines are kept for the 256 pods touched last: at higher
            // densities a pod idle since its start has none until the agent
            // notices the kill.
            AgentKind::Evlet => agent.http.timeline(name).await?.and_then(|t| {
                first_entry(&t, "cri", from, |what| {
                    what.starts_with("StartContainer ")
                        && what.contains(": ok in ")
                        && !what.contains(short)
                })
                .map(u128::from)
            }),
            AgentKind::Upstream => replacement_started(client, name, id).await?,
        };
        if let Some(ns) = started.filter(|&ns| ns >= from) {
            let took = u64::try_from(ns - from).context("a time past u64")?;
            return Ok(Duration::from_nanos(took));
        }
        if sent.elapsed() > limit {
            bail!("no replacement started {limit:?} after an unobserved kill");
        }
    }
}

/// When the runtime started the app container of pod `name` that replaced
/// container `old` (Unix ns), if one has started.
async fn replacement_started(
    client: &RuntimeClient,
    name: &str,
    old: &str,
) -> Result<Option<u128>> {
    let filter = ContainerFilter::new().label(evlet::pod::labels::POD_NAME, name.to_owned());
    for c in client.list_containers(filter).await? {
        if c.id == old || c.metadata.as_ref().is_none_or(|m| m.name != APP) {
            continue;
        }
        let status = client
            .container_status(&ContainerId::new(c.id.clone()))
            .await?;
        if status.started_at > 0 {
            return Ok(Some(u128::try_from(status.started_at).unwrap_or(0)));
        }
    }
    Ok(None)
}

/// Kill → ContainerDied, from evlet's log, for the kills [`kills`] returned.
///
/// # Errors
/// If the log cannot be read.
pub fn kill_events(log: &Path, killed: &[(String, SystemTime)], run: &mut Run) -> Result<()> {
    let seen = pleg_events(log, "ContainerDied")?;
    let mut lat = Vec::new();
    for (id, wall) in killed {
        let Some(at) = seen.get(id) else {
            run.errors.push(format!(
                "no ContainerDied event for {}",
                &id[..12.min(id.len())]
            ));
            continue;
        };
        let sent = jiff::Timestamp::try_from(*wall)?;
        let d = at.duration_since(sent);
        lat.push(Duration::try_from(d).unwrap_or_default());
    }
    run.kill_to_event = Summary::of(&lat);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_lag_counts_only_exits_the_runtime_showed_before_the_agent() {
        let sent = Instant::now();
        let at = |ms| Some(sent + Duration::from_millis(ms));
        // generic: the relist finds the exit after the runtime reported it.
        assert_eq!(
            exit_lag_before_agent(sent, at(480), at(45)),
            Some(Duration::from_millis(45))
        );
        // Both in the same poll: the agent cannot have acted yet.
        assert_eq!(
            exit_lag_before_agent(sent, at(45), at(45)),
            Some(Duration::from_millis(45))
        );
        // ebpf: the status first, the replacement under way as the runtime reports.
        assert_eq!(exit_lag_before_agent(sent, at(3), at(77)), None);
        assert_eq!(exit_lag_before_agent(sent, None, at(77)), None);
        assert_eq!(exit_lag_before_agent(sent, at(480), None), None);
    }
}
