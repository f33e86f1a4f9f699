//! User space of evlet's eBPF probes: knows aya and the kernel, not pods.
//!
//! [`Probes::load`] resolves what differs between kernels (struct offsets from
//! BTF via libbpf in [`btf`], tracepoint field offsets from tracefs in
//! [`tracefs`]), loads the object that `build.rs` compiled from `ebpf/probes`,
//! attaches raw tracepoints where it can and classic ones otherwise, and hands
//! out an [`EventReader`] (an async stream of typed [`Event`]s) plus the
//! ring-buffer loss counter. User space manages the watched-cgroup map
//! ([`Probes::watch`], [`Probes::watch_tree`]); the kernel adds cgroups created
//! under the configured prefix by itself. Dropping [`Probes`] detaches everything.
//!
//! Map: [`probes`] (load/attach/maps), [`reader`] (the stream), [`event`]
//! (decoding), [`btf`], [`tracefs`], [`cgroup`] (cgroup2 mount and IDs),
//! [`log`] (aya-log to tracing), [`error`].

pub mod btf;
pub mod cgroup;
pub mod error;
pub mod event;
pub mod log;
pub mod probes;
pub mod reader;
pub mod tracefs;

pub use error::Error;
pub use event::{CgroupChange, Event, Exit, OomKill, OomRss, Origin, monotonic_ns};
pub use evlet_ebpf_common::AttachKind;
pub use probes::{AttachMode, Config, Hook, Probes};
pub use reader::EventReader;
