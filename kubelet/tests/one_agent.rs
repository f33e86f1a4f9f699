//! One agent per node: a second `evlet` on the same root dir exits at once,
//! before it touches the runtime, naming the holder's PID.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

#[test]
fn a_second_agent_on_the_same_root_dir_exits_naming_the_holder() -> Result<()> {
    let root = tempfile::tempdir()?;
    let held = evlet::node_lock::NodeLock::acquire(&root.path().join("evlet.lock"))?;
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_evlet"))
        .arg("--root-dir")
        .arg(root.path())
        // Never reached: the lock comes first.
        .args([
            "--container-runtime-endpoint",
            "unix:///nonexistent/cri.sock",
        ])
        .args(["--address", "127.0.0.1", "--healthz-port", "0"])
        .output()
        .context("running evlet")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the second agent must fail: {stderr}"
    );
    assert!(
        stderr.contains(&format!("(pid {})", std::process::id())),
        "the message names the holder: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it exits at once, not after trying the runtime ({:?})",
        started.elapsed()
    );
    drop(held);
    Ok(())
}
