//! The `evlet` binary: flags and config file ([`flags`]) → [`evlet::agent`].

use std::time::Duration;

mod diag_cli;
mod flags;

use anyhow::Result;
use clap::Parser;
use evlet::config::{self, Config, LogFormat};
use tokio_util::sync::CancellationToken;

use flags::{Certificates, Flags};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
/// The API client (with TLS bootstrap and rotation as asked).
async fn connect(
    kubeconfig: &std::path::Path,
    certificates: &Certificates,
    config: &mut Config,
    shutdown: &CancellationToken,
) -> Result<evlet::api::ApiClient> {
    let serving = certificates.server_tls_bootstrap && config.secure.is_some();
    if serving && config.node_ip.is_none() {
        // The serving certificate names the node's IP: the same one the
        // agent would detect and report.
        match config::detect_node_ip(&config.node_name) {
            Ok(ip) => config.node_ip = Some(ip),
            Err(e) => {
                tracing::warn!(error = %e, "serverTLSBootstrap: no node IP for the serving certificate")
            }
        }
    }
    let credentials = evlet::api::Credentials {
        bootstrap_kubeconfig: certificates.bootstrap_kubeconfig.clone(),
        rotate_certificates: certificates.rotate,
        server_tls_bootstrap: serving.then(|| {
            (
                vec![config::hostname()],
                config
                    .node_ip
                    .iter()
                    .filter_map(|ip| ip.parse().ok())
                    .collect(),
            )
        }),
        cert_dir: evlet::certificate::default_cert_dir(&config.root_dir),
        requested_duration: None,
    };
    Ok(evlet::api::ApiClient::join(kubeconfig, &config.node_name, &credentials, shutdown).await?)
}

fn main() -> Result<()> {
    #[cfg(target_env = "gnu")]
    // SAFETY: no other thread exists yet.
    unsafe {
        evlet::heap::use_few_arenas();
    }
    // `evlet diag …` is a client of a running agent, not an agent.
    if std::env::args().nth(1).as_deref() == Some("diag") {
        return diag_cli::main(std::env::args().skip(1).collect());
    }
    let (args, ignored) =
        config::compat_args(std::env::args().collect()).map_err(anyhow::Error::msg)?;
    let flags = Flags::parse_from(args);
    init_logging(flags.log_format);
    for warning in ignored {
        tracing::warn!("{warning}");
    }
    let kubeconfig = flags.kubeconfig.clone();
    let lock_file = flags
        .lock_file
        .clone()
        .unwrap_or_else(|| flags.root_dir.join("evlet.lock"));
    let exit_on_contention = flags.exit_on_lock_contention;
    // Before anything touches the runtime: two agents would fight over every pod.
    // With --exit-on-lock-contention this is a hand-over, as upstream: wait for
    // the holder, which exits when it sees this process open the file.
    let lock = if exit_on_contention {
        evlet::node_lock::NodeLock::acquire_waiting(&lock_file)?
    } else {
        evlet::node_lock::NodeLock::acquire(&lock_file)?
    };
    let (mut config, certificates) = flags::effective(flags)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        #[cfg(target_env = "gnu")]
        tokio::spawn(evlet::heap::trim_after_bursts());
        let shutdown = CancellationToken::new();
        if let Some(path) = &kubeconfig {
            config.api = Some(connect(path, &certificates, &mut config, &shutdown).await?);
        }
        let contended = CancellationToken::new();
        let _watcher = if exit_on_contention {
            Some(lock.watch_contention(contended.clone())?)
        } else {
            None
        };
        let (_handles, task) = evlet::agent::start(config, shutdown.clone()).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
            _ = term.recv() => tracing::info!("terminated; stopping"),
            () = contended.cancelled() => tracing::info!(
                lock_file = %lock.path().display(),
                "another process opened the lock file; stopping (--exit-on-lock-contention)"
            ),
        }
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        Ok(())
    })
}
