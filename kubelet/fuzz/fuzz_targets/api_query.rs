//! The kubelet API's query strings (what any client of the secured port can
//! send): container-log options, exec/attach options and port-forward ports,
//! and the authorization mapping of any path. Each is decoded or refused with
//! upstream's answer; a rendered log line for any options stays a line.
//! Never a panic.
#![no_main]

use evlet::server::{auth, logs, streaming};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (query, path) = text.split_once('\n').unwrap_or((&text, "/"));
    if let Ok(r) = logs::parse_query(query) {
        assert!(r.tail_lines.is_none_or(|n| n >= 0));
        assert!(r.limit_bytes.is_none_or(|n| n >= 1));
        assert!(!(r.since_seconds.is_some() && r.since_time.is_some()));
    }
    if let Ok((o, _)) = streaming::parse_query(query) {
        assert!(o.stdin || o.stdout || o.stderr);
        assert!(!(o.tty && o.stderr));
    }
    if let Ok(ports) = streaming::parse_ports(query) {
        assert!(ports.iter().all(|p| (1..=65535).contains(p)));
    }
    for method in ["GET", "POST", "PUT", "HEAD"] {
        let checks = auth::checks(method, path);
        assert!(!checks.is_empty(), "every request is checked");
    }
});
