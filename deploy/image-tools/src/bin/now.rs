//! `now`: prints the wall clock in Unix nanoseconds (busybox's `date` has no
//! `%N`). Tests compare a container's own clock reading with statuses.

fn main() {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    println!("{ns}");
}
