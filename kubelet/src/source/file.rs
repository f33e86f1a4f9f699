//! The static manifest directory (or single file): inotify plus a periodic rescan.
//!
//! Every change (or every `period`) re-reads all manifests and sends a snapshot.
//! A file that stops parsing keeps its last good pods (a typo must not kill a
//! running static pod) and reports its errors; a deleted file removes its pods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::manifest::{self, ManifestError, StaticKind};
use super::{SourceMessage, config::Source};

/// Reads a manifest directory (or a single manifest file).
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    node: String,
    /// Last good pods per file (an unchanged file's pods are sent as the
    /// same `Arc`s again).
    good: BTreeMap<PathBuf, Vec<Arc<Pod>>>,
    /// Current errors per file (to log each change once).
    errors: BTreeMap<PathBuf, Vec<ManifestError>>,
    /// The text each file had when last parsed: an unchanged file is not parsed
    /// again (at hundreds of static pods, parsing was most of the idle CPU).
    texts: BTreeMap<PathBuf, String>,
    /// Each file's metadata when its text was last read, once that is old
    /// enough to trust: an unchanged stamp means an unchanged file, which is
    /// then not even read (reading 500 manifests every period, and the
    /// inotify events the reads cause, was the next largest idle cost).
    stamps: BTreeMap<PathBuf, Stamp>,
    /// Files changed less than this long ago are read in full (`RACY`).
    racy: Duration,
}

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of `meta`, unless the file changed so recently that another
    /// write could land within the same timestamp tick (git's "racy" files).
    fn trusted(meta: &std::fs::Metadata, racy: Duration) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let now = std::time::SystemTime::now();
        let age = |secs: i64, nanos: i64| {
            let at = std::time::UNIX_EPOCH
                + Duration::new(
                    u64::try_from(secs).unwrap_or(0),
                    u32::try_from(nanos).unwrap_or(0),
                );
            now.duration_since(at).ok()
        };
        // Both times: `touch -d` or `cp -p` set an old mtime on a new content.
        let settled = [
            (meta.mtime(), meta.mtime_nsec()),
            (meta.ctime(), meta.ctime_nsec()),
        ]
        .into_iter()
        .all(|(s, n)| age(s, n).is_some_and(|a| a > racy));
        settled.then(|| Self {
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// A file modified less than this long ago is read in full on every scan.
const RACY: Duration = Duration::from_secs(2);

/// After a watch event, the directory is scanned at once when every file
/// written since the last scan was closed (or renamed into place, or
/// removed): upstream reads a changed file at once. A file still open for
/// writing may be half-written: then the scan waits until this long has
/// passed without another event...
const QUIET: Duration = Duration::from_millis(20);
/// ... or this long since the first event of the burst.
const SETTLE_MAX: Duration = Duration::from_millis(100);

/// What the watch saw since the last scan: when its last event came, and
/// which manifests were written to and not yet closed.
#[derive(Debug, Default)]
struct Burst {
    last: Option<std::time::Instant>,
    /// Written (created, modified) and not closed, renamed or removed since.
    open: std::collections::BTreeSet<PathBuf>,
    /// The watch reported an error (lost events): nothing is known complete.
    uncertain: bool,
}

impl Burst {
    /// Takes in one watch event; returns whether it should wake a scan.
    /// Dotfiles (editors' and tools' temp files) are never read, so their
    /// events wake nothing: a temp file renamed into place wakes by its new name.
    fn record(&mut self, event: &notify::Result<notify::Event>, at: std::time::Instant) -> bool {
        use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind};
        let e = match event {
            Ok(e) => e,
            Err(_) => {
                self.uncertain = true;
                self.last = Some(at);
                return true;
            }
        };
        let visible: Vec<&PathBuf> = e
            .paths
            .iter()
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        // Only dotfiles: nothing to wake for. (An event with no path at all,
        // rare, is a write to an unknown file: the burst is uncertain.)
        if visible.is_empty() && !e.paths.is_empty() {
            return false;
        }
        match e.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Remove(_) => {
                for p in &visible {
                    self.open.remove(*p);
                }
            }
            // Opens and reads (the scan's own among them) change nothing.
            EventKind::Access(_) => return false,
            EventKind::Create(CreateKind::Folder) | EventKind::Modify(ModifyKind::Metadata(_)) => {}
            // Created or written: complete once closed.
            _ => {
                self.uncertain |= e.paths.is_empty();
                self.open.extend(visible.into_iter().cloned());
            }
        }
        self.last = Some(at);
        true
    }

    /// How long to wait before scanning, `burst` after the burst's first
    /// wake: nothing when every write is complete, else until QUIET after the
    /// last event (SETTLE_MAX after `burst` at most).
    fn wait(&self, burst: std::time::Instant, now: std::time::Instant) -> Duration {
        if self.open.is_empty() && !self.uncertain {
            return Duration::ZERO;
        }
        let quiet = self.last.map_or(now, |l| l + QUIET);
        quiet.min(burst + SETTLE_MAX).saturating_duration_since(now)
    }
}

impl FileSource {
    /// A source for `path` on node `node`.
    pub fn new(path: PathBuf, node: String) -> Self {
        Self {
            path,
            node,
            good: BTreeMap::new(),
            errors: BTreeMap::new(),
            texts: BTreeMap::new(),
            stamps: BTreeMap::new(),
            racy: RACY,
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        if self.path.is_file() {
            return vec![self.path.clone()];
        }
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            // Editors' and our own temp files: dotfiles, like upstream.
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        files.sort();
        files
    }

    /// Re-reads every manifest; returns the snapshot and the errors that are new.
    pub fn scan(&mut self) -> (Vec<Arc<Pod>>, Vec<ManifestError>) {
        let (_, errors) = self.rescan();
        (self.snapshot(), errors)
    }

    fn snapshot(&self) -> Vec<Arc<Pod>> {
        self.good.values().flatten().cloned().collect()
    }

    /// Re-reads every manifest; returns the snapshot if any file changed (was
    /// added, removed or parsed again) and the errors that are new. A quiet
    /// rescan builds no snapshot: at hundreds of static pods, cloning and
    /// comparing them every period was most of what the source cost.
    fn rescan(&mut self) -> (Option<Vec<Arc<Pod>>>, Vec<ManifestError>) {
        let files = self.files();
        let present: std::collections::BTreeSet<&PathBuf> = files.iter().collect();
        let before = self.good.len();
        self.good.retain(|f, _| present.contains(f));
        let mut changed = self.good.len() != before;
        self.errors.retain(|f, _| present.contains(f));
        self.texts.retain(|f, _| present.contains(f));
        self.stamps.retain(|f, _| present.contains(f));
        let mut new_errors = Vec::new();
        for file in &files {
            let origin = file.display().to_string();
            let stamp = std::fs::metadata(file)
                .ok()
                .and_then(|m| Stamp::trusted(&m, self.racy));
            if stamp.is_some()
                && self.stamps.get(file) == stamp.as_ref()
                && self.good.contains_key(file)
            {
                continue;
            }
            let read = std::fs::read_to_string(file);
            match (&read, stamp) {
                (Ok(_), Some(stamp)) => self.stamps.insert(file.clone(), stamp),
                _ => self.stamps.remove(file),
            };
            if let Ok(text) = &read
                && self.texts.get(file) == Some(text)
                && self.good.contains_key(file)
            {
                continue;
            }
            changed = true;
            let parsed = match read {
                Ok(text) => {
                    let parsed = manifest::parse(&text, &origin, StaticKind::File, &self.node);
                    self.texts.insert(file.clone(), text);
                    parsed
                }
                Err(e) => {
                    self.texts.remove(file);
                    manifest::Parsed {
                        pods: vec![],
                        errors: vec![ManifestError {
                            origin: origin.clone(),
                            pod: None,
                            message: format!("cannot read: {e}"),
                        }],
                    }
                }
            };
            let previous = self.good.get(file).cloned().unwrap_or_default();
            let mut pods: Vec<Arc<Pod>> = parsed.pods.into_iter().map(Arc::new).collect();
            // A document that failed keeps its last good pod (matched by name).
            for err in &parsed.errors {
                let keep = previous.iter().filter(|p| {
                    let base = crate::pod::key(p);
                    err.pod
                        .as_ref()
                        .is_none_or(|name| base.starts_with(name.as_str()))
                });
                for p in keep {
                    if !pods
                        .iter()
                        .any(|q| crate::pod::key(q) == crate::pod::key(p))
                    {
                        pods.push(p.clone());
                    }
                }
            }
            if self.errors.get(file) != Some(&parsed.errors) {
                new_errors.extend(parsed.errors.iter().cloned());
            }
            self.errors.insert(file.clone(), parsed.errors);
            // The collect above reused the parsed pods' buffer (a pod's size
            // each) for the pointers: kept, that is 2.5 KiB per file.
            pods.shrink_to_fit();
            self.good.insert(file.clone(), pods);
        }
        (changed.then(|| self.snapshot()), new_errors)
    }

    /// Runs until `cancel`: watches with inotify and rescans every `period`.
    pub async fn run(
        mut self,
        tx: mpsc::Sender<SourceMessage>,
        period: Duration,
        cancel: CancellationToken,
    ) {
        let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
        let burst = Arc::new(std::sync::Mutex::new(Burst::default()));
        let seen = Arc::clone(&burst);
        let watch_dir = if self.path.is_dir() {
            self.path.clone()
        } else {
            self.path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if crate::lock::lock(&seen).record(&res, std::time::Instant::now()) {
                let _ = wake_tx.try_send(());
            }
        });
        let _watcher = match watcher {
            Ok(mut w) => match w.watch(&watch_dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(err) => {
                    tracing::warn!(path = %watch_dir.display(), %err, "cannot watch manifest directory; rescanning every {period:?} only");
                    None
                }
            },
            Err(err) => {
                tracing::warn!(%err, "inotify unavailable; rescanning every {period:?} only");
                None
            }
        };
        // No copy of the last snapshot is kept to compare with (one more copy
        // of every static pod): a rescan answers only when a file changed,
        // and a snapshot equal to the last one changes nothing downstream.
        let mut answered = false;
        loop {
            let (pods, errors) = self.rescan();
            // The first scan always answers, even with no pods: an empty
            // directory is an answer (sourcesReady waits for it).
            let pods = pods.or_else(|| (!answered).then(|| self.snapshot()));
            for err in errors {
                tracing::error!(source = "file", error = %err, "rejected static pod manifest");
                let _ = tx.send(SourceMessage::Error(Source::File, err)).await;
            }
            if let Some(pods) = pods {
                answered = true;
                if tx
                    .send(SourceMessage::Snapshot(Source::File, pods))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(period) => {}
                Some(()) = wake_rx.recv() => settle(&burst).await,
            }
        }
    }
}

/// Lets a burst of writes settle (see [`Burst::wait`]), then starts the next
/// burst: the scan that follows reads everything written until then.
async fn settle(burst: &std::sync::Mutex<Burst>) {
    let first = std::time::Instant::now();
    loop {
        let wait = {
            let mut b = crate::lock::lock(burst);
            let wait = b.wait(first, std::time::Instant::now());
            // Checked and cleared at once: an event that comes after this
            // belongs to the next burst.
            if wait.is_zero() {
                *b = Burst::default();
            }
            wait
        };
        if wait.is_zero() {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: notify::EventKind, path: &str) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind).add_path(PathBuf::from(path)))
    }

    #[test]
    fn reads_of_manifests_and_temp_files_do_not_wake_a_rescan_but_writes_and_errors_do() {
        use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind};
        let now = std::time::Instant::now();
        let mut b = Burst::default();
        let open = EventKind::Access(AccessKind::Open(AccessMode::Any));
        let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
        assert!(!b.record(&event(open, "/m/web.yaml"), now));
        assert!(!b.record(&event(read, "/m/web.yaml"), now));
        assert!(!b.record(
            &event(EventKind::Create(CreateKind::File), "/m/.web.yaml.tmp"),
            now
        ));
        assert!(b.record(
            &event(EventKind::Create(CreateKind::File), "/m/web.yaml"),
            now
        ));
        assert!(b.record(
            &event(EventKind::Modify(ModifyKind::Any), "/m/web.yaml"),
            now
        ));
        assert!(b.record(
            &event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                "/m/web.yaml"
            ),
            now
        ));
        assert!(b.record(&Err(notify::Error::generic("queue overflow")), now));
    }

    #[test]
    fn a_scan_waits_for_a_file_still_open_for_writing_and_not_for_closed_or_renamed_ones() {
        use notify::event::{
            AccessKind, AccessMode, CreateKind, EventKind, ModifyKind, RenameMode,
        };
        let t0 = std::time::Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut b = Burst::default();
        // A temp file renamed into place (kubeadm, the bench): complete at once.
        b.record(&event(EventKind::Create(CreateKind::File), "/m/.a.tmp"), t0);
        b.record(
            &event(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                "/m/a.yaml",
            ),
            t0,
        );
        assert_eq!(b.wait(t0, t0), Duration::ZERO);
        // A file written in place: it waits until closed ...
        b.record(&event(EventKind::Create(CreateKind::File), "/m/b.yaml"), t0);
        b.record(
            &event(EventKind::Modify(ModifyKind::Any), "/m/b.yaml"),
            t0 + ms(5),
        );
        assert_eq!(
            b.wait(t0, t0 + ms(5)),
            QUIET,
            "open: QUIET after its last write"
        );
        assert_eq!(b.wait(t0, t0 + ms(15)), ms(10));
        b.record(
            &event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                "/m/b.yaml",
            ),
            t0 + ms(6),
        );
        assert_eq!(b.wait(t0, t0 + ms(6)), Duration::ZERO, "closed: at once");
        // ... or, for a writer that never closes, QUIET after its last write,
        // and SETTLE_MAX after the burst began at most.
        b.record(
            &event(EventKind::Modify(ModifyKind::Any), "/m/c.yaml"),
            t0 + ms(90),
        );
        assert_eq!(b.wait(t0, t0 + ms(95)), ms(5));
        assert_eq!(b.wait(t0, t0 + ms(100)), Duration::ZERO);
        // A removed file is complete; lost events make nothing certain.
        let mut b = Burst::default();
        b.record(&event(EventKind::Modify(ModifyKind::Any), "/m/d.yaml"), t0);
        b.record(
            &event(
                EventKind::Remove(notify::event::RemoveKind::File),
                "/m/d.yaml",
            ),
            t0,
        );
        assert_eq!(b.wait(t0, t0), Duration::ZERO);
        b.record(&Err(notify::Error::generic("queue overflow")), t0);
        assert_eq!(b.wait(t0, t0), QUIET);
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: app, image: evlet.local/test:v1}]\n";

    #[test]
    fn a_broken_edit_keeps_the_last_good_pod_and_a_fix_is_picked_up() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, POD).expect("write");
        std::fs::write(dir.path().join("other.yaml"), POD.replace("web", "other")).expect("write");
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        let (pods, errors) = src.scan();
        assert_eq!((pods.len(), errors.len()), (2, 0));
        let uid = pods
            .iter()
            .find(|p| crate::pod::name(p) == "web-n")
            .and_then(|p| p.metadata.uid.clone());

        std::fs::write(
            &file,
            POD.replace("image: evlet.local/test:v1", "image: ''"),
        )
        .expect("write");
        let (pods, errors) = src.scan();
        assert_eq!(pods.len(), 2, "the running pod is kept");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().contains(
                "web.yaml: pod \"default/web\": spec.containers[0].image: Required value"
            ),
            "{}",
            errors[0]
        );
        assert_eq!(
            pods.iter()
                .find(|p| crate::pod::name(p) == "web-n")
                .and_then(|p| p.metadata.uid.clone()),
            uid
        );
        assert!(
            src.scan().1.is_empty(),
            "an unchanged error is reported once"
        );

        std::fs::write(&file, POD.replace("test:v1", "test:v2")).expect("write");
        let (pods, errors) = src.scan();
        assert!(errors.is_empty());
        let fixed = pods
            .iter()
            .find(|p| crate::pod::name(p) == "web-n")
            .expect("web");
        assert_ne!(fixed.metadata.uid, uid, "the fix is a new pod version");

        std::fs::remove_file(&file).expect("rm");
        assert_eq!(src.scan().0.len(), 1, "a removed file removes its pods");
    }

    #[test]
    fn unchanged_files_are_not_parsed_again_but_any_edit_is_seen() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, POD).expect("write");
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        let first = src.scan().0;
        let again = src.scan().0;
        assert_eq!(first, again, "the same pods, config.seen included");
        // Same length, same second: only the content tells.
        std::fs::write(&file, POD.replace("test:v1", "test:v9")).expect("write");
        let edited = src.scan().0;
        let image = |pods: &[Arc<Pod>]| {
            pods[0]
                .spec
                .as_ref()
                .and_then(|s| s.containers[0].image.clone())
        };
        assert_eq!(image(&edited).as_deref(), Some("evlet.local/test:v9"));
        assert_ne!(edited[0].metadata.uid, first[0].metadata.uid);
    }

    #[test]
    fn a_file_keeps_room_for_its_pods_only() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("web.yaml"), POD).expect("write");
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        let _ = src.scan();
        let kept = src.good.values().next().expect("the file's pods");
        assert_eq!(
            (kept.len(), kept.capacity()),
            (1, 1),
            "held for as long as the file is"
        );
    }

    #[test]
    fn a_settled_file_is_trusted_by_its_stamp_yet_an_edit_that_restores_its_mtime_is_seen() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("web.yaml");
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        let write = |text: &str| {
            std::fs::write(&file, text).expect("write");
            std::fs::File::options()
                .write(true)
                .open(&file)
                .and_then(|f| f.set_modified(old))
                .expect("set mtime");
        };
        write(POD);
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        let _ = src.scan();
        assert!(
            !src.stamps.contains_key(&file),
            "a file changed just now is always read"
        );
        src.racy = Duration::ZERO;
        let first = src.scan().0;
        assert!(
            src.stamps.contains_key(&file),
            "a settled file's stamp is kept"
        );
        // Same length, same mtime: the ctime the write and utimes set tells
        // (a timestamp tick later: the racy window covers the same tick).
        std::thread::sleep(Duration::from_millis(20));
        write(&POD.replace("test:v1", "test:v9"));
        let edited = src.scan().0;
        assert_ne!(edited[0].metadata.uid, first[0].metadata.uid);
    }
}
