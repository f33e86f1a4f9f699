//! A test node's credentials on the real cluster, minted from the cluster
//! CA's key as the CSR signer would issue them: a client certificate for
//! `system:node:<name>` in `system:nodes` (so the Node authorizer and
//! `NodeRestriction` judge the agent), a serving certificate for its secured
//! port (SANs 127.0.0.1, the machine's address and the node name, which the
//! apiserver verifies with `--kubelet-certificate-authority`), and the
//! agent's kubeconfig.

use std::path::{Path, PathBuf};

use super::{ClusterEnv, Serving};

/// The cluster CA rebuilt from its key and subject (its subject is its CN
/// alone, as `xtask/src/cluster/pki.rs` makes it): signing needs no more.
fn cluster_ca(env: &ClusterEnv) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key_pem = std::fs::read_to_string(&env.ca_key)
        .unwrap_or_else(|e| panic!("the cluster CA key {}: {e}", env.ca_key.display()));
    let key = rcgen::KeyPair::from_pem(&key_pem).expect("the cluster CA key is a PEM key");
    let cert_pem = std::fs::read(&env.ca).expect("the cluster CA certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&cert_pem).expect("a PEM certificate");
    let parsed = pem.parse_x509().expect("an X.509 certificate");
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .expect("the CA's common name")
        .to_owned();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("the CA rebuilt");
    (cert, key)
}

/// A certificate for `cn` in `orgs` with `sans`, for a server or a client,
/// signed by the CA; written to `<dir>/<stem>.crt` and `.key`.
fn issue(
    (ca, ca_key): &(rcgen::Certificate, rcgen::KeyPair),
    dir: &Path,
    stem: &str,
    (cn, orgs, sans): (&str, &[&str], Vec<String>),
    server: bool,
) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(sans).expect("valid SANs");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    for org in orgs {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *org);
    }
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![if server {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    }];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, ca, ca_key).expect("signed");
    let (crt, key_path) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&crt, cert.pem()).expect("write the certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
    (crt, key_path)
}

/// The node `name`'s kubeconfig and serving pair (for 127.0.0.1, `host_ip`
/// and the name), written under `dir`.
pub fn credentials(env: &ClusterEnv, name: &str, host_ip: &str, dir: &Path) -> (PathBuf, Serving) {
    let ca = cluster_ca(env);
    let user = format!("system:node:{name}");
    let (client_crt, client_key) = issue(
        &ca,
        dir,
        "client",
        (&user, &["system:nodes"], Vec::new()),
        false,
    );
    let (cert, key) = issue(
        &ca,
        dir,
        "serving",
        (
            &user,
            &["system:nodes"],
            vec!["127.0.0.1".into(), host_ip.into(), name.into()],
        ),
        true,
    );
    let kubeconfig = dir.join("kubeconfig");
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "evlet", "cluster": {
            "server": env.server, "certificate-authority": env.ca}}],
        "users": [{"name": user, "user": {
            "client-certificate": client_crt, "client-key": client_key}}],
        "contexts": [{"name": "node", "context": {"cluster": "evlet", "user": user}}],
        "current-context": "node",
    });
    std::fs::write(&kubeconfig, config.to_string()).expect("write the kubeconfig");
    (
        kubeconfig,
        Serving {
            cert,
            key,
            client_ca: env.ca.clone(),
        },
    )
}
