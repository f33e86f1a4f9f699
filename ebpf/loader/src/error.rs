//! The loader's error type. Nothing here is retryable by waiting: a load failure
//! means this kernel (or this process's privileges) cannot run the probes, and the
//! agent falls back to polling.

use std::path::PathBuf;

/// Why the probes could not be loaded, attached or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Kernel BTF (`/sys/kernel/btf/vmlinux`) is missing or unreadable.
    #[error("kernel BTF is unavailable: {0}")]
    Btf(String),
    /// A struct member the programs read is not in this kernel's BTF.
    #[error("kernel BTF has no member {member} in struct {structure}")]
    BtfMember {
        /// The struct (`task_struct`, ...).
        structure: &'static str,
        /// The member (`exit_code`, ...).
        member: &'static str,
    },
    /// tracefs is not mounted and could not be mounted.
    #[error("tracefs is not available (tried {tried:?}): {reason}")]
    Tracefs {
        /// Mount points tried.
        tried: Vec<PathBuf>,
        /// Why mounting failed.
        reason: String,
    },
    /// A tracepoint `format` file is missing a field the programs need.
    #[error("tracepoint {tracepoint} has no field {field} in {path}")]
    TracepointField {
        /// `category/name`.
        tracepoint: String,
        /// The field.
        field: &'static str,
        /// The format file read.
        path: PathBuf,
    },
    /// An IO error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The ring-buffer size is not a power of two number of pages.
    #[error(
        "ring buffer of {0} bytes: the size must be a power of two and a multiple of the page size"
    )]
    RingSize(u32),
    /// The object could not be parsed or its maps created.
    #[error("loading the eBPF object failed: {0}")]
    Object(#[source] aya::EbpfError),
    /// The verifier (or the kernel) refused a program; the message carries the verifier log.
    #[error("loading program {program} failed: {source}")]
    Program {
        /// The program name.
        program: &'static str,
        /// aya's error, whose text includes the verifier log.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A program could be attached neither as raw nor as classic tracepoint.
    #[error("attaching {program} to {hook} failed: {source}")]
    Attach {
        /// The program name.
        program: &'static str,
        /// The hook.
        hook: &'static str,
        /// The last attempt's error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map is missing or has the wrong type.
    #[error("map {map}: {source}")]
    Map {
        /// The map name.
        map: &'static str,
        /// The cause.
        #[source]
        source: aya::maps::MapError,
    },
    /// A map the object must define is absent.
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    /// A program the object must define is absent.
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// The watch prefix is longer than the kernel side holds.
    #[error("cgroup watch prefix {prefix:?} is longer than {max} bytes")]
    PrefixTooLong {
        /// The prefix.
        prefix: String,
        /// The limit.
        max: usize,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
