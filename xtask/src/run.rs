//! `cargo xtask run`: evlet's main job on a local default node.

use anyhow::Result;

use crate::containerd::Version;
use crate::node::Node;
use crate::setup;

/// Sets up, brings the node up, and runs evlet against it.
///
/// PLACEHOLDER until the agent exists (issue "kubelet/"): proves the node is
/// up and serving CRI, then says so. It does not run pods.
pub fn run(version: Version, _args: &[String]) -> Result<()> {
    setup::setup()?;
    let node = Node::new(version);
    node.up()?;
    node.status()?;
    println!(
        "PLACEHOLDER: the evlet agent is not built yet; the node above is up and serving CRI."
    );
    Ok(())
}
