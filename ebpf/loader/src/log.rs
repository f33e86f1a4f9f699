//! Forwards `aya-log` records from the kernel programs to `tracing`.

use log::{Log, Metadata, Record};

/// A `log::Log` that re-emits kernel-side log records as `tracing` events with
/// target `evlet_ebpf::kernel`.
#[derive(Debug, Clone, Copy)]
pub struct TracingLog;

impl Log for TracingLog {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        let message = record.args().to_string();
        match record.level() {
            log::Level::Error => tracing::error!(target: "evlet_ebpf::kernel", "{message}"),
            log::Level::Warn => tracing::warn!(target: "evlet_ebpf::kernel", "{message}"),
            log::Level::Info => tracing::info!(target: "evlet_ebpf::kernel", "{message}"),
            log::Level::Debug => tracing::debug!(target: "evlet_ebpf::kernel", "{message}"),
            log::Level::Trace => tracing::trace!(target: "evlet_ebpf::kernel", "{message}"),
        }
    }

    fn flush(&self) {}
}
