//! `cargo xtask vm-test`: the probe tests inside Debian cloud kernels under qemu.
//!
//! Kernels come from Debian through the private APT config (5.10 bullseye, 6.1
//! bookworm, 6.12 trixie, newest sid), cached as `.tools/kernels/<package>/vmlinuz`.
//! The `kernel_*` test binaries are built static (`+crt-static`, explicit target so
//! build scripts stay dynamic) and packed with busybox into a gzip'd newc initramfs
//! whose `/init` mounts proc/sys/tracefs/cgroup2, runs them, prints one
//! `init: success|failure` line and powers off. qemu runs under TCG (KVM on the
//! dev machines opens but does not run guests), one kernel at a time.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::apt::{self, PrivateApt};
use crate::guest::{self, Guest};
use crate::{paths, sh};

/// One kernel line of the matrix.
#[derive(Debug, Clone, Copy)]
struct Line {
    label: &'static str,
    /// `apt-cache search --names-only` pattern of its image package.
    pattern: &'static str,
}

const LINES: [Line; 4] = [
    Line {
        label: "5.10",
        pattern: r"^linux-image-5\.10\.0-[0-9]+-cloud-amd64-unsigned$",
    },
    Line {
        label: "6.1",
        pattern: r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$",
    },
    Line {
        label: "6.12",
        pattern: r"^linux-image-6\.12\.[0-9]+\+deb13-cloud-amd64-unsigned$",
    },
    Line {
        label: "sid",
        pattern: r"^linux-binary-unsigned-.*\+deb14-cloud-amd64$",
    },
];

/// Kernel builds skipped in favour of the next newest of their line.
///
/// 6.12.107+deb13 double-faults in `__kmalloc` under qemu 7.2 TCG during a plain
/// fork burst, with or without evlet's probes loaded (6.12.94+deb13 does not).
const KNOWN_BAD: &[&str] = &["linux-image-6.12.107+deb13-cloud-amd64-unsigned"];

const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";
const HELPER: &str = "evlet-probe-helper";
const SENTINEL: &str = "init: ";

/// Options of `cargo xtask vm-test`.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "vm-test")]
pub struct Options {
    /// Kernel lines to boot.
    #[arg(long, value_delimiter = ',', default_values = ["5.10", "6.1", "6.12", "sid"])]
    pub kernels: Vec<String>,
    /// Wall-clock limit per kernel, in seconds.
    #[arg(long, default_value_t = 420)]
    pub timeout: u64,
    /// Kernel lines the agent guest boots (containerd, runc and the node
    /// suites on pure cgroup v2): the oldest and the newest, as in CI.
    #[arg(long, value_delimiter = ',', default_values = ["5.10", "sid"])]
    pub agent_kernels: Vec<String>,
    /// Kernel lines the systemd guest boots (the agent guest with systemd as
    /// PID 1 and the systemd cgroup driver): the newest.
    #[arg(long, value_delimiter = ',', default_values = ["sid"])]
    pub systemd_kernels: Vec<String>,
    /// Every kernel line, for the probe tests and both guests alike.
    #[arg(long)]
    pub all: bool,
    /// Skip the agent guest.
    #[arg(long)]
    pub no_agent: bool,
    /// Skip the systemd guest.
    #[arg(long)]
    pub no_systemd: bool,
    /// Skip the probe tests (boot the guests only).
    #[arg(long)]
    pub no_probes: bool,
    /// Boot the guests with smoke checks instead of the node suites (no test
    /// build): containerd answers, a container runs, and on the systemd guest
    /// a transient slice through systemd's D-Bus API.
    #[arg(long)]
    pub smoke: bool,
    /// Wall-clock limit per agent or systemd guest, in seconds.
    #[arg(long, default_value_t = 900)]
    pub agent_timeout: u64,
}

/// Compares version-like strings numerically chunk by chunk (`6.12.9` < `6.12.10`).
fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let digit = c.is_ascii_digit();
            match out.last_mut() {
                Some((d, chunk)) if *d == digit => chunk.push(c),
                _ => out.push((digit, c.to_string())),
            }
        }
        out
    }
    for (x, y) in chunks(a).iter().zip(chunks(b).iter()) {
        let ord = match (x, y) {
            ((true, p), (true, q)) => p
                .parse::<u64>()
                .unwrap_or(0)
                .cmp(&q.parse::<u64>().unwrap_or(0)),
            ((_, p), (_, q)) => p.cmp(q),
        };
        if ord.is_ne() {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// A kernel of the matrix, cached under `.tools/kernels/<package>`.
struct Kernel {
    line: Line,
    package: String,
    vmlinuz: PathBuf,
    /// The guest's modules (`<name>.ko` and `order`, see [`guest::MODULES`]).
    modules: PathBuf,
}

/// Returns the cached `vmlinuz` and modules of the newest kernel of `line`,
/// fetching them if needed.
fn kernel(apt: &PrivateApt, line: Line) -> Result<Kernel> {
    let mut candidates = apt.search(line.pattern)?;
    candidates.retain(|c| !KNOWN_BAD.contains(&c.as_str()));
    candidates.sort_by(|a, b| natural_cmp(a, b));
    let package = candidates.pop().with_context(|| {
        format!(
            "no Debian kernel package matches {} (line {})",
            line.pattern, line.label
        )
    })?;
    let dir = paths::tools().join("kernels").join(&package);
    let vmlinuz = dir.join("vmlinuz");
    let modules = dir.join("modules");
    let kernel = Kernel {
        line,
        package: package.clone(),
        vmlinuz: vmlinuz.clone(),
        modules: modules.clone(),
    };
    if vmlinuz.is_file() && modules.join("order").is_file() {
        return Ok(kernel);
    }
    eprintln!("vm-test: fetching {package}");
    let deb = apt.download(&package)?;
    let unpacked = dir.join("unpacked");
    apt::extract(&deb, &unpacked)?;
    let image = find_vmlinuz(&unpacked).with_context(|| format!("{package} holds no vmlinuz"))?;
    fs::copy(&image, &vmlinuz)?;
    let mut debs = vec![deb];
    if !has_modules(&unpacked) {
        // Newer packaging puts the modules in a package of their own.
        let release = release(&unpacked)
            .with_context(|| format!("{package}: no lib/modules/<release> directory"))?;
        let modules_deb = apt.download(&format!("linux-modules-{release}"))?;
        apt::extract(&modules_deb, &unpacked.join("modules-package"))?;
        debs.push(modules_deb);
    }
    let _ = fs::remove_dir_all(&modules);
    guest::collect_modules(&unpacked, &modules)
        .with_context(|| format!("the guest's modules of {package}"))?;
    fs::remove_dir_all(&unpacked)?;
    for deb in debs {
        fs::remove_file(&deb)?;
    }
    Ok(kernel)
}

/// True if an unpacked kernel package holds loadable modules.
fn has_modules(root: &Path) -> bool {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
        {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if entry.file_name().to_string_lossy().contains(".ko") {
                return true;
            }
        }
    }
    false
}

/// The kernel release of an unpacked kernel package: the directory under
/// `lib/modules` or `usr/lib/modules`.
fn release(root: &Path) -> Option<String> {
    ["lib/modules", "usr/lib/modules"].iter().find_map(|m| {
        fs::read_dir(root.join(m))
            .ok()?
            .filter_map(|e| e.ok())
            .find(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
    })
}

fn find_vmlinuz(root: &Path) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).ok()?.filter_map(|e| e.ok()) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if name.starts_with("vmlinuz") {
                return Some(path);
            }
        }
    }
    None
}

/// Builds the `kernel_*` test binaries and the probe helper, static.
fn build_tests(tests: &[String]) -> Result<Vec<PathBuf>> {
    let mut args = vec![
        "test",
        "--locked",
        "--no-run",
        "--message-format=json",
        "--target",
        STATIC_TARGET,
    ];
    for t in tests {
        args.extend(["--test", t.as_str()]);
    }
    // The build lives in the machine's cache, as the fuzz build does: its
    // flags differ from the tests', so in the checkout's target directory a
    // fresh clone would build every dependency again, static.
    let target_dir = paths::cache().join("static-build");
    let out = sh::output(sh::cargo(&args).env("CARGO_TARGET_DIR", &target_dir).env(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "-C target-feature=+crt-static",
    ))
    .context("building static kernel test binaries")?;
    let mut binaries: Vec<PathBuf> = test_executables(&out)
        .into_iter()
        .map(|(_, exe)| exe)
        .collect();
    if binaries.is_empty() {
        bail!("cargo built no kernel test binaries");
    }
    binaries.push(target_dir.join(STATIC_TARGET).join("debug").join(HELPER));
    Ok(binaries)
}

/// The test executables (target name, path) of `cargo test --no-run
/// --message-format=json`'s output.
pub fn test_executables(cargo_json: &str) -> Vec<(String, PathBuf)> {
    cargo_json
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["profile"]["test"] == true)
        .filter_map(|msg| {
            let exe = msg["executable"].as_str()?;
            let name = msg["target"]["name"].as_str()?;
            Some((name.to_owned(), PathBuf::from(exe)))
        })
        .collect()
}

/// A gzip'd newc cpio archive, written entry by entry.
pub struct Cpio {
    out: flate2::write::GzEncoder<Vec<u8>>,
    ino: u32,
}

impl Cpio {
    pub fn new() -> Self {
        Self {
            out: flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()),
            ino: 1,
        }
    }

    pub fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.pad(110 + name.len() + 1)?;
        self.out.write_all(data)?;
        self.pad(data.len())?;
        Ok(())
    }

    fn pad(&mut self, len: usize) -> Result<()> {
        let pad = (4 - len % 4) % 4;
        self.out.write_all(&[0u8; 3][..pad])?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<Vec<u8>> {
        self.entry("TRAILER!!!", 0, &[])?;
        Ok(self.out.finish()?)
    }
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
ulimit -l unlimited
# Processes are slow to make under emulation: a burst of 20 000 (still
# more exit records than the ring buffer holds) instead of the host's 50 000.
export CI=true RUST_BACKTRACE=1 EVLET_PROBE_HELPER=/bin/evlet-probe-helper EVLET_PROBE_BURST=20000
echo "init: kernel $(uname -r)"
rc=0
for t in /tests/*; do
  "$t" --test-threads=1 || rc=1
done
if [ $rc = 0 ]; then echo "init: success"; else echo "init: failure"; fi
poweroff -f
"#;

fn initramfs(binaries: &[PathBuf], dest: &Path) -> Result<()> {
    let mut cpio = Cpio::new();
    for dir in ["bin", "sbin", "proc", "sys", "dev", "tmp", "tests", "etc"] {
        cpio.entry(dir, 0o040_755, &[])?;
    }
    cpio.entry(
        "bin/busybox",
        0o100_755,
        &fs::read("/bin/busybox").context("reading /bin/busybox (busybox-static)")?,
    )?;
    cpio.entry("init", 0o100_755, INIT.as_bytes())?;
    for bin in binaries {
        let name = bin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
        let dest = if name == HELPER {
            format!("bin/{name}")
        } else {
            format!("tests/{name}")
        };
        cpio.entry(&dest, 0o100_755, &bytes)?;
    }
    fs::write(dest, cpio.finish()?)?;
    Ok(())
}

/// Result of one kernel's boot.
#[derive(Debug)]
struct Boot {
    label: String,
    /// Test name -> passed.
    results: Vec<(String, bool)>,
    success: bool,
    problem: Option<String>,
    elapsed: Duration,
    /// Booted a second time because the first boot died before any test ran.
    retried: bool,
}

/// The last `n` lines of a log file, for failure reports.
fn tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The failed tests' panics in `log`: each `panicked at` line with the
/// `n` lines after it (the assertion and its values), which a log tail full
/// of the runtime's output leaves out.
fn test_panics(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("panicked at"))
        .map(|(i, _)| lines[i..lines.len().min(i + 1 + n)].join("\n"))
        .collect::<Vec<_>>()
        .join("\n--\n")
}

const PANICS: [&str; 3] = [
    "end Kernel panic",
    "rcu: RCU grace-period kthread stack dump:",
    "watchdog: BUG: soft lockup",
];

/// The probe tests' guest memory (the agent guests' is [`guest::MEMORY`]).
const PROBES_MEMORY: &str = "1024M";

fn boot(
    label: &str,
    memory: &str,
    vmlinuz: &Path,
    initrd: &Path,
    limit: Duration,
    log: &Path,
) -> Result<Boot> {
    let started = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-m",
            memory,
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 noapic panic=-1 quiet loglevel=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (run `cargo xtask setup`)")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let stderr = child.stderr.take().context("qemu stderr")?;
    let (tx, rx) = mpsc::channel::<String>();
    let err_tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if err_tx.send(format!("qemu: {line}")).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log_file = fs::File::create(log)?;
    let mut results = Vec::new();
    let mut success = None;
    let mut problem = None;
    // The PLEG mode of the agent guest's current suite, prefixed to its tests.
    let mut mode = String::new();
    let deadline = started + limit;
    loop {
        let now = Instant::now();
        if now >= deadline {
            problem = Some(format!("timed out after {limit:?}"));
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(line) => {
                writeln!(log_file, "{line}")?;
                let line = line.trim_end_matches('\r');
                if let Some(rest) = line.strip_prefix("test ")
                    && let Some((name, verdict)) = rest.rsplit_once(" ... ")
                {
                    results.push((format!("{mode}{name}"), verdict == "ok"));
                } else if let Some(rest) = line.strip_prefix(SENTINEL) {
                    match rest {
                        "success" => success = Some(true),
                        "failure" => success = Some(false),
                        _ => {
                            if let Some(m) = rest.strip_prefix("mode ") {
                                mode = format!("[{m}] ");
                            }
                            eprintln!("vm-test {label}: {line}");
                        }
                    }
                } else if PANICS.iter().any(|p| line.contains(p)) {
                    problem = Some(format!("kernel problem: {line}"));
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                problem = Some(format!("timed out after {limit:?}"));
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if problem.is_some() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    if problem.is_none() && !status.success() {
        problem = Some(format!("qemu exited with {status}"));
    }
    if problem.is_none() && success.is_none() {
        problem = Some("no `init: success|failure` line".into());
    }
    if results.is_empty() || results.iter().any(|(_, ok)| !ok) {
        success = Some(false);
    }
    Ok(Boot {
        label: label.to_owned(),
        results,
        success: success == Some(true) && problem.is_none(),
        problem,
        elapsed: started.elapsed(),
        retried: false,
    })
}

/// Prints the kernel × test matrix.
fn print_matrix(boots: &[Boot]) {
    let mut tests: Vec<&str> = boots
        .iter()
        .flat_map(|b| b.results.iter().map(|(n, _)| n.as_str()))
        .collect();
    tests.sort_unstable();
    tests.dedup();
    let width = tests.iter().map(|t| t.len()).max().unwrap_or(4).max(4);
    print!("{:width$}", "test");
    for b in boots {
        print!(" | {:>6}", b.label);
    }
    println!();
    for t in &tests {
        print!("{t:width$}");
        for b in boots {
            let cell = match b.results.iter().find(|(n, _)| n == t) {
                Some((_, true)) => "ok",
                Some((_, false)) => "FAIL",
                None => "-",
            };
            print!(" | {cell:>6}");
        }
        println!();
    }
    print!("{:width$}", "(boot)");
    for b in boots {
        print!(" | {:>5.0}s", b.elapsed.as_secs_f64());
    }
    println!();
    print!("{:width$}", "(second boot)");
    for b in boots {
        print!(" | {:>6}", if b.retried { "yes" } else { "no" });
    }
    println!();
}

/// Boots `initrd` on `k`, once more if the kernel died before any test ran;
/// says how it went.
fn boot_one(
    what: &str,
    memory: &str,
    k: &Kernel,
    initrd: &Path,
    limit: Duration,
    work: &Path,
) -> Result<Boot> {
    let label = k.line.label;
    eprintln!("vm-test: booting {} ({what})", k.package);
    let log = work.join(format!("{what}-{label}.log"));
    let mut b = boot(label, memory, &k.vmlinuz, initrd, limit, &log)?;
    if !b.success && b.results.is_empty() {
        // The kernel died before any test ran: that is the emulator or the
        // boot, not the code under test. Show why, then boot once more.
        eprintln!(
            "vm-test: {label} ({what}) died before any test ran ({}); log tail:\n{}\nvm-test: booting {} again",
            b.problem.as_deref().unwrap_or("no verdict"),
            tail(&log, 25),
            k.package
        );
        b = boot(label, memory, &k.vmlinuz, initrd, limit, &log)?;
        b.retried = true;
    }
    eprintln!(
        "vm-test: {label} ({what}) {} in {:.0?}{} (log {})",
        if b.success { "passed" } else { "FAILED" },
        b.elapsed,
        b.problem
            .as_deref()
            .map(|p| format!(": {p}"))
            .unwrap_or_default(),
        log.display()
    );
    if !b.success {
        eprintln!("vm-test: {label} ({what}) log tail:\n{}", tail(&log, 60));
        let panics = test_panics(&log, 8);
        if !panics.is_empty() {
            eprintln!("vm-test: {label} ({what}) test panics:\n{panics}");
        }
    }
    Ok(b)
}

/// Boots each kernel, one after the other: two guests at once on this
/// machine kind's two cores take as long as both in turn, and their tests'
/// time bounds fail.
fn boot_each(
    what: &str,
    memory: &str,
    kernels: &[&Kernel],
    initrd: impl Fn(&Kernel) -> Result<PathBuf>,
    limit: Duration,
    work: &Path,
) -> Result<Vec<Boot>> {
    kernels
        .iter()
        .map(|k| boot_one(what, memory, k, &initrd(k)?, limit, work))
        .collect()
}

/// The kernels of `boots` that failed, as `<kernel> (<what>)`.
fn failures(boots: &[Boot], what: &str) -> Vec<String> {
    boots
        .iter()
        .filter(|b| !b.success)
        .map(|b| format!("{} ({what})", b.label))
        .collect()
}

fn lines_of(labels: &[String]) -> Result<Vec<Line>> {
    labels
        .iter()
        .map(|k| {
            LINES
                .iter()
                .copied()
                .find(|l| l.label == k)
                .with_context(|| format!("unknown kernel line {k:?}: use 5.10, 6.1, 6.12 or sid"))
        })
        .collect()
}

/// Builds `guest`'s archive and boots it on each of `kernels` with its
/// kernel's modules; prints its matrix and returns its failures.
fn boot_guest(
    guest: Guest,
    kernels: &[&Kernel],
    options: &Options,
    work: &Path,
) -> Result<Vec<String>> {
    let guest_work = work.join("guest");
    fs::create_dir_all(&guest_work)?;
    let common = fs::read(guest::archive(guest, &guest_work, options.smoke)?)?;
    let initrd = |k: &Kernel| -> Result<PathBuf> {
        let modules = guest_work.join(format!("modules-{}.cpio.gz", k.line.label));
        guest::modules_archive(&k.modules, &modules)?;
        // Two gzip'd archives back to back: the kernel unpacks both.
        let mut bytes = common.clone();
        bytes.extend(fs::read(&modules)?);
        let dest = guest_work.join(format!(
            "initramfs-{}-{}.cpio.gz",
            guest.name(),
            k.line.label
        ));
        fs::write(&dest, bytes)?;
        Ok(dest)
    };
    let limit = Duration::from_secs(options.agent_timeout);
    let boots = boot_each(guest.name(), guest::MEMORY, kernels, initrd, limit, work)?;
    println!("{}:", guest.title());
    print_matrix(&boots);
    Ok(failures(&boots, guest.name()))
}

/// Runs the matrix: the probe tests on `--kernels`, then the agent guest on
/// `--agent-kernels` and the systemd guest on `--systemd-kernels` (every
/// kernel with `--all`); fails if any kernel fails, times out, or panics.
pub fn vm_test(options: &Options, kernel_tests: &[String]) -> Result<()> {
    let all: Vec<String> = LINES.iter().map(|l| l.label.to_owned()).collect();
    let chosen = |skip: bool, labels: &[String]| -> Result<Vec<Line>> {
        match (skip, options.all) {
            (true, _) => Ok(Vec::new()),
            (false, true) => lines_of(&all),
            (false, false) => lines_of(labels),
        }
    };
    let probe_lines = chosen(options.no_probes, &options.kernels)?;
    let guests = [
        (
            Guest::Agent,
            chosen(options.no_agent, &options.agent_kernels)?,
        ),
        (
            Guest::Systemd,
            chosen(options.no_systemd, &options.systemd_kernels)?,
        ),
    ];
    let apt = PrivateApt::open()?;
    let mut kernels: Vec<Kernel> = Vec::new();
    for line in probe_lines.iter().chain(guests.iter().flat_map(|(_, l)| l)) {
        if !kernels.iter().any(|k| k.line.label == line.label) {
            kernels.push(kernel(&apt, *line)?);
        }
    }
    let pick = |lines: &[Line]| -> Vec<&Kernel> {
        lines
            .iter()
            .filter_map(|l| kernels.iter().find(|k| k.line.label == l.label))
            .collect()
    };
    let work = paths::repo().join("target/vm-test");
    fs::create_dir_all(&work)?;
    let mut failed = Vec::new();
    if !probe_lines.is_empty() {
        let binaries = build_tests(kernel_tests)?;
        let initrd = work.join("initramfs.cpio.gz");
        initramfs(&binaries, &initrd)?;
        let limit = Duration::from_secs(options.timeout);
        let boots = boot_each(
            "probes",
            PROBES_MEMORY,
            &pick(&probe_lines),
            |_| Ok(initrd.clone()),
            limit,
            &work,
        )?;
        println!("probe tests:");
        print_matrix(&boots);
        failed.extend(failures(&boots, "probes"));
    }
    for (guest, lines) in &guests {
        if !lines.is_empty() {
            failed.extend(boot_guest(*guest, &pick(lines), options, &work)?);
        }
    }
    if !failed.is_empty() {
        bail!("vm-test failed on kernel(s) {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut v = [
            "linux-image-6.12.9+deb13",
            "linux-image-6.12.107+deb13",
            "linux-image-6.12.94+deb13",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v.last(), Some(&"linux-image-6.12.107+deb13"));
        assert!(natural_cmp("5.10.0-32", "5.10.0-30").is_gt());
    }
}
