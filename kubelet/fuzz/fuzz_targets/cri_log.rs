//! CRI log records (what `kubectl logs` and termination messages read): any
//! line parses or is refused by name, and a tail of any file is text that
//! fits its limit. Never a panic.
#![no_main]

use evlet::logs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        let _ = logs::parse(line);
    }
    let dir = std::env::temp_dir().join(format!("evlet-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("0.log");
    if std::fs::write(&path, data).is_ok() {
        let max = data.first().map_or(16, |b| usize::from(*b) * 8 + 1);
        if let Ok(tail) = logs::last_text(&path, 80, max) {
            assert!(tail.len() <= max, "the tail fits its limit");
        }
    }
});
