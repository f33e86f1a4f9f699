//! The kubeconfig files of TLS bootstrap: reading a kubeconfig's current
//! context (its cluster and client credentials), judging whether its client
//! certificate still serves (upstream's `isClientConfigStillValid`), and
//! writing the node's kubeconfig that names `kubelet-client-current.pem`
//! (upstream's `writeKubeconfigFromBootstrapping`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine as _;
use serde_yaml::Value;

use super::Error;
use super::rotation::{Facts, KubeconfigState};
use super::store::{self, Pair};

/// Where a certificate or key of a kubeconfig is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file (absolute: relative paths are taken from the kubeconfig's directory).
    File(PathBuf),
    /// Embedded (`*-data`, decoded).
    Data(Vec<u8>),
}

/// A kubeconfig's current context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kubeconfig {
    /// The file.
    pub path: PathBuf,
    /// `cluster.server`.
    pub server: String,
    /// `cluster.certificate-authority`, absolute.
    pub ca_file: Option<PathBuf>,
    /// `cluster.certificate-authority-data`, as written (base64).
    pub ca_data: Option<String>,
    /// `cluster.insecure-skip-tls-verify`.
    pub insecure: bool,
    /// `cluster.tls-server-name`.
    pub tls_server_name: Option<String>,
    /// `user.client-certificate(-data)`.
    pub client_certificate: Option<Source>,
    /// `user.client-key(-data)`.
    pub client_key: Option<Source>,
}

fn invalid(path: &Path, problem: impl Into<String>) -> Error {
    Error::Kubeconfig {
        path: path.to_owned(),
        problem: problem.into(),
    }
}

fn named<'a>(doc: &'a Value, list: &str, name: &str, field: &str) -> Option<&'a Value> {
    doc.get(list)?
        .as_sequence()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?
        .get(field)
}

/// Reads the current context of the kubeconfig at `path`.
///
/// # Errors
/// [`Error`] naming the file when it cannot be read or has no usable
/// current context.
pub fn read(path: &Path) -> Result<Kubeconfig, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// Reads kubeconfig text found at `path` (named in errors; relative file
/// names are taken from its directory).
///
/// # Errors
/// [`Error::Kubeconfig`] naming the file and what is missing.
pub fn parse(text: &str, path: &Path) -> Result<Kubeconfig, Error> {
    let doc: Value = serde_yaml::from_str(text).map_err(|e| invalid(path, e.to_string()))?;
    let context_name = doc
        .get("current-context")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(path, "no current-context"))?;
    let context = named(&doc, "contexts", context_name, "context")
        .ok_or_else(|| invalid(path, format!("no context {context_name:?}")))?;
    let cluster_name = context
        .get("cluster")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let cluster = named(&doc, "clusters", cluster_name, "cluster")
        .ok_or_else(|| invalid(path, format!("no cluster {cluster_name:?}")))?;
    let user = context
        .get("user")
        .and_then(Value::as_str)
        .and_then(|u| named(&doc, "users", u, "user"));
    let dir = path.parent().unwrap_or(Path::new("/"));
    let s = |v: Option<&Value>, key: &str| {
        v.and_then(|v| v.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let file = |name: String| dir.join(name);
    let source = |file_key: &str, data_key: &str| -> Result<Option<Source>, Error> {
        if let Some(d) = s(user, data_key) {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(d.trim())
                .map_err(|e| invalid(path, format!("{data_key}: {e}")))?;
            return Ok(Some(Source::Data(bytes)));
        }
        Ok(s(user, file_key).map(|f| Source::File(file(f))))
    };
    Ok(Kubeconfig {
        path: path.to_owned(),
        server: s(Some(cluster), "server")
            .ok_or_else(|| invalid(path, format!("cluster {cluster_name:?} has no server")))?,
        ca_file: s(Some(cluster), "certificate-authority").map(file),
        ca_data: s(Some(cluster), "certificate-authority-data"),
        insecure: cluster
            .get("insecure-skip-tls-verify")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        tls_server_name: s(Some(cluster), "tls-server-name"),
        client_certificate: source("client-certificate", "client-certificate-data")?,
        client_key: source("client-key", "client-key-data")?,
    })
}

fn load(source: &Source) -> Result<(Vec<u8>, Option<PathBuf>), Error> {
    match source {
        Source::Data(d) => Ok((d.clone(), None)),
        Source::File(f) => std::fs::read(f)
            .map(|d| (d, Some(f.clone())))
            .map_err(|e| Error::Io {
                path: f.clone(),
                source: e,
            }),
    }
}

/// The kubeconfig's client certificate and key; None when it has none
/// (a token, say).
///
/// # Errors
/// [`Error`] naming the file that cannot be read.
pub fn identity(kc: &Kubeconfig) -> Result<Option<Pair>, Error> {
    let (Some(cert), Some(key)) = (&kc.client_certificate, &kc.client_key) else {
        return Ok(None);
    };
    let (cert_pem, cert_file) = load(cert)?;
    let (key_pem, _) = load(key)?;
    let named = cert_file.unwrap_or_else(|| kc.path.clone());
    store::parse_pair(&cert_pem, &key_pem, &named).map(Some)
}

/// Whether the kubeconfig at `path` holds a client certificate valid at
/// `now` (every certificate of its chain), as upstream decides whether to
/// bootstrap.
pub fn state(path: &Path, now: SystemTime) -> KubeconfigState {
    if !path.exists() {
        return KubeconfigState::Missing;
    }
    let pair = match read(path).and_then(|kc| identity(&kc)) {
        Ok(Some(p)) => p,
        Ok(None) => return KubeconfigState::Unusable("it has no client certificate".into()),
        Err(e) => return KubeconfigState::Unusable(e.to_string()),
    };
    let mut until: Option<SystemTime> = None;
    for der in &pair.certs {
        let Some(facts) = Facts::from_der(der) else {
            return KubeconfigState::Unusable(format!(
                "{}: a certificate that does not parse",
                pair.path.display()
            ));
        };
        if facts.expired(now) {
            return KubeconfigState::Unusable(format!(
                "part of its client certificate ({}) expired at {}",
                pair.path.display(),
                humantime(facts.not_after)
            ));
        }
        until = Some(until.map_or(facts.not_after, |u| u.min(facts.not_after)));
    }
    until.map_or_else(
        || KubeconfigState::Unusable("no certificate".into()),
        KubeconfigState::Valid,
    )
}

/// A time as seconds since the epoch, for logs.
pub fn humantime(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// The node's kubeconfig: `cluster`'s server and CA (a CA file stays a
/// file), the client certificate and key both `pem` (upstream's names:
/// `default-cluster`, `default-auth`, `default-context`, namespace `default`).
pub fn node_kubeconfig(cluster: &Kubeconfig, pem: &Path) -> String {
    let mut c = serde_yaml::Mapping::new();
    c.insert("server".into(), cluster.server.clone().into());
    if cluster.insecure {
        c.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(f) = &cluster.ca_file {
        c.insert(
            "certificate-authority".into(),
            f.display().to_string().into(),
        );
    } else if let Some(d) = &cluster.ca_data {
        c.insert("certificate-authority-data".into(), d.clone().into());
    }
    if let Some(n) = &cluster.tls_server_name {
        c.insert("tls-server-name".into(), n.clone().into());
    }
    let pem = pem.display().to_string();
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": c}],
        "users": [{"name": "default-auth", "user": {
            "client-certificate": pem,
            "client-key": pem,
        }}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster",
            "user": "default-auth",
            "namespace": "default",
        }}],
        "current-context": "default-context",
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

/// Writes [`node_kubeconfig`] to `path` (mode 0600, through a rename: a
/// reader sees the old file or the new one).
///
/// # Errors
/// [`Error::Io`] naming the file.
pub fn write(path: &Path, cluster: &Kubeconfig, pem: &Path) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    store::write_private(&tmp, node_kubeconfig(cluster, pem).as_bytes())?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// The cluster of `kc` without credentials, as kube-rs reads it (the node
/// client presents the manager's certificate instead: upstream's
/// `AnonymousClientConfig`).
///
/// # Errors
/// [`Error::Kubeconfig`] naming the file.
pub async fn anonymous(kc: &Kubeconfig) -> Result<kube::Config, Error> {
    let mut cluster = serde_json::json!({ "server": kc.server });
    if kc.insecure {
        cluster["insecure-skip-tls-verify"] = true.into();
    }
    if let Some(f) = &kc.ca_file {
        cluster["certificate-authority"] = f.display().to_string().into();
    }
    if let Some(d) = &kc.ca_data {
        cluster["certificate-authority-data"] = d.clone().into();
    }
    if let Some(n) = &kc.tls_server_name {
        cluster["tls-server-name"] = n.clone().into();
    }
    let doc = serde_json::json!({
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    });
    let kubeconfig: kube::config::Kubeconfig =
        serde_json::from_value(doc).map_err(|e| invalid(&kc.path, e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| invalid(&kc.path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    const BOOTSTRAP: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: evlet
  cluster:
    server: https://127.0.0.1:16343
    certificate-authority: pki/ca.crt
users:
- name: tls-bootstrap-token-user
  user:
    token: abcdef.0123456789abcdef
contexts:
- name: evlet
  context:
    cluster: evlet
    user: tls-bootstrap-token-user
current-context: evlet
"#;

    #[test]
    fn a_bootstrap_kubeconfig_is_read_with_paths_from_its_directory() {
        let kc = parse(BOOTSTRAP, Path::new("/etc/evlet/bootstrap.kubeconfig")).expect("kc");
        assert_eq!(kc.server, "https://127.0.0.1:16343");
        assert_eq!(kc.ca_file, Some(PathBuf::from("/etc/evlet/pki/ca.crt")));
        assert_eq!(kc.client_certificate, None);
        let err = parse("clusters: []\n", Path::new("/k")).expect_err("no context");
        assert_eq!(err.to_string(), "kubeconfig /k: no current-context");
    }

    #[test]
    fn the_node_kubeconfig_names_the_current_pem_and_keeps_the_ca_file() {
        let kc = parse(BOOTSTRAP, Path::new("/etc/evlet/bootstrap.kubeconfig")).expect("kc");
        let text = node_kubeconfig(
            &kc,
            Path::new("/var/lib/evlet/pki/kubelet-client-current.pem"),
        );
        let back = parse(&text, Path::new("/etc/evlet/kubelet.kubeconfig")).expect("reads back");
        assert_eq!(back.server, kc.server);
        assert_eq!(back.ca_file, kc.ca_file);
        let pem = Source::File("/var/lib/evlet/pki/kubelet-client-current.pem".into());
        assert_eq!(back.client_certificate, Some(pem.clone()));
        assert_eq!(back.client_key, Some(pem));
        assert!(text.contains("current-context: default-context"), "{text}");
        assert!(text.contains("namespace: default"), "{text}");
    }

    #[test]
    fn a_kubeconfig_is_valid_only_with_a_readable_unexpired_certificate() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("kubelet.kubeconfig");
        assert_eq!(state(&path, SystemTime::now()), KubeconfigState::Missing);
        std::fs::write(&path, BOOTSTRAP).expect("write");
        assert!(
            matches!(state(&path, SystemTime::now()), KubeconfigState::Unusable(w) if w.contains("no client certificate"))
        );
        let kc = parse(BOOTSTRAP, &path).expect("kc");
        let pem = dir.path().join("pki/kubelet-client-current.pem");
        write(&path, &kc, &pem).expect("write");
        assert!(
            matches!(state(&path, SystemTime::now()), KubeconfigState::Unusable(w) if w.contains("kubelet-client-current.pem")),
            "the certificate file is missing"
        );
        let store = store::Store::new(dir.path().join("pki"), store::CLIENT);
        let (cert, key) = store::tests::self_signed("system:node:n1");
        store.update(&cert, &key, SystemTime::now()).expect("store");
        let now = SystemTime::now();
        let KubeconfigState::Valid(until) = state(&path, now) else {
            panic!("valid: {:?}", state(&path, now));
        };
        assert!(until > now);
        let later = until + Duration::from_secs(1);
        assert!(
            matches!(state(&path, later), KubeconfigState::Unusable(w) if w.contains("expired")),
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(humantime(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[tokio::test]
    async fn the_anonymous_cluster_keeps_the_server_and_drops_credentials() {
        let dir = tempfile::tempdir().expect("tmp");
        let (ca, _) = store::tests::self_signed("ca");
        std::fs::create_dir_all(dir.path().join("pki")).expect("dir");
        std::fs::write(dir.path().join("pki/ca.crt"), ca).expect("ca");
        let kc = parse(BOOTSTRAP, &dir.path().join("bootstrap.kubeconfig")).expect("kc");
        let config = anonymous(&kc).await.expect("config");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:16343/");
        assert!(config.root_cert.is_some());
        assert!(config.auth_info.token.is_none());
    }
}
