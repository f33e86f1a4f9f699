//! The KubeletConfiguration file and the flag values parsed alongside it
//! (Go durations, `--register-with-taints`): any text is an answer or an
//! error naming the field, never a panic.
#![no_main]

use std::path::Path;

use evlet::config::{self, KubeletConfiguration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = KubeletConfiguration::parse(text, Path::new("/fuzz/config.yaml"));
    for line in text.lines().take(8) {
        let _ = config::parse_duration(line);
        let _ = config::parse_taints(line);
    }
});
