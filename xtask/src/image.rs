//! Local OCI images, built without a registry.
//!
//! Each image is one uncompressed layer holding Debian's static busybox (with
//! its applet links) and the static helper programs of `deploy/image-tools`,
//! written as an OCI image layout in a tar archive that `ctr images import`
//! accepts. Everything is deterministic (mtime 0, root owner), so the digest
//! only changes when an input does.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::{paths, sh};

/// Name of the sandbox (pause) image; the node's CRI config points at it.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// Name of the workload image used by examples and tests.
pub const TEST_IMAGE: &str = "evlet.local/test:v1";
/// An image no pod uses (the image GC test removes it; `node up` and the test
/// import it again).
pub const SPARE_IMAGE: &str = "evlet.local/spare:v1";
/// The spare image's archive, under the images directory.
pub const SPARE_FILE: &str = "spare.oci.tar";

const BUSYBOX: &str = "/bin/busybox";
const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// An image to build.
#[derive(Debug)]
struct Spec {
    name: &'static str,
    file: &'static str,
    entrypoint: &'static [&'static str],
    cmd: &'static [&'static str],
}

const IMAGES: [Spec; 3] = [
    Spec {
        name: PAUSE_IMAGE,
        file: "pause.oci.tar",
        entrypoint: &["/pause"],
        cmd: &[],
    },
    Spec {
        name: TEST_IMAGE,
        file: "test.oci.tar",
        entrypoint: &[],
        cmd: &["/bin/sh"],
    },
    // The same layer, another config: an image of its own ID.
    Spec {
        name: SPARE_IMAGE,
        file: SPARE_FILE,
        entrypoint: &[],
        cmd: &["/bin/true"],
    },
];

/// Builds every image archive (if its inputs changed) and returns `(name, path)` pairs.
pub fn build_all() -> Result<Vec<(&'static str, PathBuf)>> {
    if !Path::new(BUSYBOX).is_file() {
        bail!("{BUSYBOX} is missing (Debian package busybox-static): run `cargo xtask setup`");
    }
    let tools = build_tools()?;
    let dir = dir();
    fs::create_dir_all(&dir)?;
    let layer = layer(&tools)?;
    let mut out = Vec::new();
    for spec in &IMAGES {
        let path = dir.join(spec.file);
        write_layout(spec, &layer, &path)?;
        out.push((spec.name, path));
    }
    Ok(out)
}

/// Where the image archives are written.
pub fn dir() -> PathBuf {
    paths::tools().join("images")
}

/// Builds `pause`, `memhog`, `burst`, `now` and `grpc-health` as static binaries.
fn build_tools() -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(paths::repo())
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        )
        .args([
            "build",
            "--quiet",
            "--release",
            "--package",
            "evlet-image-tools",
            "--target",
            STATIC_TARGET,
        ]);
    sh::run(&mut cmd).context("cannot build the image helper programs")?;
    Ok(paths::repo()
        .join("target")
        .join(STATIC_TARGET)
        .join("release"))
}

/// The root filesystem layer as an uncompressed tar.
fn layer(tools: &Path) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    for dir in [
        "bin", "dev", "etc", "proc", "sys", "tmp", "root", "var", "usr", "usr/bin", "usr/sbin",
        "sbin",
    ] {
        let mut h = header(
            tar::EntryType::Directory,
            if dir == "tmp" { 0o1777 } else { 0o755 },
        );
        tar.append_data(&mut h, dir, std::io::empty())?;
    }
    let busybox = fs::read(BUSYBOX).with_context(|| format!("cannot read {BUSYBOX}"))?;
    append_file(&mut tar, "bin/busybox", &busybox, 0o755)?;
    let applets = sh::output(Command::new(BUSYBOX).arg("--list-full"))?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet == "bin/busybox" {
            continue;
        }
        let mut h = header(tar::EntryType::Symlink, 0o777);
        tar.append_link(&mut h, applet, "/bin/busybox")?;
    }
    for (program, dest) in [
        ("pause", "pause"),
        ("memhog", "bin/memhog"),
        ("burst", "bin/burst"),
        ("now", "bin/now"),
        ("grpc-health", "bin/grpc-health"),
    ] {
        let bytes = fs::read(tools.join(program))
            .with_context(|| format!("cannot read the built {program}"))?;
        append_file(&mut tar, dest, &bytes, 0o755)?;
    }
    append_file(
        &mut tar,
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        0o644,
    )?;
    append_file(
        &mut tar,
        "etc/group",
        b"root:x:0:\nnogroup:x:65534:\n",
        0o644,
    )?;
    Ok(tar.into_inner()?)
}

fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h
}

fn append_file(tar: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, mode);
    h.set_size(bytes.len() as u64);
    tar.append_data(&mut h, path, bytes)?;
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes an OCI image layout (as a tar) holding one image with one layer.
fn write_layout(spec: &Spec, layer: &[u8], path: &Path) -> Result<()> {
    let mut config = json!({
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    });
    if !spec.entrypoint.is_empty() {
        config["Entrypoint"] = json!(spec.entrypoint);
    }
    if !spec.cmd.is_empty() {
        config["Cmd"] = json!(spec.cmd);
    }
    let (tar, _) = oci_layout(spec.name, &config, "cargo xtask (evlet local image)", layer)?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, tar)?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// An OCI image layout archive (what `ctr images import` takes) holding the
/// one-layer image `name` with the image config's `config` section, and the
/// image's manifest digest (`sha256:...`).
///
/// # Errors
/// If the JSON or the archive cannot be written.
pub fn oci_layout(
    name: &str,
    config: &serde_json::Value,
    created_by: &str,
    layer: &[u8],
) -> Result<(Vec<u8>, String)> {
    let layer_digest = sha256(layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
        "history": [{ "created_by": created_by }],
    }))?;
    let config_digest = sha256(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer.len(),
        }],
    }))?;
    let manifest_digest = sha256(&manifest);
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    append_file(
        &mut tar,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    append_file(&mut tar, "index.json", &index, 0o644)?;
    for (digest, bytes) in [
        (&layer_digest, layer),
        (&config_digest, &config[..]),
        (&manifest_digest, &manifest[..]),
    ] {
        append_file(&mut tar, &format!("blobs/sha256/{digest}"), bytes, 0o644)?;
    }
    Ok((tar.into_inner()?, format!("sha256:{manifest_digest}")))
}
