//! An in-process `certificates.k8s.io/v1` API (create, get, list and watch
//! of CertificateSigningRequests) with a signer, for the manager's tests
//! (`tests.rs`). Each client is tagged with the user it stands for, as the
//! API server fills `spec.username`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use tokio::sync::broadcast;
use x509_parser::prelude::FromDer as _;

/// What the fake's signer does with a new CSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Approve and issue at once, valid for this long.
    Issue(Duration),
    /// Leave it pending ([`FakeApi::issue`] later).
    Hold,
    /// Deny it.
    Deny,
}

#[derive(Default)]
struct State {
    csrs: BTreeMap<String, CertificateSigningRequest>,
    rv: u64,
    generated: u64,
    /// (name, user) of every accepted create.
    created: Vec<(String, String)>,
    /// Creates refused because the name existed.
    conflicts: u32,
}

/// The fake API server.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<CertificateSigningRequest>,
    policy: Arc<Mutex<Policy>>,
    ca: Arc<(rcgen::Certificate, rcgen::KeyPair)>,
}

struct RawKey(Vec<u8>);

impl rcgen::PublicKeyData for RawKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

fn json(code: u16, body: &impl serde::Serialize) -> http::Response<axum::body::Body> {
    let mut r = http::Response::new(axum::body::Body::from(
        serde_json::to_vec(body).unwrap_or_default(),
    ));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or_default();
    r
}

fn status(code: u16, reason: &str) -> http::Response<axum::body::Body> {
    json(
        code,
        &serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": reason, "code": code, "message": reason}),
    )
}

impl FakeApi {
    /// A fake with its own CA, signing as `policy` says.
    pub fn new(policy: Policy) -> Self {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("ca");
        Self {
            state: Arc::default(),
            changes: broadcast::channel(64).0,
            policy: Arc::new(Mutex::new(policy)),
            ca: Arc::new((ca, key)),
        }
    }

    /// What the signer does from now on.
    pub fn set_policy(&self, p: Policy) {
        *crate::lock::lock(&self.policy) = p;
    }

    /// (name, user) of every CSR created.
    pub fn created(&self) -> Vec<(String, String)> {
        crate::lock::lock(&self.state).created.clone()
    }

    /// Creates refused because the name existed.
    pub fn conflicts(&self) -> u32 {
        crate::lock::lock(&self.state).conflicts
    }

    /// The CSR named `name`.
    pub fn csr(&self, name: &str) -> Option<CertificateSigningRequest> {
        crate::lock::lock(&self.state).csrs.get(name).cloned()
    }

    /// A client that acts as `user`.
    pub fn client(&self, user: &str) -> kube::Client {
        let api = self.clone();
        let user = user.to_owned();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let api = api.clone();
            let user = user.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = http_body_util::BodyExt::collect(body)
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Ok::<_, Infallible>(api.handle(&parts, &body, &user))
            }
        });
        crate::api::ApiClient::over(svc).client
    }

    fn sign(&self, csr: &mut CertificateSigningRequest, valid: Duration) {
        let der = match rustls_pemfile::read_one(&mut csr.spec.request.0.as_slice()) {
            Ok(Some(rustls_pemfile::Item::Csr(der))) => der,
            _ => return,
        };
        let Ok((_, req)) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        else {
            return;
        };
        let info = &req.certification_request_info;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for cn in info
            .subject
            .iter_common_name()
            .filter_map(|c| c.as_str().ok())
        {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        for o in info
            .subject
            .iter_organization()
            .filter_map(|c| c.as_str().ok())
        {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, o);
        }
        for ext in req.requested_extensions().into_iter().flatten() {
            if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
                for n in &san.general_names {
                    match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => params
                            .subject_alt_names
                            .push(rcgen::SanType::DnsName((*d).try_into().expect("dns"))),
                        x509_parser::extensions::GeneralName::IPAddress(b) => {
                            if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                                params
                                    .subject_alt_names
                                    .push(rcgen::SanType::IpAddress(v4.into()));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("time")
            .as_secs();
        let at = |s: u64| {
            time::OffsetDateTime::from_unix_timestamp(i64::try_from(s).expect("i64")).expect("time")
        };
        params.not_before = at(now.saturating_sub(1));
        params.not_after = at(now + valid.as_secs());
        let key = RawKey(info.subject_pki.subject_public_key.data.to_vec());
        let cert = params
            .signed_by(&key, &self.ca.0, &self.ca.1)
            .expect("sign");
        csr.status = Some(CertificateSigningRequestStatus {
            certificate: Some(k8s_openapi::ByteString(cert.pem().into_bytes())),
            conditions: Some(vec![condition("Approved")]),
        });
    }

    /// Approves and issues `name`, valid for `valid`.
    pub fn issue(&self, name: &str, valid: Duration) {
        let mut st = crate::lock::lock(&self.state);
        let Some(mut csr) = st.csrs.get(name).cloned() else {
            return;
        };
        self.sign(&mut csr, valid);
        st.rv += 1;
        csr.metadata.resource_version = Some(st.rv.to_string());
        st.csrs.insert(name.to_owned(), csr.clone());
        let _ = self.changes.send(csr);
    }

    fn handle(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        user: &str,
    ) -> http::Response<axum::body::Body> {
        let path = parts.uri.path();
        let query: BTreeMap<String, String> =
            form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let Some(rest) =
            path.strip_prefix("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        else {
            return status(404, "NotFound");
        };
        let name = rest.trim_start_matches('/');
        let mut st = crate::lock::lock(&self.state);
        match (parts.method.as_str(), name.is_empty()) {
            ("POST", true) => {
                let Ok(mut csr) = serde_json::from_slice::<CertificateSigningRequest>(body) else {
                    return status(400, "BadRequest");
                };
                let name = match (&csr.metadata.name, &csr.metadata.generate_name) {
                    (Some(n), _) => n.clone(),
                    (None, Some(g)) => {
                        st.generated += 1;
                        format!("{g}{:05}", st.generated)
                    }
                    (None, None) => return status(400, "BadRequest"),
                };
                if st.csrs.contains_key(&name) {
                    st.conflicts += 1;
                    return status(409, "AlreadyExists");
                }
                st.rv += 1;
                csr.metadata.name = Some(name.clone());
                csr.metadata.uid = Some(format!("uid-{}", st.rv));
                csr.metadata.resource_version = Some(st.rv.to_string());
                csr.spec.username = Some(user.to_owned());
                match *crate::lock::lock(&self.policy) {
                    Policy::Issue(valid) => self.sign(&mut csr, valid),
                    Policy::Deny => {
                        csr.status = Some(CertificateSigningRequestStatus {
                            certificate: None,
                            conditions: Some(vec![condition("Denied")]),
                        });
                    }
                    Policy::Hold => {}
                }
                st.csrs.insert(name.clone(), csr.clone());
                st.created.push((name, user.to_owned()));
                let _ = self.changes.send(csr.clone());
                json(201, &csr)
            }
            ("GET", false) => match st.csrs.get(name) {
                Some(csr) => json(200, csr),
                None => status(404, "NotFound"),
            },
            ("GET", true) => {
                let wanted = query
                    .get("fieldSelector")
                    .and_then(|f| f.strip_prefix("metadata.name="))
                    .map(str::to_owned);
                let matches = move |c: &CertificateSigningRequest| {
                    wanted
                        .as_deref()
                        .is_none_or(|w| c.metadata.name.as_deref() == Some(w))
                };
                if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                    // Subscribed under the lock: what changed after the
                    // client's list is sent first, nothing is lost.
                    let mut rx = self.changes.subscribe();
                    let from: u64 = query
                        .get("resourceVersion")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let newer: Vec<_> = st
                        .csrs
                        .values()
                        .filter(|c| {
                            c.metadata
                                .resource_version
                                .as_deref()
                                .and_then(|v| v.parse::<u64>().ok())
                                .is_some_and(|v| v > from)
                        })
                        .cloned()
                        .collect();
                    let (tx, out) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
                    tokio::spawn(async move {
                        let line = |csr: &CertificateSigningRequest| {
                            let mut line = serde_json::to_vec(
                                &serde_json::json!({"type": "MODIFIED", "object": csr}),
                            )
                            .unwrap_or_default();
                            line.push(b'\n');
                            Ok(Bytes::from(line))
                        };
                        for csr in newer.iter().filter(|c| matches(c)) {
                            if tx.send(line(csr)).await.is_err() {
                                return;
                            }
                        }
                        while let Ok(csr) = rx.recv().await {
                            if !matches(&csr) {
                                continue;
                            }
                            if tx.send(line(&csr)).await.is_err() {
                                return;
                            }
                        }
                    });
                    return http::Response::new(axum::body::Body::from_stream(
                        tokio_stream::wrappers::ReceiverStream::new(out),
                    ));
                }
                let items: Vec<_> = st.csrs.values().filter(|c| matches(c)).cloned().collect();
                json(
                    200,
                    &serde_json::json!({"kind": "CertificateSigningRequestList",
                        "apiVersion": "certificates.k8s.io/v1",
                        "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                )
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }
}

fn condition(type_: &str) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: type_.to_owned(),
        status: "True".into(),
        reason: Some(format!("Fake{type_}")),
        message: Some(format!("the fake signer says {type_}")),
        ..Default::default()
    }
}
