//! The whole agent inside the kernel matrix's guests, on pure cgroup v2.
//!
//! The guest is an initramfs: busybox, containerd 2.1 with its shim and `ctr`,
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
//! The guest's `/init` copies the archive into a tmpfs and switches root to it
//! (runc's `pivot_root` cannot leave the initramfs root), mounts cgroup2
//! alone at `/sys/fs/cgroup` (pure v2), loads the modules, starts containerd,
//! imports the images and runs [`SUITES`] with the node tests' environment,
//! one `init: mode <mode>` line before each suite, then `init: success` or
//! `init: failure`.

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

/// The guest suite: a pod with init and app containers (logs, preStop,
/// graceful delete leaving nothing behind), kill → restart with `lastState`,
/// OOMKilled, an agent restart adopting running pods — in `ebpf` mode with
/// `generic` as the control — then the OOM kill modes and the pods' cgroup
/// tree on pure v2. Each hinted-mode test ends by asserting that a full
/// relist found no change the kernel's hints missed.
const SUITES: &[Suite] = &[
    Suite {
        test: "node_agent",
        filters: &[
            "init_then_two_containers_run_with_logs_in_the_pods_layout",
            "a_killed_container_restarts_with_its_exit_in_last_state",
            "exceeding_the_memory_limit_is_reported_as_oom_killed",
            "a_restarted_agent_adopts_running_pods",
        ],
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
];

/// The guest's memory (the suites' pods, containerd and a tmpfs root).
pub const MEMORY: &str = "3072M";

/// The node's directory inside the guest, as `cargo xtask node` lays it out.
const NODE_DIR: &str = "/var/lib/evlet-node/2.1";

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

/// Builds the `node_*` test binaries of [`SUITES`] and strips their debug
/// info into `work` (a 100 MB test binary unpacks slowly under TCG).
fn build_tests(work: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut args = vec!["test", "--locked", "--no-run", "--message-format=json"];
    for suite in SUITES {
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
    if binaries.len() != SUITES.len() {
        bail!(
            "cargo built {} of the guest's {} test binaries",
            binaries.len(),
            SUITES.len()
        );
    }
    Ok(binaries)
}

/// The shell lines that run the suites, each after its `init: mode` line.
fn suite_script() -> String {
    let mut script = String::new();
    for suite in SUITES {
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

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
if [ ! -e /.switched ]; then
  # runc's pivot_root cannot leave the initramfs root: move to a tmpfs.
  mkdir -p /newroot /proc
  mount -t tmpfs -o size=2200m tmpfs /newroot
  for d in /*; do [ "$d" = /newroot ] || [ "$d" = /proc ] || cp -a "$d" /newroot/; done
  mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run /newroot/var
  touch /newroot/.switched
  exec switch_root /newroot /init
fi
mount -t proc proc /proc
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
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "init: insmod $m failed"; done
ip link set lo up
hostname evlet-guest
ulimit -l unlimited
ulimit -n 65536
echo "init: kernel $(uname -r), /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)"
D=@NODE_DIR@
mkdir -p $D/root $D/state $D/cni/net.d $D/cni/ipam
export PATH=/opt/containerd/bin:/bin:/sbin
t0=$(date +%s)
containerd --config $D/config.toml > /tmp/containerd.log 2>&1 &
i=0
until ctr -a $D/containerd.sock version > /dev/null 2>&1; do
  i=$((i+1))
  if [ $i -gt 300 ]; then echo "init: containerd did not serve"; tail -30 /tmp/containerd.log; echo "init: failure"; poweroff -f; fi
  sleep 0.2
done
for f in /images/*.tar; do
  ok=
  for attempt in 1 2 3; do
    if timeout 120 ctr -a $D/containerd.sock -n k8s.io images import "$f" > /dev/null; then ok=1; break; fi
    echo "init: import of $f failed (attempt $attempt)"
  done
  [ -n "$ok" ] || { tail -30 /tmp/containerd.log; echo "init: failure"; poweroff -f; }
done
echo "init: containerd up, images imported in $(( $(date +%s) - t0 ))s"
export CI=true RUST_BACKTRACE=1 EVLET_CRI_ENDPOINT=unix://$D/containerd.sock EVLET_CONTAINERD_VERSION=2.1 EVLET_NODE_DIR=$D EVLET_CGROUP_ROOT=/evlet-node-21 EVLET_PAUSE_IMAGE=@PAUSE@ EVLET_TEST_IMAGE=@TEST@
rc=0
@SUITES@
echo "init: suites done in $(( $(date +%s) - t0 ))s"
[ $rc = 0 ] || { echo "init: containerd log tail"; tail -30 /tmp/containerd.log; }
if [ $rc = 0 ]; then echo "init: success"; else echo "init: failure"; fi
poweroff -f
"#;

/// Builds the guest's shared archive in `work`.
pub fn common_archive(work: &Path) -> Result<PathBuf> {
    let apt = PrivateApt::open()?;
    let sid = sid_userland(&apt)?;
    let bins = containerd::binaries(CONTAINERD)?;
    let tests_dir = work.join("tests");
    fs::create_dir_all(&tests_dir)?;
    let tests = build_tests(&tests_dir)?;
    let mut tree = Tree::default();
    tree.file("bin/busybox", Path::new("/bin/busybox"));
    let init = INIT
        .replace("@NODE_DIR@", NODE_DIR)
        .replace("@PAUSE@", image::PAUSE_IMAGE)
        .replace("@TEST@", image::TEST_IMAGE)
        .replace("@SUITES@", &suite_script());
    tree.bytes("init", 0o100_755, init.into_bytes());
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
    // The host's libraries the test binaries and containerd load, then sid's
    // C library over them (the same names: sid's win).
    let mut programs: Vec<PathBuf> = tests.iter().map(|(_, p)| p.clone()).collect();
    programs.push(bins.containerd.clone());
    for program in &programs {
        for lib in libraries(program)? {
            let name = lib
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with("ld-linux") {
                continue;
            }
            tree.file(
                &format!("usr/lib/x86_64-linux-gnu/{name}"),
                &fs::canonicalize(&lib)?,
            );
        }
    }
    tree.dir(
        "usr/lib/x86_64-linux-gnu",
        &sid.join("usr/lib/x86_64-linux-gnu"),
    )?;
    tree.dir("usr/lib64", &sid.join("usr/lib64"))?;
    tree.0
        .retain(|k, _| !k.starts_with("usr/lib/x86_64-linux-gnu/gconv"));
    tree.link("lib", "usr/lib");
    tree.link("lib64", "usr/lib64");
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
        crate::node::containerd_config(Path::new(NODE_DIR)).into_bytes(),
    );
    tree.bytes(
        &format!(
            "{}/cni/net.d/10-evlet.conflist",
            NODE_DIR.trim_start_matches('/')
        ),
        0o100_644,
        serde_json::to_vec_pretty(&crate::node::cni_config(CONTAINERD, Path::new(NODE_DIR)))?,
    );
    tree.bytes(
        "etc/passwd",
        0o100_644,
        b"root:x:0:0:root:/root:/bin/sh\n".to_vec(),
    );
    tree.bytes("etc/group", 0o100_644, b"root:x:0:\n".to_vec());
    tree.bytes(
        "etc/hosts",
        0o100_644,
        b"127.0.0.1 localhost evlet-guest\n".to_vec(),
    );
    tree.bytes(
        "etc/resolv.conf",
        0o100_644,
        b"nameserver 10.0.2.3\n".to_vec(),
    );
    let dest = work.join("common.cpio.gz");
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
        let script = suite_script();
        assert!(script.contains("EVLET_E2E_PLEG=ebpf /tests/node_agent"));
        assert!(script.contains("EVLET_E2E_PLEG=generic /tests/node_agent"));
        assert!(
            script.contains("EVLET_E2E_PLEG=ebpf /tests/node_cgroups --test-threads=1  || rc=1")
        );
        assert!(script.contains("/tests/node_pleg --test-threads=1 --exact a_childs_oom_kill"));
    }
}
