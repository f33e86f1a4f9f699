//! Builds the kernel programs (`ebpf/probes`) for `bpfel-unknown-none` with the
//! nightly toolchain and `bpf-linker`, and leaves the object in `OUT_DIR`.
fn main() -> anyhow::Result<()> {
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
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
