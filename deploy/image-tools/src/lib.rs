//! Static helper programs baked into evlet's local container images.
//!
//! * `pause`: the sandbox (infra) container's process. Sleeps, reaps orphaned
//!   children, and exits 0 on SIGTERM/SIGINT, like upstream's `pause`.
//! * `memhog`: allocates and touches memory in 1 MiB steps until it holds the
//!   requested amount (or the OOM killer ends it), then sleeps. Used by OOM tests.
//!
//! `cargo xtask` builds them with `+crt-static` so the images need no libc.
