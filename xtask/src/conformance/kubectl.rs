//! What the run asks of the cluster, through the release's `kubectl` as the
//! cluster admin: the conformance Node's readiness, other nodes the
//! scheduler could use, and removing what a run leaves behind (its Node, the
//! namespaces whose pods ran on it).

use std::path::PathBuf;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::sh;

/// Namespaces a cleanup never deletes.
const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// `kubectl` with the admin kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    /// The release's kubectl.
    pub bin: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s");
        cmd
    }

    /// `kubectl get <what> -o json`.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let out = sh::output(self.cmd().arg("get").args(args).args(["-o", "json"]))?;
        serde_json::from_str(&out).context("kubectl printed no JSON")
    }

    /// Waits until Node `name` is Ready, calling `alive` (the kubelet still
    /// runs) between looks.
    pub fn wait_ready(
        &self,
        name: &str,
        timeout: Duration,
        mut alive: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let started = Instant::now();
        let mut last = String::from("not registered");
        loop {
            alive()?;
            if let Ok(node) = self.get_json(&["node", name]) {
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready");
                match ready {
                    Some(c) if c["status"] == "True" => {
                        eprintln!(
                            "conformance: node {name} Ready after {:.1}s",
                            started.elapsed().as_secs_f64()
                        );
                        return Ok(());
                    }
                    Some(c) => {
                        last = format!(
                            "Ready={} ({}: {})",
                            c["status"].as_str().unwrap_or("?"),
                            c["reason"].as_str().unwrap_or(""),
                            c["message"].as_str().unwrap_or("")
                        );
                    }
                    None => last = "registered, no Ready condition yet".into(),
                }
            }
            if started.elapsed() > timeout {
                bail!("node {name} was not Ready within {timeout:?}: {last}");
            }
            sleep(Duration::from_secs(2));
        }
    }

    /// Ready, schedulable nodes other than `ours` (the scheduler may put the
    /// suite's pods there: the run would not test our kubelet alone).
    pub fn other_ready_nodes(&self, ours: &str) -> Result<Vec<String>> {
        let nodes = self.get_json(&["nodes"])?;
        Ok(nodes["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["metadata"]["name"] != ours)
            .filter(|n| n["spec"]["unschedulable"] != true)
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Namespaces (not the system ones) with a pod bound to `node`.
    pub fn namespaces_with_pods_on(&self, node: &str) -> Result<Vec<String>> {
        let pods = self.get_json(&[
            "pods",
            "--all-namespaces",
            &format!("--field-selector=spec.nodeName={node}"),
        ])?;
        let mut namespaces: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["metadata"]["namespace"].as_str().map(str::to_string))
            .filter(|ns| !SYSTEM_NAMESPACES.contains(&ns.as_str()))
            .collect();
        namespaces.sort();
        namespaces.dedup();
        Ok(namespaces)
    }

    /// Deletes the namespaces whose pods ran on `node` (an interrupted suite
    /// leaves them) and waits until no pod is bound to `node`, at most `timeout`.
    pub fn clean_up_after(&self, node: &str, timeout: Duration) -> Result<()> {
        let terminating = self.terminating_namespaces()?;
        let namespaces: Vec<String> = self
            .namespaces_with_pods_on(node)?
            .into_iter()
            .filter(|ns| !terminating.contains(ns))
            .collect();
        if !namespaces.is_empty() {
            eprintln!(
                "conformance: deleting namespaces left with pods on {node}: {}",
                namespaces.join(", ")
            );
            let _ = sh::output(
                self.cmd()
                    .args(["delete", "namespace", "--wait=false"])
                    .args(&namespaces),
            );
        }
        let started = Instant::now();
        loop {
            let pods = self.get_json(&[
                "pods",
                "--all-namespaces",
                &format!("--field-selector=spec.nodeName={node}"),
            ])?;
            let left = pods["items"].as_array().map_or(0, Vec::len);
            if left == 0 {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!("{left} pods are still bound to {node} after {timeout:?}");
            }
            sleep(Duration::from_secs(3));
        }
    }

    /// Namespaces being deleted (the suite deletes its own and does not wait).
    fn terminating_namespaces(&self) -> Result<Vec<String>> {
        let list = self.get_json(&["namespaces"])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["status"]["phase"] == "Terminating")
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Deletes Node `name` (its Lease goes with it, by owner reference).
    pub fn delete_node(&self, name: &str) -> Result<()> {
        sh::output(
            self.cmd()
                .args(["delete", "node", name, "--ignore-not-found", "--wait=true"]),
        )
        .map(|_| ())
    }
}
