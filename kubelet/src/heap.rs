//! The agent's heap under glibc: two arenas, and what a burst of work freed
//! handed back to the kernel once the burst is over.
//!
//! glibc keeps freed memory in its arenas. After a batch of pod starts most of
//! the heap is free but resident, spread over pages that also hold live data;
//! `malloc_trim` returns every free page. A trim walks every free chunk, so on
//! a quiet node it would be most of the idle CPU (as would `mallinfo2`, which
//! walks the bins too, to see how much is free). [`TrimPolicy`] therefore
//! trims on the first quiet tick after ticks of work, when a burst's last
//! garbage has been freed, and during a long burst whenever the heap grew by
//! a few MiB; work is told by the agent's CPU time and its anonymous memory,
//! both one read of `/proc/self`. Trimming on every tick of a burst returns
//! pages the burst takes again at once.

use std::time::Duration;

/// How often the policy looks.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// CPU time in one tick above which the agent was at work (1 % of a core; the
/// idle agent uses about 0.2 % with a thousand pods).
pub const BUSY_CPU: Duration = Duration::from_millis(100);

/// Growth of the anonymous memory since the last trim that counts as work.
pub const TRIM_AFTER_GROWTH: u64 = 4 << 20;

/// glibc gives each thread that allocates an arena of its own, up to eight
/// per core; each keeps what was freed in it. Two arenas (the runtime's two
/// workers) hold the agent's heap with less left over: measured with 500
/// pods, 53.4 MiB RSS against 55.3 with glibc's default (jemalloc 70.7,
/// mimalloc 89.0, both through `LD_PRELOAD`).
pub const ARENAS: i32 = 2;

/// Decides on each tick whether to trim (pure; [`trim_after_bursts`] reads
/// `/proc` and trims).
#[derive(Debug, Default)]
pub struct TrimPolicy {
    /// Anonymous bytes left by the last trim.
    after_last: u64,
    /// The agent's CPU time at the last tick.
    last_cpu: Option<Duration>,
    /// The last tick was one of work.
    busy_before: bool,
}

impl TrimPolicy {
    /// A tick: `anon` is the resident anonymous memory now, `cpu` the agent's
    /// CPU time so far. True when the heap should be trimmed: it grew since
    /// the last trim, or the agent was at work until this quiet tick.
    pub fn tick(&mut self, anon: u64, cpu: Duration) -> bool {
        let worked = self
            .last_cpu
            .is_some_and(|last| cpu.saturating_sub(last) > BUSY_CPU);
        self.last_cpu = Some(cpu);
        let grew = anon > self.after_last + TRIM_AFTER_GROWTH;
        let trim = grew || (self.busy_before && !worked);
        self.busy_before = worked || grew;
        trim
    }

    /// After a trim: the anonymous memory it left.
    pub fn trimmed(&mut self, anon: u64) {
        self.after_last = anon;
    }
}

/// Sets the number of arenas.
///
/// # Safety
/// Must run before any other thread exists (glibc reads it unlocked).
#[cfg(target_env = "gnu")]
pub unsafe fn use_few_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; the caller runs it
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Trims the heap on the ticks [`TrimPolicy`] picks, for as long as the
/// runtime runs.
#[cfg(target_env = "gnu")]
pub async fn trim_after_bursts() {
    let mut tick = crate::clock::Ticks::every(TRIM_EVERY);
    let mut policy = TrimPolicy::default();
    loop {
        tick.tick().await;
        let Some((anon, cpu)) = usage() else {
            continue;
        };
        if policy.tick(anon, cpu) {
            let started = std::time::Instant::now();
            // The first trim after a burst can take tens of milliseconds:
            // not on a runtime worker.
            // SAFETY: malloc_trim has no preconditions; it only releases free pages.
            let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
            let left = usage().map_or(anon, |(a, _)| a);
            policy.trimmed(left);
            tracing::debug!(
                before = anon,
                after = left,
                took_us = started.elapsed().as_micros(),
                "heap trimmed"
            );
        }
    }
}

/// The agent's resident memory not backed by a file (statm's resident less
/// shared pages), and its CPU time (user and system).
#[cfg(target_env = "gnu")]
fn usage() -> Option<(u64, Duration)> {
    let me = procfs::process::Process::myself().ok()?;
    let statm = me.statm().ok()?;
    let stat = me.stat().ok()?;
    let anon = statm.resident.saturating_sub(statm.shared) * procfs::page_size();
    let ticks = procfs::ticks_per_second().max(1);
    let cpu = Duration::from_millis((stat.utime + stat.stime) * 1000 / ticks);
    Some((anon, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_burst_is_trimmed_when_its_heap_grows_and_once_after_even_when_it_stopped_growing() {
        let ms = Duration::from_millis;
        let mut p = TrimPolicy::default();
        // Start: the heap grew from nothing.
        assert!(p.tick(20 * MIB, ms(300)));
        p.trimmed(18 * MIB);
        // The next tick trims once more (what the start's end freed).
        assert!(p.tick(18 * MIB, ms(310)));
        p.trimmed(18 * MIB);
        // Quiet: no trim.
        assert!(!p.tick(18 * MIB, ms(320)));
        assert!(!p.tick(19 * MIB, ms(340)));
        // A burst of pod starts: busy for three ticks, the heap grows only
        // in the first (the rest reuses what the first freed).
        assert!(p.tick(30 * MIB, ms(1_000)), "grew");
        p.trimmed(26 * MIB);
        assert!(!p.tick(27 * MIB, ms(2_000)), "at work, not grown");
        assert!(!p.tick(27 * MIB, ms(3_000)), "at work, not grown");
        // The burst ended: its last garbage goes on the first quiet tick.
        assert!(p.tick(27 * MIB, ms(3_020)), "once after the burst");
        p.trimmed(16 * MIB);
        assert!(!p.tick(16 * MIB, ms(3_040)));
        assert!(!p.tick(16 * MIB, ms(3_060)));
    }

    #[test]
    fn a_quiet_agent_is_not_trimmed_for_the_slow_growth_of_its_state() {
        let ms = Duration::from_millis;
        let mut p = TrimPolicy::default();
        assert!(p.tick(10 * MIB, ms(0)));
        p.trimmed(10 * MIB);
        assert!(p.tick(10 * MIB, ms(10)));
        p.trimmed(10 * MIB);
        // 20 ms of CPU per tick, 1 MiB more each time: never work.
        for i in 1..4 {
            assert!(!p.tick((10 + i) * MIB, ms(10 + 20 * i)));
        }
        // Past 4 MiB since the last trim it is.
        assert!(p.tick(15 * MIB, ms(100)));
    }
}
