//! `/exec`, `/attach`, `/portForward` and `/run`: as upstream since the
//! dockershim went, the agent asks the runtime (CRI `Exec`, `Attach`,
//! `PortForward`) for a session on its streaming server and proxies the
//! client's upgrade request there, then splices the two connections. The
//! proxy does not look inside: SPDY and WebSocket, and every subprotocol the
//! runtime speaks, pass through as they are. `/run` is the old synchronous
//! exec (`ExecSync`, combined output).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse as _, Response};
use hyper_util::rt::TokioIo;

/// The streams a remote command asks for (upstream's `remotecommand.Options`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// `input=1`.
    pub stdin: bool,
    /// `output=1`.
    pub stdout: bool,
    /// `error=1` (dropped with a TTY, as upstream).
    pub stderr: bool,
    /// `tty=1`.
    pub tty: bool,
}

/// Parses the remote-command query (`input`, `output`, `error`, `tty` must be
/// exactly `1`) and the repeated `command`.
///
/// # Errors
/// Upstream's 400 message when no stream is asked for.
pub fn parse_query(query: &str) -> Result<(StreamOptions, Vec<String>), String> {
    let mut o = StreamOptions::default();
    let mut command = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let on = v == "1";
        match k.as_ref() {
            "input" => o.stdin = on,
            "output" => o.stdout = on,
            "error" => o.stderr = on,
            "tty" => o.tty = on,
            "command" => command.push(v.into_owned()),
            _ => {}
        }
    }
    if o.tty && o.stderr {
        o.stderr = false;
    }
    if !o.stdin && !o.stdout && !o.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok((o, command))
}

/// The ports of a WebSocket port-forward (`?port=`, repeated or comma-separated).
///
/// # Errors
/// Upstream's message naming the bad value.
pub fn parse_ports(query: &str) -> Result<Vec<i32>, String> {
    let mut ports = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k != "port" {
            continue;
        }
        if v.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in v.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {p:?} as a port: {e}"))?;
            if port == 0 {
                return Err(format!("port {p:?} must be > 0"));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// Is `req` an HTTP upgrade (SPDY or WebSocket)?
pub fn is_upgrade(req: &Request) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        });
    connection_upgrade && req.headers().contains_key(header::UPGRADE)
}

/// The answer to a request that is not an upgrade (upstream's wording).
pub fn upgrade_required() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "Upgrade request required",
    )
        .into_response()
}

/// How long connecting to the runtime's streaming server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn failed(message: String) -> Response {
    tracing::warn!(%message, "error while proxying request");
    (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
}

/// Sends `req` (an upgrade) to the runtime's session `url` and, when it
/// switches protocols, splices the client's connection to the runtime's
/// until either side closes. Any other answer is relayed as it is.
pub async fn proxy(mut req: Request, url: &str) -> Response {
    let target: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return failed(format!("bad streaming URL {url:?}: {e}")),
    };
    let (Some(host), Some(authority)) = (target.host(), target.authority().cloned()) else {
        return failed(format!("bad streaming URL {url:?}"));
    };
    let port = target.port_u16().unwrap_or(80);
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let stream = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return failed(format!("error dialing backend: {e}")),
        Err(_) => return failed("error dialing backend: timed out".into()),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return failed(format!("error dialing backend: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming backend connection ended");
        }
    });
    let client_upgrade = hyper::upgrade::on(&mut req);
    let path = target
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut builder = hyper::Request::builder()
        .method(req.method().clone())
        .uri(path);
    for (name, value) in req.headers() {
        if name != header::HOST && name != header::AUTHORIZATION && name != header::CONTENT_LENGTH {
            builder = builder.header(name, value);
        }
    }
    let backend_req = match builder
        .header(header::HOST, authority.as_str())
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
    {
        Ok(r) => r,
        Err(e) => return failed(format!("building the backend request: {e}")),
    };
    let mut resp = match sender.send_request(backend_req).await {
        Ok(r) => r,
        Err(e) => return failed(format!("error proxying to the runtime: {e}")),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "stream upgrade failed");
                return;
            }
        };
        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
        // Either side closing ends the session; dropping both frees the runtime's stream.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
    });
    let (parts, _) = resp.into_parts();
    let mut out = Response::from_parts(parts, Body::empty());
    out.headers_mut()
        .entry(header::CONNECTION)
        .or_insert(HeaderValue::from_static("Upgrade"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_follow_upstreams_rules() {
        let (o, cmd) =
            parse_query("command=sh&command=-c&command=echo%20hi&input=1&output=1&tty=1&error=1")
                .expect("valid");
        assert_eq!(cmd, ["sh", "-c", "echo hi"]);
        assert!(
            o.stdin && o.stdout && o.tty && !o.stderr,
            "a TTY drops stderr"
        );
        assert_eq!(
            parse_query("command=ls&output=true"),
            Err("you must specify at least 1 of stdin, stdout, stderr".into()),
            "only \"1\" turns a stream on"
        );
    }

    #[test]
    fn ports_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_ports("port=80,443&port=8080"),
            Ok(vec![80, 443, 8080])
        );
        assert_eq!(parse_ports(""), Ok(vec![]));
        assert_eq!(
            parse_ports("port="),
            Err("query parameter \"port\" cannot be empty".into())
        );
        assert!(
            parse_ports("port=http")
                .expect_err("bad")
                .starts_with("unable to parse \"http\" as a port")
        );
        assert_eq!(parse_ports("port=0"), Err("port \"0\" must be > 0".into()));
    }
}
