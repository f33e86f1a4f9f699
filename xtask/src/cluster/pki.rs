//! The cluster's PKI: two CAs, the serving and client certificates, and the
//! service-account key pair, all ECDSA P-256, as kubeadm lays them out.
//!
//! * `ca`: signs every client and serving certificate, is the apiserver's
//!   `--client-ca-file`, the kubelets' trust root, and the controller
//!   manager's CSR signer (`--cluster-signing-cert-file/-key-file`).
//! * `front-proxy-ca`: signs only `front-proxy-client` (the aggregation layer).
//! * `sa.key` / `sa.pub`: service-account token signing.
//!
//! [`ensure`] is idempotent: the CAs and the service-account key are made
//! once; a leaf is (re)issued when its files are missing or its spec (subject,
//! SANs, usage, the issuing CA's certificate) changed, e.g. the machine's
//! address moved. Since the CA parameters are ours and fixed, a CA loaded from
//! disk is rebuilt from its key: signing needs only its name and key.

use std::fs;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use sha2::{Digest as _, Sha256};

use super::components::SERVICE_IP;

/// The cluster CA's certificate.
pub const CA_CRT: &str = "ca.crt";
/// The cluster CA's key (also the CSR signing key).
pub const CA_KEY: &str = "ca.key";
/// The apiserver's serving certificate.
pub const APISERVER_CRT: &str = "apiserver.crt";
/// The apiserver's serving key.
pub const APISERVER_KEY: &str = "apiserver.key";
/// The apiserver's client certificate towards kubelets (user `kube-apiserver`).
pub const KUBELET_CLIENT_CRT: &str = "apiserver-kubelet-client.crt";
/// Its key.
pub const KUBELET_CLIENT_KEY: &str = "apiserver-kubelet-client.key";
/// The front-proxy (aggregation) CA.
pub const FRONT_PROXY_CA_CRT: &str = "front-proxy-ca.crt";
/// The apiserver's front-proxy client certificate.
pub const FRONT_PROXY_CLIENT_CRT: &str = "front-proxy-client.crt";
/// Its key.
pub const FRONT_PROXY_CLIENT_KEY: &str = "front-proxy-client.key";
/// The front-proxy client's common name (`--requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT_CN: &str = "front-proxy-client";
/// The service-account signing key.
pub const SA_KEY: &str = "sa.key";
/// The service-account public key.
pub const SA_PUB: &str = "sa.pub";
/// The user the apiserver is towards kubelets (bound to `system:kubelet-api-admin`).
pub const APISERVER_KUBELET_USER: &str = "kube-apiserver";

/// Which CA signs a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Issuer {
    /// `ca`.
    Cluster,
    /// `front-proxy-ca`.
    FrontProxy,
}

impl Issuer {
    fn stem(self) -> &'static str {
        match self {
            Issuer::Cluster => "ca",
            Issuer::FrontProxy => "front-proxy-ca",
        }
    }

    fn common_name(self) -> &'static str {
        match self {
            Issuer::Cluster => "evlet-cluster-ca",
            Issuer::FrontProxy => "evlet-front-proxy-ca",
        }
    }
}

/// One leaf certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// File stem: `<stem>.crt` and `<stem>.key`.
    pub stem: &'static str,
    /// The signing CA.
    pub issuer: Issuer,
    /// Subject CN (the user name for client certificates).
    pub common_name: &'static str,
    /// Subject O (groups for client certificates).
    pub organizations: Vec<&'static str>,
    /// DNS names and IP addresses (serving certificates only).
    pub sans: Vec<String>,
    /// Serving (server auth) rather than client auth.
    pub server: bool,
}

impl Leaf {
    fn client(stem: &'static str, common_name: &'static str, orgs: &[&'static str]) -> Self {
        Self {
            stem,
            issuer: Issuer::Cluster,
            common_name,
            organizations: orgs.to_vec(),
            sans: Vec::new(),
            server: false,
        }
    }

    /// What the leaf is; a change (or a new issuing CA, `ca_pem`) reissues it.
    pub fn spec(&self, ca_pem: &str) -> String {
        format!(
            "cn={}\no={}\nsans={}\nserver={}\nca={}\n",
            self.common_name,
            self.organizations.join(","),
            self.sans.join(","),
            self.server,
            hex::encode(Sha256::digest(ca_pem.as_bytes()))
        )
    }
}

/// What the PKI depends on besides itself.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The apiserver's advertise address (a SAN of its serving certificate).
    pub advertise: Ipv4Addr,
}

impl Inputs {
    /// Inputs for an apiserver advertising `advertise`.
    pub fn new(advertise: Ipv4Addr) -> Self {
        Self { advertise }
    }
}

/// The apiserver's serving SANs: loopback, the `kubernetes` Service's IP and
/// names, and the advertise address.
pub fn apiserver_sans(advertise: Ipv4Addr) -> Vec<String> {
    let mut sans: Vec<String> = [
        "127.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sans.push(SERVICE_IP.to_string());
    if !advertise.is_loopback() && !advertise.is_unspecified() {
        sans.push(advertise.to_string());
    }
    sans
}

/// Every leaf the cluster needs.
pub fn leaves(inputs: &Inputs) -> Vec<Leaf> {
    vec![
        Leaf {
            stem: "apiserver",
            issuer: Issuer::Cluster,
            common_name: "kube-apiserver",
            organizations: Vec::new(),
            sans: apiserver_sans(inputs.advertise),
            server: true,
        },
        Leaf::client("apiserver-kubelet-client", APISERVER_KUBELET_USER, &[]),
        Leaf {
            issuer: Issuer::FrontProxy,
            ..Leaf::client("front-proxy-client", FRONT_PROXY_CLIENT_CN, &[])
        },
        Leaf::client("admin", "evlet-admin", &["system:masters"]),
        Leaf::client("controller-manager", "system:kube-controller-manager", &[]),
        Leaf::client("scheduler", "system:kube-scheduler", &[]),
    ]
}

/// The PKI directory once [`ensure`] made it complete.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The directory.
    pub dir: PathBuf,
}

impl Pki {
    /// The text of one PKI file.
    pub fn read(&self, name: &str) -> Result<String> {
        let path = self.dir.join(name);
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    }
}

/// Makes the PKI under `dir` complete and current (idempotent).
pub fn ensure(dir: &Path, inputs: &Inputs) -> Result<Pki> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cluster_ca = ensure_ca(dir, Issuer::Cluster)?;
    let front_proxy_ca = ensure_ca(dir, Issuer::FrontProxy)?;
    ensure_service_account_key(dir)?;
    for leaf in leaves(inputs) {
        let (ca, key, pem) = match leaf.issuer {
            Issuer::Cluster => &cluster_ca,
            Issuer::FrontProxy => &front_proxy_ca,
        };
        let spec = leaf.spec(pem);
        let spec_path = dir.join(format!("{}.spec", leaf.stem));
        let crt = dir.join(format!("{}.crt", leaf.stem));
        let key_path = dir.join(format!("{}.key", leaf.stem));
        let current = crt.exists()
            && key_path.exists()
            && fs::read_to_string(&spec_path).is_ok_and(|s| s == spec);
        if current {
            continue;
        }
        let leaf_key = KeyPair::generate()
            .with_context(|| format!("cannot generate a key for {}", leaf.stem))?;
        let cert = leaf_params(&leaf)?
            .signed_by(&leaf_key, ca, key)
            .with_context(|| format!("cannot sign the {} certificate", leaf.stem))?;
        write_private(&key_path, &leaf_key.serialize_pem())?;
        write(&crt, &cert.pem())?;
        write(&spec_path, &spec)?;
        println!("cluster: issued {} ({})", crt.display(), leaf.common_name);
    }
    Ok(Pki {
        dir: dir.to_path_buf(),
    })
}

/// Loads or makes one CA; returns its (rebuilt) certificate, key and PEM on disk.
fn ensure_ca(dir: &Path, issuer: Issuer) -> Result<(Certificate, KeyPair, String)> {
    let crt = dir.join(format!("{}.crt", issuer.stem()));
    let key_path = dir.join(format!("{}.key", issuer.stem()));
    if crt.exists() && key_path.exists() {
        let key_pem = fs::read_to_string(&key_path)
            .with_context(|| format!("cannot read {}", key_path.display()))?;
        let key = KeyPair::from_pem(&key_pem)
            .with_context(|| format!("{} is not a PEM private key", key_path.display()))?;
        let cert = ca_params(issuer)
            .self_signed(&key)
            .with_context(|| format!("cannot rebuild the CA of {}", key_path.display()))?;
        let pem =
            fs::read_to_string(&crt).with_context(|| format!("cannot read {}", crt.display()))?;
        return Ok((cert, key, pem));
    }
    let key = KeyPair::generate().context("cannot generate a CA key")?;
    let cert = ca_params(issuer)
        .self_signed(&key)
        .with_context(|| format!("cannot self-sign {}", crt.display()))?;
    write_private(&key_path, &key.serialize_pem())?;
    write(&crt, &cert.pem())?;
    println!(
        "cluster: made CA {} ({})",
        crt.display(),
        issuer.common_name()
    );
    let pem = cert.pem();
    Ok((cert, key, pem))
}

fn ensure_service_account_key(dir: &Path) -> Result<()> {
    let (key_path, pub_path) = (dir.join(SA_KEY), dir.join(SA_PUB));
    if key_path.exists() && pub_path.exists() {
        return Ok(());
    }
    let key = KeyPair::generate().context("cannot generate the service-account key")?;
    write_private(&key_path, &key.serialize_pem())?;
    write(&pub_path, &key.public_key_pem())?;
    println!("cluster: made service-account key {}", key_path.display());
    Ok(())
}

fn ca_params(issuer: Issuer) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, issuer.common_name());
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params);
    params
}

fn leaf_params(leaf: &Leaf) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(leaf.sans.clone())
        .with_context(|| format!("invalid SANs for {}: {:?}", leaf.stem, leaf.sans))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name);
    for org in &leaf.organizations {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *org);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![if leaf.server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    Ok(params)
}

/// Valid from yesterday (clock skew) for ten years: a development cluster.
fn set_validity(params: &mut CertificateParams) {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    let (y, m, d) = civil_from_days(days - 1);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    params.not_after = rcgen::date_time_ymd(y + 10, m, d.min(28));
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y as i32, m as u8, d as u8)
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes a private key readable by root only.
fn write_private(path: &Path, text: &str) -> Result<()> {
    let _ = fs::remove_file(path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write the private key {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apiserver_serves_loopback_the_service_ip_and_the_advertise_address() {
        let sans = apiserver_sans(Ipv4Addr::new(192, 0, 2, 2));
        for want in [
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "192.0.2.2",
            "kubernetes.default.svc",
        ] {
            assert!(
                sans.iter().any(|s| s == want),
                "{want} missing from {sans:?}"
            );
        }
        assert!(!apiserver_sans(Ipv4Addr::UNSPECIFIED).contains(&"0.0.0.0".to_string()));
    }

    #[test]
    fn client_certificates_name_the_users_and_groups_upstream_binds() {
        let leaves = leaves(&Inputs::new(Ipv4Addr::new(192, 0, 2, 2)));
        let find = |stem: &str| leaves.iter().find(|l| l.stem == stem).expect(stem).clone();
        assert_eq!(find("admin").organizations, vec!["system:masters"]);
        assert_eq!(
            find("apiserver-kubelet-client").common_name,
            "kube-apiserver"
        );
        assert_eq!(
            find("controller-manager").common_name,
            "system:kube-controller-manager"
        );
        assert_eq!(find("scheduler").common_name, "system:kube-scheduler");
        assert_eq!(find("front-proxy-client").issuer, Issuer::FrontProxy);
        assert!(find("apiserver").server);
        assert!(
            leaves
                .iter()
                .filter(|l| l.stem != "apiserver")
                .all(|l| !l.server)
        );
    }

    #[test]
    fn a_leaf_is_reissued_when_its_sans_or_its_ca_change() {
        let a = leaves(&Inputs::new(Ipv4Addr::new(192, 0, 2, 2)))[0].clone();
        let b = leaves(&Inputs::new(Ipv4Addr::new(192, 0, 2, 3)))[0].clone();
        assert_ne!(a.spec("ca"), b.spec("ca"));
        assert_ne!(a.spec("ca"), a.spec("other ca"));
        assert_eq!(a.spec("ca"), a.clone().spec("ca"));
    }

    #[test]
    fn days_since_the_epoch_become_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }

    #[test]
    fn ensure_makes_a_pki_once_and_keeps_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inputs = Inputs::new(Ipv4Addr::new(192, 0, 2, 2));
        ensure(dir.path(), &inputs).expect("first ensure");
        let ca = fs::read(dir.path().join(CA_CRT)).expect("ca");
        let admin = fs::read(dir.path().join("admin.crt")).expect("admin");
        ensure(dir.path(), &inputs).expect("second ensure");
        assert_eq!(ca, fs::read(dir.path().join(CA_CRT)).expect("ca"));
        assert_eq!(
            admin,
            fs::read(dir.path().join("admin.crt")).expect("admin")
        );
        let before = fs::read(dir.path().join(APISERVER_CRT)).expect("apiserver");
        ensure(dir.path(), &Inputs::new(Ipv4Addr::new(192, 0, 2, 9))).expect("moved");
        assert_ne!(
            before,
            fs::read(dir.path().join(APISERVER_CRT)).expect("apiserver")
        );
        assert_eq!(
            admin,
            fs::read(dir.path().join("admin.crt")).expect("admin")
        );
    }
}
