//! `cargo xtask run`: evlet's main job on a local default: a private containerd
//! and the example static pods of `deploy/examples`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::containerd::Version;
use crate::node::Node;
use crate::{paths, setup, sh};

/// Where `run` serves `/healthz`, `/pods`, `/metrics`.
const ADDRESS: &str = "127.0.0.1:10255";

fn get(path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(ADDRESS)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default())
}

/// One line per pod and container from `/pods`.
fn summary() -> Result<(String, bool)> {
    let pods: serde_json::Value = serde_json::from_str(&get("/pods")?)?;
    let mut out = String::new();
    let mut all_up = true;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let phase = pod["status"]["phase"].as_str().unwrap_or("?");
        all_up &= phase == "Running" || phase == "Succeeded";
        out += &format!(
            "  pod {:<28} {:<10} ip {}\n",
            pod["metadata"]["name"].as_str().unwrap_or("?"),
            phase,
            pod["status"]["podIP"].as_str().unwrap_or("-")
        );
        let statuses = pod["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                pod["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            );
        for c in statuses {
            let state = c["state"]
                .as_object()
                .and_then(|s| s.keys().next().cloned())
                .unwrap_or_default();
            out += &format!(
                "    container {:<16} {:<11} restarts {}\n",
                c["name"].as_str().unwrap_or("?"),
                state,
                c["restartCount"]
            );
        }
    }
    let any = !out.is_empty();
    Ok((out, all_up && any))
}

/// Asks evlet to stop (SIGTERM to its PID) and waits for it.
fn stop_evlet(child: &mut std::process::Child) -> Result<()> {
    let pid = i32::try_from(child.id()).context("evlet's pid")?;
    // SAFETY: kill has no memory-safety preconditions; the child is ours.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    child.wait().context("waiting for evlet to stop")?;
    Ok(())
}

/// Sets up, brings the node up, builds and runs evlet with the example pods.
/// With `duration`, stops evlet after that long (pods keep running, as with any kubelet).
pub fn run(version: Version, duration: Option<u64>, args: &[String]) -> Result<()> {
    setup::setup()?;
    let node = Node::new(version);
    node.up()?;
    sh::run(&mut sh::cargo(&["build", "--locked", "--package", "evlet"]))?;
    let evlet = paths::repo().join("target/debug/evlet");
    let root = node.dir.join("evlet");
    let mut cmd = Command::new(&evlet);
    cmd.arg("--container-runtime-endpoint")
        .arg(node.endpoint())
        .arg("--pod-manifest-path")
        .arg(paths::repo().join("deploy/examples"))
        .arg("--root-dir")
        .arg(&root)
        .args([
            "--cgroup-root",
            &node.cgroup_root(),
            "--hostname-override",
            "evlet-dev",
            "--address",
            ADDRESS,
        ])
        .args(args);
    // Ctrl-C (SIGINT to the whole terminal group) or a SIGTERM to this task
    // stops evlet by its PID and ends quietly; the node and its pods stay.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    eprintln!("$ {}", sh::display(&cmd));
    let mut child = cmd.spawn().context("cannot start evlet")?;
    let started = Instant::now();
    let mut shown = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            stop_evlet(&mut child)?;
            eprintln!("evlet stopped; the node and its pods keep running");
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            if duration.is_some() && shown {
                return Ok(());
            }
            bail!("evlet exited: {status}");
        }
        if !shown
            && let Ok((text, all_up)) = summary()
            && (all_up || started.elapsed() > Duration::from_secs(60))
        {
            println!(
                "evlet is running the example pods (http://{ADDRESS}/pods, /healthz, /metrics):\n{text}"
            );
            println!("{}", get("/healthz").unwrap_or_default().trim_end());
            println!(
                "Ctrl-C stops evlet; `cargo xtask node down --containerd {version}` removes the node and its pods."
            );
            shown = true;
        }
        if let Some(limit) = duration
            && started.elapsed() > Duration::from_secs(limit)
        {
            stop_evlet(&mut child)?;
            if !shown {
                bail!("the example pods did not come up within {limit} s");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
