//! OOM kills against the agent under test: a pod whose container outgrows
//! its memory limit, from the kernel's first OOM message on `/dev/kmsg` →
//! `OOMKilled` in the pod's status, and (in `ebpf`) from the victim's exit
//! as the kernel recorded it.
//!
//! The hog waits a random delay ([`HOG_DELAY_MS`], drawn per pod) after its
//! container starts, so the OOM strikes a running container at a random
//! phase of any periodic relist: a fixed 1 s wait is `generic`'s relist
//! period and locked every sample to the same point of it.

use std::ops::RangeInclusive;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result};

use crate::pods::write_manifest;
use crate::report::{OomSample, Run};
use crate::watch::{Waits, first_container, first_entry, poll_pod, slow_timeline};
use crate::{Agent, NODE, Summary};

/// The hog's wait after its container starts, drawn uniformly per OOM pod
/// (ms): long enough that the runtime's `StartContainer` has returned (an
/// OOM while it is out is published when that sync ends, tens of ms at 500
/// pods), and a full relist period wide.
pub const HOG_DELAY_MS: RangeInclusive<u64> = 500..=1500;

/// One draw from [`HOG_DELAY_MS`], to the millisecond.
pub fn hog_delay() -> Duration {
    Duration::from_millis(fastrand::u64(HOG_DELAY_MS))
}

/// Manifest `oom<k>.yaml`: a container limited to 64 MiB that waits `delay`
/// (to the millisecond; busybox `sleep` takes fractions) and then allocates
/// 256 MiB. Left exited (`restartPolicy: Never`).
pub fn manifest(k: usize, image: &str, delay: Duration) -> String {
    let ms = delay.as_millis();
    let delay = format!("{}.{:03}", ms / 1000, ms % 1000);
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: oom{k}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: hog\n    image: {image}\n    command: [/bin/sh, -c, 'sleep {delay}; exec /bin/memhog 256']\n    resources: {{limits: {{memory: 64Mi}}}}\n"
    )
}

/// `count` OOM kills, one pod after the other (each left exited), each hog
/// after its own [`hog_delay`]; every sample with its delay goes into
/// [`Run::oom_samples`].
///
/// # Errors
/// If `/dev/kmsg` cannot be read or a manifest cannot be written; an OOM
/// kill that does not show is an error in `run.errors`.
pub async fn oom(
    agent: &Agent,
    manifests: &Path,
    image: &str,
    count: usize,
    run: &mut Run,
) -> Result<()> {
    let mut lat = Vec::new();
    let mut from_exit = Vec::new();
    let mut published = Vec::new();
    for k in 0..count {
        let killed = kmsg_oom("memhog", agent.pid)?;
        let delay = hog_delay();
        write_manifest(
            manifests,
            &format!("oom{k}.yaml"),
            &manifest(k, image, delay),
        )?;
        let name = format!("oom{k}-{NODE}");
        let mut sample = OomSample {
            pod: name.clone(),
            hog_delay_ms: delay.as_millis() as u64,
            ..OomSample::default()
        };
        let seen = poll_pod(
            &agent.http,
            &name,
            agent.http.poll_every(),
            Duration::from_secs(60),
            |p| first_container(p)["state"]["terminated"]["reason"] == "OOMKilled",
        )
        .await;
        let kernel = tokio::time::timeout(Duration::from_secs(1), killed).await;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        match (seen, kernel) {
            (Some(seen), Ok(Ok((kernel, waits)))) => {
                let waited = waits.since(agent.pid);
                let took = seen.saturating_duration_since(kernel);
                lat.push(took);
                sample.to_status_ms = Some(ms(took));
                let at = SystemTime::now() - kernel.elapsed();
                let seen_at = SystemTime::now() - seen.elapsed();
                if let Some((exit, status)) = kernel_exit_and_status(agent, &name, at).await {
                    let d = seen_at.duration_since(exit).unwrap_or_default();
                    from_exit.push(d);
                    sample.exit_to_status_ms = Some(ms(d));
                    if let Some(status) = status {
                        let d = status.duration_since(exit).unwrap_or_default();
                        published.push(d);
                        sample.exit_to_published_ms = Some(ms(d));
                    }
                }
                slow_timeline(agent, &name, "OOM kill", at, took, waited, run).await;
            }
            (None, _) => run
                .errors
                .push(format!("{name}: OOMKilled not in status after 60 s")),
            (_, _) => run
                .errors
                .push(format!("{name}: no OOM message on /dev/kmsg")),
        }
        run.oom_samples.push(sample);
    }
    run.oom_to_status = Summary::of(&lat);
    run.oom_exit_to_status = Summary::of(&from_exit);
    run.oom_exit_to_published = Summary::of(&published);
    run.oom_to_status_ms = run.oom_to_status.as_ref().map(|s| s.p50_ms);
    Ok(())
}

/// When the kernel recorded the exit of `name`'s container init, from the
/// pod's timeline (its kernel time converted to wall time by the agent): the
/// first such exit after `after`, less a millisecond for the clocks' rounding;
/// with it, when the agent published the `OOMKilled` status after that exit
/// (the timeline's first such status entry), if it did. None in the modes
/// without kernel records.
async fn kernel_exit_and_status(
    agent: &Agent,
    name: &str,
    after: SystemTime,
) -> Option<(SystemTime, Option<SystemTime>)> {
    let from = after
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_nanos()
        .saturating_sub(1_000_000);
    let timeline = agent.http.timeline(name).await.ok()??;
    let exit = first_entry(&timeline, "kernel", from, |w| w.contains("exited"))?;
    let status = first_entry(&timeline, "status", u128::from(exit), |w| {
        w.contains("OOMKilled")
    });
    let at = |ns: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
    Some((at(exit), status.map(at)))
}

/// Waits on `/dev/kmsg` for the kernel's first OOM message about `comm`
/// (`<comm> invoked oom-killer`, which heads the report the kernel prints
/// before it picks and kills a victim; or the kill's own line): when it
/// came, with the CPU waits of `agent` and the bench at that moment.
fn kmsg_oom(
    comm: &'static str,
    agent: u32,
) -> Result<tokio::sync::oneshot::Receiver<(Instant, Waits)>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut kmsg = std::fs::File::open("/dev/kmsg").context("opening /dev/kmsg")?;
    kmsg.seek(SeekFrom::End(0))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        // One record per read; ends when the message comes (or the process does).
        while let Ok(n) = kmsg.read(&mut buf) {
            let record = String::from_utf8_lossy(&buf[..n]);
            if record.contains(comm)
                && (record.contains("Killed process") || record.contains("oom-kill"))
            {
                let _ = tx.send((Instant::now(), Waits::now(agent)));
                return;
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hog_delays_cover_a_relist_period_around_a_second() {
        let (mut low, mut high) = (u64::MAX, 0);
        for _ in 0..10_000 {
            let ms = hog_delay().as_millis() as u64;
            assert!(HOG_DELAY_MS.contains(&ms), "{ms} ms");
            (low, high) = (low.min(ms), high.max(ms));
        }
        // Uniform over 1001 values: 10 000 draws reach both ends' tenths.
        assert!(low < 600 && high > 1400, "draws from {low} to {high} ms");
    }

    #[test]
    fn the_manifest_waits_the_drawn_delay_to_the_millisecond() {
        let yaml = manifest(3, "img", Duration::from_millis(737));
        assert!(yaml.contains("name: oom3}"), "{yaml}");
        assert!(
            yaml.contains("'sleep 0.737; exec /bin/memhog 256'"),
            "{yaml}"
        );
        let yaml = manifest(0, "img", Duration::from_millis(1500));
        assert!(yaml.contains("'sleep 1.500; exec"), "{yaml}");
        let yaml = manifest(0, "img", Duration::from_millis(504));
        assert!(yaml.contains("'sleep 0.504; exec"), "{yaml}");
    }
}
