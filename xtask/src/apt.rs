//! A private APT configuration for fetching `.deb`s from other Debian suites.
//!
//! It has its own source list, index lists and cache under the tools dir and
//! never touches the system's sources; packages are downloaded and unpacked
//! with `dpkg-deb -x`, never installed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, bail};

use crate::{paths, sh};

const SUITES: &[&str] = &["bullseye", "bookworm", "bookworm-updates", "trixie", "sid"];
const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Index lists older than this are refreshed.
const MAX_LIST_AGE: Duration = Duration::from_secs(24 * 3600);

/// A private APT root under `<tools>/apt`.
#[derive(Debug)]
pub struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    /// Prepares the directories and source list, refreshing indexes when stale.
    pub fn open() -> Result<Self> {
        let dir = paths::tools().join("apt");
        for sub in ["lists/partial", "cache/archives/partial", "debs"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot create {}", dir.join(sub).display()))?;
        }
        let sources: String = SUITES
            .iter()
            .map(|suite| format!("deb [signed-by={KEYRING}] {MIRROR} {suite} main\n"))
            .collect();
        fs::write(dir.join("sources.list"), sources)?;
        let apt = Self { dir };
        if apt.stale() {
            apt.update()?;
        }
        Ok(apt)
    }

    fn stamp(&self) -> PathBuf {
        self.dir.join("updated.stamp")
    }

    fn stale(&self) -> bool {
        fs::metadata(self.stamp())
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_none_or(|age| age > MAX_LIST_AGE)
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            "-o".into(),
            format!("Dir::Etc::SourceList={d}/sources.list"),
            "-o".into(),
            "Dir::Etc::SourceParts=/dev/null".into(),
            "-o".into(),
            format!("Dir::State::Lists={d}/lists"),
            "-o".into(),
            format!("Dir::Cache={d}/cache"),
            "-o".into(),
            "Dir::State::Status=/var/lib/dpkg/status".into(),
            "-o".into(),
            "Debug::NoLocking=1".into(),
            "-o".into(),
            "Acquire::Retries=3".into(),
            "-o".into(),
            "APT::Sandbox::User=root".into(),
            "-q".into(),
        ]
    }

    fn update(&self) -> Result<()> {
        eprintln!("apt (private): updating indexes of {}", SUITES.join(", "));
        let out = Command::new("apt-get")
            .args(self.options())
            .arg("update")
            .output()
            .context("cannot run apt-get")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("Err:") || l.starts_with("E:"))
            .collect();
        if !out.status.success() || !errors.is_empty() {
            bail!(
                "apt cannot reach its package registry ({MIRROR}): check the network, then re-run\n{}",
                errors.join("\n")
            );
        }
        fs::write(self.stamp(), b"")?;
        Ok(())
    }

    /// Package names matching the POSIX regular expression `pattern`.
    pub fn search(&self, pattern: &str) -> Result<Vec<String>> {
        let out = sh::output(Command::new("apt-cache").args(self.options()).args([
            "search",
            "--names-only",
            pattern,
        ]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(str::to_owned)
            .collect())
    }

    /// Downloads `package` (optionally `package=version`), reusing a cached `.deb`.
    pub fn download(&self, spec: &str) -> Result<PathBuf> {
        let debs = self.dir.join("debs");
        let (name, version) = match spec.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (spec, None),
        };
        let cached = |debs: &Path| -> Option<PathBuf> {
            let mut hits: Vec<PathBuf> = fs::read_dir(debs)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let f = p
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let v = version.map(|v| v.replace(':', "%3a"));
                    f.starts_with(&format!("{name}_"))
                        && f.ends_with(".deb")
                        && v.is_none_or(|v| f.starts_with(&format!("{name}_{v}_")))
                })
                .collect();
            hits.sort();
            hits.pop()
        };
        if let Some(hit) = cached(&debs) {
            return Ok(hit);
        }
        sh::run(
            Command::new("apt-get")
                .current_dir(&debs)
                .args(self.options())
                .args(["download", spec]),
        )
        .with_context(|| format!("cannot download Debian package {spec}"))?;
        cached(&debs).with_context(|| {
            format!(
                "apt-get download {spec} produced no .deb in {}",
                debs.display()
            )
        })
    }

    /// The newest version of `package` in the suite `suite`.
    pub fn version_in(&self, package: &str, suite: &str) -> Result<String> {
        let out = sh::output(
            Command::new("apt-cache")
                .args(self.options())
                .args(["madison", package]),
        )?;
        out.lines()
            .filter(|l| l.contains(&format!(" {suite}/")))
            .filter_map(|l| l.split('|').nth(1))
            .map(|v| v.trim().to_owned())
            .next()
            .with_context(|| format!("no {package} in Debian {suite}"))
    }
}

/// Unpacks a `.deb` into `dest` (created), replacing what was there.
pub fn extract(deb: &Path, dest: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dest);
    fs::create_dir_all(dest)?;
    sh::output(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest))
        .with_context(|| format!("cannot unpack {}", deb.display()))?;
    Ok(())
}
