//! Where the project keeps its tools, caches and node state.

use std::path::PathBuf;

/// The repository root (the parent of `xtask/`).
pub fn repo() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Project-local tools and caches: `bpf-linker`, downloaded `.deb`s, kernels, images.
///
/// Kept outside `target/` because `bpf-linker` keeps a RUNPATH into it (`cargo clean`
/// must not break the linker). `EVLET_TOOLS_DIR` overrides it.
pub fn tools() -> PathBuf {
    std::env::var_os("EVLET_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".tools"))
}

/// The directory on `PATH` for the project's own tool binaries (`bpf-linker`).
pub fn tools_bin() -> PathBuf {
    tools().join("bin")
}

/// `PATH` with the project's tool dir in front, for child processes.
pub fn path_with_tools() -> std::ffi::OsString {
    let mut dirs = vec![tools_bin()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Caches shared by every checkout on this machine, outside the repository
/// (as Go's own build and module caches are): what is expensive to build and
/// the same for every clone (cargo-fuzz, the fuzz targets' dependencies).
/// `EVLET_CACHE_DIR` overrides `$XDG_CACHE_HOME/evlet` (`~/.cache/evlet`).
pub fn cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("EVLET_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| repo().join("target"));
    base.join("evlet")
}
