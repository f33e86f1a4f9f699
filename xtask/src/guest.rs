//! The whole agent inside the kernel matrix's guests, on pure cgroup v2.
//!
//! A guest is an initramfs: busybox, containerd 2.1 with its shim and `ctr`,
//! runc, the CNI bridge/host-local/loopback plugins, the local images, and the
//! host's `node_*` test binaries (debug info stripped) with their libraries.
//! The userland's C library, libseccomp and runc are Debian sid's, the line
//! containerd 2.1 comes from: bookworm's runc 1.1.5 cannot start a container
//! on 5.10 (`nsexec: could not ensure we are a cloned binary`), and glibc runs
//! binaries linked against an older glibc, so the host's test binaries run
//! there unchanged. Each kernel gets a second, small archive with its own
//! `overlay`, `bridge` and `veth` modules (and their dependencies),
//! concatenated to the first: the kernel unpacks both.
//!
//! Each guest's `/init` copies the archive into a tmpfs and switches root to
//! it (runc's `pivot_root` cannot leave the initramfs root). There the two
//! [`Guest`]s part:
//!
//! * the agent guest's `/init` stays PID 1, mounts cgroup2 alone at
//!   `/sys/fs/cgroup` (pure v2) and runs [`RUN`] with [`SUITES`];
//! * the systemd guest execs the host's systemd (with the host's D-Bus), which
//!   mounts cgroup2 itself and starts one unit, `evlet-suite.service`, that
//!   runs [`RUN`] with [`SYSTEMD_SUITES`], containerd's runc and the tests on
//!   the systemd cgroup driver (`EVLET_E2E_CGROUP_DRIVER=systemd`).
//!
//! [`RUN`] loads the modules, starts containerd, imports the images and runs
//! the suites with the node tests' environment, one `init: mode <mode>` line
//! before each suite, then `init: success` or `init: failure` on the console.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::apt::{self, PrivateApt};
use crate::containerd::{self, Version};
use crate::vm::Cpio;
use crate::{image, paths, sh};

/// The containerd line inside the guests: the newest.
const CONTAINERD: Version = Version::V2_1;

/// Debian sid packages of the guest's userland: runc, and the C library and
/// libseccomp it links.
const SID_PACKAGES: [&str; 3] = ["runc", "libc6", "libseccomp2"];

/// CNI plugins the node's network uses (Debian's, static Go programs).
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];

/// Modules containerd (overlayfs snapshots) and the CNI bridge need; their
/// dependencies are found in the modules' `depends=`.
pub const MODULES: [&str; 3] = ["overlay", "bridge", "veth"];

/// One node test binary and the tests of it the guest runs, in which PLEG modes.
struct Suite {
    test: &'static str,
    /// libtest name filters (substrings); empty: all.
    filters: &'static [&'static str],
    modes: &'static [&'static str],
}

/// The agent tests both guests run: a pod with init and app containers (logs,
/// preStop, graceful delete leaving nothing behind), kill → restart with
/// `lastState`, OOMKilled, an agent restart adopting running pods.
const AGENT_TESTS: &[&str] = &[
    "init_then_two_containers_run_with_logs_in_the_pods_layout",
    "a_killed_container_restarts_with_its_exit_in_last_state",
    "exceeding_the_memory_limit_is_reported_as_oom_killed",
    "a_restarted_agent_adopts_running_pods",
];

/// The agent guest's suite: [`AGENT_TESTS`] in `ebpf` mode with `generic` as
/// the control, then the OOM kill modes, the pods' cgroup tree and the
/// nested PID namespaces and cgroups of `node_truth` on pure v2.
/// Each hinted-mode test ends by asserting that a full relist found no change
/// the kernel's hints missed.
const SUITES: &[Suite] = &[
    Suite {
        test: "node_agent",
        filters: AGENT_TESTS,
        modes: &["ebpf", "generic"],
    },
    Suite {
        test: "node_pleg",
        filters: &[
            "a_childs_oom_kill_does_not_make_the_container_oom_killed",
            "a_childs_oom_kill_follows_the_nodes_default_oom_kill_mode",
            "an_init_oom_kill_is_oom_killed_from_the_kernel",
        ],
        modes: &["ebpf"],
    },
    Suite {
        test: "node_cgroups",
        filters: &[],
        modes: &["ebpf"],
    },
    Suite {
        test: "node_truth",
        filters: &[],
        modes: &["ebpf"],
    },
];

/// The systemd guest's suite, with the systemd cgroup driver: [`AGENT_TESTS`],
/// the pods' cgroup tree and `node_truth`, in `ebpf` mode.
const SYSTEMD_SUITES: &[Suite] = &[
    Suite {
        test: "node_agent",
        filters: AGENT_TESTS,
        modes: &["ebpf"],
    },
    Suite {
        test: "node_cgroups",
        filters: &[],
        modes: &["ebpf"],
    },
    Suite {
        test: "node_truth",
        filters: &[],
        modes: &["ebpf"],
    },
];

/// The guests' memory (the suites' pods, containerd and a tmpfs root).
pub const MEMORY: &str = "3072M";

/// The node's directory inside the guest, as `cargo xtask node` lays it out.
const NODE_DIR: &str = "/var/lib/evlet-node/2.1";

/// The two agent guests: the same userland, node and images, another PID 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// busybox's shell is PID 1 and mounts cgroup2 itself; runc and the
    /// tests use the cgroupfs driver.
    Agent,
    /// The host's systemd is PID 1, with the host's D-Bus; runc and the tests
    /// use the systemd cgroup driver.
    Systemd,
}

impl Guest {
    /// The guest's short name: its archive's, logs' and failures' label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Systemd => "systemd",
        }
    }

    /// The heading of the guest's results.
    pub fn title(self) -> String {
        match self {
            Self::Agent => format!("agent guest (containerd {CONTAINERD}, pure cgroup v2)"),
            Self::Systemd => format!(
                "systemd guest (containerd {CONTAINERD}, pure cgroup v2, {} as PID 1)",
                systemd_version()
            ),
        }
    }

    fn suites(self) -> &'static [Suite] {
        match self {
            Self::Agent => SUITES,
            Self::Systemd => SYSTEMD_SUITES,
        }
    }

    /// The lines [`RUN`] starts with: the guest's mounts and its `diagnose`.
    fn setup(self) -> &'static str {
        match self {
            Self::Agent => AGENT_SETUP,
            Self::Systemd => SYSTEMD_SETUP,
        }
    }

    /// The smoke checks that stand for the suites with `--smoke`.
    fn smoke(self) -> String {
        let (run_flags, extra) = match self {
            Self::Agent => ("", ""),
            Self::Systemd => (
                " --runc-systemd-cgroup --cgroup system.slice:evlet:smoke",
                SYSTEMD_SMOKE,
            ),
        };
        SMOKE.replace("@RUN_FLAGS@", run_flags) + extra
    }
}

/// The host's systemd version, as `systemd <n>`.
fn systemd_version() -> String {
    sh::output(std::process::Command::new(SYSTEMD).arg("--version"))
        .ok()
        .and_then(|out| {
            let words: Vec<&str> = out.split_whitespace().take(2).collect();
            (words.len() == 2).then(|| words.join(" "))
        })
        .unwrap_or_else(|| "systemd".to_owned())
}

/// Where a file of the archive comes from.
enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
    Link(String),
}

/// Files of an archive by their path inside the guest.
#[derive(Default)]
struct Tree(BTreeMap<String, (u32, Source)>);

impl Tree {
    fn file(&mut self, guest: &str, host: &Path) {
        self.0
            .insert(guest.to_owned(), (0o100_755, Source::File(host.to_owned())));
    }

    fn bytes(&mut self, guest: &str, mode: u32, data: Vec<u8>) {
        self.0.insert(guest.to_owned(), (mode, Source::Bytes(data)));
    }

    /// A host's configuration file (not executable), read now.
    fn config(&mut self, guest: &str, host: &Path) -> Result<()> {
        let data = fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        self.bytes(guest, 0o100_644, data);
        Ok(())
    }

    fn link(&mut self, guest: &str, target: &str) {
        self.0.insert(
            guest.to_owned(),
            (0o120_777, Source::Link(target.to_owned())),
        );
    }

    /// Every file of `dir` (recursively, symlinks kept) under `guest`.
    fn dir(&mut self, guest: &str, dir: &Path) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            let name = format!("{guest}/{}", entry.file_name().to_string_lossy());
            let kind = entry.file_type()?;
            if kind.is_symlink() {
                self.link(&name, &fs::read_link(&path)?.to_string_lossy());
            } else if kind.is_dir() {
                self.dir(&name, &path)?;
            } else {
                self.file(&name, &path);
            }
        }
        Ok(())
    }

    /// The host's shared libraries `programs` load (as `ldd` resolves them),
    /// flat under `usr/lib/x86_64-linux-gnu` (the loader's default path).
    fn libraries(&mut self, programs: &[PathBuf]) -> Result<()> {
        for program in programs {
            for lib in libraries(program)? {
                let name = lib
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if name.starts_with("ld-linux") {
                    continue;
                }
                self.file(
                    &format!("usr/lib/x86_64-linux-gnu/{name}"),
                    &fs::canonicalize(&lib)?,
                );
            }
        }
        Ok(())
    }

    /// Writes the archive: each file's missing parent directories first.
    fn write(&self, dest: &Path) -> Result<()> {
        let mut cpio = Cpio::new();
        let mut dirs = std::collections::BTreeSet::new();
        for guest in self.0.keys() {
            let mut parent = Path::new(guest).parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                dirs.insert(p.to_string_lossy().into_owned());
                parent = p.parent();
            }
        }
        for dir in &dirs {
            if !self.0.contains_key(dir) {
                cpio.entry(dir, 0o040_755, &[])?;
            }
        }
        for (guest, (mode, source)) in &self.0 {
            let data = match source {
                Source::File(host) => {
                    fs::read(host).with_context(|| format!("reading {}", host.display()))?
                }
                Source::Bytes(b) => b.clone(),
                Source::Link(target) => target.as_bytes().to_vec(),
            };
            cpio.entry(guest, *mode, &data)?;
        }
        fs::write(dest, cpio.finish()?)?;
        Ok(())
    }
}

/// The sid packages of the userland, unpacked once under `.tools/guest`.
fn sid_userland(apt: &PrivateApt) -> Result<PathBuf> {
    let root = paths::tools().join("guest/sid");
    let stamp = root.join(".complete");
    if stamp.is_file() {
        return Ok(root);
    }
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    for package in SID_PACKAGES {
        let version = apt.version_in(package, "sid")?;
        eprintln!("vm-test: fetching {package} {version} from Debian sid");
        let deb = apt.download(&format!("{package}={version}"))?;
        let unpacked = paths::tools().join("guest/unpack");
        apt::extract(&deb, &unpacked)?;
        sh::run(
            std::process::Command::new("cp")
                .args(["-a", "--"])
                .arg(unpacked.join("."))
                .arg(&root),
        )?;
        fs::remove_dir_all(&unpacked)?;
    }
    fs::write(&stamp, b"")?;
    Ok(root)
}

/// The shared libraries `binary` loads, as `ldd` resolves them on the host.
fn libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = sh::output(std::process::Command::new("ldd").arg(binary))
        .with_context(|| format!("the libraries of {}", binary.display()))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from)
        .collect())
}

/// Builds the `node_*` test binaries of `suites` and strips their debug
/// info into `work` (a 100 MB test binary unpacks slowly under TCG).
fn build_tests(suites: &[Suite], work: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut args = vec!["test", "--locked", "--no-run", "--message-format=json"];
    for suite in suites {
        args.extend(["--test", suite.test]);
    }
    let out = sh::output(&mut sh::cargo(&args)).context("building the guest's node tests")?;
    let mut binaries = Vec::new();
    for (name, exe) in crate::vm::test_executables(&out) {
        let stripped = work.join(&name);
        sh::run(
            std::process::Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&stripped)
                .arg(exe),
        )?;
        binaries.push((name, stripped));
    }
    if binaries.len() != suites.len() {
        bail!(
            "cargo built {} of the guest's {} test binaries",
            binaries.len(),
            suites.len()
        );
    }
    Ok(binaries)
}

/// The shell lines that run `suites`, each after its `init: mode` line.
fn suite_script(suites: &[Suite]) -> String {
    let mut script = String::new();
    for suite in suites {
        for mode in suite.modes {
            let exact = if suite.filters.is_empty() {
                ""
            } else {
                " --exact"
            };
            script += &format!(
                "echo \"init: mode {mode}\"\nEVLET_E2E_PLEG={mode} /tests/{} --test-threads=1{exact} {} || rc=1\n",
                suite.test,
                suite.filters.join(" ")
            );
        }
    }
    script
}

/// The first stage of every guest's `/init`: it copies the archive into a
/// tmpfs (runc's `pivot_root` cannot leave the initramfs root) and there
/// execs `@PID1@`, the agent guest's `/init` again or systemd.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
if [ ! -e /.switched ]; then
  # runc's pivot_root cannot leave the initramfs root: move to a tmpfs.
  mkdir -p /newroot /proc
  mount -t tmpfs -o size=2200m tmpfs /newroot
  for d in /*; do [ "$d" = /newroot ] || [ "$d" = /proc ] || cp -a "$d" /newroot/; done
  mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run /newroot/var
  touch /newroot/.switched
  exec switch_root /newroot @PID1@
fi
"#;

/// The agent guest's setup: the shell is PID 1 and mounts everything,
/// cgroup2 alone at `/sys/fs/cgroup` (pure v2).
const AGENT_SETUP: &str = r#"mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
diagnose() { echo "init: containerd log tail"; tail -30 /tmp/containerd.log; }
"#;

/// How the systemd guest's PID 1 starts: only [`SYSTEMD_UNIT`]'s target; its
/// warnings, failed units and what services print on the console (the guest
/// has no journal).
const SYSTEMD_PID1: &str = "/lib/systemd/systemd --unit=evlet.target --log-target=console \
     --log-level=warning --show-status=error --default-standard-output=tty";

/// The systemd guest's setup, in [`SYSTEMD_UNIT`]: systemd mounted the API
/// file systems and cgroup2 (pure v2) but not tracefs; the suites wait for
/// systemd's name on the system bus.
const SYSTEMD_SETUP: &str = r#"export SYSTEMD_PAGER=cat SYSTEMD_COLORS=0
grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs tracefs /sys/kernel/tracing
diagnose() {
  echo "init: containerd log tail"; tail -30 /tmp/containerd.log
  f=$(systemctl --failed --no-legend --plain | cut -d' ' -f1 | tr '\n' ' ')
  echo "init: systemd is $(systemctl is-system-running), failed units: ${f:-none}"
}
echo "init: $(systemctl --version | head -1 | cut -d' ' -f1,2) is PID 1 ($(cat /proc/1/comm)); unit started $(cut -d' ' -f1 /proc/uptime)s after boot"
i=0
until busctl --acquired list 2>/dev/null | grep -q '^org\.freedesktop\.systemd1 '; do
  i=$((i+1))
  [ $i -le 150 ] || fail "systemd is not on the system bus"
  sleep 0.2
done
echo "init: systemd on the system bus $(cut -d' ' -f1 /proc/uptime)s after boot"
export EVLET_E2E_CGROUP_DRIVER=systemd
# Each test's cgroup root sits at the top: systemd slice names repeat every
# part above them, and the eBPF cgroup watch prefix holds 64 bytes.
export EVLET_CGROUP_ROOT=/
"#;

/// What both guests do once set up: load the modules, start containerd,
/// import the images, run `@SUITES@` and power off, one `init: success` or
/// `init: failure` line before.
const RUN: &str = r#"# The console's first line carries the firmware's escape codes.
echo
export PATH=/opt/containerd/bin:/bin:/sbin:/usr/bin
fail() { echo "init: $1"; diagnose; echo "init: failure"; poweroff -f; }
@SETUP@for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "init: insmod $m failed"; done
ip link set lo up
hostname evlet-guest
ulimit -l unlimited
ulimit -n 65536
echo "init: kernel $(uname -r), /sys/fs/cgroup is $(awk '$2 == "/sys/fs/cgroup" { print $3 }' /proc/mounts), $(grep -c '^[^ ]* [^ ]* cgroup ' /proc/mounts) cgroup v1 hierarchies"
D=@NODE_DIR@
mkdir -p $D/root $D/state $D/cni/net.d $D/cni/ipam
t0=$(date +%s)
containerd --config $D/config.toml > /tmp/containerd.log 2>&1 &
i=0
until ctr -a $D/containerd.sock version > /dev/null 2>&1; do
  i=$((i+1))
  [ $i -le 300 ] || fail "containerd did not serve"
  sleep 0.2
done
for f in /images/*.tar; do
  ok=
  for attempt in 1 2 3; do
    if timeout 120 ctr -a $D/containerd.sock -n k8s.io images import "$f" > /dev/null; then ok=1; break; fi
    echo "init: import of $f failed (attempt $attempt)"
  done
  [ -n "$ok" ] || fail "no import of $f"
done
echo "init: containerd up, images imported in $(( $(date +%s) - t0 ))s"
# Under emulation the runtime's teardown alone takes seconds: the tests
# that bound a grace period allow 10 s over it instead of the host's 5.
export CI=true RUST_BACKTRACE=1 EVLET_E2E_SLACK_SECS=10 EVLET_CRI_ENDPOINT=unix://$D/containerd.sock EVLET_CONTAINERD_VERSION=2.1 EVLET_NODE_DIR=$D EVLET_CGROUP_ROOT=${EVLET_CGROUP_ROOT:-/evlet-node-21} EVLET_PAUSE_IMAGE=@PAUSE@ EVLET_TEST_IMAGE=@TEST@
rc=0
@SUITES@
echo "init: suites done in $(( $(date +%s) - t0 ))s"
[ $rc = 0 ] || diagnose
if [ $rc = 0 ]; then echo "init: success"; else echo "init: failure"; fi
poweroff -f
"#;

/// `--smoke`'s checks instead of the suites, printed as libtest prints tests.
const SMOKE: &str = r#"smoke() {
  n=$1; shift
  if "$@" > /tmp/smoke.out 2>&1; then echo "test smoke::$n ... ok"
  else cat /tmp/smoke.out; echo "test smoke::$n ... FAILED"; rc=1; fi
}
smoke ctr_answers ctr -a $D/containerd.sock version
smoke a_container_runs ctr -a $D/containerd.sock -n k8s.io run --rm@RUN_FLAGS@ @TEST@ evlet-smoke /bin/true
"#;

/// The systemd guest's smoke check of systemd's D-Bus API: a transient slice
/// with a CPU weight and a memory limit, as the systemd cgroup driver asks.
const SYSTEMD_SMOKE: &str = r#"transient_slice() {
  busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager StartTransientUnit 'ssa(sv)a(sa(sv))' test-pod_x.slice replace 2 CPUWeight t 50 MemoryMax t 67108864 0 || return 1
  s=/sys/fs/cgroup/test.slice/test-pod_x.slice
  i=0
  until [ -e $s/cpu.weight ] && [ -e $s/memory.max ]; do i=$((i+1)); [ $i -le 50 ] || return 1; sleep 0.1; done
  echo "init: $s: cpu.weight $(cat $s/cpu.weight), memory.max $(cat $s/memory.max)" > /dev/console
  [ "$(cat $s/cpu.weight)" = 50 ] && [ "$(cat $s/memory.max)" = 67108864 ]
}
smoke a_transient_slice_gets_its_cpu_weight_and_memory_max transient_slice
"#;

/// The systemd guest's PID 1 and the D-Bus daemon, from the host.
const SYSTEMD: &str = "/lib/systemd/systemd";
const SYSTEMD_PROGRAMS: [&str; 4] = [
    SYSTEMD,
    "/usr/bin/systemctl",
    "/usr/bin/busctl",
    "/usr/bin/dbus-daemon",
];

/// The host's units systemd reaches [`SYSTEMD_UNIT`] through (a unit's
/// default dependencies, and D-Bus). Their `.wants` are left out: the guest
/// has no journald, udev or tmpfiles.
const SYSTEMD_UNITS: [&str; 13] = [
    "basic.target",
    "sysinit.target",
    "sockets.target",
    "local-fs.target",
    "local-fs-pre.target",
    "swap.target",
    "timers.target",
    "paths.target",
    "slices.target",
    "shutdown.target",
    "umount.target",
    "dbus.socket",
    "dbus.service",
];

/// The systemd guest's target (systemd's `--unit`) and the service that
/// runs [`RUN`] as `/evlet-suite`, its output on the console. It runs even if
/// D-Bus does not start (its wait for the bus then fails, saying why), and
/// should it end without powering off, systemd powers off.
const SYSTEMD_UNIT: &str = r#"[Unit]
Description=evlet's node suites
Wants=dbus.socket dbus.service
After=dbus.socket dbus.service
SuccessAction=poweroff-immediate
FailureAction=poweroff-immediate

[Service]
Type=oneshot
ExecStart=/evlet-suite
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/console
TimeoutStartSec=infinity
LimitMEMLOCK=infinity
LimitNOFILE=65536
"#;
const SYSTEMD_TARGET: &str = r#"[Unit]
Description=evlet's guest
Wants=evlet-suite.service
After=evlet-suite.service
"#;

/// systemd's and D-Bus's programs, configuration and units in `tree`, the
/// node suites' service, and the machine's identity.
fn add_systemd(tree: &mut Tree) -> Result<()> {
    if let Some(missing) = SYSTEMD_PROGRAMS.iter().find(|p| !Path::new(p).is_file()) {
        bail!(
            "the systemd guest packs this host's systemd and D-Bus, and {missing} is missing \
             (Debian packages systemd and dbus-daemon); skip the guest with --no-systemd"
        );
    }
    for program in SYSTEMD_PROGRAMS {
        tree.file(program.trim_start_matches('/'), Path::new(program));
    }
    let units = Path::new("/lib/systemd/system");
    for unit in SYSTEMD_UNITS {
        tree.config(&format!("usr/lib/systemd/system/{unit}"), &units.join(unit))?;
    }
    // The bus's configuration, and the policy that lets systemd own its name.
    for config in ["system.conf", "system.d/org.freedesktop.systemd1.conf"] {
        tree.config(
            &format!("usr/share/dbus-1/{config}"),
            &Path::new("/usr/share/dbus-1").join(config),
        )?;
    }
    tree.bytes(
        "etc/systemd/system/evlet-suite.service",
        0o100_644,
        SYSTEMD_UNIT.as_bytes().to_vec(),
    );
    tree.bytes(
        "etc/systemd/system/evlet.target",
        0o100_644,
        SYSTEMD_TARGET.as_bytes().to_vec(),
    );
    // A machine ID of its own: without one systemd boots as a first boot.
    tree.bytes(
        "etc/machine-id",
        0o100_444,
        b"e71e7a6e5c0d4e1e9e0a1e7e71e7e7e7\n".to_vec(),
    );
    tree.bytes(
        "etc/os-release",
        0o100_644,
        b"NAME=\"evlet guest\"\nID=evlet-guest\nPRETTY_NAME=\"evlet guest\"\n".to_vec(),
    );
    Ok(())
}

/// The guest's scripts by their path: `/init`, and the systemd guest's
/// `/evlet-suite` (its [`SYSTEMD_UNIT`]'s), running `suites`.
fn scripts(guest: Guest, suites: &str) -> Vec<(&'static str, String)> {
    let run = RUN
        .replace("@SETUP@", guest.setup())
        .replace("@SUITES@", suites)
        .replace("@NODE_DIR@", NODE_DIR)
        .replace("@PAUSE@", image::PAUSE_IMAGE)
        .replace("@TEST@", image::TEST_IMAGE);
    match guest {
        Guest::Agent => vec![("init", INIT.replace("@PID1@", "/init") + &run)],
        Guest::Systemd => vec![
            ("init", INIT.replace("@PID1@", SYSTEMD_PID1)),
            ("evlet-suite", format!("#!/bin/busybox sh\n{run}")),
        ],
    }
}

/// Builds `guest`'s archive in `work`, its kernel's modules apart: the node
/// suites, or with `smoke` the smoke checks (no test build).
pub fn archive(guest: Guest, work: &Path, smoke: bool) -> Result<PathBuf> {
    let apt = PrivateApt::open()?;
    let sid = sid_userland(&apt)?;
    let bins = containerd::binaries(CONTAINERD)?;
    let tests = if smoke {
        Vec::new()
    } else {
        let dir = work.join("tests");
        fs::create_dir_all(&dir)?;
        build_tests(guest.suites(), &dir)?
    };
    let mut tree = Tree::default();
    tree.file("bin/busybox", Path::new("/bin/busybox"));
    let suites = if smoke {
        guest.smoke()
    } else {
        suite_script(guest.suites())
    };
    for (name, script) in scripts(guest, &suites) {
        tree.bytes(name, 0o100_755, script.into_bytes());
    }
    let mut programs: Vec<PathBuf> = tests.iter().map(|(_, p)| p.clone()).collect();
    programs.push(bins.containerd.clone());
    if guest == Guest::Systemd {
        add_systemd(&mut tree)?;
        programs.extend(SYSTEMD_PROGRAMS.iter().map(PathBuf::from));
    }
    let shim = bins.bin_dir.join("containerd-shim-runc-v2");
    for (name, path) in [
        ("containerd", &bins.containerd),
        ("ctr", &bins.ctr),
        ("containerd-shim-runc-v2", &shim),
    ] {
        tree.file(&format!("opt/containerd/bin/{name}"), path);
    }
    tree.file("opt/containerd/bin/runc", &sid.join("usr/sbin/runc"));
    for plugin in CNI_PLUGINS {
        tree.file(
            &format!("usr/lib/cni/{plugin}"),
            &Path::new("/usr/lib/cni").join(plugin),
        );
    }
    // The host's libraries of the programs, then sid's C library over them
    // (the same names: sid's win).
    tree.libraries(&programs)?;
    tree.dir(
        "usr/lib/x86_64-linux-gnu",
        &sid.join("usr/lib/x86_64-linux-gnu"),
    )?;
    tree.dir("usr/lib64", &sid.join("usr/lib64"))?;
    tree.0
        .retain(|k, _| !k.starts_with("usr/lib/x86_64-linux-gnu/gconv"));
    tree.link("lib", "usr/lib");
    tree.link("lib64", "usr/lib64");
    // godbus (runc's systemd driver) dials /var/run/dbus/system_bus_socket.
    tree.link("var/run", "../run");
    for (name, path) in &tests {
        tree.file(&format!("tests/{name}"), path);
    }
    for (_, archive) in image::build_all()? {
        let name = archive
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        tree.file(&format!("images/{name}"), &archive);
    }
    tree.bytes(
        &format!("{}/config.toml", NODE_DIR.trim_start_matches('/')),
        0o100_644,
        crate::node::containerd_config(Path::new(NODE_DIR), guest == Guest::Systemd).into_bytes(),
    );
    tree.bytes(
        &format!(
            "{}/cni/net.d/10-evlet.conflist",
            NODE_DIR.trim_start_matches('/')
        ),
        0o100_644,
        serde_json::to_vec_pretty(&crate::node::cni_config(CONTAINERD, Path::new(NODE_DIR)))?,
    );
    for (name, text) in [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/sh\nmessagebus:x:100:101::/nonexistent:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        ),
        ("group", "root:x:0:\nmessagebus:x:101:\nnogroup:x:65534:\n"),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
        ),
        ("hostname", "evlet-guest\n"),
        ("hosts", "127.0.0.1 localhost evlet-guest\n"),
        ("resolv.conf", "nameserver 10.0.2.3\n"),
    ] {
        tree.bytes(&format!("etc/{name}"), 0o100_644, text.as_bytes().to_vec());
    }
    let dest = work.join(format!("{}.cpio.gz", guest.name()));
    tree.write(&dest)?;
    Ok(dest)
}

/// The archive of one kernel's modules (`modules/<name>.ko` and
/// `modules/order`, dependencies first), from the kernel's cached modules.
pub fn modules_archive(modules: &Path, dest: &Path) -> Result<()> {
    let order = fs::read_to_string(modules.join("order"))
        .with_context(|| format!("{} has no module order", modules.display()))?;
    let mut tree = Tree::default();
    for name in order.split_whitespace() {
        tree.file(
            &format!("modules/{name}.ko"),
            &modules.join(format!("{name}.ko")),
        );
    }
    tree.bytes("modules/order", 0o100_644, order.into_bytes());
    tree.write(dest)
}

/// The `depends=` of a module's `.modinfo` (names, `-` as `_`).
fn depends(module: &[u8]) -> Vec<String> {
    module
        .split(|b| *b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|d| {
            String::from_utf8_lossy(d)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// A module's bytes, decompressed (`.ko`, `.ko.xz`, `.ko.zst`).
fn module_bytes(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => Ok(fs::read(path)?),
        Some(tool) => {
            let out = std::process::Command::new(tool)
                .args(["-dc", "--"])
                .arg(path)
                .output()
                .with_context(|| format!("cannot run {tool} (run `cargo xtask setup`)"))?;
            if !out.status.success() {
                bail!(
                    "{tool} -dc {}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(out.stdout)
        }
    }
}

/// Finds [`MODULES`] and their dependencies under `unpacked` (a kernel's
/// unpacked packages), writes them decompressed to `dest` with an `order`
/// file (dependencies first). A module built into the kernel is skipped.
pub fn collect_modules(unpacked: &Path, dest: &Path) -> Result<()> {
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut builtin = String::new();
    let mut stack = vec![unpacked.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)?.filter_map(|e| e.ok()) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if name == "modules.builtin" {
                builtin += &fs::read_to_string(&path)?;
            } else if let Some(stem) = [".ko", ".ko.xz", ".ko.zst"]
                .iter()
                .find_map(|ext| name.strip_suffix(ext))
            {
                found.insert(stem.replace('-', "_"), path);
            }
        }
    }
    let is_builtin = |m: &str| {
        builtin.lines().any(|l| {
            l.rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".ko"))
                .map(|f| f.replace('-', "_"))
                == Some(m.to_owned())
        })
    };
    fs::create_dir_all(dest)?;
    let mut order: Vec<String> = Vec::new();
    fn visit(
        name: &str,
        found: &BTreeMap<String, PathBuf>,
        is_builtin: &dyn Fn(&str) -> bool,
        dest: &Path,
        order: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        if order.iter().any(|o| o == name) || depth > 16 {
            return Ok(());
        }
        let Some(path) = found.get(name) else {
            if is_builtin(name) {
                return Ok(());
            }
            bail!("kernel module {name} is neither a module of this kernel nor built in");
        };
        let bytes = module_bytes(path)?;
        for dep in depends(&bytes) {
            visit(&dep, found, is_builtin, dest, order, depth + 1)?;
        }
        fs::write(dest.join(format!("{name}.ko")), &bytes)?;
        order.push(name.to_owned());
        Ok(())
    }
    for m in MODULES {
        visit(m, &found, &is_builtin, dest, &mut order, 0)?;
    }
    fs::write(dest.join("order"), order.join("\n") + "\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modules_dependencies_come_from_its_modinfo() {
        let module = b"\x7fELF junk\0license=GPL\0depends=llc,stp\0intree=Y\0name=bridge\0";
        assert_eq!(depends(module), ["llc", "stp"]);
        assert!(depends(b"\0depends=\0name=veth\0").is_empty());
        assert_eq!(depends(b"\0depends=nf-conntrack\0"), ["nf_conntrack"]);
    }

    #[test]
    fn every_suite_runs_in_ebpf_mode_and_the_agent_suite_also_in_generic() {
        let script = suite_script(SUITES);
        assert!(script.contains("EVLET_E2E_PLEG=ebpf /tests/node_agent"));
        assert!(script.contains("EVLET_E2E_PLEG=generic /tests/node_agent"));
        assert!(
            script.contains("EVLET_E2E_PLEG=ebpf /tests/node_cgroups --test-threads=1  || rc=1")
        );
        assert!(script.contains("/tests/node_pleg --test-threads=1 --exact a_childs_oom_kill"));
    }

    #[test]
    fn the_agent_guests_init_is_pid_1_throughout_and_mounts_cgroup2_itself() {
        let scripts = scripts(Guest::Agent, &suite_script(SUITES));
        let [("init", init)] = scripts.as_slice() else {
            panic!("the agent guest has one script, /init: {scripts:?}");
        };
        assert!(init.contains("exec switch_root /newroot /init\n"));
        assert!(init.contains("mount -t cgroup2 cgroup2 /sys/fs/cgroup"));
        assert!(init.contains("EVLET_E2E_PLEG=generic /tests/node_agent"));
        assert!(!init.contains("EVLET_E2E_CGROUP_DRIVER"));
        assert!(!init.contains("@"), "a placeholder is left: {init}");
    }

    #[test]
    fn the_systemd_guest_runs_its_suites_in_a_unit_under_systemd() {
        let scripts = scripts(Guest::Systemd, &suite_script(SYSTEMD_SUITES));
        let [("init", init), ("evlet-suite", suite)] = scripts.as_slice() else {
            panic!("the systemd guest has /init and /evlet-suite: {scripts:?}");
        };
        // /init moves to the tmpfs, then systemd is PID 1 and mounts cgroup2.
        assert!(
            init.contains("exec switch_root /newroot /lib/systemd/systemd --unit=evlet.target")
        );
        assert!(init.trim_end().ends_with("fi"));
        assert!(!init.contains("cgroup2") && !suite.contains("mount -t cgroup2"));
        assert!(SYSTEMD_TARGET.contains("Wants=evlet-suite.service"));
        assert!(SYSTEMD_UNIT.contains("ExecStart=/evlet-suite\n"));
        assert!(SYSTEMD_UNIT.contains("Type=oneshot"));
        assert!(SYSTEMD_UNIT.contains("FailureAction=poweroff-immediate"));
        assert!(SYSTEMD_UNIT.contains("After=dbus.socket dbus.service"));
        assert!(SYSTEMD_UNIT.contains("TTYPath=/dev/console"));
        assert!(SYSTEMD_UNITS.contains(&"dbus.socket") && SYSTEMD_UNITS.contains(&"dbus.service"));
        // The suites wait for systemd on the bus, with the systemd driver,
        // in ebpf mode only; a failure shows systemd's failed units.
        let bus = suite
            .find("org\\.freedesktop\\.systemd1")
            .expect("waits for the bus");
        let driver = suite
            .find("export EVLET_E2E_CGROUP_DRIVER=systemd")
            .expect("the systemd driver");
        let first = suite.find("/tests/node_agent").expect("the agent suite");
        assert!(bus < driver && driver < first);
        assert!(suite.contains("EVLET_E2E_PLEG=ebpf /tests/node_cgroups"));
        assert!(!suite.contains("EVLET_E2E_PLEG=generic"));
        assert!(suite.contains("systemctl --failed"));
        assert!(suite.starts_with("#!/bin/busybox sh\n"));
        assert!(suite.trim_end().ends_with("poweroff -f"));
        assert!(!suite.contains("@"), "a placeholder is left: {suite}");
    }

    #[test]
    fn the_systemd_guests_smoke_checks_a_transient_slice_and_a_systemd_cgroup_container() {
        let smoke = Guest::Systemd.smoke();
        assert!(smoke.contains("StartTransientUnit 'ssa(sv)a(sa(sv))' test-pod_x.slice"));
        assert!(smoke.contains("run --rm --runc-systemd-cgroup --cgroup system.slice:evlet:smoke"));
        assert!(!Guest::Agent.smoke().contains("systemd"));
        let config = crate::node::containerd_config(Path::new(NODE_DIR), true);
        assert!(config.contains("SystemdCgroup = true"));
    }
}
