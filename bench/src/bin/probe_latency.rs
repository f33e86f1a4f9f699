//! Kernel → user-space latency and per-event cost of evlet's eBPF probes.
//!
//! Loads the probes watching a cgroup tree of its own, then forks processes that
//! exit at once inside a watched cgroup, and measures for each exit the time from
//! the kernel's timestamp (`bpf_ktime_get_ns`, CLOCK_MONOTONIC, taken in the
//! `sched_process_exit` program) to the reader receiving the record:
//! - idle: 200 measured exits per second and nothing else;
//! - busy: the same while a noise process makes ~10 000 exits/s in another watched
//!   cgroup (every one of them goes through the ring buffer and the reader).
//!
//! Per-event cost: the reader thread's CPU time (CLOCK_THREAD_CPUTIME_ID) divided
//! by the records it read, and the kernel side from `kernel.bpf_stats_enabled`
//! (`run_time_ns / run_cnt` of each program, from `/proc/self/fdinfo`): the cost
//! of every invocation, including the processes the in-kernel filter drops.
//!
//! Needs root. `cargo xtask bench` runs it first; on its own:
//!
//! ```sh
//! cargo build --release -p evlet-bench && target/release/probe_latency --out bench/results
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Parser;
use evlet_bench::Summary;
use evlet_ebpf::{Config, Event, Probes, cgroup, monotonic_ns};
use serde::Serialize;

#[derive(Debug, Parser)]
struct Args {
    /// Measured exits per phase.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Noise exits per second in the busy phase.
    #[arg(long, default_value_t = 10_000)]
    noise_rate: u64,
    /// Fewer samples (CI): checks the harness only.
    #[arg(long)]
    quick: bool,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Internal: run as the noise process at this many exits per second.
    #[arg(long, hide = true)]
    noise_child: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Phase {
    name: String,
    /// Measured exits per second asked for, and noise exits per second achieved.
    measured_per_s: f64,
    noise_per_s: f64,
    latency: Option<Summary>,
    /// Measured exits that never arrived.
    missing: usize,
    records_read: u64,
    lost: u64,
    reader_cpu_ns_per_record: f64,
}

#[derive(Debug, Serialize)]
struct Program {
    name: String,
    runs: u64,
    ns_per_run: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    started: String,
    kernel: String,
    cpus: usize,
    hooks: Vec<String>,
    phases: Vec<Phase>,
    programs: Vec<Program>,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Forks a child that joins `procs` (a `cgroup.procs` path) and exits; reaps it.
fn exit_in(procs: &std::ffi::CStr) -> Option<u32> {
    // SAFETY: the child makes only async-signal-safe calls on a pre-built path.
    match unsafe { libc::fork() } {
        0 => unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            let ok = fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            libc::_exit(if ok { 0 } else { 1 })
        },
        -1 => None,
        pid => {
            let mut status = 0;
            // SAFETY: reaps our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            Some(pid as u32)
        }
    }
}

fn procs_path(dir: &Path) -> Result<std::ffi::CString> {
    Ok(std::ffi::CString::new(
        dir.join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )?)
}

/// What the reader thread shares.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    records: AtomicU64,
    /// (tgid, kernel ns, receipt ns) of exits in the measured cgroup.
    measured: std::sync::Mutex<Vec<(u32, u64, u64)>>,
    cpu_ns: AtomicU64,
    lost: AtomicU64,
}

/// Reads on its own thread, driving `rt` (the runtime `events` registered with).
fn reader(
    rt: tokio::runtime::Runtime,
    mut events: evlet_ebpf::EventReader,
    measured_id: u64,
    shared: Arc<Shared>,
) {
    rt.block_on(async {
        let start = thread_cpu();
        let mut batch = Vec::new();
        while !shared.stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_millis(50), events.next()).await;
            shared
                .lost
                .store(events.lost().unwrap_or(0), Ordering::Relaxed);
            let Ok(Some(first)) = next else { continue };
            let received = monotonic_ns();
            batch.push(first);
            events.drain_ready(&mut batch);
            shared
                .records
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            for e in batch.drain(..) {
                if let Event::Exit(x) = e
                    && x.origin.cgroup_id == measured_id
                    && let Ok(mut m) = shared.measured.lock()
                {
                    m.push((x.origin.tgid, x.origin.ktime_ns, received));
                }
            }
            shared
                .cpu_ns
                .store((thread_cpu() - start).as_nanos() as u64, Ordering::Relaxed);
        }
    });
}

/// The noise process (a fresh, small process: forks are cheap): `rate` exits
/// per second until killed.
fn noise_child(rate: u64) -> ! {
    let start = Instant::now();
    let mut made = 0u64;
    loop {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if made >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        // SAFETY: the child only calls `_exit`.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(0) },
            -1 => std::thread::sleep(Duration::from_millis(1)),
            pid => {
                // SAFETY: reaps our own child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                made += 1;
            }
        }
    }
}

/// Starts the noise process inside the cgroup `dir`.
fn start_noise(dir: &Path, rate: u64) -> Result<std::process::Child> {
    use std::os::unix::process::CommandExt as _;
    let procs = procs_path(dir)?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["--noise-child", &rate.to_string()]);
    // SAFETY: only async-signal-safe calls on a pre-built path.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}

fn phase(
    name: &str,
    samples: usize,
    measured: &std::ffi::CStr,
    shared: &Shared,
    lost: &dyn Fn() -> u64,
) -> Phase {
    let gap = Duration::from_millis(5);
    if let Ok(mut m) = shared.measured.lock() {
        m.clear();
    }
    let (r0, c0, l0) = (
        shared.records.load(Ordering::Relaxed),
        shared.cpu_ns.load(Ordering::Relaxed),
        lost(),
    );
    let start = Instant::now();
    let mut pids = Vec::with_capacity(samples);
    for _ in 0..samples {
        if let Some(pid) = exit_in(measured) {
            pids.push(pid);
        }
        std::thread::sleep(gap);
    }
    let took = start.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let got = shared
        .measured
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    let lat: Vec<Duration> = got
        .iter()
        .filter(|(tgid, ..)| pids.contains(tgid))
        .map(|(_, k, r)| Duration::from_nanos(r.saturating_sub(*k)))
        .collect();
    let records = shared.records.load(Ordering::Relaxed) - r0;
    let cpu = shared.cpu_ns.load(Ordering::Relaxed) - c0;
    Phase {
        name: name.into(),
        measured_per_s: pids.len() as f64 / took.as_secs_f64(),
        // Every other record of the phase is a noise exit.
        noise_per_s: records.saturating_sub(got.len() as u64) as f64 / took.as_secs_f64(),
        missing: pids.len().saturating_sub(lat.len()),
        latency: Summary::of(&lat),
        records_read: records,
        lost: lost() - l0,
        reader_cpu_ns_per_record: if records > 0 {
            cpu as f64 / records as f64
        } else {
            0.0
        },
    }
}

/// `run_time_ns` / `run_cnt` of this process's BPF programs (stats must be on).
fn program_stats() -> Vec<Program> {
    let names: std::collections::HashMap<u32, String> = aya::programs::loaded_programs()
        .filter_map(|p| p.ok())
        .map(|p| (p.id(), p.name_as_str().unwrap_or("?").to_owned()))
        .collect();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(ns), Some(runs)) =
            (field("prog_id:"), field("run_time_ns:"), field("run_cnt:"))
        {
            out.push(Program {
                name: names
                    .get(&(id as u32))
                    .cloned()
                    .unwrap_or_else(|| format!("prog {id}")),
                runs,
                ns_per_run: if runs > 0 {
                    ns as f64 / runs as f64
                } else {
                    0.0
                },
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

fn markdown(r: &Results) -> String {
    let mut md = format!(
        "Run {} on {} CPUs, kernel {}; hooks {}.\nCommand: `cargo xtask bench` (or `target/release/probe_latency --out bench/results`)\n\n\
         | phase | measured exits/s | noise exits/s | kernel → reader p50 (µs) | p99 (µs) | max (µs) | missing | lost | reader CPU per record (ns) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.started,
        r.cpus,
        r.kernel,
        r.hooks.join(", ")
    );
    for p in &r.phases {
        let us = |f: fn(&Summary) -> f64| {
            p.latency
                .as_ref()
                .map_or("–".into(), |s| format!("{:.0}", f(s) * 1e3))
        };
        md += &format!(
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {:.0} |\n",
            p.name,
            p.measured_per_s,
            p.noise_per_s,
            us(|s| s.p50_ms),
            us(|s| s.p99_ms),
            us(|s| s.max_ms),
            p.missing,
            p.lost,
            p.reader_cpu_ns_per_record
        );
    }
    md += "\n| kernel program | runs | ns per run |\n|---|---:|---:|\n";
    for p in &r.programs {
        md += &format!("| {} | {} | {:.0} |\n", p.name, p.runs, p.ns_per_run);
    }
    md
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(rate) = args.noise_child {
        noise_child(rate);
    }
    let samples = if args.quick { 200 } else { args.samples };
    let stats_knob = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let stats_before = std::fs::read_to_string(stats_knob).unwrap_or_default();
    std::fs::write(stats_knob, "1").context("enabling kernel.bpf_stats_enabled (needs root)")?;

    let mount = cgroup::unified_mount()?.context("no cgroup2 mount")?;
    let rel = format!("/evlet-bench-probes-{}", std::process::id());
    let root = mount.join(&rel[1..]);
    let measured = root.join("measured");
    let noisy = root.join("noise");
    for d in [&root, &measured, &noisy] {
        std::fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let result = (|| -> Result<Results> {
        use std::os::unix::fs::MetadataExt as _;
        let measured_id = std::fs::metadata(&measured)?.ino();
        let mut probes = Probes::load(&Config {
            watch_prefix: Some(format!("{rel}/")),
            ..Config::default()
        })?;
        for dir in [&measured, &noisy] {
            probes.watch(std::fs::metadata(dir)?.ino())?;
        }
        let hooks = probes
            .hooks()
            .iter()
            .map(|h| format!("{}:{:?}", h.tracepoint, h.kind))
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let events = {
            let _in_runtime = rt.enter();
            probes.take_events().context("no reader")??
        };
        let shared = Arc::new(Shared::default());
        let lost = {
            let shared = Arc::clone(&shared);
            move || shared.lost.load(Ordering::Relaxed)
        };
        let reading = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || reader(rt, events, measured_id, shared))
        };
        let measured_procs = procs_path(&measured)?;
        let mut phases = vec![phase("idle", samples, &measured_procs, &shared, &lost)];
        let mut noise = start_noise(&noisy, args.noise_rate)?;
        std::thread::sleep(Duration::from_millis(500));
        let busy = phase(
            &format!("busy ({} exits/s asked)", args.noise_rate),
            samples,
            &measured_procs,
            &shared,
            &lost,
        );
        let _ = noise.kill();
        let _ = noise.wait();
        phases.push(busy);
        let programs = program_stats();
        shared.stop.store(true, Ordering::Relaxed);
        let _ = reading.join();
        drop(probes);
        Ok(Results {
            started: jiff::Timestamp::now()
                .strftime("%Y-%m-%d %H:%M UTC")
                .to_string(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")?
                .trim()
                .into(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            hooks,
            phases,
            programs,
        })
    })();
    let _ = std::fs::write(stats_knob, stats_before.trim());
    for d in [&measured, &noisy, &root] {
        let _ = std::fs::remove_dir(d);
    }
    let results = result?;
    std::fs::create_dir_all(&args.out)?;
    let stem = args.out.join(format!(
        "probes-{}",
        jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ")
    ));
    let md = markdown(&results);
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    std::fs::write(stem.with_extension("md"), &md)?;
    if !args.quick {
        std::fs::copy(stem.with_extension("md"), args.out.join("latest-probes.md"))?;
    }
    println!("{md}");
    let missing: usize = results.phases.iter().map(|p| p.missing).sum();
    anyhow::ensure!(
        missing == 0,
        "{missing} measured exits never reached the reader"
    );
    Ok(())
}
