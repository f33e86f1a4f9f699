//! The `ebpf` hint source: kernel events → "pod X may have changed".
//!
//! The probes watch every cgroup under the pods' cgroup root (the kernel adds
//! each new one at its mkdir). A [`CgroupMap`](super::cgroup_map::CgroupMap)
//! maps a cgroup v2 ID to its pod and container, built from a scan at start and
//! from mkdir/rmdir events. A container's init exiting (or its cgroup going
//! away) is an exit hint naming the container (invariant 9). An event in a cgroup nobody knows triggers a
//! targeted lookup, then a full relist; a lost ring-buffer record, a reader
//! restart or a load of the probes triggers a full relist.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_ebpf::{Config as ProbeConfig, Event, EventReader, Probes, cgroup};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cgroup_map::{CgroupMap, namespace_init};
use super::hints::{Hints, Reason};
use super::kernel::{Binder, KernelView, Meaning};
use super::process::Processes;
use crate::cache::PodCache;
use crate::diagnostics::{Diagnostics, OomRecord};
use crate::lock::lock;
use crate::metrics::Metrics;

/// Where the probes look and how the source reacts.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The cgroup2 mount.
    pub mount: PathBuf,
    /// The pods' cgroup root relative to the mount, with a trailing `/` (`/kubepods/`).
    pub prefix: String,
    /// Ring-buffer size (bytes).
    pub ring_bytes: u32,
}

/// How long a BPF program may hold a reserved, not yet submitted record. The
/// programs run for microseconds with preemption off; this is a wide margin.
/// A quiet proof vouches for the pods as of this long before its drain.
pub const IN_FLIGHT: Duration = Duration::from_millis(2);

/// Proofs that every kernel event up to a moment has become a hint.
///
/// On request the reader drains the ring buffer and answers with the instant it
/// started. A pod that has no hint after that, no SyncPod running and no loss
/// pending has not changed in any way the kernel sees, so its cache entry can be
/// vouched for without a CRI call (design invariant 2's stamp, per pod).
#[derive(Debug)]
pub struct Quiet {
    wanted: Notify,
    proven: watch::Sender<Option<Instant>>,
}

impl Default for Quiet {
    fn default() -> Self {
        Self {
            wanted: Notify::new(),
            proven: watch::channel(None).0,
        }
    }
}

impl Quiet {
    /// An instant before which every kernel event is in the hints, or `None`
    /// if the reader did not answer within `timeout` (it is down or busy).
    pub async fn prove(&self, timeout: Duration) -> Option<Instant> {
        let asked = Instant::now();
        let mut proven = self.proven.subscribe();
        self.wanted.notify_one();
        let answer =
            tokio::time::timeout(timeout, proven.wait_for(|t| t.is_some_and(|t| t >= asked)))
                .await
                .ok()?
                .ok()
                .and_then(|t| *t)?;
        answer.checked_sub(IN_FLIGHT)
    }

    /// The reader's side: waits until a proof is asked for.
    ///
    /// # Cancel safety
    /// Cancel safe; a request that arrives meanwhile is kept for the next call.
    pub async fn requested(&self) {
        self.wanted.notified().await;
    }

    /// The reader's side, after a drain that started at `at`: every kernel
    /// event before `at` is in the hints, unless records were lost — so the
    /// proof is given only if the loss counter could be read (`loss_known`;
    /// a loss it showed has already asked for a full relist).
    pub fn drained(&self, at: Instant, loss_known: bool) {
        if loss_known {
            self.proven.send_replace(Some(at));
        }
    }
}

/// Why the eBPF source cannot run.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The probes' IDs are cgroup v2 IDs: a cgroup2 hierarchy is needed.
    #[error("no cgroup2 hierarchy is mounted")]
    NoCgroup2,
    /// The loader's error (no BTF, not root, verifier refusal, ...).
    #[error(transparent)]
    Loader(#[from] evlet_ebpf::Error),
    /// The ring buffer could not be registered with the runtime.
    #[error("eBPF ring buffer: {0}")]
    Ring(#[source] std::io::Error),
}

/// The running eBPF source: the probes, the map, and the reader task.
#[derive(Debug)]
pub struct EbpfSource {
    probes: Arc<Mutex<Probes>>,
    map: Arc<Mutex<CgroupMap>>,
    setup: Setup,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    stall: Arc<Mutex<Option<Duration>>>,
    quiet: Arc<Quiet>,
}

/// Shared by the reader task.
#[derive(Debug, Clone)]
struct Ctx {
    map: Arc<Mutex<CgroupMap>>,
    probes: Arc<Mutex<Probes>>,
    hints: Arc<Hints>,
    metrics: Arc<Metrics>,
    cache: PodCache,
    diagnostics: Arc<Diagnostics>,
    setup: Setup,
    stall: Arc<Mutex<Option<Duration>>>,
    quiet: Arc<Quiet>,
}

impl EbpfSource {
    /// Loads the probes for `pods_cgroup` (a cgroupfs path such as `/kubepods`).
    ///
    /// # Errors
    /// Why eBPF cannot be used (no cgroup2, no BTF, not root, verifier refusal):
    /// the caller falls back to the generic PLEG.
    pub fn load(pods_cgroup: &str, ring_bytes: u32) -> Result<Self, EbpfError> {
        let mount = cgroup::unified_mount()?.ok_or(EbpfError::NoCgroup2)?;
        let prefix = format!("/{}/", pods_cgroup.trim_matches('/'));
        let probes = Probes::load(&ProbeConfig {
            watch_prefix: Some(prefix.clone()),
            ring_bytes,
            ..ProbeConfig::default()
        })?;
        let setup = Setup {
            mount,
            prefix,
            ring_bytes,
        };
        Ok(Self {
            probes: Arc::new(Mutex::new(probes)),
            map: Arc::default(),
            setup,
            reader: Mutex::new(None),
            stall: Arc::default(),
            quiet: Arc::default(),
        })
    }

    /// Where each hook attached, for logs and health.
    pub fn describe(&self) -> String {
        lock(&self.probes)
            .hooks()
            .iter()
            .map(|h| format!("{}:{:?}", h.tracepoint, h.kind))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Scans the existing pod cgroups (watching them and learning their inits),
    /// then starts the reader. Call from within the runtime.
    pub fn start(
        self: &Arc<Self>,
        hints: Arc<Hints>,
        metrics: Arc<Metrics>,
        cache: PodCache,
        diagnostics: Arc<Diagnostics>,
        cancel: CancellationToken,
    ) {
        let root = self.setup.mount.join(self.setup.prefix.trim_matches('/'));
        let _ = std::fs::create_dir_all(&root);
        {
            let mut probes = lock(&self.probes);
            let mut map = lock(&self.map);
            for (dir, id) in cgroup::walk(&root) {
                let rel = format!(
                    "/{}",
                    dir.strip_prefix(&self.setup.mount)
                        .unwrap_or(&dir)
                        .display()
                );
                if let Err(e) = probes.watch(id) {
                    tracing::warn!(cgroup = %rel, %e, "cannot watch cgroup");
                }
                if map.insert(id, &rel).is_some_and(|o| !o.nested)
                    && let Some(init) = namespace_init(&dir)
                {
                    map.exec(id, init, true);
                }
            }
        }
        let ctx = Ctx {
            map: Arc::clone(&self.map),
            probes: Arc::clone(&self.probes),
            hints,
            metrics,
            cache,
            diagnostics,
            setup: self.setup.clone(),
            stall: Arc::clone(&self.stall),
            quiet: Arc::clone(&self.quiet),
        };
        let this = Arc::clone(self);
        tokio::spawn(async move { this.supervise(ctx, cancel).await });
    }

    /// The relister's way to give the map the runtime's init of each
    /// container, reading process starts from `processes`.
    pub fn binder(&self, processes: Arc<dyn Processes>) -> Binder {
        Binder::new(Arc::clone(&self.map), processes)
    }

    /// The reader's quiet proofs, for the dispatcher.
    pub fn quiet(&self) -> Arc<Quiet> {
        Arc::clone(&self.quiet)
    }

    /// Aborts the reader task (tests: the supervisor must recover without losing a change).
    pub fn abort_reader(&self) {
        if let Some(task) = lock(&self.reader).as_ref() {
            task.abort();
        }
    }

    /// Makes the reader sleep for `pause` after its next batch (tests: a reader
    /// that falls behind must cost a full relist, never a lost change).
    pub fn stall_reader(&self, pause: Duration) {
        *lock(&self.stall) = Some(pause);
    }

    async fn supervise(self: Arc<Self>, ctx: Ctx, cancel: CancellationToken) {
        let mut first = true;
        loop {
            let opened: Result<EventReader, EbpfError> = {
                let mut probes = lock(&self.probes);
                match probes.take_events() {
                    Some(taken) if first => taken.map_err(EbpfError::Ring),
                    _ => probes.reopen_events().map_err(EbpfError::from),
                }
            };
            let reader = match opened {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "cannot open the eBPF ring buffer; retrying");
                    ctx.hints.full(Reason::ReaderUnavailable, e.to_string());
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
            };
            if !first {
                ctx.hints.full(Reason::ReaderRestarted, "");
            }
            first = false;
            let mut task = tokio::spawn(read(reader, ctx.clone(), cancel.clone()));
            *lock(&self.reader) = Some(task.abort_handle());
            // Woken by the task's end, not by polling it (an idle wakeup 10
            // times a second was a visible part of the idle CPU).
            tokio::select! {
                () = cancel.cancelled() => {
                    task.abort();
                    return;
                }
                _ = &mut task => {}
            }
            tracing::error!(
                "the eBPF reader task ended; reopening the ring buffer and relisting everything"
            );
        }
    }
}

/// How often the loss counter is read even when no record arrives (a reserve
/// can fail after the reader's last check of a burst).
const LOSS_CHECK: Duration = Duration::from_secs(1);

/// Reads events until cancelled; checks the loss counter after every batch
/// and every [`LOSS_CHECK`].
async fn read(mut reader: EventReader, ctx: Ctx, cancel: CancellationToken) {
    let mut lost_seen = reader.lost().unwrap_or(0);
    let mut state = KernelView::new(Arc::clone(&ctx.map), procfs::ticks_per_second());
    let mut batch = Vec::new();
    let mut tick = crate::clock::Ticks::every(LOSS_CHECK);
    loop {
        let mut proof = None;
        tokio::select! {
            () = cancel.cancelled() => return,
            e = reader.next() => {
                let Some(first) = e else { return };
                batch.push(first);
            }
            // Taken before the drain: every record submitted by now is read below.
            () = ctx.quiet.requested() => proof = Some(Instant::now()),
            () = tick.tick() => {}
        }
        reader.drain_ready(&mut batch);
        for event in batch.drain(..) {
            handle(&ctx, &mut state, event);
        }
        let loss_known = match reader.lost() {
            Ok(lost) => {
                if lost > lost_seen {
                    ctx.metrics.ebpf_ringbuf_lost.inc_by(lost - lost_seen);
                    tracing::warn!(
                        lost = lost - lost_seen,
                        "eBPF ring buffer lost events; relisting everything"
                    );
                    ctx.hints.full(
                        Reason::LostEvents,
                        format!("{} kernel events lost", lost - lost_seen),
                    );
                    lost_seen = lost;
                }
                true
            }
            Err(_) => false,
        };
        if let Some(at) = proof {
            ctx.quiet.drained(at, loss_known);
        }
        let stall = lock(&ctx.stall).take();
        if let Some(pause) = stall {
            tracing::warn!(?pause, "eBPF reader stalled on request");
            tokio::time::sleep(pause).await;
        }
    }
}

/// Finds an unknown cgroup by its ID under the pods' root (rare: a cgroup made
/// before the probes or while the reader was down).
fn lookup(ctx: &Ctx, id: u64) -> bool {
    let root = ctx.setup.mount.join(ctx.setup.prefix.trim_matches('/'));
    let Some((dir, _)) = cgroup::walk(&root).into_iter().find(|(_, i)| *i == id) else {
        return false;
    };
    let rel = format!(
        "/{}",
        dir.strip_prefix(&ctx.setup.mount).unwrap_or(&dir).display()
    );
    let _ = lock(&ctx.probes).watch(id);
    let mut map = lock(&ctx.map);
    match map.insert(id, &rel) {
        Some(owner) => {
            if !owner.nested
                && let Some(init) = namespace_init(&dir)
            {
                map.exec(id, init, true);
            }
            true
        }
        None => false,
    }
}

fn handle(ctx: &Ctx, view: &mut KernelView, event: Event) {
    tracing::trace!(?event, "kernel event");
    match event {
        Event::CgroupMkdir(c) => view.mkdir(c.origin.cgroup_id, &c.path),
        Event::CgroupRmdir(c) => {
            let meaning = view.rmdir(c.origin.cgroup_id, c.origin.ktime_ns);
            deliver(ctx, meaning);
        }
        Event::Exec { origin, pid_ns, .. } => {
            if !view.exec(origin.cgroup_id, origin.tgid, pid_ns) && lookup(ctx, origin.cgroup_id) {
                view.exec(origin.cgroup_id, origin.tgid, pid_ns);
            }
        }
        Event::Exit(e) => {
            let mut meaning = view.exit(&e);
            if meaning == Meaning::Unknown && lookup(ctx, e.origin.cgroup_id) {
                meaning = view.exit(&e);
            }
            if meaning == Meaning::Unknown {
                ctx.hints.full(
                    Reason::UnknownCgroup,
                    format!("process exit in cgroup {}", e.origin.cgroup_id),
                );
                return;
            }
            deliver(ctx, meaning);
        }
        Event::OomKill(o) => {
            view.oom_victim(o.origin.tgid);
            let owner = lock(&ctx.map).get(o.origin.cgroup_id).cloned();
            let Some(owner) = owner else {
                if o.origin.watched {
                    ctx.hints.full(
                        Reason::UnknownCgroup,
                        format!("OOM kill in cgroup {}", o.origin.cgroup_id),
                    );
                }
                tracing::warn!(pid = o.origin.tgid, comm = %o.comm, "OOM kill outside the agent's pods");
                return;
            };
            let status = ctx.cache.get(&owner.uid).and_then(|e| e.status.ok());
            let container = owner.container.clone().unwrap_or_default();
            let mut name = status
                .as_ref()
                .and_then(|s| {
                    s.containers
                        .iter()
                        .find(|c| c.id.as_str() == container)
                        .map(|c| c.name.clone())
                })
                .unwrap_or_default();
            let (mut namespace, mut pod) = status
                .as_ref()
                .map(|s| (s.namespace.clone(), s.name.clone()))
                .unwrap_or_default();
            // Killed before a relist showed the container (an OOM right after
            // its start): the names the agent gave it when it made it.
            if (name.is_empty() || pod.is_empty())
                && let Some((ns, p, c)) = ctx.diagnostics.identify(&owner.uid.0, &container)
            {
                if pod.is_empty() {
                    (namespace, pod) = (ns, p);
                }
                if name.is_empty() {
                    name = c;
                }
            }
            ctx.metrics
                .oom_kills
                .with_label_values(&[&namespace, &pod, &name])
                .inc();
            let levels = crate::diagnostics::memcg::hierarchy()
                .map(|h| crate::diagnostics::memcg::read(h, &owner.path, &ctx.setup.prefix))
                .unwrap_or_default();
            let hit = ctx.diagnostics.limit_hit(&levels);
            ctx.diagnostics.oom(OomRecord {
                namespace,
                pod,
                pod_uid: owner.uid.0.clone(),
                container: name,
                container_id: container,
                pid: o.origin.tgid,
                tid: o.origin.pid,
                comm: o.comm.clone(),
                cgroup_id: o.origin.cgroup_id,
                anon_rss_kb: o.rss.map(|r| r.anon_rss_kb),
                file_rss_kb: o.rss.map(|r| r.file_rss_kb),
                shmem_rss_kb: o.rss.map(|r| r.shmem_rss_kb),
                total_vm_kb: o.rss.map(|r| r.total_vm_kb),
                oom_score_adj: o.oom_score_adj,
                victim_is_init: lock(&ctx.map).is_init(o.origin.cgroup_id, o.origin.tgid),
                memcg_limit_bytes: hit.as_ref().and_then(|l| l.limit_bytes),
                limit_hit: hit.map(|l| l.level),
                levels,
                time: crate::clock::now().0.to_string(),
            });
            ctx.hints.pod(owner.uid, Some(o.origin.ktime_ns));
        }
        Event::ThreadExit(_) | Event::Fork { .. } => {}
    }
}

/// Notes a container's end in its pod's timeline and hands it to the dispatcher.
fn deliver(ctx: &Ctx, meaning: Meaning) {
    if let Meaning::Exit {
        uid,
        container,
        exit,
        pid: Some(pid),
    } = &meaning
    {
        let short = evlet_cri::ids::short(container);
        let what = match &exit.record {
            Some(r) => format!(
                "init (pid {pid}) of container {short} exited with code {}{}",
                r.exit_code,
                if r.oom {
                    ", killed by the OOM killer"
                } else {
                    ""
                }
            ),
            None => format!(
                "presumed init (pid {pid}) of container {short} exited; the runtime decides"
            ),
        };
        ctx.diagnostics
            .trace(&uid.0, crate::diagnostics::Source::Kernel, what);
    }
    super::kernel::hint(&ctx.hints, meaning);
}
