//! `certificates.k8s.io/v1` CertificateSigningRequests as upstream's
//! client-go `csr` package makes and follows them: the PEM request for a
//! [`Template`] and key, the bootstrap CSR's name `node-csr-<hash>`, the
//! object with its signer and usages, [`submit`] (reusing a CSR of the same
//! name that this key made) and [`wait`] (a watch on the one name, until it
//! is issued, denied, failed, deleted or the bound runs out).

use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use sha2::Digest as _;
use x509_parser::prelude::FromDer as _;

use super::Error;
use super::rotation::Template;

/// The client certificate's signer.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The serving certificate's signer.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The client certificate's usages (an ECDSA key: no key encipherment, as
/// upstream since its key-algorithm choice).
pub const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
/// The serving certificate's usages.
pub const SERVING_USAGES: &[&str] = &["digital signature", "server auth"];
/// How long a bootstrap CSR is waited for (upstream's `requestNodeCertificate`).
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);
/// How long a renewal is waited for (client-go's `certificateWaitTimeout`).
pub const RENEW_WAIT: Duration = Duration::from_secs(15 * 60);
/// How often the wait says it still waits.
const STILL_WAITING: Duration = Duration::from_secs(60);

/// The PEM request (`CERTIFICATE REQUEST`) for `template`, signed by `key`.
///
/// # Errors
/// [`Error::Generate`] when a SAN is not a valid DNS name.
pub fn request_pem(template: &Template, key: &rcgen::KeyPair) -> Result<String, Error> {
    let generate = |e: rcgen::Error| Error::Generate(e.to_string());
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, template.common_name.as_str());
    for o in &template.organizations {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, o.as_str());
    }
    for d in &template.dns_names {
        let name = rcgen::Ia5String::try_from(d.as_str()).map_err(generate)?;
        params.subject_alt_names.push(rcgen::SanType::DnsName(name));
    }
    for ip in &template.ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(generate)
}

/// Upstream's bootstrap CSR name: `node-csr-` and the SHA-512/256 of the
/// public key (PKIX DER), the CN, the Os and the usages, each base64url and
/// `|`-terminated. The same key and subject give the same name, so a restart
/// finds its own CSR.
pub fn digested_name(public_key_der: &[u8], template: &Template, usages: &[&str]) -> String {
    let encode = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let mut hash = sha2::Sha512_256::new();
    let mut write = |data: &[u8]| {
        hash.update(encode(data).as_bytes());
        hash.update(b"|");
    };
    write(public_key_der);
    write(template.common_name.as_bytes());
    for o in &template.organizations {
        write(o.as_bytes());
    }
    for u in usages {
        write(u.as_bytes());
    }
    format!("node-csr-{}", encode(&hash.finalize()))
}

/// The object: `name`, or a generated `csr-…` one (renewals, as upstream).
pub fn object(
    name: Option<&str>,
    request_pem: &str,
    signer: &str,
    usages: &[&str],
    expiration: Option<Duration>,
) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: name.map(str::to_owned),
            generate_name: name.is_none().then(|| "csr-".to_owned()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request_pem.as_bytes().to_vec()),
            signer_name: signer.to_owned(),
            usages: Some(usages.iter().map(|u| (*u).to_owned()).collect()),
            expiration_seconds: expiration.map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX)),
            ..Default::default()
        },
        status: None,
    }
}

/// Where a CSR stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Neither approved nor denied yet.
    Pending,
    /// Approved, the certificate not issued yet.
    Approved,
    /// Issued: the certificate chain (PEM).
    Issued(Vec<u8>),
    /// Denied: reason, message.
    Denied(String, String),
    /// The signer failed: reason, message.
    Failed(String, String),
    /// Not the object that was created (another UID).
    Replaced,
}

/// Where `csr` stands, for the one created with `uid` (upstream's
/// `WaitForCertificate` conditions).
pub fn verdict(csr: &CertificateSigningRequest, uid: &str) -> Verdict {
    if csr.metadata.uid.as_deref() != Some(uid) {
        return Verdict::Replaced;
    }
    let status = csr.status.as_ref();
    let mut approved = false;
    for c in status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
    {
        let words = || {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        };
        match c.type_.as_str() {
            "Denied" => {
                let (r, m) = words();
                return Verdict::Denied(r, m);
            }
            "Failed" => {
                let (r, m) = words();
                return Verdict::Failed(r, m);
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    match status.and_then(|s| s.certificate.as_ref()) {
        Some(cert) if approved && !cert.0.is_empty() => Verdict::Issued(cert.0.clone()),
        _ if approved => Verdict::Approved,
        _ => Verdict::Pending,
    }
}

/// Can an existing CSR of the same name stand for `ours`? Same subject,
/// signer and public key, and no expired certificate issued (upstream's
/// `ensureCompatible`).
///
/// # Errors
/// What differs.
pub fn compatible(
    existing: &CertificateSigningRequest,
    ours: &CertificateSigningRequest,
    now: std::time::SystemTime,
) -> Result<(), String> {
    let parse = |csr: &CertificateSigningRequest| -> Result<(String, Vec<u8>), String> {
        let der = match rustls_pemfile::read_one(&mut csr.spec.request.0.as_slice()) {
            Ok(Some(rustls_pemfile::Item::Csr(der))) => der,
            _ => return Err("the request is not a PEM CERTIFICATE REQUEST".into()),
        };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
            .map_err(|e| format!("unreadable request: {e}"))?;
        let info = &req.certification_request_info;
        Ok((info.subject.to_string(), info.subject_pki.raw.to_vec()))
    };
    let (their_subject, their_key) = parse(existing)?;
    let (our_subject, our_key) = parse(ours)?;
    if their_subject != our_subject {
        return Err(format!(
            "subjects differ: {their_subject:?}, ours {our_subject:?}"
        ));
    }
    if !existing.spec.signer_name.is_empty() && existing.spec.signer_name != ours.spec.signer_name {
        return Err(format!(
            "signer names differ: {:?}, ours {:?}",
            existing.spec.signer_name, ours.spec.signer_name
        ));
    }
    if their_key != our_key {
        return Err("it was made with another key".into());
    }
    if let Some(cert) = existing
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
    {
        for der in rustls_pemfile::certs(&mut cert.0.as_slice()).flatten() {
            let facts =
                super::rotation::Facts::from_der(&der).ok_or("its certificate does not parse")?;
            if facts.expired(now) {
                return Err("its certificate expired".into());
            }
        }
    }
    Ok(())
}

/// Creates `csr`; a bootstrap CSR whose name exists already is reused when
/// it is [`compatible`] (a restart mid-bootstrap). Returns its name and UID.
///
/// # Errors
/// [`Error::Api`] naming the CSR; [`Error::Incompatible`].
pub async fn submit(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
) -> Result<(String, String), Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let shown = csr
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "csr-<generated>".into());
    let api_error = |source| Error::Api {
        csr: shown.clone(),
        source,
    };
    let made = match api.create(&PostParams::default(), csr).await {
        Ok(made) => made,
        Err(e) if crate::api::is_conflict(&e) && csr.metadata.name.is_some() => {
            let existing = api.get(&shown).await.map_err(api_error)?;
            compatible(&existing, csr, std::time::SystemTime::now()).map_err(|problem| {
                Error::Incompatible {
                    csr: shown.clone(),
                    problem,
                }
            })?;
            tracing::info!(csr = %shown, "a CSR for this node and key exists already; reusing it");
            existing
        }
        Err(e) => return Err(api_error(e)),
    };
    let name = made.metadata.name.clone().unwrap_or(shown.clone());
    let uid = made
        .metadata
        .uid
        .clone()
        .ok_or_else(|| Error::Incompatible {
            csr: name.clone(),
            problem: "the API server returned it without a UID".into(),
        })?;
    Ok((name, uid))
}

/// Watches CSR `name` (UID `uid`) until its certificate is issued, for at
/// most `bound`, saying every minute that it still waits; returns the
/// certificate chain (PEM).
///
/// # Errors
/// [`Error::Denied`], [`Error::Failed`], [`Error::Deleted`],
/// [`Error::Timeout`], each naming the CSR.
///
/// # Cancel safety
/// Dropping the future stops the watch; the CSR stays.
pub async fn wait(
    client: &kube::Client,
    name: &str,
    uid: &str,
    bound: Duration,
) -> Result<Vec<u8>, Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let events = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff();
    let mut events = std::pin::pin!(events);
    let started = tokio::time::Instant::now();
    let deadline = started + bound;
    let mut still = tokio::time::interval_at(started + STILL_WAITING, STILL_WAITING);
    tracing::info!(
        csr = %name, bound = ?bound,
        "waiting for the CSR to be approved and issued (upstream waits as long)"
    );
    loop {
        let event = tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                return Err(Error::Timeout { csr: name.to_owned(), after: bound });
            }
            _ = still.tick() => {
                tracing::info!(
                    csr = %name, waited = ?started.elapsed(), bound = ?bound,
                    "still waiting for the CSR to be approved and issued"
                );
                continue;
            }
            e = events.next() => e,
        };
        let csr = match event {
            None => {
                return Err(Error::Timeout {
                    csr: name.to_owned(),
                    after: started.elapsed(),
                });
            }
            Some(Err(e)) => {
                tracing::warn!(csr = %name, error = %e, "watching the CSR failed; retrying");
                continue;
            }
            Some(Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr))) => csr,
            Some(Ok(watcher::Event::Delete(_))) => {
                return Err(Error::Deleted {
                    csr: name.to_owned(),
                });
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => continue,
        };
        match verdict(&csr, uid) {
            Verdict::Issued(pem) => {
                tracing::info!(csr = %name, "the CSR is issued");
                return Ok(pem);
            }
            Verdict::Approved => {
                tracing::info!(csr = %name, "the CSR is approved, waiting to be issued");
            }
            Verdict::Pending => {}
            Verdict::Denied(reason, message) => {
                return Err(Error::Denied {
                    csr: name.to_owned(),
                    reason,
                    message,
                });
            }
            Verdict::Failed(reason, message) => {
                return Err(Error::Failed {
                    csr: name.to_owned(),
                    reason,
                    message,
                });
            }
            Verdict::Replaced => {
                return Err(Error::Deleted {
                    csr: name.to_owned(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    fn node_template() -> Template {
        Template::client("node-1")
    }

    fn with_status(uid: &str, conditions: &[&str], cert: &[u8]) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(CertificateSigningRequestStatus {
                certificate: (!cert.is_empty()).then(|| k8s_openapi::ByteString(cert.to_vec())),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|t| CertificateSigningRequestCondition {
                            type_: (*t).into(),
                            status: "True".into(),
                            reason: Some(format!("{t}Reason")),
                            message: Some("words".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_request_carries_the_subject_and_sans_and_nothing_else() {
        let key = super::super::store::new_key().expect("key");
        let pem = request_pem(&node_template(), &key).expect("pem");
        let der = match rustls_pemfile::read_one(&mut pem.as_bytes()) {
            Ok(Some(rustls_pemfile::Item::Csr(der))) => der,
            other => panic!("not a CSR: {other:?}"),
        };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
            .expect("parses");
        let info = &req.certification_request_info;
        assert_eq!(
            info.subject.to_string(),
            "CN=system:node:node-1, O=system:nodes"
        );
        assert_eq!(info.subject_pki.raw, key.public_key_der().as_slice());
        assert!(
            req.requested_extensions()
                .is_none_or(|mut e| e.next().is_none()),
            "no SANs in a client CSR"
        );

        let ip = "10.0.0.5".parse().expect("ip");
        let serving =
            Template::serving("node-1", &["node-1.example".into()], &[ip]).expect("template");
        let pem = request_pem(&serving, &key).expect("pem");
        let der = match rustls_pemfile::read_one(&mut pem.as_bytes()) {
            Ok(Some(rustls_pemfile::Item::Csr(der))) => der,
            other => panic!("not a CSR: {other:?}"),
        };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
            .expect("parses");
        let sans: Vec<String> = req
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(s) => Some(
                    s.general_names
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        // x509-parser shows an IP SAN as hex bytes.
        assert_eq!(sans, ["DNSName(node-1.example)", "IPAddress(0a:00:00:05)"]);
    }

    #[test]
    fn the_bootstrap_name_is_a_stable_digest_of_key_subject_and_usages() {
        let a = digested_name(b"key-1", &node_template(), CLIENT_USAGES);
        assert_eq!(a, digested_name(b"key-1", &node_template(), CLIENT_USAGES));
        assert!(a.starts_with("node-csr-"), "{a}");
        // 32 bytes of SHA-512/256, base64url without padding.
        assert_eq!(a.len(), "node-csr-".len() + 43, "{a}");
        assert_ne!(a, digested_name(b"key-2", &node_template(), CLIENT_USAGES));
        assert_ne!(
            a,
            digested_name(b"key-1", &Template::client("node-2"), CLIENT_USAGES)
        );
        assert_ne!(a, digested_name(b"key-1", &node_template(), SERVING_USAGES));
        // The delimiter keeps `foo|bar` and `foob|ar` apart.
        let mut t = node_template();
        t.organizations = vec!["ab".into()];
        let mut u = t.clone();
        u.common_name.push('a');
        u.organizations = vec!["b".into()];
        assert_ne!(digested_name(b"k", &t, &[]), digested_name(b"k", &u, &[]));
    }

    #[test]
    fn the_object_names_its_signer_usages_and_name() {
        let o = object(
            Some("node-csr-x"),
            "PEM",
            CLIENT_SIGNER,
            CLIENT_USAGES,
            None,
        );
        assert_eq!(o.metadata.name.as_deref(), Some("node-csr-x"));
        assert_eq!(o.metadata.generate_name, None);
        assert_eq!(
            o.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert_eq!(
            o.spec.usages.as_deref(),
            Some(&["digital signature".to_owned(), "client auth".to_owned()][..])
        );
        let r = object(
            None,
            "PEM",
            SERVING_SIGNER,
            SERVING_USAGES,
            Some(Duration::from_secs(600)),
        );
        assert_eq!(r.metadata.name, None);
        assert_eq!(r.metadata.generate_name.as_deref(), Some("csr-"));
        assert_eq!(r.spec.expiration_seconds, Some(600));
    }

    #[test]
    fn verdicts_follow_upstreams_conditions() {
        assert_eq!(verdict(&with_status("u", &[], b""), "u"), Verdict::Pending);
        assert_eq!(
            verdict(&with_status("u", &["Approved"], b""), "u"),
            Verdict::Approved
        );
        assert_eq!(
            verdict(&with_status("u", &["Approved"], b"CERT"), "u"),
            Verdict::Issued(b"CERT".to_vec())
        );
        assert_eq!(
            verdict(&with_status("u", &[], b"CERT"), "u"),
            Verdict::Pending,
            "a certificate without approval is not taken"
        );
        assert_eq!(
            verdict(&with_status("u", &["Approved", "Denied"], b""), "u"),
            Verdict::Denied("DeniedReason".into(), "words".into())
        );
        assert_eq!(
            verdict(&with_status("u", &["Approved", "Failed"], b"CERT"), "u"),
            Verdict::Failed("FailedReason".into(), "words".into())
        );
        assert_eq!(
            verdict(&with_status("v", &["Approved"], b"CERT"), "u"),
            Verdict::Replaced
        );
    }

    #[test]
    fn an_existing_csr_is_reused_only_for_the_same_key_subject_and_signer() {
        let key = super::super::store::new_key().expect("key");
        let pem = request_pem(&node_template(), &key).expect("pem");
        let ours = object(Some("n"), &pem, CLIENT_SIGNER, CLIENT_USAGES, None);
        let now = std::time::SystemTime::now();
        assert_eq!(compatible(&ours.clone(), &ours, now), Ok(()));

        let other_key = super::super::store::new_key().expect("key");
        let theirs = object(
            Some("n"),
            &request_pem(&node_template(), &other_key).expect("pem"),
            CLIENT_SIGNER,
            CLIENT_USAGES,
            None,
        );
        assert_eq!(
            compatible(&theirs, &ours, now),
            Err("it was made with another key".into())
        );
        let theirs = object(
            Some("n"),
            &request_pem(&Template::client("node-2"), &key).expect("pem"),
            CLIENT_SIGNER,
            CLIENT_USAGES,
            None,
        );
        assert!(compatible(&theirs, &ours, now).is_err_and(|e| e.contains("subjects differ")));
        let theirs = object(Some("n"), &pem, SERVING_SIGNER, CLIENT_USAGES, None);
        assert!(compatible(&theirs, &ours, now).is_err_and(|e| e.contains("signer names")));
    }
}
