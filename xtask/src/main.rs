//! `cargo xtask`: evlet's single developer entry point.
//!
//! * `setup`: install packages and toolchain pieces (idempotent)
//! * `node up|down|status [--containerd 1.6|1.7|2.1]`: a private containerd
//! * `cluster up|down|status|build [--version 1.34|1.37]`: an upstream control plane on loopback
//! * `images`: build the local OCI images
//! * `run`: setup, node up, and evlet with the example static pods
//! * `test`: setup, fmt, clippy, unit tests, privileged node and kernel tests, vm-test
//! * `vm-test`: the kernel probe tests in Debian kernels under qemu
//! * `bench`: the PLEG modes side by side (latency, CPU, memory, start-up)
//! * `fuzz`: the libFuzzer targets in `kubelet/fuzz` for a bounded time each

mod apt;
mod bench;
mod cluster;
mod conformance;
mod containerd;
mod fuzz;
mod guest;
mod image;
mod node;
mod paths;
mod run;
mod setup;
mod sh;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::containerd::Version;
use crate::node::Node;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "evlet developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install Debian packages, rust-src, bpf-linker; mount tracefs. Idempotent.
    Setup,
    /// Manage the private containerd node.
    Node {
        #[command(subcommand)]
        action: NodeAction,
        /// containerd line: 1.6 (system), 1.7 (trixie) or 2.1 (sid).
        #[arg(long, default_value = "1.6", global = true)]
        containerd: Version,
    },
    /// Manage the upstream control plane on loopback (built from upstream/v1.X).
    Cluster(cluster::Options),
    /// Upstream's e2e node conformance specs against evlet and upstream kubelet.
    Conformance(conformance::Options),
    /// Build the local pause and test images (OCI archives under .tools/images).
    Images,
    /// Set up, bring the node up, and run evlet with deploy/examples.
    Run {
        /// containerd line for the node.
        #[arg(long, default_value = "1.6")]
        containerd: Version,
        /// Also bring up the local upstream control plane (`cluster up`) of
        /// this version and join it as its node.
        #[arg(long, num_args = 0..=1, default_missing_value = "1.34")]
        cluster: Option<cluster::Version>,
        /// Stop evlet after this many seconds (default: run until Ctrl-C).
        #[arg(long)]
        duration: Option<u64>,
        /// Extra arguments passed to evlet.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up and run every check and test.
    Test(test::Options),
    /// Run the kernel probe tests inside Debian kernels 5.10, 6.1, 6.12 and sid under qemu.
    VmTest(vm::Options),
    /// Benchmark the PLEG modes on the containerd 1.7 node (bench/results).
    Bench(bench::Options),
    /// Run the fuzz targets (kubelet/fuzz) for a bounded time each.
    Fuzz(fuzz::Options),
}

#[derive(Debug, Subcommand)]
enum NodeAction {
    /// Start the node (idempotent) and import the local images.
    Up,
    /// Stop the node and remove everything it owns.
    Down,
    /// Print whether the node is up and what it holds.
    Status,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Task::Setup => setup::setup(),
        Task::Node { action, containerd } => {
            let node = Node::new(containerd);
            match action {
                NodeAction::Up => node.up(),
                NodeAction::Down => node.down(),
                NodeAction::Status => node.status(),
            }
        }
        Task::Cluster(options) => cluster::run(&options),
        Task::Conformance(options) => conformance::run(&options),
        Task::Images => {
            for (name, path) in image::build_all()? {
                println!("{name}\t{}", path.display());
            }
            Ok(())
        }
        Task::Run {
            containerd,
            cluster,
            duration,
            args,
        } => run::run(containerd, cluster, duration, &args),
        Task::Test(options) => test::test(&options),
        Task::Bench(options) => bench::bench(&options),
        Task::Fuzz(options) => fuzz::fuzz(&options).map(|_| ()),
        Task::VmTest(options) => {
            setup::setup()?;
            vm::vm_test(&options, &test::test_targets()?.kernel)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
