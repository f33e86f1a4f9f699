//! containerd versions the node can run, and where their binaries come from.
//!
//! 1.6 is Debian bookworm's system package; 1.7 and 2.1 are unpacked from the
//! trixie and sid `.deb`s through the private APT config (never installed).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Result, bail};

use crate::apt::{self, PrivateApt};
use crate::paths;

/// A containerd release line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Debian bookworm's containerd (no CRI `GetContainerEvents`).
    V1_6,
    /// Debian trixie's containerd.
    V1_7,
    /// Debian sid's containerd.
    V2_1,
}

impl Version {
    /// A short token usable in names (`16`, `17`, `21`).
    pub fn tag(self) -> &'static str {
        match self {
            Version::V1_6 => "16",
            Version::V1_7 => "17",
            Version::V2_1 => "21",
        }
    }

    fn suite(self) -> Option<&'static str> {
        match self {
            Version::V1_6 => None,
            Version::V1_7 => Some("trixie"),
            Version::V2_1 => Some("sid"),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1_6 => "1.6",
            Version::V1_7 => "1.7",
            Version::V2_1 => "2.1",
        })
    }
}

impl FromStr for Version {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "1.6" => Ok(Version::V1_6),
            "1.7" => Ok(Version::V1_7),
            "2.1" => Ok(Version::V2_1),
            other => bail!("unknown containerd version {other:?}: use 1.6, 1.7 or 2.1"),
        }
    }
}

/// The programs of one containerd version.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The daemon.
    pub containerd: PathBuf,
    /// The debugging client, used for image import and teardown.
    pub ctr: PathBuf,
    /// Directory holding `containerd-shim-runc-v2`; goes first on the daemon's `PATH`.
    pub bin_dir: PathBuf,
}

/// Finds (1.6) or fetches and unpacks (1.7, 2.1) the binaries of `version`.
pub fn binaries(version: Version) -> Result<Binaries> {
    let Some(suite) = version.suite() else {
        let bin = PathBuf::from("/usr/bin");
        for program in ["containerd", "ctr", "containerd-shim-runc-v2"] {
            if !bin.join(program).is_file() {
                bail!(
                    "containerd 1.6 is the system package and /usr/bin/{program} is missing: \
                     run `cargo xtask setup`"
                );
            }
        }
        return Ok(Binaries {
            containerd: bin.join("containerd"),
            ctr: bin.join("ctr"),
            bin_dir: bin,
        });
    };
    let root = paths::tools().join(format!("containerd-{version}"));
    let bin = root.join("usr/bin");
    let found = |bin: &Path| bin.join("containerd").is_file() && bin.join("ctr").is_file();
    if !found(&bin) {
        let apt = PrivateApt::open()?;
        let full = apt.version_in("containerd", suite)?;
        eprintln!("node: fetching containerd {full} from Debian {suite}");
        let deb = apt.download(&format!("containerd={full}"))?;
        apt::extract(&deb, &root)?;
        if !bin.join("ctr").is_file() {
            // Newer packaging splits ctr out of the daemon package.
            if let Ok(ctr_deb) = apt.download(&format!("containerd-ctr={full}")) {
                let tmp = root.join(".ctr");
                apt::extract(&ctr_deb, &tmp)?;
                fs::rename(tmp.join("usr/bin/ctr"), bin.join("ctr"))?;
                let _ = fs::remove_dir_all(&tmp);
            }
        }
        if !found(&bin) {
            bail!(
                "the containerd {full} package from Debian {suite} has no usr/bin/containerd and ctr \
                 (unpacked in {})",
                root.display()
            );
        }
    }
    Ok(Binaries {
        containerd: bin.join("containerd"),
        ctr: bin.join("ctr"),
        bin_dir: bin,
    })
}
