//! The kubelet API's ports under slow and many clients, in paused time over
//! real loopback sockets: request headers sent a byte a second are cut off
//! at the header timeout, an idle keep-alive connection at the idle timeout,
//! and a thousand clients that never finish their request hold a bounded
//! number of connections while an authenticated request still gets its
//! answer at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use evlet::server::auth::{Auth, Check, Mode, Reviews, Settings, User};
use evlet::server::{Gate, Limits};
use futures_util::future::BoxFuture;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn router() -> Router {
    Router::new().route("/pods", get(|| async { "pods" }))
}

async fn plain(limits: Limits) -> (SocketAddr, Arc<Gate>, CancellationToken) {
    let (listener, address) = evlet::server::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let gate = Gate::new(limits);
    let shutdown = CancellationToken::new();
    evlet::server::serve_plain(listener, router(), Arc::clone(&gate), shutdown.clone());
    (address, gate, shutdown)
}

/// Reads until the server closes the connection (or resets it); what was read.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn headers_sent_a_byte_a_second_are_cut_off_at_the_header_timeout() {
    let (address, gate, shutdown) = plain(Limits::default()).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let mut reader = stream.try_clone_for_test();
    let started = Instant::now();
    let slow = async {
        for b in b"GET /pods HTTP/1.1\r\nHost: node\r\nX-Slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'))
        {
            if stream.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        () = slow => {}
        _ = until_closed(&mut reader) => {}
    }
    let cut = started.elapsed();
    assert!(
        cut >= Duration::from_secs(32) && cut <= Duration::from_secs(34),
        "cut after {cut:?}, the header timeout is 32 s"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(gate.held(), 0, "its slot is free again");
    shutdown.cancel();
}

/// Splits a test stream so one task writes while another waits for the close.
trait TryCloneForTest {
    fn try_clone_for_test(&self) -> TcpStream;
}

impl TryCloneForTest for TcpStream {
    fn try_clone_for_test(&self) -> TcpStream {
        let fd = std::os::fd::AsFd::as_fd(self)
            .try_clone_to_owned()
            .expect("dup");
        let std = std::net::TcpStream::from(fd);
        std.set_nonblocking(true).expect("nonblocking");
        TcpStream::from_std(std).expect("tokio stream")
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout_not_the_header_timeout() {
    let (address, _gate, shutdown) = plain(Limits::default()).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"GET /pods HTTP/1.1\r\nHost: node\r\n\r\n")
        .await
        .expect("request");
    let mut buf = [0u8; 1024];
    let n = stream.read(&mut buf).await.expect("response");
    assert!(
        String::from_utf8_lossy(&buf[..n]).ends_with("pods"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let answered = Instant::now();
    until_closed(&mut stream).await;
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_secs(90) && idle <= Duration::from_secs(91),
        "closed after {idle:?} idle; upstream's IdleTimeout is 90 s"
    );
    shutdown.cancel();
}

/// Token `good` is user alice; nothing else is a valid token.
#[derive(Debug)]
struct Tokens;

impl Reviews for Tokens {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<User>, String>> {
        let user = (token == "good").then(|| User {
            name: "alice".into(),
            ..User::default()
        });
        Box::pin(std::future::ready(Ok(user)))
    }

    fn review_access<'a>(
        &'a self,
        _: &'a User,
        _: &'a str,
        _: Check,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(std::future::ready(Ok(true)))
    }
}

/// The secured port with a self-signed certificate for 127.0.0.1, and a TLS
/// client that trusts it.
async fn secure(
    limits: Limits,
    dir: &std::path::Path,
) -> (
    SocketAddr,
    Arc<Gate>,
    tokio_rustls::TlsConnector,
    CancellationToken,
) {
    let settings = evlet::server::tls::TlsSettings {
        cert_file: None,
        key_file: None,
        client_ca_file: None,
        cert_dir: dir.to_owned(),
        hostname: "node-1".into(),
        ips: vec!["127.0.0.1".parse().expect("ip")],
    };
    let tls = evlet::server::tls::server_config(&settings).expect("tls");
    let (cert, _) = evlet::server::tls::cert_files(&settings).expect("files");
    let pem = std::fs::read(cert).expect("cert");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let auth = Arc::new(Auth::new(Settings {
        node: "node-1".into(),
        anonymous: false,
        tokens: Some((Arc::new(Tokens) as _, Duration::from_secs(120))),
        mode: Mode::AlwaysAllow,
    }));
    let (listener, address) = evlet::server::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let gate = Gate::new(limits);
    let shutdown = CancellationToken::new();
    evlet::server::secure::serve(
        listener,
        tls,
        evlet::server::secure::protect(router(), auth),
        Arc::clone(&gate),
        shutdown.clone(),
    );
    (
        address,
        gate,
        tokio_rustls::TlsConnector::from(Arc::new(client)),
        shutdown,
    )
}

/// `GET /pods` over TLS with `token`: the status.
async fn authenticated_get(
    address: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    token: &str,
) -> u16 {
    let tcp = TcpStream::connect(address).await.expect("connect");
    let name = rustls::pki_types::ServerName::IpAddress(
        "127.0.0.1".parse::<std::net::IpAddr>().expect("ip").into(),
    );
    let tls = connector.connect(name, tcp).await.expect("handshake");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("http");
    tokio::spawn(conn);
    let request = http::Request::get("/pods")
        .header("host", "node-1")
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    sender
        .send_request(request)
        .await
        .expect("response")
        .status()
        .as_u16()
}

/// Raises the soft limit of open files to the hard one: a thousand clients
/// and the server's side of them.
fn more_descriptors() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )
    .expect("RLIMIT_NOFILE");
}

#[tokio::test(start_paused = true)]
async fn a_thousand_slow_clients_hold_a_bounded_number_of_connections_and_never_starve_an_authenticated_request()
 {
    more_descriptors();
    let dir = tempfile::tempdir().expect("tmp");
    let limits = Limits::default();
    let (address, gate, connector, shutdown) = secure(limits, dir.path()).await;
    // A thousand clients that connect and send one byte of a TLS hello, and
    // then nothing.
    let mut slow = Vec::new();
    for _ in 0..1000 {
        let mut s = TcpStream::connect(address).await.expect("connect");
        s.write_all(&[0x16]).await.expect("a byte");
        slow.push(s);
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (held, pending) = (gate.held(), gate.pending());
    assert!(
        held <= limits.max_pending && pending <= limits.max_pending,
        "held {held}, pending {pending}: at most {} connections that showed nobody",
        limits.max_pending
    );
    let started = Instant::now();
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        authenticated_get(address, &connector, "good"),
    )
    .await
    .expect("the authenticated request is answered without waiting for the slow ones");
    assert_eq!(status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered after {:?}",
        started.elapsed()
    );
    let mut closed = 0;
    for s in &mut slow {
        let mut b = [0u8; 16];
        if matches!(
            tokio::time::timeout(Duration::from_millis(1), s.read(&mut b)).await,
            Ok(Ok(0) | Err(_))
        ) {
            closed += 1;
        }
    }
    assert!(
        closed >= 1000 - limits.max_pending,
        "{closed} of the slow clients' connections were closed by the server"
    );
    // The rest go at the TLS handshake timeout.
    tokio::time::sleep(limits.tls_handshake_timeout + Duration::from_secs(1)).await;
    assert!(
        gate.held() <= 1,
        "held {} after the handshake timeout",
        gate.held()
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_full_port_makes_new_connections_wait_and_serves_them_in_order() {
    let limits = Limits {
        max_connections: 2,
        max_pending: 2,
        ..Limits::default()
    };
    let dir = tempfile::tempdir().expect("tmp");
    let (address, gate, connector, shutdown) = secure(limits, dir.path()).await;
    // Two established connections (each made one authenticated request and
    // keeps its connection open) take every slot.
    let mut kept = Vec::new();
    for _ in 0..2 {
        let tcp = TcpStream::connect(address).await.expect("connect");
        let name = rustls::pki_types::ServerName::IpAddress(
            "127.0.0.1".parse::<std::net::IpAddr>().expect("ip").into(),
        );
        let tls = connector.connect(name, tcp).await.expect("handshake");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("http");
        tokio::spawn(conn);
        let request = http::Request::get("/pods")
            .header("authorization", "Bearer good")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        assert_eq!(
            sender.send_request(request).await.expect("answer").status(),
            200
        );
        kept.push(sender);
    }
    assert_eq!((gate.held(), gate.pending()), (2, 0));
    let waiting = tokio::spawn({
        let connector = connector.clone();
        async move { authenticated_get(address, &connector, "good").await }
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!waiting.is_finished(), "no slot: it waits in the backlog");
    drop(kept.pop());
    let status = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served once a slot is free")
        .expect("task");
    assert_eq!(status, 200);
    shutdown.cancel();
}
