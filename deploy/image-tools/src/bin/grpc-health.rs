//! `grpc-health PORT FILE`: a gRPC server with only the standard health
//! service (`grpc.health.v1.Health`). The server and the service `app` are
//! SERVING while FILE exists and NOT_SERVING otherwise, so a test flips a gRPC
//! probe by creating and removing a file in the container.

use std::path::PathBuf;
use std::time::Duration;

use tonic_health::ServingStatus;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(port), Some(file)) = (args.next(), args.next()) else {
        eprintln!("usage: grpc-health PORT FILE");
        std::process::exit(2);
    };
    let Ok(port) = port.parse::<u16>() else {
        eprintln!("grpc-health: invalid port {port:?}");
        std::process::exit(2);
    };
    let file = PathBuf::from(file);
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if file.exists() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if last != Some(status) {
                reporter.set_service_status("", status).await;
                reporter.set_service_status("app", status).await;
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("grpc-health: cannot listen on port {port}: {e}");
            std::process::exit(1);
        }
    };
    println!("grpc-health: serving on port {port}");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
    {
        eprintln!("grpc-health: {e}");
        std::process::exit(1);
    }
}
