//! `memhog <MiB>`: touch that much memory one MiB at a time, then sleep.
//!
//! With a container memory limit below `<MiB>` the kernel's OOM killer ends it.

use std::io::Write as _;
use std::time::Duration;

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn main() {
    let target: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(mib)) => mib,
        _ => {
            eprintln!("usage: memhog <MiB>");
            std::process::exit(2);
        }
    };
    let mut held: Vec<Vec<u8>> = Vec::with_capacity(target);
    for i in 0..target {
        let mut chunk = vec![0u8; MIB];
        for page in chunk.iter_mut().step_by(PAGE) {
            *page = 1;
        }
        held.push(std::hint::black_box(chunk));
        if (i + 1) % 16 == 0 {
            println!("memhog: {} MiB", i + 1);
            let _ = std::io::stdout().flush();
        }
    }
    println!("memhog: holding {target} MiB");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
