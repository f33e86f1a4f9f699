//! TCP: healthy if a connection opens within the timeout (nothing is sent).

use std::time::Duration;

use super::Outcome;

/// Connects to `host:port` (upstream's `DoTCPProbe`).
pub async fn check(host: &str, port: u16, timeout: Duration) -> Outcome {
    match super::dial(host, port, timeout).await {
        Ok(stream) => {
            drop(stream);
            Outcome::Success(String::new())
        }
        Err(e) => Outcome::Failure(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_open_port_is_healthy_and_a_closed_one_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(
            check("127.0.0.1", port, Duration::from_secs(1)).await,
            Outcome::Success(String::new())
        );
        drop(listener);
        assert!(matches!(
            check("127.0.0.1", port, Duration::from_secs(1)).await,
            Outcome::Failure(m) if m.contains("connection refused")
        ));
    }
}
