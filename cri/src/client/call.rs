//! How one CRI call runs: a [`Call`] names it, its object, deadline and retry
//! rule; [`RuntimeClient::call`] runs it with that deadline, in a `cri` tracing
//! span, retrying an idempotent call that failed with `Unavailable`.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use super::RuntimeClient;
use crate::error::{Error, ErrorKind};
use crate::retry::Retry;

/// One RPC's name, object (for errors and spans), deadline and retry rule.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call<'a> {
    name: &'static str,
    object: Option<&'a str>,
    timeout: Duration,
    idempotent: Idempotent,
}

/// Whether a call may be repeated after `Unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idempotent {
    Yes,
    No,
}

impl Call<'_> {
    /// The same call with `extra` added to its deadline (for calls that wait on purpose).
    pub(super) fn extended_by(self, extra: Duration) -> Self {
        Self {
            timeout: extra + self.timeout,
            ..self
        }
    }
}

/// The pause before retry `n` (1, 2, …) of an idempotent call: 100 ms doubling to 3.2 s.
fn read_retry() -> Retry {
    Retry::new(Duration::from_millis(100), Duration::from_millis(3200))
}

/// Runs the tonic method `$client.$method` (`$client`: `runtime` or `images`)
/// on `$request` as the [`Call`] `$call`, through [`RuntimeClient::call`].
macro_rules! rpc {
    ($this:ident.$client:ident.$method:ident($request:expr), $call:expr) => {
        $this.call(&$this.$client, $call, $request, |mut c, r| async move {
            c.$method(r).await
        })
    };
}
pub(super) use rpc;

impl RuntimeClient {
    /// A read-only call: the status deadline, retried on `Unavailable`.
    pub(super) fn read<'a>(&self, name: &'static str, object: Option<&'a str>) -> Call<'a> {
        Call {
            name,
            object,
            timeout: self.options.status_timeout,
            idempotent: Idempotent::Yes,
        }
    }

    /// A mutating call (or image pull): the request deadline, retried on
    /// `Unavailable` only if `idempotent`.
    pub(super) fn mutate<'a>(
        &self,
        name: &'static str,
        object: Option<&'a str>,
        idempotent: Idempotent,
    ) -> Call<'a> {
        Call {
            name,
            object,
            timeout: self.options.request_timeout,
            idempotent,
        }
    }

    /// Runs one RPC with a deadline, a span, and (for idempotent calls) retries on `Unavailable`.
    pub(super) async fn call<C, Req, Resp, F, Fut>(
        &self,
        client: &C,
        call: Call<'_>,
        request: Req,
        rpc: F,
    ) -> Result<Resp, Error>
    where
        C: Clone,
        Req: Clone,
        F: Fn(C, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let Call {
            name,
            object,
            timeout,
            idempotent,
        } = call;
        let span = tracing::debug_span!("cri", call = name, object = object.unwrap_or(""));
        async {
            let started = Instant::now();
            let deadline = started + timeout;
            let attempts = match idempotent {
                Idempotent::Yes => self.options.read_attempts.max(1),
                Idempotent::No => 1,
            };
            let mut retry = read_retry();
            let mut attempt = 0;
            let report = |result: Result<Resp, Error>| {
                if let Some(observer) = &self.options.observer {
                    observer.observe(name, started.elapsed(), result.as_ref().err());
                }
                result
            };
            loop {
                attempt += 1;
                let remaining = deadline.saturating_duration_since(Instant::now());
                let mut req = tonic::Request::new(request.clone());
                req.set_timeout(remaining);
                let result = match tokio::time::timeout(remaining, rpc(client.clone(), req)).await {
                    Ok(Ok(resp)) => Ok(resp.into_inner()),
                    // tonic enforces the grpc-timeout itself and reports it as Cancelled.
                    Ok(Err(_)) if Instant::now() >= deadline => {
                        Err(Error::deadline(name, object.map(str::to_owned), timeout))
                    }
                    Ok(Err(status)) => {
                        Err(Error::from_status(name, object.map(str::to_owned), &status))
                    }
                    Err(_) => Err(Error::deadline(name, object.map(str::to_owned), timeout)),
                };
                match result {
                    Err(err) if err.kind == ErrorKind::Unavailable && attempt < attempts => {
                        let backoff = retry.next_delay();
                        if Instant::now() + backoff >= deadline {
                            return report(Err(err));
                        }
                        tracing::debug!(attempt, %err, "retrying");
                        tokio::time::sleep(backoff).await;
                    }
                    Err(err) => {
                        tracing::debug!(elapsed = ?started.elapsed(), %err, "failed");
                        return report(Err(err));
                    }
                    Ok(resp) => {
                        tracing::trace!(elapsed = ?started.elapsed(), "ok");
                        return report(Ok(resp));
                    }
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// `field` of `call`'s response, which the CRI spec requires: a malformed-response error if missing.
pub(super) fn required<T>(call: Call<'_>, field: Option<T>, what: &str) -> Result<T, Error> {
    field.ok_or_else(|| Error::malformed(call.name, call.object.map(str::to_owned), what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_keep_the_delays_of_before_retry() {
        // The delays the client used before `Retry`: 50 ms << attempt, capped at attempt 6.
        let mut retry = read_retry();
        for attempt in 1..10u32 {
            let before = Duration::from_millis(50 << attempt.min(6));
            assert_eq!(retry.next_delay(), before, "attempt {attempt}");
        }
    }
}
