//! gRPC: the standard `grpc.health.v1.Health/Check` over plaintext HTTP/2;
//! healthy iff the answer is `SERVING` within the timeout (one timeout for
//! connecting and the call, as upstream).

use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::{KUBE_VERSION, Outcome, join_host_port};

/// Asks `host:port` about `service` ("" = the server as a whole).
pub async fn check(host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    let deadline = tokio::time::Instant::now() + timeout;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())
        .and_then(|e| {
            e.user_agent(format!("kube-probe/{KUBE_VERSION}"))
                .map_err(|e| e.to_string())
        });
    let endpoint = match endpoint {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => {
            return Outcome::Failure(format!("error: failed to connect service at {addr:?}: {e}"));
        }
    };
    let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Outcome::Failure(format!(
                "error: failed to connect service at {addr:?}: {}",
                source_chain(&e)
            ));
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"
            ));
        }
    };
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    match tokio::time::timeout_at(deadline, client.check(request)).await {
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            Outcome::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            ))
        }
        Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => Outcome::Failure(
            format!("timeout: health rpc did not complete within {timeout:?}"),
        ),
        Ok(Err(status)) => Outcome::Failure(format!(
            "error: health rpc probe failed: {}",
            status.message()
        )),
        Ok(Ok(response)) => {
            let status = response.into_inner().status();
            if status == ServingStatus::Serving {
                Outcome::Success("service healthy".into())
            } else {
                Outcome::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    status.as_str_name()
                ))
            }
        }
    }
}

/// An error with its causes (`transport error: connection refused`).
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::server::health_reporter;

    #[tokio::test]
    async fn serving_is_healthy_and_not_serving_is_not() {
        let (reporter, service) = health_reporter();
        reporter
            .set_service_status("db", tonic_health::ServingStatus::NotServing)
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        let timeout = Duration::from_secs(2);
        assert_eq!(
            check("127.0.0.1", port, "", timeout).await,
            Outcome::Success("service healthy".into())
        );
        assert_eq!(
            check("127.0.0.1", port, "db", timeout).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let refused = check("127.0.0.1", 1, "", timeout).await;
        assert!(
            matches!(&refused, Outcome::Failure(m) if m.starts_with("error: failed to connect service at \"127.0.0.1:1\"")),
            "{refused:?}"
        );
    }
}
