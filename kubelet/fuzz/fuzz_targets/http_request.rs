//! Whatever a client sends to one of the kubelet API's plain ports (the
//! read-only and healthz ports share this path: hyper's parser under the
//! connection's limits and watchdog, then the router): each input is one
//! connection over loopback, written and half-closed. The server answers
//! with an HTTP/1 response or closes, within the time a client that stops
//! writing may take, and gives the connection's slot back: no input leaks a
//! slot of the connection cap. Never a panic.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use evlet::server::{Gate, Limits, routes};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// The server every input talks to, started once.
struct Rig {
    runtime: tokio::runtime::Runtime,
    address: SocketAddr,
    gate: Arc<Gate>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let gate = Gate::new(Limits::default());
        let address = runtime.block_on(async {
            let (listener, address) =
                evlet::server::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                    .await
                    .expect("bind loopback");
            evlet::server::serve_plain(
                listener,
                routes::healthz_port(),
                Arc::clone(&gate),
                CancellationToken::new(),
            );
            address
        });
        Rig {
            runtime,
            address,
            gate,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let rig = rig();
    rig.runtime.block_on(async {
        let mut stream = tokio::net::TcpStream::connect(rig.address)
            .await
            .expect("connect to the server");
        // The server may answer and close before all was written.
        let _ = stream.write_all(data).await;
        let _ = stream.shutdown().await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            stream.read_to_end(&mut answer),
        )
        .await;
        assert!(
            read.is_ok(),
            "the server neither answered nor closed within 10 s of a half-close"
        );
        assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1."),
            "not an HTTP/1 response: {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(64)])
        );
        drop(stream);
        let released = async {
            while rig.gate.held() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(2), released)
                .await
                .is_ok(),
            "a closed connection still holds a slot ({} held)",
            rig.gate.held()
        );
    });
});
