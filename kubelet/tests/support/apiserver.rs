//! A mocked Kubernetes API server, in process, speaking the real wire format:
//! JSON objects with `resourceVersion`, `uid` and `creationTimestamp`, lists,
//! newline-delimited watch event streams (with `ERROR` 410 Gone for compacted
//! versions), `Status` bodies for 404 / 409 (AlreadyExists, Conflict, UID
//! preconditions), graceful pod deletion (`deletionTimestamp` first, removal at
//! grace 0), strategic-merge patches (lists merged by `type`/`name`/`key`),
//! injected faults (429, 5xx) and outages (connection refused, watches cut).
//!
//! Every request is recorded (verb, path, query, content type, body, time) so
//! tests assert on exactly what evlet sent. It runs as a tower service behind
//! `kube::Client::new`, so paused tokio time works.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tower::ServiceExt as _;

/// The condition of type `kind` in an object's status (a Node's or a Pod's).
pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// What the node lifecycle controller writes into a Node whose Lease went
/// stale: every condition `Unknown` (for tests of the agent putting it right,
/// on the mock and on the real server alike).
pub fn mark_node_unknown(node: &mut Value) {
    for c in node["status"]["conditions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        c["status"] = json!("Unknown");
        c["reason"] = json!("NodeStatusUnknown");
        c["message"] = json!("Kubelet stopped posting node status.");
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    pub body: Option<Value>,
    pub at: tokio::time::Instant,
}

impl Recorded {
    /// `PATCH /api/v1/...` style summary.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    coll: String,
    kind: &'static str,
    object: Value,
}

#[derive(Debug)]
struct Fault {
    method: Method,
    path_contains: String,
    code: u16,
    times: u32,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    uids: u64,
    /// collection → (namespace, name) → object.
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    history: Vec<Change>,
    /// Watches from a version older than this get 410 Gone.
    compacted: u64,
    requests: Vec<Recorded>,
    faults: VecDeque<Fault>,
    /// Lifetime of the tokens TokenRequest issues, seconds (0: as asked).
    token_lifetime: i64,
    /// Tokens issued so far (numbers them).
    tokens: u64,
    /// Added to every UID: this server's own range.
    uid_base: u64,
    /// Bearer tokens TokenReview accepts: token → (user, groups).
    known_tokens: BTreeMap<String, (String, Vec<String>)>,
    /// What SubjectAccessReview allows: (user or group, subresource or `*`).
    allowed: Vec<(String, String)>,
}

/// The token the mock's kubelet client (the API server's side of
/// `kubectl logs/exec/port-forward`) presents to kubelets.
pub const KUBELET_CLIENT_TOKEN: &str = "apiserver-kubelet-client-token";
/// The user that token belongs to (allowed everything on nodes).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// The mock API server.
#[derive(Debug, Clone)]
pub struct MockApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    /// True while the server is "down"; a change cuts open watches.
    outage: watch::Sender<bool>,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    let mut r = (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response();
    if code == 429 {
        r.headers_mut()
            .insert("Retry-After", axum::http::HeaderValue::from_static("1"));
    }
    r
}

fn kind_of(coll: &str) -> (&'static str, &'static str) {
    match coll {
        "nodes" => ("Node", "v1"),
        "pods" => ("Pod", "v1"),
        "leases" => ("Lease", "coordination.k8s.io/v1"),
        "events" => ("Event", "v1"),
        "secrets" => ("Secret", "v1"),
        "configmaps" => ("ConfigMap", "v1"),
        "serviceaccounts" => ("ServiceAccount", "v1"),
        "persistentvolumeclaims" => ("PersistentVolumeClaim", "v1"),
        "persistentvolumes" => ("PersistentVolume", "v1"),
        "services" => ("Service", "v1"),
        "runtimeclasses" => ("RuntimeClass", "node.k8s.io/v1"),
        _ => ("Unknown", "v1"),
    }
}

/// The merge key of a strategic-merge list.
fn merge_key(items: &[Value]) -> Option<&'static str> {
    ["type", "name", "key"]
        .into_iter()
        .find(|k| items.iter().all(|i| i.get(k).is_some()) && !items.is_empty())
}

/// The patch formats the API server accepts; anything else is a 415.
const PATCH_TYPES: [&str; 3] = [
    "application/strategic-merge-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

/// Checks a strategic merge patch's `$setElementOrder/<list>` directives as
/// the API server does: every element the patch sends for `<list>` must be
/// named in the order list, by merge key. Returns the first violation.
pub fn check_element_order(patch: &Value) -> Result<(), String> {
    let Some(obj) = patch.as_object() else {
        return Ok(());
    };
    for (k, v) in obj {
        if let Some(list) = k.strip_prefix("$setElementOrder/") {
            let order = v.as_array().ok_or_else(|| format!("{k} must be a list"))?;
            let items = obj
                .get(list)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if items.is_empty() {
                continue;
            }
            let key = merge_key(order)
                .or_else(|| merge_key(&items))
                .ok_or_else(|| format!("{k}: the list has no merge key"))?;
            for item in &items {
                if !order.iter().any(|o| o.get(key) == item.get(key)) {
                    return Err(format!(
                        "The order in patch list:\n{items:?}\n doesn't match $setElementOrder list:\n{order:?}"
                    ));
                }
            }
        } else if v.is_object() {
            check_element_order(v)?;
        }
    }
    Ok(())
}

/// JSON merge patch (RFC 7386): objects merge, everything else (lists
/// included) is replaced, `null` removes.
pub fn merge_json(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_json(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Strategic merge (the subset Kubernetes objects need here).
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let Some(t) = target.as_object_mut() else {
                return;
            };
            for (k, v) in p {
                if k.starts_with('$') {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        Value::Array(p) => match (target.as_array_mut(), merge_key(p)) {
            (Some(t), Some(key)) if merge_key(t).is_some_and(|k| k == key) || t.is_empty() => {
                for item in p {
                    match t.iter_mut().find(|x| x.get(key) == item.get(key)) {
                        Some(existing) => merge(existing, item),
                        None => t.push(item.clone()),
                    }
                }
            }
            _ => *target = patch.clone(),
        },
        _ => *target = patch.clone(),
    }
}

fn field_matches(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (path, want, negated) = match term.split_once("!=") {
            Some((path, want)) => (path, want, true),
            None => match term.split_once('=') {
                Some((path, want)) => (path.trim_end_matches('='), want, false),
                None => return true,
            },
        };
        let got = path
            .split('.')
            .try_fold(obj, |v, seg| v.get(seg))
            .and_then(Value::as_str)
            .unwrap_or("");
        (got == want) != negated
    })
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(collection, namespace, name, subresource)` of a path.
fn parse_path(path: &str) -> Option<(String, String, String, String)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let get = |i: usize| rest.get(i).map(|s| s.to_string()).unwrap_or_default();
    Some((get(0), ns, get(1), get(2)))
}

/// The discovery documents clients such as kubectl read first (`/version`,
/// `/api`, `/apis`, `/api/v1` with the resources the mock serves).
fn discovery(path: &str) -> Option<Value> {
    let resource = |name: &str, kind: &str, namespaced: bool, verbs: &[&str]| json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs});
    let all = [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];
    Some(match path.trim_end_matches('/') {
        "/version" => {
            json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-mock", "platform": "linux/amd64"})
        }
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        "/api/v1" => json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            resource("pods", "Pod", true, &all),
            resource("pods/log", "Pod", true, &["get"]),
            resource("pods/exec", "PodExecOptions", true, &["create", "get"]),
            resource("pods/attach", "PodAttachOptions", true, &["create", "get"]),
            resource("pods/portforward", "PodPortForwardOptions", true, &["create", "get"]),
            resource("pods/status", "Pod", true, &["get", "patch", "update"]),
            resource("nodes", "Node", false, &all),
            resource("nodes/proxy", "NodeProxyOptions", false, &["create", "delete", "get", "patch", "update"]),
            resource("events", "Event", true, &all),
            resource("configmaps", "ConfigMap", true, &all),
            resource("secrets", "Secret", true, &all),
            resource("services", "Service", true, &all),
            resource("namespaces", "Namespace", false, &all),
        ]}),
        _ => return None,
    })
}

/// A TLS client that accepts any server certificate (the API server's
/// kubelet client without a kubelet CA).
fn insecure_tls() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct AnyCert(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

impl MockApi {
    pub fn new() -> Self {
        let (changes, _) = broadcast::channel(4096);
        let (outage, _) = watch::channel(false);
        static SERVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let api = Self {
            state: Arc::new(Mutex::new(State {
                uid_base: SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32,
                ..State::default()
            })),
            changes,
            outage,
        };
        api.add_token(
            KUBELET_CLIENT_TOKEN,
            KUBELET_CLIENT_USER,
            &["system:masters"],
        );
        api.allow(KUBELET_CLIENT_USER, "*");
        api
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn router(&self) -> axum::Router {
        let api = self.clone();
        axum::Router::new().fallback(move |req: axum::extract::Request| {
            let api = api.clone();
            async move {
                if let Some(target) = api.kubelet_target(req.uri()) {
                    return api.proxy_to_kubelet(req, target).await;
                }
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 64 << 20)
                    .await
                    .unwrap_or_default();
                api.handle(parts.method, parts.uri, parts.headers, body)
                    .await
            }
        })
    }

    /// Makes TokenReview accept `token` as `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.lock().known_tokens.insert(
            token.to_owned(),
            (
                user.to_owned(),
                groups.iter().map(|g| (*g).to_owned()).collect(),
            ),
        );
    }

    /// Makes SubjectAccessReview allow `who` (a user or group) `subresource`
    /// (`*`: all) of nodes.
    pub fn allow(&self, who: &str, subresource: &str) {
        self.lock()
            .allowed
            .push((who.to_owned(), subresource.to_owned()));
    }

    /// The kubelet path a pod or node proxy subresource goes to (as the API
    /// server's `LogLocation`, `streamLocation`, `PortForwardLocation` and
    /// node proxy build it), with the node it is on.
    fn kubelet_target(&self, uri: &Uri) -> Option<(String, String)> {
        let path = uri.path();
        let query = uri.query().unwrap_or("");
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let q: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        let get = |k: &str| q.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        match segs.as_slice() {
            ["api", "v1", "nodes", node, "proxy", rest @ ..] => {
                let mut target = format!("/{}", rest.join("/"));
                if !query.is_empty() {
                    target.push('?');
                    target.push_str(query);
                }
                Some(((*node).to_owned(), target))
            }
            [
                "api",
                "v1",
                "namespaces",
                ns,
                "pods",
                name,
                sub @ ("log" | "exec" | "attach" | "portforward"),
            ] => {
                let pod = self.get("pods", ns, name)?;
                let node = pod["spec"]["nodeName"].as_str()?.to_owned();
                let container = get("container").or_else(|| {
                    pod["spec"]["containers"][0]["name"]
                        .as_str()
                        .map(str::to_owned)
                })?;
                let mut out = form_urlencoded::Serializer::new(String::new());
                let target = match *sub {
                    "log" => {
                        for k in [
                            "follow",
                            "previous",
                            "timestamps",
                            "sinceSeconds",
                            "sinceTime",
                            "tailLines",
                            "limitBytes",
                        ] {
                            if let Some(v) = get(k) {
                                out.append_pair(k, &v);
                            }
                        }
                        format!("/containerLogs/{ns}/{name}/{container}")
                    }
                    "portforward" => {
                        let ports: Vec<String> = q
                            .iter()
                            .filter(|(k, _)| k == "ports")
                            .map(|(_, v)| v.clone())
                            .collect();
                        if !ports.is_empty() {
                            out.append_pair("port", &ports.join(","));
                        }
                        format!("/portForward/{ns}/{name}")
                    }
                    _ => {
                        for (api_name, kubelet_name) in [
                            ("stdin", "input"),
                            ("stdout", "output"),
                            ("stderr", "error"),
                            ("tty", "tty"),
                        ] {
                            if get(api_name).is_some_and(|v| v == "true" || v == "1") {
                                out.append_pair(kubelet_name, "1");
                            }
                        }
                        for (k, v) in &q {
                            if k == "command" {
                                out.append_pair("command", v);
                            }
                        }
                        format!("/{sub}/{ns}/{name}/{container}")
                    }
                };
                let query = out.finish();
                Some((
                    node,
                    if query.is_empty() {
                        target
                    } else {
                        format!("{target}?{query}")
                    },
                ))
            }
            _ => None,
        }
    }

    /// Forwards `req` to the kubelet of `node` over TLS (its certificate not
    /// verified, as the API server without `--kubelet-certificate-authority`),
    /// with the API server's own token, and relays the answer; an upgrade is
    /// spliced both ways, as the API server's upgrade-aware proxy does.
    async fn proxy_to_kubelet(
        &self,
        mut req: axum::extract::Request,
        (node, target): (String, String),
    ) -> Response {
        let node_proxy = req.uri().path().starts_with("/api/v1/nodes/");
        self.lock().requests.push(Recorded {
            method: req.method().to_string(),
            path: req.uri().path().to_owned(),
            query: req.uri().query().unwrap_or("").to_owned(),
            content_type: None,
            authorization: None,
            body: None,
            at: tokio::time::Instant::now(),
        });
        let Some(n) = self.get("nodes", "", &node) else {
            return status(404, "NotFound", &format!("nodes \"{node}\" not found"));
        };
        let port = n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
            .as_u64()
            .unwrap_or(10250);
        let ip = n["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("127.0.0.1")
            .to_owned();
        let tcp = match tokio::net::TcpStream::connect((
            ip.as_str(),
            u16::try_from(port).unwrap_or(10250),
        ))
        .await
        {
            Ok(t) => t,
            Err(e) => {
                return status(
                    503,
                    "ServiceUnavailable",
                    &format!("error dialing backend: {e}"),
                );
            }
        };
        let tls = tokio_rustls::TlsConnector::from(insecure_tls());
        let server_name =
            rustls::pki_types::ServerName::try_from(ip.clone()).unwrap_or_else(|_| {
                rustls::pki_types::ServerName::try_from("localhost").expect("name")
            });
        let stream = match tls.connect(server_name, tcp).await {
            Ok(s) => s,
            Err(e) => {
                return status(
                    503,
                    "ServiceUnavailable",
                    &format!("error dialing backend: {e}"),
                );
            }
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
            {
                Ok(x) => x,
                Err(e) => {
                    return status(
                        503,
                        "ServiceUnavailable",
                        &format!("error dialing backend: {e}"),
                    );
                }
            };
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let client_upgrade = hyper::upgrade::on(&mut req);
        let mut builder = hyper::Request::builder()
            .method(req.method().clone())
            .uri(target);
        for (k, v) in req.headers() {
            if k != http::header::AUTHORIZATION
                && k != http::header::HOST
                && k != http::header::CONTENT_LENGTH
            {
                builder = builder.header(k, v);
            }
        }
        let backend_req = builder
            .header(http::header::HOST, format!("{ip}:{port}"))
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {KUBELET_CLIENT_TOKEN}"),
            )
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let mut resp = match sender.send_request(backend_req).await {
            Ok(r) => r,
            Err(e) => return status(503, "ServiceUnavailable", &format!("error proxying: {e}")),
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let backend_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(c), Ok(b)) = tokio::join!(client_upgrade, backend_upgrade) {
                    let (mut c, mut b) = (
                        hyper_util::rt::TokioIo::new(c),
                        hyper_util::rt::TokioIo::new(b),
                    );
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
                }
            });
            let (parts, _) = resp.into_parts();
            return Response::from_parts(parts, Body::empty());
        }
        let (parts, body) = resp.into_parts();
        if parts.status.is_success() || node_proxy {
            return Response::from_parts(parts, Body::new(body));
        }
        // The API server's GenericHttpResponseChecker: a kubelet error becomes
        // a Status (a 400's or 500's text is its message; a 404 is generic).
        let text = http_body_util::BodyExt::collect(body)
            .await
            .map(|b| {
                String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(50_000)
                    .collect::<String>()
            })
            .unwrap_or_default();
        let code = parts.status.as_u16();
        let (reason, message) = match code {
            400 => ("BadRequest", text.clone()),
            404 => (
                "NotFound",
                "the server could not find the requested resource".to_owned(),
            ),
            _ => (
                "InternalError",
                format!(
                    "an error on the server ({text}) has prevented the request from succeeding"
                ),
            ),
        };
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code, "details": {"causes": [{"reason": "UnexpectedServerResponse", "message": text}]}});
        (parts.status, axum::Json(body)).into_response()
    }

    /// Serves the API over HTTP on a loopback port (for kubeconfig clients).
    pub async fn serve_http(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let router = self.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        addr
    }

    /// A kube client talking to this server in process.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The server as an HTTP service (what a client is built over).
    pub fn service(
        &self,
    ) -> tower::util::BoxCloneService<
        http::Request<kube::client::Body>,
        http::Response<axum::body::Body>,
        std::io::Error,
    > {
        let router = self.router();
        let outage = self.outage.subscribe();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let router = router.clone();
            let down = *outage.borrow();
            async move {
                if down {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "mock API server is down",
                    ));
                }
                Ok(router
                    .oneshot(req)
                    .await
                    .unwrap_or_else(|e: Infallible| match e {}))
            }
        });
        tower::util::BoxCloneService::new(svc)
    }

    /// Takes the server down (connections refused, watches cut) or up.
    pub fn set_outage(&self, down: bool) {
        self.outage.send_replace(down);
    }

    /// The next `times` requests with `method` whose path contains `path` fail with `code`.
    pub fn fail(&self, method: Method, path: &str, code: u16, times: u32) {
        self.lock().faults.push_back(Fault {
            method,
            path_contains: path.to_owned(),
            code,
            times,
        });
    }

    /// Forgets history: watches from any version before the current one get
    /// 410 Gone (a watch from the current version, as after a relist, is fine).
    /// Makes TokenRequest issue tokens living `seconds` (0: as asked).
    pub fn set_token_lifetime(&self, seconds: i64) {
        self.lock().token_lifetime = seconds;
    }

    pub fn compact(&self) {
        let mut st = self.lock();
        st.compacted = st.rv;
        st.history.clear();
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Requests whose `METHOD path` contains `needle`.
    pub fn requests_matching(&self, method: &str, needle: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.contains(needle))
            .collect()
    }

    pub fn get(&self, coll: &str, ns: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(coll)
            .and_then(|m| m.get(&(ns.to_owned(), name.to_owned())))
            .cloned()
    }

    pub fn list(&self, coll: &str) -> Vec<Value> {
        self.lock()
            .objects
            .get(coll)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Stores `obj` as a client would create it (uid, resourceVersion set here).
    pub fn create(&self, coll: &str, ns: &str, obj: Value) -> Value {
        let mut st = self.lock();
        self.insert(&mut st, coll, ns, obj)
    }

    /// Changes an object as another client would (a new resourceVersion).
    pub fn modify(&self, coll: &str, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let mut st = self.lock();
        let key = (ns.to_owned(), name.to_owned());
        let Some(mut obj) = st.objects.get(coll).and_then(|m| m.get(&key)).cloned() else {
            return;
        };
        f(&mut obj);
        self.store(&mut st, coll, key, obj, "MODIFIED");
    }

    /// Deletes a pod as `kubectl delete` does (graceful if bound and grace > 0).
    pub fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) {
        let mut st = self.lock();
        let _ = self.delete(
            &mut st,
            "pods",
            ns,
            name,
            &json!({"gracePeriodSeconds": grace}),
        );
    }

    fn insert(&self, st: &mut State, coll: &str, ns: &str, mut obj: Value) -> Value {
        st.uids += 1;
        let (kind, api_version) = kind_of(coll);
        obj["kind"] = json!(kind);
        obj["apiVersion"] = json!(api_version);
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !ns.is_empty() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        // Unique across mock servers and test runs, as real UIDs are: a pod
        // left in the runtime by an earlier run never shares a new pod's UID.
        obj["metadata"]["uid"] = json!(format!(
            "{:08x}-{:08x}-mock-{}",
            std::process::id(),
            st.uids + st.uid_base,
            coll
        ));
        obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        self.store(st, coll, (ns.to_owned(), name), obj, "ADDED")
    }

    fn store(
        &self,
        st: &mut State,
        coll: &str,
        key: (String, String),
        mut obj: Value,
        kind: &'static str,
    ) -> Value {
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.objects
            .entry(coll.to_owned())
            .or_default()
            .insert(key, obj.clone());
        self.emit(st, coll, kind, obj.clone());
        obj
    }

    fn emit(&self, st: &mut State, coll: &str, kind: &'static str, object: Value) {
        let change = Change {
            rv: st.rv,
            coll: coll.to_owned(),
            kind,
            object,
        };
        st.history.push(change.clone());
        let _ = self.changes.send(change);
    }

    fn delete(
        &self,
        st: &mut State,
        coll: &str,
        ns: &str,
        name: &str,
        options: &Value,
    ) -> Response {
        let key = (ns.to_owned(), name.to_owned());
        let Some(obj) = st.objects.get(coll).and_then(|m| m.get(&key)).cloned() else {
            return status(404, "NotFound", &format!("{coll} \"{name}\" not found"));
        };
        if let Some(uid) = options["preconditions"]["uid"].as_str()
            && obj["metadata"]["uid"].as_str() != Some(uid)
        {
            return status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {coll} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    obj["metadata"]["uid"].as_str().unwrap_or("")
                ),
            );
        }
        let bound = obj["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let grace = options["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        if coll == "pods" && bound && grace > 0 {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                let mut obj = obj;
                let at = k8s_openapi::jiff::Timestamp::now()
                    .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
                    .unwrap_or(k8s_openapi::jiff::Timestamp::now());
                obj["metadata"]["deletionTimestamp"] = json!(at.to_string());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                let stored = self.store(st, coll, key, obj, "MODIFIED");
                return (StatusCode::OK, axum::Json(stored)).into_response();
            }
            return (StatusCode::OK, axum::Json(obj)).into_response();
        }
        if let Some(m) = st.objects.get_mut(coll) {
            m.remove(&key);
        }
        st.rv += 1;
        let mut gone = obj;
        gone["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        self.emit(st, coll, "DELETED", gone.clone());
        (StatusCode::OK, axum::Json(gone)).into_response()
    }

    async fn handle(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let path = uri.path().to_owned();
        let query = uri.query().unwrap_or("").to_owned();
        let body_json: Option<Value> = serde_json::from_slice(&body).ok();
        let mut st = self.lock();
        st.requests.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            content_type: headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            authorization: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body: body_json.clone(),
            at: tokio::time::Instant::now(),
        });
        if let Some(i) = st
            .faults
            .iter()
            .position(|f| f.method == method && path.contains(&f.path_contains))
        {
            let code = st.faults[i].code;
            st.faults[i].times -= 1;
            if st.faults[i].times == 0 {
                st.faults.remove(i);
            }
            let reason = match code {
                415 => "UnsupportedMediaType",
                429 => "TooManyRequests",
                503 => "ServiceUnavailable",
                409 => "Conflict",
                _ => "InternalError",
            };
            return status(code, reason, "injected fault");
        }
        if method == Method::GET
            && let Some(doc) = discovery(&path)
        {
            return axum::Json(doc).into_response();
        }
        let Some((coll, ns, name, sub)) = parse_path(&path) else {
            return status(404, "NotFound", &format!("no route {path}"));
        };
        if method == Method::POST && coll == "tokenreviews" {
            let token = body_json
                .as_ref()
                .and_then(|b| b["spec"]["token"].as_str())
                .unwrap_or("");
            let status = match st.known_tokens.get(token) {
                Some((user, groups)) => {
                    json!({"authenticated": true, "user": {"username": user, "uid": format!("uid-{user}"), "groups": groups}})
                }
                None => json!({"authenticated": false}),
            };
            let mut review = body_json.clone().unwrap_or_else(|| json!({}));
            review["status"] = status;
            return (StatusCode::CREATED, axum::Json(review)).into_response();
        }
        if method == Method::POST && coll == "subjectaccessreviews" {
            let spec = body_json
                .as_ref()
                .map(|b| b["spec"].clone())
                .unwrap_or_default();
            let user = spec["user"].as_str().unwrap_or("");
            let groups: Vec<&str> = spec["groups"]
                .as_array()
                .map(|g| g.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let sub = spec["resourceAttributes"]["subresource"]
                .as_str()
                .unwrap_or("");
            let on_nodes = spec["resourceAttributes"]["resource"] == "nodes";
            let allowed = on_nodes
                && st.allowed.iter().any(|(who, s)| {
                    (who == user || groups.contains(&who.as_str())) && (s == "*" || s == sub)
                });
            let mut review = body_json.clone().unwrap_or_else(|| json!({}));
            review["status"] = json!({"allowed": allowed});
            return (StatusCode::CREATED, axum::Json(review)).into_response();
        }
        let q = query_map(&query);
        let key = (ns.clone(), name.clone());
        let existing = st.objects.get(&coll).and_then(|m| m.get(&key)).cloned();
        match (method.clone(), name.is_empty()) {
            (Method::GET, true) => {
                let selector = q.get("fieldSelector").cloned().unwrap_or_default();
                if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                    let from: u64 = q
                        .get("resourceVersion")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    return self.watch(&mut st, coll, ns, selector, from);
                }
                let items: Vec<Value> = st
                    .objects
                    .get(&coll)
                    .map(|m| {
                        m.iter()
                            .filter(|((ons, _), _)| ns.is_empty() || *ons == ns)
                            .map(|(_, o)| o.clone())
                            .filter(|o| field_matches(o, &selector))
                            .collect()
                    })
                    .unwrap_or_default();
                let (kind, api_version) = kind_of(&coll);
                axum::Json(json!({
                    "kind": format!("{kind}List"), "apiVersion": api_version,
                    "metadata": {"resourceVersion": st.rv.to_string()},
                    "items": items,
                }))
                .into_response()
            }
            (Method::GET, false) => match existing {
                Some(o) => axum::Json(o).into_response(),
                None => status(404, "NotFound", &format!("{coll} \"{name}\" not found")),
            },
            (Method::POST, true) => {
                let Some(obj) = body_json else {
                    return status(400, "BadRequest", "body is not JSON");
                };
                let (expected, _) = kind_of(&coll);
                if let Some(kind) = obj["kind"].as_str()
                    && kind != expected
                {
                    return status(
                        400,
                        "BadRequest",
                        &format!("{expected} in version \"v1\" cannot be handled as a {kind}"),
                    );
                }
                if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
                    && !ns.is_empty()
                    && body_ns != ns
                {
                    return status(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    );
                }
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if st
                    .objects
                    .get(&coll)
                    .is_some_and(|m| m.contains_key(&(ns.clone(), name.clone())))
                {
                    return status(
                        409,
                        "AlreadyExists",
                        &format!("{coll} \"{name}\" already exists"),
                    );
                }
                let created = self.insert(&mut st, &coll, &ns, obj);
                (StatusCode::CREATED, axum::Json(created)).into_response()
            }
            (Method::POST, false) if coll == "serviceaccounts" && sub == "token" => {
                // TokenRequest: a token bound to the pod, expiring as asked
                // (or after the lifetime a test set).
                if existing.is_none() {
                    return status(
                        404,
                        "NotFound",
                        &format!("serviceaccounts \"{name}\" not found"),
                    );
                }
                let Some(mut req) = body_json else {
                    return status(400, "BadRequest", "body is not JSON");
                };
                let asked = req["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
                let lifetime = if st.token_lifetime > 0 {
                    st.token_lifetime
                } else {
                    asked
                };
                st.tokens += 1;
                let expires = k8s_openapi::jiff::Timestamp::now()
                    + k8s_openapi::jiff::SignedDuration::from_secs(lifetime);
                let pod = req["spec"]["boundObjectRef"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                req["kind"] = json!("TokenRequest");
                req["apiVersion"] = json!("authentication.k8s.io/v1");
                req["status"] = json!({
                    "token": format!("token-{}-{}-{}", name, pod, st.tokens),
                    "expirationTimestamp": expires.to_string(),
                });
                (StatusCode::CREATED, axum::Json(req)).into_response()
            }
            (Method::PUT, false) => {
                let (Some(old), Some(mut obj)) = (existing, body_json) else {
                    return status(404, "NotFound", &format!("{coll} \"{name}\" not found"));
                };
                if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                    return status(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {coll} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                        ),
                    );
                }
                obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                obj["kind"] = old["kind"].clone();
                obj["apiVersion"] = old["apiVersion"].clone();
                let stored = self.store(&mut st, &coll, key, obj, "MODIFIED");
                axum::Json(stored).into_response()
            }
            (Method::PATCH, false) => {
                let content_type = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !PATCH_TYPES.contains(&content_type) {
                    return status(
                        415,
                        "UnsupportedMediaType",
                        &format!(
                            "the body of the request was in an unknown format ({content_type:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                        ),
                    );
                }
                let (Some(mut obj), Some(patch)) = (existing, body_json) else {
                    return status(404, "NotFound", &format!("{coll} \"{name}\" not found"));
                };
                if content_type == PATCH_TYPES[0]
                    && let Err(e) = check_element_order(&patch)
                {
                    return status(400, "BadRequest", &e);
                }
                if let Some(uid) = patch["metadata"]["uid"].as_str()
                    && obj["metadata"]["uid"].as_str() != Some(uid)
                {
                    return status(
                        409,
                        "Conflict",
                        &format!("Precondition failed: UID in precondition: {uid}"),
                    );
                }
                // A resourceVersion in the patch is a precondition.
                if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
                    && obj["metadata"]["resourceVersion"].as_str() != Some(rv)
                {
                    return status(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {coll} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                        ),
                    );
                }
                if content_type == "application/merge-patch+json" {
                    // RFC 7386: lists are replaced whole.
                    let mut patch = patch.clone();
                    if let Some(m) = patch["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    merge_json(&mut obj, &patch);
                } else if sub == "status" {
                    if !patch["status"].is_null() {
                        merge(&mut obj["status"], &patch["status"]);
                    }
                    if coll == "nodes" && !patch["metadata"].is_null() {
                        let mut meta = patch["metadata"].clone();
                        if let Some(m) = meta.as_object_mut() {
                            m.remove("uid");
                        }
                        merge(&mut obj["metadata"], &meta);
                    }
                } else {
                    merge(&mut obj, &patch);
                }
                let stored = self.store(&mut st, &coll, key, obj, "MODIFIED");
                axum::Json(stored).into_response()
            }
            (Method::DELETE, false) => {
                let options = body_json.unwrap_or(Value::Null);
                self.delete(&mut st, &coll, &ns, &name, &options)
            }
            _ => status(405, "MethodNotAllowed", "method not allowed"),
        }
    }

    fn watch(
        &self,
        st: &mut State,
        coll: String,
        ns: String,
        selector: String,
        from: u64,
    ) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(1024);
        let line = |kind: &str, object: &Value| {
            let mut s =
                serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
            s.push(b'\n');
            Ok(Bytes::from(s))
        };
        if from != 0 && from < st.compacted {
            let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from} ({})", st.compacted), "reason": "Expired", "code": 410});
            let _ = tx.try_send(line("ERROR", &gone));
            return Response::new(Body::from_stream(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ));
        }
        let matches = move |c: &Change| {
            c.coll == coll
                && (ns.is_empty()
                    || c.object["metadata"]["namespace"].as_str() == Some(ns.as_str()))
                && field_matches(&c.object, &selector)
        };
        let mut sent = from;
        for c in st.history.iter().filter(|c| c.rv > from && matches(c)) {
            let _ = tx.try_send(line(c.kind, &c.object));
            sent = c.rv;
        }
        sent = sent.max(st.rv);
        let mut live = self.changes.subscribe();
        let mut outage = self.outage.subscribe();
        tokio::spawn(async move {
            loop {
                // An outage cuts the stream before any later change goes out:
                // a change made after `set_outage(true)` is never streamed.
                tokio::select! {
                    biased;
                    _ = outage.changed() => return,
                    c = live.recv() => match c {
                        Ok(c) if c.rv > sent && matches(&c) => {
                            sent = c.rv;
                            if tx.send(line(c.kind, &c.object)).await.is_err() { return; }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    },
                    () = tx.closed() => return,
                }
            }
        });
        Response::new(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }
}
