//! Exec: a command run in the container through CRI `ExecSync`; healthy iff it
//! exits 0 within the timeout.

use std::time::Duration;

use evlet_cri::{ContainerId, RuntimeClient};

use super::{MAX_OUTPUT, Outcome, ProbeError, head_text};

/// Runs `cmd` in container `id` for at most `timeout` (upstream's exec probe
/// with `ExecProbeTimeout`: a timeout is a failure).
///
/// # Errors
/// [`ProbeError`] if the runtime could not run the command at all (not a
/// verdict about the container).
pub async fn check(
    client: &RuntimeClient,
    id: &ContainerId,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<Outcome, ProbeError> {
    let shown = format!("{cmd:?}");
    match client.exec_sync(id, cmd, timeout).await {
        Ok(out) => {
            let mut bytes = out.stdout;
            bytes.extend_from_slice(&out.stderr);
            let output = head_text(&bytes, MAX_OUTPUT);
            Ok(if out.exit_code == 0 {
                Outcome::Success(output)
            } else {
                Outcome::Failure(output)
            })
        }
        // containerd kills the command at the deadline and answers
        // DeadlineExceeded ("timeout 1s exceeded: context deadline exceeded").
        Err(e)
            if e.kind == evlet_cri::ErrorKind::DeadlineExceeded
                || e.message.contains("deadline exceeded") =>
        {
            Ok(Outcome::Failure(format!(
                "command timed out: {shown} timed out after {timeout:?}"
            )))
        }
        Err(e) => Err(ProbeError(e.to_string())),
    }
}
