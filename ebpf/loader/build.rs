//! Builds the kernel programs (`ebpf/probes`) for `bpfel-unknown-none` with the
//! nightly toolchain and `bpf-linker`, and leaves the object in `OUT_DIR`.
//!
//! `cargo xtask setup` installs `bpf-linker` into the repository's `.tools/bin`;
//! a plain `cargo build` finds it there too (it is put first on the PATH of the
//! inner build), so only a machine where setup never ran lacks it.
use std::path::PathBuf;

fn on_path(program: &str, path: &std::ffi::OsStr) -> bool {
    std::env::split_paths(path).any(|dir| dir.join(program).is_file())
}

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let tools = manifest.join("../../.tools/bin");
    println!(
        "cargo:rerun-if-changed={}",
        tools.join("bpf-linker").display()
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !on_path("bpf-linker", &path) {
        if !tools.join("bpf-linker").is_file() {
            anyhow::bail!(
                "bpf-linker is neither on PATH nor in {}: run `cargo xtask setup` once \
                 (it installs bpf-linker and the nightly toolchain the kernel programs need)",
                tools.display()
            );
        }
        let joined = std::env::join_paths(
            std::iter::once(tools.clone()).chain(std::env::split_paths(&path)),
        )?;
        // SAFETY: a build script is single-threaded; nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var("PATH", joined) };
    }
    let probes = manifest.join("../probes");
    let probes = probes
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "evlet-ebpf-probes",
            root_dir: probes,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
