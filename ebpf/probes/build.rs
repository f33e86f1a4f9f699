//! Fails early with a clear message if `bpf-linker` is not on `PATH`.
fn main() {
    println!("cargo:rerun-if-env-changed=PATH");
    if std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "bpf")
        && which::which("bpf-linker").is_err()
    {
        println!(
            "cargo:warning=bpf-linker is not on PATH: run `cargo xtask setup` and build through `cargo xtask`"
        );
    }
}
