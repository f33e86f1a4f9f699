//! TLS of the secured port (rustls): `tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed certificate for the node's names and IPs kept under
//! `<root-dir>/pki` (upstream's `kubelet.crt`/`kubelet.key`, made once and
//! reused), or with `serverTLSBootstrap` whatever the certificate manager
//! holds at each handshake ([`server_config_with`]); client certificates
//! verified against `clientCAFile` when it is set (requested, not required:
//! a client without one may use a token).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::auth::User;

/// Where the certificates come from.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// `tlsCertFile` (with `tlsPrivateKeyFile`); None: self-signed.
    pub cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`.
    pub key_file: Option<PathBuf>,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    /// Where a self-signed pair is kept (`<root-dir>/pki`).
    pub cert_dir: PathBuf,
    /// The node's host name (the self-signed certificate's name).
    pub hostname: String,
    /// The node's IPs (the self-signed certificate's IP SANs).
    pub ips: Vec<IpAddr>,
}

/// A TLS set-up that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM.
    #[error("{path}: {problem}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Only one of `tlsCertFile` and `tlsPrivateKeyFile` is set.
    #[error("tlsCertFile and tlsPrivateKeyFile must be set together")]
    Half,
    /// The certificate could not be made.
    #[error("generating a self-signed certificate: {0}")]
    Generate(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA cannot verify certificates.
    #[error("clientCAFile: {0}")]
    ClientCa(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_owned(),
        source,
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = std::fs::read(path).map_err(io(path))?;
    let certs = rustls_pemfile::certs(&mut text.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(io(path))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            problem: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = std::fs::read(path).map_err(io(path))?;
    rustls_pemfile::private_key(&mut text.as_slice())
        .map_err(io(path))?
        .ok_or_else(|| TlsError::Pem {
            path: path.to_owned(),
            problem: "no PRIVATE KEY block".into(),
        })
}

/// The certificate and key files to serve: the configured pair, or the
/// self-signed pair under `cert_dir`, made if missing.
///
/// # Errors
/// [`TlsError`] naming the file.
pub fn cert_files(s: &TlsSettings) -> Result<(PathBuf, PathBuf), TlsError> {
    match (&s.cert_file, &s.key_file) {
        (Some(c), Some(k)) => return Ok((c.clone(), k.clone())),
        (None, None) => {}
        _ => return Err(TlsError::Half),
    }
    let cert = s.cert_dir.join("kubelet.crt");
    let key = s.cert_dir.join("kubelet.key");
    if cert.is_file() && key.is_file() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&s.cert_dir).map_err(io(&s.cert_dir))?;
    let (cert_pem, key_pem) = self_signed(&s.hostname, &s.ips)?;
    write_private(&key, key_pem.as_bytes())?;
    std::fs::write(&cert, cert_pem).map_err(io(&cert))?;
    tracing::info!(cert = %cert.display(), "generated a self-signed serving certificate");
    Ok((cert, key))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

/// A self-signed certificate (PEM) and its key for `hostname` and `ips`,
/// valid for a year, named as upstream names its own (`<host>@<unix time>`).
fn self_signed(hostname: &str, ips: &[IpAddr]) -> Result<(String, String), TlsError> {
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(generate)?;
    let mut params = rcgen::CertificateParams::new(vec![hostname.to_owned()]).map_err(generate)?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{hostname}@{now}"));
    let start = time_of(now.saturating_sub(3600));
    params.not_before = start;
    params.not_after = time_of(now.saturating_add(365 * 24 * 3600));
    let cert = params.self_signed(&key).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn time_of(unix: u64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(unix).unwrap_or(i64::MAX))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// The server configuration: the certificate, HTTP/1.1, and client
/// certificates verified against `clientCAFile` when set.
///
/// # Errors
/// [`TlsError`] naming the file.
pub fn server_config(s: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (cert_file, key_file) = cert_files(s)?;
    let certs = read_certs(&cert_file)?;
    let key = read_key(&key_file)?;
    let mut config = builder(s.client_ca_file.as_deref())?.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server configuration with the certificate `resolver` gives at each
/// handshake (`serverTLSBootstrap`: the certificate manager's, swapped
/// without a restart; none yet fails the handshake, as upstream's), HTTP/1.1
/// and client certificates as [`server_config`].
///
/// # Errors
/// [`TlsError`] naming the client CA file.
pub fn server_config_with(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca_file: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = builder(client_ca_file)?.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// TLS versions and client authentication: certificates signed by
/// `client_ca_file` requested, not required.
fn builder(
    client_ca_file: Option<&Path>,
) -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>, TlsError>
{
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    Ok(match client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| TlsError::ClientCa(format!("{}: {e}", ca.display())))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    })
}

/// The user a verified client certificate names: its CN, and its O values as groups.
pub fn peer_user(conn: &rustls::ServerConnection) -> Option<User> {
    let der = conn.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(User {
        name,
        groups,
        ..User::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_pair_is_made_once_and_reused() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = TlsSettings {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            cert_dir: dir.path().join("pki"),
            hostname: "node-1".into(),
            ips: vec!["10.0.0.5".parse().expect("ip")],
        };
        server_config(&s).expect("config");
        let (cert, key) = cert_files(&s).expect("files");
        let first = std::fs::read(&cert).expect("cert");
        server_config(&s).expect("again");
        assert_eq!(
            std::fs::read(&cert).expect("cert"),
            first,
            "reused, not remade"
        );
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&key).expect("key").permissions().mode() & 0o777,
            0o600
        );
        let der = read_certs(&cert).expect("pem");
        let (_, parsed) = x509_parser::parse_x509_certificate(der[0].as_ref()).expect("x509");
        let cn = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .expect("cn");
        assert!(cn.starts_with("node-1@"), "{cn}");
    }

    /// A CA and a leaf for `node-1` it signed (PEM chain, key).
    fn ca_and_leaf() -> (rcgen::Certificate, rcgen::KeyPair) {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        (ca.self_signed(&ca_key).expect("ca"), ca_key)
    }

    fn leaf(
        ca: &(rcgen::Certificate, rcgen::KeyPair),
        cn: &str,
    ) -> crate::certificate::current::Issued {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["node-1".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &ca.0, &ca.1).expect("leaf");
        let pair = crate::certificate::store::parse_pair(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            Path::new("/leaf.pem"),
        )
        .expect("pair");
        crate::certificate::current::Issued::from_pair(pair).expect("issued")
    }

    /// The CN of the certificate the server at `addr` shows, or the handshake error.
    async fn served_cn(
        addr: std::net::SocketAddr,
        ca: &rcgen::Certificate,
    ) -> Result<String, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).expect("root");
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("node-1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let der = tls.get_ref().1.peer_certificates().expect("certs")[0].clone();
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).expect("x509");
        Ok(cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .expect("cn")
            .to_owned())
    }

    #[tokio::test]
    async fn the_bootstrapped_serving_certificate_is_swapped_in_without_a_restart() {
        use crate::certificate::current::{Cell, ServingResolver};
        let cell = Arc::new(Cell::default());
        let config =
            server_config_with(Arc::new(ServingResolver(Arc::clone(&cell))), None).expect("config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let server = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        use tokio::io::AsyncWriteExt as _;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let ca = ca_and_leaf();
        let refused = served_cn(addr, &ca.0)
            .await
            .expect_err("no certificate yet");
        assert!(!refused.is_empty());
        cell.set(leaf(&ca, "first"));
        assert_eq!(served_cn(addr, &ca.0).await.as_deref(), Ok("first"));
        cell.set(leaf(&ca, "second"));
        assert_eq!(served_cn(addr, &ca.0).await.as_deref(), Ok("second"));
        server.abort();
    }

    #[test]
    fn half_a_pair_and_bad_files_are_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let bad = dir.path().join("bad.pem");
        std::fs::write(&bad, "not pem").expect("write");
        let mut s = TlsSettings {
            cert_file: Some(bad.clone()),
            key_file: None,
            client_ca_file: None,
            cert_dir: dir.path().into(),
            hostname: "n".into(),
            ips: vec![],
        };
        assert!(matches!(server_config(&s), Err(TlsError::Half)));
        s.key_file = Some(bad.clone());
        let err = server_config(&s).expect_err("bad pem").to_string();
        assert!(err.contains("bad.pem: no CERTIFICATE block"), "{err}");
    }
}
