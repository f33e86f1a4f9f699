//! `cargo xtask setup`: installs everything the project needs, idempotently.
//!
//! Each step checks before it acts and prints one line saying what it found or
//! did, so a second run is quick and says "ok" everywhere.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
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
];

/// Runs every setup step.
pub fn setup() -> Result<()> {
    sh::require_root("setup")?;
    apt_packages()?;
    rust_src()?;
    bpf_linker()?;
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
    apt_update()?;
    // The host's packages are not ours to remove: simulate first, and refuse
    // a plan that removes anything (qemu-system-x86 once replaced qemu-utils).
    let removed = removals(&simulate(&missing)?);
    if !removed.is_empty() {
        bail!(
            "installing {} would remove {} from this host; setup removes nothing it did not \
             install. Resolve the conflict by hand (`apt-get -s install {}` shows the plan), \
             then re-run `cargo xtask setup`",
            missing.join(" "),
            removed.join(", "),
            missing.join(" ")
        );
    }
    let mut install = Command::new("apt-get");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args([
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--no-remove",
        ])
        .args(&missing);
    if let Err(err) = sh::run(&mut install) {
        let reasons: Vec<String> = PACKAGES
            .iter()
            .filter(|(name, _)| !installed(name))
            .map(|(name, why)| format!("  {name}: needed for {why}"))
            .collect();
        bail!(
            "could not install Debian packages:\n{}\n({err})",
            reasons.join("\n")
        );
    }
    Ok(())
}

/// apt's plan for installing `packages` (`apt-get -s`: nothing is changed).
fn simulate(packages: &[&str]) -> Result<String> {
    let out = Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-s", "install", "-q", "--no-install-recommends"])
        .args(packages)
        .output()
        .context("cannot run apt-get -s")?;
    if !out.status.success() {
        bail!(
            "apt cannot plan installing {}:\n{}",
            packages.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The packages a simulated plan removes (its `Remv <name> [<version>]` lines).
fn removals(plan: &str) -> Vec<String> {
    plan.lines()
        .filter_map(|l| l.strip_prefix("Remv "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `apt-get update`, turning "cannot reach the mirror" into a clear error.
///
/// apt exits 0 when some indexes fail to download, so its output is checked too.
fn apt_update() -> Result<()> {
    let out = Command::new("apt-get")
        .args(["update", "-q", "-o", "Acquire::Retries=3"])
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
            "apt cannot reach its package registry (the Debian mirror in /etc/apt/sources.list*): \
             check the network or proxy, then re-run `cargo xtask setup`\n{}",
            unreachable.join("\n")
        );
    }
    Ok(())
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

    /// The plan for this project's packages, on this host, removes nothing.
    #[test]
    fn installing_the_project_packages_removes_nothing_here() {
        if Command::new("apt-get").arg("--version").output().is_err() {
            eprintln!("SKIP: no apt-get on this machine");
            assert!(std::env::var_os("CI").is_none(), "CI machines are Debian");
            return;
        }
        let names: Vec<&str> = PACKAGES.iter().map(|(name, _)| *name).collect();
        let plan = simulate(&names).expect("apt-get -s");
        assert_eq!(removals(&plan), Vec::<String>::new(), "{plan}");
    }
}
