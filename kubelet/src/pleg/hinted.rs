//! The hint-driven dispatcher of the `ebpf` and `cri-events` modes.
//!
//! One task owns the [`Relister`]. In priority order it runs: a full relist when
//! one is needed (start, lost events, a reader or runtime restart) or due (the
//! safety period), then the re-reads of pods whose kernel exits the runtime has
//! not shown yet, then per-pod relists of hinted pods that are not in a SyncPod.
//! A failed relist is retried with backoff and is followed by a full relist once
//! the runtime answers again.
//!
//! **Expectations.** The kernel is faster than the runtime: a container's init
//! has exited, but containerd has not reaped it yet and still says RUNNING. A
//! kernel exit hint names the container, and the pod stays *expecting* until
//! the runtime shows that container stopped — not until the pod shows *some*
//! change (its own SyncPod's work is a change too: that confusion left pods
//! stuck behind a finished init container, issue 22). While expecting, the
//! container is polled with one status call, every 1, 2, 4, 5 ms for the fast
//! window (5 s), then every second; after 30 s a full relist is asked for and a
//! warning names the container; after 2 min it ends unconfirmed, counted in
//! `evlet_pleg_expectations_abandoned_total` (a presumed init that was not the
//! container's, a runtime that lost the exit). Until then a pod with one is
//! never proven quiet, and its polls wait while its SyncPod runs. A kernel
//! record whose init process still lives is refused by the relister and
//! expects nothing.
//!
//! **Quiet proofs.** A pod worker waiting for a status newer than its last sync
//! (a resync, an update) does not need a CRI read when nothing changed: in
//! `ebpf` mode the reader drains the ring buffer on request ([`Quiet`]), and a
//! pod with no hint, no expectation and no SyncPod running after that has its
//! entry vouched for as of the drain.
//!
//! **Missed events.** A *counting* full relist (the periodic safety relist, or
//! one asked for with [`Hints::verify`]) counts every change it finds in a pod
//! that has no hint waiting, no expectation and no SyncPod running, whatever
//! the pod did before: the hint path did not deliver it. In `ebpf` mode the
//! ring buffer is drained between the listing and that check, so a change whose
//! kernel event is still in flight is never miscounted. CRI's event stream
//! cannot be drained, so in `cri-events` mode such a pod is counted only if no
//! hint for it arrives within a grace period.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ebpf::Quiet;
use super::hints::{Dirty, ExitRecord, Hints, KernelExit, Next, Reason};
use super::relist::{PodRelist, Relister};
use crate::backoff::Retry;
use crate::metrics::Metrics;
use crate::pod::PodUid;
use crate::runtime::PodStatus;

/// The dispatcher's timings. [`Timing::new`] has the production values.
#[derive(Debug, Clone)]
pub struct Timing {
    /// The safety relist period.
    pub safety: Duration,
    /// How long an unconfirmed exit is polled fast. containerd shows an exit
    /// 40–70 ms after the kernel when idle, seconds later under a start burst.
    pub fast_for: Duration,
    /// The longest gap between fast polls of one pod: a few ms after the
    /// runtime's own lag. With several pods expecting, the gap grows with their
    /// number (up to `slow_step`), so the polls of a start burst share one
    /// budget of calls instead of adding load to a runtime that is already behind.
    pub fast_step: Duration,
    /// The gap between polls after the fast window.
    pub slow_step: Duration,
    /// After this long unconfirmed, a full relist is asked for and a warning logged.
    pub full_after: Duration,
    /// After this long unconfirmed, the expectation ends (counted): every
    /// expectation ends.
    pub give_up_after: Duration,
    /// How long a quiet proof may take before the pods are relisted instead.
    pub prove_for: Duration,
    /// `cri-events`: how long an unannounced change may wait for its event.
    pub grace: Duration,
}

impl Timing {
    /// Production timings with a safety relist every `safety`.
    pub fn new(safety: Duration) -> Self {
        Self {
            safety,
            fast_for: Duration::from_secs(5),
            fast_step: Duration::from_millis(5),
            slow_step: Duration::from_secs(1),
            full_after: Duration::from_secs(30),
            give_up_after: Duration::from_secs(120),
            prove_for: Duration::from_secs(1),
            grace: Duration::from_secs(1),
        }
    }
}

/// Kernel exits the runtime has not shown yet, for one pod.
#[derive(Debug, Clone)]
struct Expect {
    /// Container (or sandbox) ID → the kernel's report.
    exits: BTreeMap<String, Open>,
    /// The first read that did not show them.
    since: Instant,
    /// The next poll.
    due: Instant,
    attempt: u32,
    /// A full relist was asked for (once).
    escalated: bool,
    /// The runtime's loss of these exits was counted (once).
    lost: bool,
}

/// One exit the runtime has not shown yet.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// The kernel's exit time (CLOCK_MONOTONIC ns).
    at: u64,
    /// The status already shows it (the kernel's record was applied).
    shown: bool,
}

/// How old a quiet proof may be and still answer a worker's wait.
const PROOF_REUSE: Duration = Duration::from_millis(500);

/// After this long without the runtime showing a kernel-reported exit, the
/// exit counts as lost by the runtime (`evlet_runtime_exit_lost_total`).
const EXIT_LOST_AFTER: Duration = Duration::from_secs(10);

/// Runs until `cancel`; a full relist runs first. With `quiet` (the `ebpf`
/// mode), a worker's wait for a fresh status is answered by a kernel quiet
/// proof when the pod has no hint; otherwise, and in `cri-events` mode, the pod
/// is relisted.
pub async fn run(
    relister: Relister,
    hints: Arc<Hints>,
    quiet: Option<Arc<Quiet>>,
    timing: Timing,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut dispatcher = Dispatcher {
        next_full: Instant::now() + timing.safety,
        last_proof: None,
        relister,
        hints,
        quiet,
        timing,
        metrics,
        expecting: BTreeMap::new(),
        suspects: BTreeMap::new(),
        verifying: Vec::new(),
    };
    dispatcher.hints.full(Reason::Start, "");
    // A failed relist is retried after 200 ms doubling to 5 s.
    let mut retry = Retry::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        if cancel.is_cancelled() {
            return;
        }
        let failed = match dispatcher.step(&cancel).await {
            Step::Done => false,
            Step::Failed => true,
            Step::Cancelled => return,
        };
        if failed {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(retry.next_delay()) => {}
            }
        } else {
            retry.reset();
        }
    }
}

/// The outcome of one step.
enum Step {
    Done,
    /// A runtime call failed: back off before the next step.
    Failed,
    Cancelled,
}

/// What to do next, in priority order.
enum Work {
    Full {
        reason: Reason,
        also: Vec<Reason>,
        detail: String,
        counting: bool,
    },
    Poll(PodUid),
    Hinted(Next),
}

struct Dispatcher {
    relister: Relister,
    hints: Arc<Hints>,
    quiet: Option<Arc<Quiet>>,
    timing: Timing,
    metrics: Arc<Metrics>,
    expecting: BTreeMap<PodUid, Expect>,
    /// `cri-events`: pods a counting relist found changed with no hint, and
    /// when their grace ends.
    suspects: BTreeMap<PodUid, Instant>,
    /// `cri-events`: ends of the grace periods of counting relists.
    verifying: Vec<Instant>,
    next_full: Instant,
    /// The last quiet proof: every kernel event before it is in the hints.
    last_proof: Option<Instant>,
}

impl Dispatcher {
    async fn step(&mut self, cancel: &CancellationToken) -> Step {
        let now = Instant::now();
        self.settle_suspects(now);
        let due = self
            .expecting
            .iter()
            .find(|(uid, e)| e.due <= now && !self.hints.suspended(uid))
            .map(|(uid, _)| uid.clone());
        let work = if now >= self.next_full {
            Work::Full {
                reason: Reason::Periodic,
                also: Vec::new(),
                detail: String::new(),
                counting: true,
            }
        } else if let Some(uid) = due {
            Work::Poll(uid)
        } else {
            match self.hints.next() {
                Next::Full {
                    reason,
                    also,
                    detail,
                    counting,
                } => Work::Full {
                    reason,
                    also,
                    detail,
                    counting,
                },
                other => Work::Hinted(other),
            }
        };
        match work {
            Work::Full {
                reason,
                also,
                detail,
                counting,
            } => self.full(reason, also, detail, counting).await,
            Work::Poll(uid) => self.poll(uid).await,
            Work::Hinted(Next::Pod(uid, dirty)) => self.pod(uid, dirty).await,
            Work::Hinted(Next::Fresh(wanted)) => {
                self.fresh(wanted).await;
                Step::Done
            }
            Work::Hinted(Next::Idle | Next::Full { .. }) => {
                let wake = self.wake();
                tokio::select! {
                    () = cancel.cancelled() => return Step::Cancelled,
                    () = self.hints.changed() => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
                Step::Done
            }
        }
    }

    /// The next instant something is due without a new hint.
    fn wake(&self) -> Instant {
        self.expecting
            .iter()
            .filter(|(uid, _)| !self.hints.suspended(uid))
            .map(|(_, e)| e.due)
            .chain(self.suspects.values().copied())
            .chain(self.verifying.iter().copied())
            .fold(self.next_full, Instant::min)
    }

    async fn full(
        &mut self,
        reason: Reason,
        also: Vec<Reason>,
        detail: String,
        counting: bool,
    ) -> Step {
        let listing = match self.relister.list().await {
            Ok(listing) => listing,
            Err(err) => {
                tracing::warn!(reason = reason.label(), %detail, %err, "full relist failed; retrying");
                self.hints.retry_full(reason, also, detail, counting);
                return Step::Failed;
            }
        };
        // Every kernel event before the listing becomes a hint before the check.
        let counting = counting
            && match &self.quiet {
                Some(q) => {
                    let drained = q.prove(self.timing.prove_for).await.is_some();
                    if !drained {
                        tracing::warn!(
                            "the eBPF reader did not drain; not counting missed events in this relist"
                        );
                    }
                    drained
                }
                None => true,
            };
        let (hints, expecting) = (&self.hints, &self.expecting);
        let announced = |uid: &PodUid| expecting.contains_key(uid) || hints.pending(uid);
        let report = self
            .relister
            .apply(listing, counting.then_some(&announced))
            .await;
        let now = Instant::now();
        self.next_full = now + self.timing.safety;
        for r in std::iter::once(reason).chain(also) {
            self.metrics
                .pleg_full_relists
                .with_label_values(&[r.label()])
                .inc();
        }
        if !matches!(reason, Reason::Periodic | Reason::Verification) {
            tracing::info!(reason = reason.label(), %detail, changed = report.changed.len(), "full relist");
        }
        if !counting {
            return Step::Done;
        }
        if self.quiet.is_some() {
            for uid in &report.unannounced {
                self.missed(uid);
            }
            self.metrics.pleg_counted_relists.inc();
        } else {
            let end = now + self.timing.grace;
            for uid in report.unannounced {
                self.suspects.entry(uid).or_insert(end);
            }
            self.verifying.push(end);
        }
        Step::Done
    }

    fn missed(&self, uid: &PodUid) {
        self.metrics.pleg_missed_events.inc();
        tracing::warn!(pod = %uid, "a full relist found a change no hint announced (missed event)");
    }

    /// `cri-events`: counts the suspects whose grace ended without a hint.
    fn settle_suspects(&mut self, now: Instant) {
        let ended: Vec<PodUid> = self
            .suspects
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in ended {
            self.suspects.remove(&uid);
            if !self.hints.pending(&uid) && !self.expecting.contains_key(&uid) {
                self.missed(&uid);
            }
        }
        let before = self.verifying.len();
        self.verifying.retain(|end| *end > now);
        self.metrics
            .pleg_counted_relists
            .inc_by((before - self.verifying.len()) as u64);
    }

    async fn pod(&mut self, uid: PodUid, mut dirty: Dirty) -> Step {
        self.suspects.remove(&uid);
        // The kernel's certain exits go into the status at once (invariant 1);
        // the runtime is polled only to confirm them.
        let certain: BTreeMap<String, ExitRecord> = dirty
            .exits
            .iter()
            .filter_map(|(id, e)| Some((id.clone(), e.record?)))
            .collect();
        if !certain.is_empty() {
            let applied = self.relister.apply_kernel_exits(&uid, &certain);
            // A refused record named a process that lives: nothing to expect,
            // and the pod is read below.
            for id in &applied.refused {
                dirty.exits.remove(id);
            }
            if applied.shown {
                for e in dirty.exits.values().filter(|e| e.record.is_some()) {
                    self.observe_latency(e.at);
                }
                if applied.refused.is_empty() && dirty.exits.values().all(|e| e.record.is_some()) {
                    tracing::debug!(pod = %uid, exits = certain.len(), "kernel exits applied");
                    self.expect(uid, &dirty.exits, None);
                    return Step::Done;
                }
            }
        }
        match self.relister.relist_pod(&uid).await {
            Ok(PodRelist { changed, status }) => {
                tracing::debug!(pod = %uid, changed, exits = dirty.exits.len(), "pod relisted");
                if changed
                    && dirty.exits.is_empty()
                    && let Some(origin) = dirty.origin
                {
                    self.observe_latency(origin);
                }
                self.expect(uid, &dirty.exits, Some(&status));
                Step::Done
            }
            Err(err) => {
                let retryable = err.is_retryable();
                self.hints.retry(uid, dirty);
                if retryable {
                    // The runtime went away: once it answers, re-read everything.
                    self.hints.full(Reason::RuntimeUnavailable, err.to_string());
                }
                Step::Failed
            }
        }
    }

    fn observe_latency(&self, origin: u64) {
        let latency = evlet_ebpf::monotonic_ns().saturating_sub(origin);
        self.metrics.pleg_hint_latency.observe(latency as f64 / 1e9);
    }

    /// Merges `exits` into `uid`'s expectation and settles what the runtime
    /// shows stopped in `status` (`None`: nothing was read).
    fn expect(
        &mut self,
        uid: PodUid,
        exits: &BTreeMap<String, KernelExit>,
        status: Option<&PodStatus>,
    ) {
        let now = Instant::now();
        let previous = self.expecting.remove(&uid);
        let mut open = previous
            .as_ref()
            .map(|e| e.exits.clone())
            .unwrap_or_default();
        for (id, exit) in exits {
            let shown = exit.record.is_some() && self.relister.has_kernel_exit(id);
            let slot = open
                .entry(id.clone())
                .or_insert(Open { at: exit.at, shown });
            slot.at = slot.at.min(exit.at);
            slot.shown |= shown;
        }
        if let Some(status) = status {
            open.retain(|id, o| {
                let stopped = self.relister.runtime_shows_stopped(status, id);
                if stopped && !o.shown {
                    self.observe_latency(o.at);
                }
                !stopped
            });
        }
        if open.is_empty() {
            if let Some(e) = previous {
                self.metrics
                    .pleg_expectation_wait
                    .observe((now - e.since).as_secs_f64());
            }
        } else {
            let mut e = previous.unwrap_or(Expect {
                exits: BTreeMap::new(),
                since: now,
                due: now,
                attempt: 0,
                escalated: false,
                lost: false,
            });
            e.exits = open;
            if self.schedule(&uid, &mut e, now) {
                self.expecting.insert(uid, e);
            }
        }
        self.metrics
            .pleg_expectations
            .set(self.expecting.len() as i64);
    }

    /// Schedules `uid`'s next poll; false once the expectation has waited
    /// past [`Timing::give_up_after`] (it ends, counted).
    fn schedule(&self, uid: &PodUid, e: &mut Expect, now: Instant) -> bool {
        let waited = now - e.since;
        let step = if waited < self.timing.fast_for {
            let open = u32::try_from(self.expecting.len() + 1).unwrap_or(u32::MAX);
            let gap = (self.timing.fast_step * open).min(self.timing.slow_step);
            Duration::from_millis(1 << e.attempt.min(10)).min(gap)
        } else {
            self.timing.slow_step
        };
        e.attempt += 1;
        e.due = now + step;
        let containers: Vec<&String> = e.exits.keys().collect();
        if waited >= EXIT_LOST_AFTER && !e.lost {
            e.lost = true;
            self.metrics.runtime_exit_lost.inc_by(e.exits.len() as u64);
            tracing::warn!(pod = %uid, ?containers, ?waited, "the runtime has not processed exits the kernel saw (a lost exit?); the status shows the kernel's, the agent goes on");
        }
        if waited >= self.timing.full_after && !e.escalated {
            e.escalated = true;
            tracing::warn!(pod = %uid, ?containers, ?waited, "the kernel saw these containers' init exit, and the runtime still shows them running; relisting everything");
            self.hints.full(
                Reason::UnconfirmedExit,
                format!("pod {uid}: {containers:?}"),
            );
        }
        if waited >= self.timing.give_up_after {
            self.metrics
                .pleg_expectations_abandoned
                .inc_by(e.exits.len() as u64);
            tracing::warn!(pod = %uid, ?containers, ?waited, "the runtime never showed these kernel-reported exits; no longer waiting for it");
            return false;
        }
        true
    }

    /// Polls an expectation: one status call per container; a relist of the
    /// pod once any of them shows stopped.
    async fn poll(&mut self, uid: PodUid) -> Step {
        let Some(ids) = self
            .expecting
            .get(&uid)
            .map(|e| e.exits.keys().cloned().collect::<Vec<_>>())
        else {
            return Step::Done;
        };
        let mut any = false;
        for id in ids {
            match self.relister.shows_stopped(&uid, &id).await {
                Ok(stopped) => any |= stopped,
                Err(err) => {
                    if err.is_retryable() {
                        self.hints.full(Reason::RuntimeUnavailable, err.to_string());
                    }
                    self.reschedule(&uid);
                    return Step::Failed;
                }
            }
        }
        if any {
            return self.pod(uid, Dirty::default()).await;
        }
        self.reschedule(&uid);
        Step::Done
    }

    fn reschedule(&mut self, uid: &PodUid) {
        if let Some(mut e) = self.expecting.remove(uid)
            && self.schedule(uid, &mut e, Instant::now())
        {
            self.expecting.insert(uid.clone(), e);
        }
        self.metrics
            .pleg_expectations
            .set(self.expecting.len() as i64);
    }

    /// Answers workers that want a fresh entry: a quiet proof, or a relist.
    async fn fresh(&mut self, mut wanted: Vec<(PodUid, Instant)>) {
        // A pod with a relist coming (hint, expectation, SyncPod end or full
        // relist), or one that a relist made after the wait was asked for has
        // answered already, needs nothing here; checked again after the
        // proof, which may bring new hints.
        let pending = |this: &Self, uid: &PodUid, since: Instant| {
            this.expecting.contains_key(uid)
                || !this.hints.settled(uid)
                || this.relister.answers(uid, since)
        };
        wanted.retain(|(uid, since)| !pending(self, uid, *since));
        // A recent proof newer than every wanted `since` answers them as well as
        // a new one would: at 500 pods, resyncs ask several times a second.
        let reusable = self
            .last_proof
            .filter(|p| p.elapsed() < PROOF_REUSE && wanted.iter().all(|(_, since)| p > since));
        let proven = match &self.quiet {
            Some(_) if reusable.is_some() => reusable,
            Some(q) if !wanted.is_empty() => {
                let proven = q.prove(self.timing.prove_for).await;
                self.last_proof = proven.or(self.last_proof);
                proven
            }
            _ => None,
        };
        for (uid, since) in wanted {
            if pending(self, &uid, since) {
                continue;
            }
            if proven.is_some_and(|at| at > since && self.relister.touch(&uid, at)) {
                self.metrics.pleg_quiet_proofs.inc();
            } else {
                self.hints.pod(uid, None);
            }
        }
    }
}
