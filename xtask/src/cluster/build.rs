//! Building upstream programs from the `upstream/v1.X` Go module.
//!
//! Each program is built the way upstream's `hack/lib/golang.sh` builds it:
//! `go build -trimpath -tags=selinux,notest -ldflags "all=<version> -s -w"`,
//! with the version stamped into `k8s.io/component-base/version` and
//! `k8s.io/client-go/pkg/version` (`hack/lib/version.sh`) and `CGO_ENABLED=0`
//! for the static programs (everything but the kubelet). The binaries go to
//! `.tools/upstream/<release>/bin` (git ignores `.tools`); Go's own caches
//! stay where Go keeps them (`go env GOCACHE GOMODCACHE`), outside the
//! repository, so a fresh clone relinks from a warm cache.
//!
//! A binary is rebuilt only when its stamp changes: release, package, Go
//! version, the hashes of the module's go.mod and go.sum, cgo and ldflags.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use super::{Version, module_dir};
use crate::{paths, sh};

/// How a program is built from its package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `go build` of a `main` package.
    Main,
    /// `go test -c` of a test package (e2e.test).
    TestBinary,
}

/// One upstream program the module can build.
#[derive(Debug, Clone, Copy)]
pub struct Binary {
    /// The file name under the bin directory.
    pub name: &'static str,
    /// The Go package.
    pub package: &'static str,
    /// Built with cgo (upstream builds the kubelet with cgo when it can).
    pub cgo: bool,
    /// `go build` or `go test -c`.
    pub kind: Kind,
}

const fn main(name: &'static str, package: &'static str) -> Binary {
    Binary {
        name,
        package,
        cgo: false,
        kind: Kind::Main,
    }
}

/// etcd: the root package of `go.etcd.io/etcd/server/v3` is its `main`.
pub const ETCD: Binary = main("etcd", "go.etcd.io/etcd/server/v3");
/// The API server.
pub const KUBE_APISERVER: Binary = main("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver");
/// The controller manager.
pub const KUBE_CONTROLLER_MANAGER: Binary = main(
    "kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
);
/// The scheduler.
pub const KUBE_SCHEDULER: Binary = main("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler");
/// kubectl of the same release (the machine's may be too far off in version skew).
pub const KUBECTL: Binary = main("kubectl", "k8s.io/kubernetes/cmd/kubectl");

/// What `cluster up` needs.
pub const CONTROL_PLANE: &[Binary] = &[
    ETCD,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KUBECTL,
];

/// Programs the module can also build, for conformance runs (`cluster build --with`).
pub const EXTRAS: &[Binary] = &[
    Binary {
        name: "kubelet",
        package: "k8s.io/kubernetes/cmd/kubelet",
        cgo: true,
        kind: Kind::Main,
    },
    Binary {
        name: "e2e.test",
        package: "k8s.io/kubernetes/test/e2e",
        cgo: false,
        kind: Kind::TestBinary,
    },
    main("ginkgo", "github.com/onsi/ginkgo/v2/ginkgo"),
    main("agnhost", "k8s.io/kubernetes/test/images/agnhost"),
    main(
        "sample-device-plugin",
        "k8s.io/kubernetes/test/images/sample-device-plugin",
    ),
];

/// The directory of `version`'s binaries: `.tools/upstream/<release>/bin`.
pub fn bin_dir(version: Version) -> PathBuf {
    paths::tools()
        .join("upstream")
        .join(version.release())
        .join("bin")
}

/// The `-ldflags` value upstream uses for `release` built at `build_date`.
pub fn ldflags(release: &str, build_date: &str) -> String {
    let mut parts = release.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    let mut flags = String::from("all=");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (key, value) in [
            ("gitVersion", release),
            ("gitMajor", major),
            ("gitMinor", minor),
            // The module proxy does not say which commit a tag is.
            ("gitCommit", ""),
            ("gitTreeState", "clean"),
            ("buildDate", build_date),
        ] {
            flags.push_str(&format!("-X {pkg}.{key}={value} "));
        }
    }
    flags.push_str("-s -w");
    flags
}

/// The stamp of one binary: every input that changes what `go build` makes.
pub fn stamp(
    binary: &Binary,
    release: &str,
    go_version: &str,
    go_mod: &[u8],
    go_sum: &[u8],
    ldflags: &str,
) -> String {
    format!(
        "release={release}\npackage={}\nkind={:?}\ngo={go_version}\ngo.mod={}\ngo.sum={}\ncgo={}\nldflags={ldflags}\n",
        binary.package,
        binary.kind,
        hex::encode(Sha256::digest(go_mod)),
        hex::encode(Sha256::digest(go_sum)),
        u8::from(binary.cgo),
    )
}

/// Builds `binaries` of `version` whose stamps are stale; returns the bin directory.
pub fn build(version: Version, binaries: &[Binary]) -> Result<PathBuf> {
    let module = module_dir(version);
    let bin = bin_dir(version);
    fs::create_dir_all(bin.join(".stamps"))
        .with_context(|| format!("cannot create {}", bin.display()))?;
    let read = |name: &str| {
        let path = module.join(name);
        fs::read(&path)
            .with_context(|| format!("cannot read the Go module file {}", path.display()))
    };
    let (go_mod, go_sum) = (read("go.mod")?, read("go.sum")?);
    let go_version = sh::output(go(&module).args(["env", "GOVERSION"]))?
        .trim()
        .to_string();
    let mut flags = None;
    for binary in binaries {
        let path = bin.join(binary.name);
        let stamp_path = bin.join(".stamps").join(binary.name);
        // The build date only comes from the proxy's .info: ask once, and only if needed.
        let flags = match &flags {
            Some(f) => f,
            None => flags.insert(ldflags(version.release(), &release_date(&module)?)),
        };
        let want = stamp(
            binary,
            version.release(),
            &go_version,
            &go_mod,
            &go_sum,
            flags,
        );
        if path.exists() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == want) {
            println!(
                "cluster {version}: {} is up to date ({})",
                binary.name,
                path.display()
            );
            continue;
        }
        let started = Instant::now();
        go_build(&module, binary, flags, &path)?;
        fs::write(&stamp_path, want)
            .with_context(|| format!("cannot write the stamp {}", stamp_path.display()))?;
        let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!(
            "cluster {version}: built {} in {:.1}s ({} MiB, {})",
            binary.name,
            started.elapsed().as_secs_f64(),
            size >> 20,
            path.display()
        );
    }
    Ok(bin)
}

/// Builds one binary into `out` (through a temporary file, so a running
/// program keeps its old inode).
fn go_build(module: &Path, binary: &Binary, ldflags: &str, out: &Path) -> Result<()> {
    let tmp = out.with_extension("tmp");
    let mut cmd = go(module);
    match binary.kind {
        Kind::Main => cmd.arg("build"),
        Kind::TestBinary => cmd.args(["test", "-c"]),
    };
    cmd.args(["-mod=readonly", "-trimpath", "-tags=selinux,notest"])
        .arg(format!("-ldflags={ldflags}"))
        .arg("-o")
        .arg(&tmp)
        .arg(binary.package)
        .env("CGO_ENABLED", if binary.cgo { "1" } else { "0" });
    sh::run(&mut cmd).with_context(|| {
        format!(
            "cannot build {} from the Go module {} (a missing go.sum line: run `go mod tidy` \
             there; a download error: check the Go module proxy)",
            binary.name,
            module.display()
        )
    })?;
    fs::rename(&tmp, out)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), out.display()))
}

/// A `go` command in `module` that never downloads another toolchain.
fn go(module: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(module).env("GOTOOLCHAIN", "local");
    cmd
}

/// The date the module proxy gives for the module's `k8s.io/kubernetes`
/// release (its `.info` `Time`), as upstream's `buildDate` format.
fn release_date(module: &Path) -> Result<String> {
    let out = sh::output(go(module).args(["mod", "download", "-json", "k8s.io/kubernetes"]))?;
    let download: serde_json::Value = serde_json::from_str(&out).with_context(|| {
        format!(
            "`go mod download -json` in {} printed no JSON",
            module.display()
        )
    })?;
    if let Some(err) = download.get("Error").and_then(|e| e.as_str()) {
        bail!(
            "cannot download k8s.io/kubernetes for {}: {err}",
            module.display()
        );
    }
    let info_path = download
        .get("Info")
        .and_then(|i| i.as_str())
        .context("`go mod download -json k8s.io/kubernetes` named no .info file")?;
    let info: serde_json::Value = serde_json::from_slice(
        &fs::read(info_path).with_context(|| format!("cannot read {info_path}"))?,
    )
    .with_context(|| format!("{info_path} is not JSON"))?;
    info.get("Time")
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .with_context(|| format!("{info_path} has no Time"))
}

/// Looks a program up by name among the control plane and the extras.
pub fn by_name(name: &str) -> Result<Binary> {
    CONTROL_PLANE
        .iter()
        .chain(EXTRAS)
        .find(|b| b.name == name)
        .copied()
        .with_context(|| {
            let names: Vec<&str> = CONTROL_PLANE.iter().chain(EXTRAS).map(|b| b.name).collect();
            format!(
                "no upstream program {name:?}: choose from {}",
                names.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldflags_stamp_both_version_packages_and_strip() {
        let flags = ldflags("v1.34.4", "2026-02-10T12:53:36Z");
        assert!(flags.starts_with("all="));
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.34.4 "));
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMinor=34 "));
        assert!(flags.contains("-X k8s.io/component-base/version.gitMajor=1 "));
        assert!(flags.contains("version.buildDate=2026-02-10T12:53:36Z "));
        assert!(flags.ends_with("-s -w"));
    }

    #[test]
    fn a_stamp_changes_with_go_sum_go_version_and_release_only() {
        let base = stamp(&KUBECTL, "v1.34.4", "go1.26.8", b"mod", b"sum", "f");
        assert_eq!(
            base,
            stamp(&KUBECTL, "v1.34.4", "go1.26.8", b"mod", b"sum", "f")
        );
        assert_ne!(
            base,
            stamp(&KUBECTL, "v1.34.4", "go1.26.8", b"mod", b"sum2", "f")
        );
        assert_ne!(
            base,
            stamp(&KUBECTL, "v1.34.4", "go1.27.0", b"mod", b"sum", "f")
        );
        assert_ne!(
            base,
            stamp(&KUBECTL, "v1.37.2", "go1.26.8", b"mod", b"sum", "f")
        );
        assert_ne!(
            base,
            stamp(&ETCD, "v1.34.4", "go1.26.8", b"mod", b"sum", "f")
        );
    }

    #[test]
    fn only_the_kubelet_uses_cgo_and_only_e2e_is_a_test_binary() {
        let all: Vec<Binary> = CONTROL_PLANE.iter().chain(EXTRAS).copied().collect();
        for b in &all {
            assert_eq!(b.cgo, b.name == "kubelet", "{}", b.name);
            assert_eq!(
                b.kind == Kind::TestBinary,
                b.name == "e2e.test",
                "{}",
                b.name
            );
        }
        assert!(by_name("e2e.test").is_ok());
        assert!(by_name("kube-proxy").is_err());
    }

    #[test]
    fn binaries_live_outside_gits_view_per_release() {
        let dir = bin_dir(Version::V1_34);
        assert!(
            dir.ends_with(".tools/upstream/v1.34.4/bin")
                || std::env::var_os("EVLET_TOOLS_DIR").is_some()
        );
    }
}
