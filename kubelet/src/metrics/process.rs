//! `process_*`: what Prometheus' Go client reports about the process, read
//! from `/proc/self` at each scrape (upstream kubelet serves these through
//! component-base's registry; names and help texts are the Go client's).

use prometheus::{Counter, Gauge};

use super::{Catalog, Kind};

/// The process metrics, set by [`ProcessMetrics::refresh`].
#[derive(Debug)]
pub struct ProcessMetrics {
    cpu_seconds: Counter,
    open_fds: Gauge,
    max_fds: Gauge,
    virtual_memory: Gauge,
    virtual_memory_max: Gauge,
    resident_memory: Gauge,
    start_time: Gauge,
    network_receive: Counter,
    network_transmit: Counter,
}

impl ProcessMetrics {
    pub(super) fn new(c: &mut Catalog) -> Self {
        let mut gauge = |name: &str, help: &str| {
            c.add(Kind::Gauge, super::expect_valid(Gauge::new(name, help)))
        };
        let open_fds = gauge("process_open_fds", "Number of open file descriptors.");
        let max_fds = gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
        );
        let virtual_memory = gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
        );
        let virtual_memory_max = gauge(
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
        );
        let resident_memory = gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
        );
        let start_time = gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        );
        let mut counter = |name: &str, help: &str| {
            c.add(Kind::Counter, super::expect_valid(Counter::new(name, help)))
        };
        Self {
            cpu_seconds: counter(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
            ),
            network_receive: counter(
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            ),
            network_transmit: counter(
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            ),
            open_fds,
            max_fds,
            virtual_memory,
            virtual_memory_max,
            resident_memory,
            start_time,
        }
    }

    /// Reads `/proc/self` into the metrics; what cannot be read keeps its
    /// last value.
    pub fn refresh(&self) {
        let Ok(me) = procfs::process::Process::myself() else {
            return;
        };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            advance(&self.cpu_seconds, (stat.utime + stat.stime) as f64 / ticks);
            self.virtual_memory.set(stat.vsize as f64);
            self.resident_memory
                .set((stat.rss * procfs::page_size()) as f64);
            if let Some(start) = start_time_of(&stat) {
                self.start_time.set(start);
            }
        }
        if let Ok(n) = me.fd_count() {
            self.open_fds.set(n as f64);
        }
        if let Ok(limits) = me.limits() {
            self.max_fds.set(limit(limits.max_open_files.soft_limit));
            self.virtual_memory_max
                .set(limit(limits.max_address_space.soft_limit));
        }
        if let Ok(devices) = me.dev_status() {
            let (rx, tx) = devices.values().fold((0u64, 0u64), |(r, t), d| {
                (r + d.recv_bytes, t + d.sent_bytes)
            });
            advance(&self.network_receive, rx as f64);
            advance(&self.network_transmit, tx as f64);
        }
    }
}

/// The process' start time (for `/metrics/probes`), if `/proc` tells it.
pub fn start_time_seconds() -> Option<f64> {
    start_time_of(&procfs::process::Process::myself().ok()?.stat().ok()?)
}

/// Unix seconds at which the process of `stat` started.
fn start_time_of(stat: &procfs::process::Stat) -> Option<f64> {
    let boot = procfs::boot_time_secs().ok()?;
    Some(boot as f64 + stat.starttime as f64 / procfs::ticks_per_second() as f64)
}

/// Moves a counter up to `total` (the kernel's cumulative value).
fn advance(counter: &Counter, total: f64) {
    let delta = total - counter.get();
    if delta > 0.0 {
        counter.inc_by(delta);
    }
}

/// A resource limit as the Go client reports it: unlimited is the maximum
/// of a 64-bit integer.
fn limit(v: procfs::process::LimitValue) -> f64 {
    match v {
        procfs::process::LimitValue::Value(n) => n as f64,
        procfs::process::LimitValue::Unlimited => u64::MAX as f64,
    }
}
