//! The conformance kubelet's identity: a client certificate for
//! `system:node:<name>` and a serving certificate for the node's address,
//! both signed with the cluster CA's key, and the kubeconfig naming them.
//!
//! Both kubelets get the same kind of identity, minted here rather than
//! requested by TLS bootstrap, so neither run depends on the CSR approver or
//! on an admin approving a serving CSR: the API server verifies a kubelet's
//! serving certificate against the cluster CA (`--kubelet-certificate-authority`),
//! and the Node authorizer and `NodeRestriction` know the node by the client
//! certificate's CN. The CA is rebuilt from its key as `cluster::pki` does
//! (signing needs only the issuer's name and key).

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// The cluster CA's common name (`cluster::pki`'s `Issuer::Cluster`).
const CLUSTER_CA_CN: &str = "evlet-cluster-ca";

/// The files of one kubelet's identity.
#[derive(Debug, Clone)]
pub struct Identity {
    /// kubeconfig with the API server, the CA and the client certificate.
    pub kubeconfig: PathBuf,
    /// The secured port's certificate.
    pub serving_crt: PathBuf,
    /// Its key.
    pub serving_key: PathBuf,
    /// The cluster CA (the kubelet's `clientCAFile`).
    pub ca_crt: PathBuf,
}

/// Mints the identity of node `node` (reachable at `ip`) into `dir`, signed
/// by the CA in `pki`, for the API server at `server`.
///
/// # Errors
/// If the CA cannot be read or a file cannot be written.
pub fn mint(dir: &Path, pki: &Path, server: &str, node: &str, ip: Ipv4Addr) -> Result<Identity> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ca_crt = pki.join("ca.crt");
    let ca_key_path = pki.join("ca.key");
    let ca_key = KeyPair::from_pem(
        &fs::read_to_string(&ca_key_path)
            .with_context(|| format!("cannot read {}", ca_key_path.display()))?,
    )
    .with_context(|| format!("{} is not a PEM private key", ca_key_path.display()))?;
    let ca = ca_params()
        .self_signed(&ca_key)
        .context("cannot rebuild the cluster CA from its key")?;
    let user = format!("system:node:{node}");

    let client_key = KeyPair::generate().context("cannot generate the client key")?;
    let client = leaf(&user, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)?
        .signed_by(&client_key, &ca, &ca_key)
        .context("cannot sign the kubelet client certificate")?;
    let client_crt = dir.join("kubelet-client.crt");
    let client_key_path = dir.join("kubelet-client.key");
    write(&client_crt, &client.pem())?;
    write_private(&client_key_path, &client_key.serialize_pem())?;

    let sans = vec![node.to_string(), ip.to_string(), "127.0.0.1".to_string()];
    let serving_key = KeyPair::generate().context("cannot generate the serving key")?;
    let serving = leaf(&user, sans, ExtendedKeyUsagePurpose::ServerAuth)?
        .signed_by(&serving_key, &ca, &ca_key)
        .context("cannot sign the kubelet serving certificate")?;
    let serving_crt = dir.join("kubelet-serving.crt");
    let serving_key_path = dir.join("kubelet-serving.key");
    write(&serving_crt, &serving.pem())?;
    write_private(&serving_key_path, &serving_key.serialize_pem())?;

    let kubeconfig = dir.join("kubelet.kubeconfig");
    let config = kubeconfig_json(server, &ca_crt, &user, &client_crt, &client_key_path);
    write_private(&kubeconfig, &serde_json::to_string_pretty(&config)?)?;
    Ok(Identity {
        kubeconfig,
        serving_crt,
        serving_key: serving_key_path,
        ca_crt,
    })
}

/// A kubeconfig naming the certificate files (kubelets and kubectl read paths).
pub fn kubeconfig_json(
    server: &str,
    ca: &Path,
    user: &str,
    crt: &Path,
    key: &Path,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "evlet",
            "cluster": { "server": server, "certificate-authority": ca },
        }],
        "users": [{
            "name": user,
            "user": { "client-certificate": crt, "client-key": key },
        }],
        "contexts": [{ "name": "evlet", "context": { "cluster": "evlet", "user": user } }],
        "current-context": "evlet",
    })
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CLUSTER_CA_CN);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A node certificate: CN `system:node:<name>`, O `system:nodes`.
fn leaf(
    user: &str,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<CertificateParams> {
    let mut params =
        CertificateParams::new(sans.clone()).with_context(|| format!("invalid SANs {sans:?}"))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, user);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    // Valid from yesterday (clock skew) for a year: one run needs hours.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let day = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = day + time_days(now / 86_400 - 1);
    params.not_after = day + time_days(now / 86_400 + 365);
    Ok(params)
}

fn time_days(days: u64) -> std::time::Duration {
    std::time::Duration::from_secs(days * 86_400)
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_identity_is_signed_by_the_ca_and_names_the_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = dir.path().join("pki");
        fs::create_dir_all(&pki).expect("pki");
        let ca_key = KeyPair::generate().expect("key");
        let ca = ca_params().self_signed(&ca_key).expect("ca");
        fs::write(pki.join("ca.key"), ca_key.serialize_pem()).expect("key");
        fs::write(pki.join("ca.crt"), ca.pem()).expect("crt");
        let id = mint(
            &dir.path().join("id"),
            &pki,
            "https://127.0.0.1:16343",
            "conf-x",
            Ipv4Addr::new(192, 0, 2, 2),
        )
        .expect("mint");
        let kc: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&id.kubeconfig).expect("kc")).expect("json");
        assert_eq!(kc["users"][0]["name"], "system:node:conf-x");
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:16343"
        );
        let serving = fs::read_to_string(&id.serving_crt).expect("crt");
        assert!(serving.starts_with("-----BEGIN CERTIFICATE-----"));
        // openssl, when present, checks the chain and the SAN.
        if Path::new("/usr/bin/openssl").exists() {
            let out = std::process::Command::new("openssl")
                .args(["verify", "-CAfile"])
                .arg(pki.join("ca.crt"))
                .arg(&id.serving_crt)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = std::process::Command::new("openssl")
                .args(["x509", "-noout", "-text", "-in"])
                .arg(&id.serving_crt)
                .output()
                .expect("openssl");
            let text = String::from_utf8_lossy(&text.stdout);
            assert!(text.contains("IP Address:192.0.2.2"), "{text}");
            assert!(
                text.contains("CN=system:node:conf-x") || text.contains("CN = system:node:conf-x")
            );
        }
    }
}
