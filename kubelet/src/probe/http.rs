//! HTTP: a GET as upstream's `pkg/probe/http`. A fresh connection per check
//! (no keep-alive, no proxy, no compression), TLS without verification for
//! `HTTPS` (upstream's `InsecureSkipVerify`), at most 10 KiB of the body read.
//!
//! For probes, 200–399 is healthy and anything else a failure; a redirect to
//! the same host name is followed (at most 10), one to another host ends the
//! check as a [`Outcome::Warning`] (healthy, with an event), as upstream.
//! Lifecycle hooks use [`hook`]: any answer is fine, only a transport error
//! fails the hook (upstream does not check a hook's status code).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::{KUBE_VERSION, MAX_OUTPUT, Outcome, head_text, join_host_port};

/// Redirects followed at most (Go's `http.Client` default, kept by upstream).
pub const MAX_REDIRECTS: usize = 10;

/// Who sends the request (the `User-Agent` upstream sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `kube-probe/<version>`.
    Probe,
    /// `kube-lifecycle/<version>`.
    Lifecycle,
}

/// Where a GET goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https` rather than `http`.
    pub https: bool,
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Target {
    fn url(&self) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            join_host_port(&self.host, self.port),
            self.path
        )
    }

    /// Where a `Location` header sends a request to `self`.
    fn follow(&self, location: &str) -> Option<Target> {
        if let Some((scheme, rest)) = location.split_once("://") {
            let https = match scheme.to_ascii_lowercase().as_str() {
                "http" => false,
                "https" => true,
                _ => return None,
            };
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            let uri: hyper::Uri = format!("{scheme}://{authority}/").parse().ok()?;
            let host = uri
                .host()?
                .trim_matches(|c| c == '[' || c == ']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            return Some(Target {
                https,
                host,
                port,
                path: path.to_owned(),
            });
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = self
                .path
                .split('?')
                .next()
                .and_then(|p| p.rfind('/').map(|i| &p[..=i]))
                .unwrap_or("/");
            format!("{dir}{location}")
        };
        Some(Target {
            path,
            ..self.clone()
        })
    }
}

/// A GET request.
#[derive(Debug, Clone)]
pub struct Request {
    /// The first URL.
    pub target: Target,
    /// Headers from the spec (`Host` overrides the request's host).
    pub headers: Vec<(String, String)>,
    /// Probe or hook.
    pub purpose: Purpose,
}

impl Request {
    /// The request of an `httpGet` probe or hook of container `c` in a pod at
    /// `pod_ip` (upstream's `NewRequestForHTTPGetAction`): the spec's host or
    /// the pod IP, the port by number or name, path `/` and scheme HTTP by
    /// default.
    ///
    /// # Errors
    /// A port that does not resolve, or no host to send to.
    pub fn for_action(
        action: &k8s_openapi::api::core::v1::HTTPGetAction,
        c: &k8s_openapi::api::core::v1::Container,
        pod_ip: Option<&str>,
        purpose: Purpose,
    ) -> Result<Self, super::ProbeError> {
        let port = super::resolve_port(&action.port, c)?;
        let host = action
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .or_else(|| pod_ip.map(str::to_owned))
            .ok_or_else(|| super::ProbeError("the pod has no IP yet".into()))?;
        let path = action
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        Ok(Self {
            target: Target {
                https: action
                    .scheme
                    .as_deref()
                    .is_some_and(|s| s.eq_ignore_ascii_case("https")),
                host,
                port,
                path,
            },
            headers: action
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            purpose,
        })
    }
}

/// One answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Vec<u8>,
    location: Option<String>,
}

/// Probes with `request` within `timeout` (the whole exchange, redirects included).
pub async fn check(request: &Request, timeout: Duration) -> Outcome {
    let url = request.target.url();
    match tokio::time::timeout(timeout, get(request)).await {
        Err(_) => Outcome::Failure(format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(answer)) => {
            let body = head_text(&answer.body, MAX_OUTPUT);
            match answer.status {
                200..=299 => Outcome::Success(body),
                300..=399 => {
                    Outcome::Warning(format!("Probe terminated redirects, Response body: {body}"))
                }
                code => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
            }
        }
    }
}

/// Runs a lifecycle hook's GET: any answer is a success.
///
/// # Errors
/// The transport error (cannot connect, connection reset, too many redirects).
pub async fn hook(request: &Request) -> Result<(), String> {
    get(request).await.map(|_| ())
}

/// GETs, following same-host redirects.
async fn get(request: &Request) -> Result<Answer, String> {
    let first = &request.target;
    let mut target = first.clone();
    let mut redirects = 0;
    loop {
        let answer = fetch(&target, request).await?;
        let Some(next) = answer
            .location
            .as_deref()
            .filter(|_| matches!(answer.status, 301 | 302 | 303 | 307 | 308))
            .and_then(|l| target.follow(l))
        else {
            return Ok(answer);
        };
        if !next.host.eq_ignore_ascii_case(&first.host) {
            // Another host: not followed; the 3xx itself is the answer.
            return Ok(answer);
        }
        redirects += 1;
        if redirects >= MAX_REDIRECTS {
            return Err(format!("Get {:?}: stopped after 10 redirects", next.url()));
        }
        target = next;
    }
}

/// One request and at most [`MAX_OUTPUT`] bytes of its answer.
async fn fetch(target: &Target, request: &Request) -> Result<Answer, String> {
    let url = target.url();
    let failed = |what: String| format!("Get {url:?}: {what}");
    let tcp = super::dial(&target.host, target.port, Duration::from_secs(3600))
        .await
        .map_err(failed)?;
    let mut builder = hyper::Request::get(target.path.as_str());
    let mut host = join_host_port(&target.host, target.port);
    let mut user_agent = true;
    let mut accept = Some("*/*");
    for (name, value) in &request.headers {
        if name.eq_ignore_ascii_case("host") {
            host.clone_from(value);
            continue;
        }
        if name.eq_ignore_ascii_case("user-agent") {
            user_agent = false;
        }
        if name.eq_ignore_ascii_case("accept") {
            accept = None;
            if value.is_empty() {
                continue;
            }
        }
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder = builder.header(hyper::header::HOST, host);
    if user_agent {
        let who = match request.purpose {
            Purpose::Probe => "probe",
            Purpose::Lifecycle => "lifecycle",
        };
        builder = builder.header(
            hyper::header::USER_AGENT,
            format!("kube-{who}/{KUBE_VERSION}"),
        );
    }
    if let Some(a) = accept {
        builder = builder.header(hyper::header::ACCEPT, a);
    }
    let req = builder
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let response = if target.https {
        let tls = tls_connect(tcp, &target.host).await.map_err(failed)?;
        send(TokioIo::new(tls), req).await
    } else {
        send(TokioIo::new(tcp), req).await
    }
    .map_err(failed)?;
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::new();
    let mut frames = response.into_body();
    while body.len() < MAX_OUTPUT {
        match frames.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(data);
                }
            }
            Some(Err(e)) => return Err(failed(e.to_string())),
            None => break,
        }
    }
    body.truncate(MAX_OUTPUT);
    Ok(Answer {
        status,
        body,
        location,
    })
}

async fn send<T>(
    io: TokioIo<T>,
    req: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// TLS without certificate checks: upstream probes HTTPS endpoints with
/// `InsecureSkipVerify` (pods serve self-signed certificates).
async fn tls_connect(
    tcp: tokio::net::TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("invalid TLS server name {host:?}: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// Accepts any certificate (but still checks the handshake's signatures).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A server answering each connection with the next canned response;
    /// returns its port and the requests it saw.
    async fn serve(responses: Vec<String>) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for response in responses {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        (port, rx)
    }

    fn request(port: u16, path: &str) -> Request {
        Request {
            target: Target {
                https: false,
                host: "127.0.0.1".into(),
                port,
                path: path.into(),
            },
            headers: vec![("X-Custom".into(), "1".into())],
            purpose: Purpose::Probe,
        }
    }

    fn answer(status: &str, extra: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn status_codes_decide_and_the_headers_are_upstreams() {
        let (port, mut seen) = serve(vec![
            answer("200 OK", "", "fine"),
            answer("500 Internal Server Error", "", "broken"),
        ])
        .await;
        let t = Duration::from_secs(2);
        assert_eq!(
            check(&request(port, "/healthz?x=1"), t).await,
            Outcome::Success("fine".into())
        );
        let sent = seen.recv().await.expect("request");
        assert!(sent.starts_with("GET /healthz?x=1 HTTP/1.1\r\n"), "{sent}");
        for header in [
            "user-agent: kube-probe/1.35",
            "accept: */*",
            "x-custom: 1",
            &format!("host: 127.0.0.1:{port}"),
        ] {
            assert!(sent.to_lowercase().contains(header), "{header} in {sent}");
        }
        assert_eq!(
            check(&request(port, "/"), t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
    }

    #[tokio::test]
    async fn same_host_redirects_are_followed_and_others_are_a_warning() {
        let (port, _seen) = serve(vec![
            answer("302 Found", "Location: /ok\r\n", ""),
            answer("200 OK", "", "there"),
            answer(
                "302 Found",
                "Location: http://elsewhere.example/x\r\n",
                "moved",
            ),
        ])
        .await;
        let t = Duration::from_secs(2);
        assert_eq!(
            check(&request(port, "/"), t).await,
            Outcome::Success("there".into())
        );
        assert_eq!(
            check(&request(port, "/"), t).await,
            Outcome::Warning("Probe terminated redirects, Response body: moved".into())
        );
    }

    #[tokio::test]
    async fn a_redirect_loop_fails_after_ten() {
        let loop_answer = answer("302 Found", "Location: /again\r\n", "");
        let (port, _seen) = serve(vec![loop_answer; 11]).await;
        let out = check(&request(port, "/"), Duration::from_secs(5)).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.ends_with("stopped after 10 redirects")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_server_that_never_answers_is_a_timeout_failure() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let out = check(&request(port, "/slow"), Duration::from_millis(200)).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.contains("Client.Timeout exceeded")),
            "{out:?}"
        );
        drop(listener);
    }

    #[test]
    fn locations_resolve_against_the_current_url() {
        let base = Target {
            https: false,
            host: "10.0.0.2".into(),
            port: 8080,
            path: "/a/b?q".into(),
        };
        assert_eq!(base.follow("/c").map(|t| t.path), Some("/c".into()));
        assert_eq!(base.follow("c").map(|t| t.path), Some("/a/c".into()));
        let other = base.follow("https://example.com:8443/z").expect("absolute");
        assert_eq!(
            (
                other.https,
                other.host.as_str(),
                other.port,
                other.path.as_str()
            ),
            (true, "example.com", 8443, "/z")
        );
        assert!(base.follow("ftp://x/").is_none());
    }
}
