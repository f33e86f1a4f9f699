//! The crate's one error type. Every CRI failure is classified here, once.
//!
//! Retryable: [`ErrorKind::Unavailable`] (the runtime is restarting or its socket
//! is gone) and [`ErrorKind::DeadlineExceeded`]. The client itself retries reads
//! and idempotent writes on `Unavailable` (`Options::read_attempts` tries, waiting
//! [`Retry`](crate::Retry) delays from 100 ms doubling, within the call's deadline);
//! callers retry anything else on their own schedule (the agent's pod-sync backoff).

use std::fmt;

/// What kind of failure a CRI call had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object (sandbox, container, image) does not exist.
    NotFound,
    /// The runtime could not be reached (socket missing, connection refused or reset).
    Unavailable,
    /// The call did not finish within its deadline.
    DeadlineExceeded,
    /// The runtime refused the request as malformed or not applicable now.
    InvalidArgument,
    /// The runtime does not implement the call (e.g. `GetContainerEvents` before containerd 1.7).
    Unsupported,
    /// Anything else the runtime reported.
    Other,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::Unavailable => "runtime unavailable",
            ErrorKind::DeadlineExceeded => "deadline exceeded",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Unsupported => "unsupported by the runtime",
            ErrorKind::Other => "failed",
        })
    }
}

/// A failed CRI call: which call, on which object, what kind of failure, and the runtime's message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cri {call}{}: {kind}: {message}", object.as_deref().map(|o| format!(" {o}")).unwrap_or_default())]
pub struct Error {
    /// The RPC, e.g. `ContainerStatus`.
    pub call: &'static str,
    /// The object the call was about (an ID or image name), if any.
    pub object: Option<String>,
    /// The classification.
    pub kind: ErrorKind,
    /// The runtime's (or transport's) message.
    pub message: String,
}

impl Error {
    /// Classifies a gRPC status from `call` about `object`.
    pub fn from_status(call: &'static str, object: Option<String>, status: &tonic::Status) -> Self {
        use tonic::Code;
        let kind = match status.code() {
            Code::NotFound => ErrorKind::NotFound,
            Code::Unavailable | Code::Cancelled => ErrorKind::Unavailable,
            Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::OutOfRange => ErrorKind::InvalidArgument,
            Code::Unimplemented => ErrorKind::Unsupported,
            // containerd wraps some lookups as Unknown with its errdefs text.
            Code::Unknown if status.message().contains("not found") => ErrorKind::NotFound,
            // containerd's CRI answers this while it restores state after a restart.
            _ if status.message().contains("server is not initialized yet") => {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Other,
        };
        let mut message = status.message().to_owned();
        if message.is_empty() {
            message = format!("{:?}", status.code());
        }
        Self {
            call,
            object,
            kind,
            message,
        }
    }

    /// A call that ran past its deadline on the client side.
    pub fn deadline(
        call: &'static str,
        object: Option<String>,
        after: std::time::Duration,
    ) -> Self {
        Self {
            call,
            object,
            kind: ErrorKind::DeadlineExceeded,
            message: format!("no answer within {after:?}"),
        }
    }

    /// A response that lacks a field the CRI spec requires.
    pub fn malformed(call: &'static str, object: Option<String>, what: &str) -> Self {
        Self {
            call,
            object,
            kind: ErrorKind::Other,
            message: format!("malformed response: {what}"),
        }
    }

    /// True if the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }

    /// True if retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        use ErrorKind::{
            DeadlineExceeded, InvalidArgument, NotFound, Other, Unavailable, Unsupported,
        };
        use tonic::Status;
        let cases = [
            (Status::not_found("container \"x\" not found"), NotFound),
            (Status::unknown("an error occurred: not found"), NotFound),
            (Status::unavailable("connection refused"), Unavailable),
            (Status::deadline_exceeded("slow"), DeadlineExceeded),
            (Status::invalid_argument("bad"), InvalidArgument),
            (
                Status::unimplemented("unknown method GetContainerEvents"),
                Unsupported,
            ),
            (
                Status::unknown("server is not initialized yet"),
                Unavailable,
            ),
            (Status::internal("boom"), Other),
        ];
        for (status, kind) in cases {
            assert_eq!(
                Error::from_status("Test", None, &status).kind,
                kind,
                "{status:?}"
            );
        }
    }

    #[test]
    fn message_names_call_and_object() {
        let err = Error::from_status(
            "ContainerStatus",
            Some("abc".into()),
            &tonic::Status::not_found("no such container"),
        );
        assert_eq!(
            err.to_string(),
            "cri ContainerStatus abc: not found: no such container"
        );
        assert!(err.is_not_found());
        assert!(!err.is_retryable());
    }
}
