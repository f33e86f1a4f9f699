//! The kubeconfigs and the objects that let a kubelet join, as kubeadm makes them.
//!
//! * `admin`, `controller-manager`, `scheduler` kubeconfigs: client
//!   certificates, everything embedded (`*-data`), so the files stand alone.
//! * `bootstrap.kubeconfig`: the CA, the apiserver URL and a bootstrap token
//!   (`<id>.<secret>`, kept in `bootstrap-token` so `up` reuses it).
//! * The token's Secret in `kube-system` and kubeadm's RBAC
//!   (`cmd/kubeadm/app/phases/bootstraptoken/node/tlsbootstrap.go`): bootstrap
//!   tokens may create CSRs, which are auto-approved; nodes may renew their own
//!   client certificates; user `kube-apiserver` may use the kubelet API.
//! * `kube-public/cluster-info`, which the `bootstrapsigner` controller signs
//!   with the token, for `kubeadm join`-style discovery.

use std::fs;
use std::io::Read as _;
use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::Cluster;
use super::components::Layout;
use super::pki::{self, Pki};
use crate::sh;

/// The extra group kubeadm gives its default node token.
pub const KUBEADM_NODE_TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// How long `up` waits for the controllers to publish the `default` namespace's objects.
const OBJECTS_TIMEOUT: Duration = Duration::from_secs(120);

/// Who a kubeconfig authenticates as.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A client certificate and its key (PEM).
    Certificate {
        /// The certificate.
        cert: String,
        /// Its key.
        key: String,
    },
    /// A bearer token.
    Token(String),
}

/// A kubeconfig with one cluster, user and context, the CA embedded.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, credentials: &Credentials) -> Value {
    let user_entry = match credentials {
        Credentials::Certificate { cert, key } => json!({
            "client-certificate-data": base64(cert.as_bytes()),
            "client-key-data": base64(key.as_bytes()),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "evlet",
            "cluster": {
                "server": server,
                "certificate-authority-data": base64(ca_pem.as_bytes()),
            },
        }],
        "users": [{ "name": user, "user": user_entry }],
        "contexts": [{ "name": "evlet", "context": { "cluster": "evlet", "user": user } }],
        "current-context": "evlet",
    })
}

/// Writes the admin, controller-manager, scheduler and bootstrap kubeconfigs.
pub fn write_kubeconfigs(cluster: &Cluster, pki: &Pki) -> Result<()> {
    let ca = pki.read(pki::CA_CRT)?;
    let server = cluster.server();
    for (name, stem) in [
        ("admin", "admin"),
        ("controller-manager", "controller-manager"),
        ("scheduler", "scheduler"),
    ] {
        let credentials = Credentials::Certificate {
            cert: pki.read(&format!("{stem}.crt"))?,
            key: pki.read(&format!("{stem}.key"))?,
        };
        let config = kubeconfig(&server, &ca, name, &credentials);
        write_private_json(&cluster.dir.join(format!("{name}.kubeconfig")), &config)?;
    }
    let token = token(cluster)?;
    let config = kubeconfig(
        &server,
        &ca,
        "kubelet-bootstrap",
        &Credentials::Token(token),
    );
    write_private_json(&cluster.bootstrap_kubeconfig(), &config)
}

/// The cluster's bootstrap token, made once and kept in `<dir>/bootstrap-token`.
pub fn token(cluster: &Cluster) -> Result<String> {
    let path = cluster.dir.join("bootstrap-token");
    if let Ok(token) = fs::read_to_string(&path) {
        let token = token.trim().to_string();
        if parse_token(&token).is_some() {
            return Ok(token);
        }
    }
    let mut random = [0u8; 22];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .context("cannot read /dev/urandom for the bootstrap token")?;
    let token = token_from_bytes(&random);
    write_private(&path, &format!("{token}\n"))?;
    Ok(token)
}

/// A token `[a-z0-9]{6}.[a-z0-9]{16}` from 22 random bytes.
pub fn token_from_bytes(bytes: &[u8; 22]) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let chars: String = bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    format!("{}.{}", &chars[..6], &chars[6..])
}

/// The id and secret of a well-formed bootstrap token.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// The objects `up` applies: the token Secret, kubeadm's RBAC, cluster-info.
pub fn objects(token: &str, server: &str, ca_pem: &str) -> Result<Value> {
    let (id, secret) = parse_token(token).context("malformed bootstrap token")?;
    let binding = |name: &str, role: &str, kind: &str, subject: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject }],
        })
    };
    let cluster_info = kubeconfig(server, ca_pem, "", &Credentials::Token(String::new()));
    let cluster_info = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": cluster_info["clusters"],
    });
    Ok(json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": format!("bootstrap-token-{id}"), "namespace": "kube-system" },
                "type": "bootstrap.kubernetes.io/token",
                "stringData": {
                    "description": "evlet cluster: kubelet TLS bootstrap",
                    "token-id": id,
                    "token-secret": secret,
                    "usage-bootstrap-authentication": "true",
                    "usage-bootstrap-signing": "true",
                    "auth-extra-groups": KUBEADM_NODE_TOKEN_GROUP,
                },
            },
            binding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", "Group", "system:bootstrappers"),
            binding(
                "kubeadm:node-autoapprove-bootstrap",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                "Group",
                "system:bootstrappers",
            ),
            binding(
                "kubeadm:node-autoapprove-certificate-rotation",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "Group",
                "system:nodes",
            ),
            binding(
                "kube-apiserver-kubelet-admin",
                "system:kubelet-api-admin",
                "User",
                pki::APISERVER_KUBELET_USER,
            ),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": "cluster-info", "namespace": "kube-public" },
                "data": { "kubeconfig": serde_json::to_string_pretty(&cluster_info)? },
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": { "name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public" },
                "rules": [{
                    "apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": ["cluster-info"], "verbs": ["get"],
                }],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": { "name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kubeadm:bootstrap-signer-clusterinfo" },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous" }],
            },
        ],
    }))
}

/// Applies [`objects`] with the cluster's kubectl (server-side, idempotent).
pub fn apply(cluster: &Cluster, layout: &Layout) -> Result<()> {
    let ca = fs::read_to_string(layout.pki.join(pki::CA_CRT))
        .with_context(|| format!("cannot read {}", layout.pki.join(pki::CA_CRT).display()))?;
    let token = token(cluster)?;
    let manifest = cluster.dir.join("bootstrap-objects.json");
    write_private_json(&manifest, &objects(&token, &cluster.server(), &ca)?)?;
    let out = sh::output(
        kubectl(cluster, layout)
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=evlet-xtask",
                "-f",
            ])
            .arg(&manifest),
    )
    .with_context(|| {
        format!(
            "cannot apply the bootstrap objects in {}",
            manifest.display()
        )
    })?;
    let id = parse_token(&token).map(|(id, _)| id).unwrap_or_default();
    println!(
        "cluster {}: bootstrap token {id}, its RBAC and cluster-info applied ({} objects)",
        cluster.version,
        out.lines().count()
    );
    Ok(())
}

/// Waits for the `default` ServiceAccount and the `kube-root-ca.crt`
/// ConfigMap in `default`: the controller manager's service-account and
/// root-CA publisher controllers work, and every pod's API volume can mount.
pub fn wait_for_default_namespace_objects(cluster: &Cluster, layout: &Layout) -> Result<()> {
    let started = Instant::now();
    for (kind, name) in [
        ("serviceaccount", "default"),
        ("configmap", "kube-root-ca.crt"),
    ] {
        loop {
            let found = kubectl(cluster, layout)
                .args(["get", "-n", "default", kind, name, "-o", "name"])
                .output()
                .is_ok_and(|o| o.status.success());
            if found {
                println!(
                    "cluster {}: {kind}/{name} in default after {:.1}s",
                    cluster.version,
                    started.elapsed().as_secs_f64()
                );
                break;
            }
            if started.elapsed() > OBJECTS_TIMEOUT {
                bail!(
                    "{kind}/{name} did not appear in namespace default within {OBJECTS_TIMEOUT:?}: \
                     is kube-controller-manager working? see {}",
                    layout
                        .log(super::components::Component::KubeControllerManager)
                        .display()
                );
            }
            sleep(Duration::from_millis(500));
        }
    }
    Ok(())
}

fn kubectl(cluster: &Cluster, layout: &Layout) -> Command {
    let mut cmd = Command::new(layout.kubectl());
    cmd.arg("--kubeconfig").arg(cluster.admin_kubeconfig());
    cmd
}

/// Writes JSON readable by root only (kubeconfigs hold keys and tokens).
fn write_private_json(path: &Path, value: &Value) -> Result<()> {
    write_private(path, &serde_json::to_string_pretty(value)?)
}

/// Writes `text` to `path` readable by root only, through a renamed temporary file.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Standard base64 with padding (RFC 4648), for the kubeconfigs' `*-data`.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn tokens_have_the_bootstrap_token_shape() {
        let token = token_from_bytes(&[255; 22]);
        assert!(parse_token(&token).is_some(), "{token}");
        assert_eq!(token.len(), 23);
        assert!(parse_token("abcdef.0123456789abcdef").is_some());
        assert!(parse_token("ABCDEF.0123456789abcdef").is_none());
        assert!(parse_token("abcde.0123456789abcdef").is_none());
    }

    #[test]
    fn the_bootstrap_kubeconfig_carries_the_token_and_the_ca() {
        let config = kubeconfig(
            "https://127.0.0.1:16343",
            "PEM",
            "kubelet-bootstrap",
            &Credentials::Token("abcdef.0123456789abcdef".into()),
        );
        assert_eq!(
            config["users"][0]["user"]["token"],
            "abcdef.0123456789abcdef"
        );
        assert_eq!(
            config["clusters"][0]["cluster"]["certificate-authority-data"],
            base64(b"PEM")
        );
        assert_eq!(
            config["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:16343"
        );
        assert_eq!(config["current-context"], "evlet");
    }

    #[test]
    fn the_token_secret_and_rbac_follow_kubeadm() {
        let objects = objects("abcdef.0123456789abcdef", "https://x", "PEM").expect("objects");
        let items = objects["items"].as_array().expect("items");
        let secret = &items[0];
        assert_eq!(secret["metadata"]["name"], "bootstrap-token-abcdef");
        assert_eq!(secret["metadata"]["namespace"], "kube-system");
        assert_eq!(secret["type"], "bootstrap.kubernetes.io/token");
        assert_eq!(
            secret["stringData"]["usage-bootstrap-authentication"],
            "true"
        );
        let bound = |role: &str| {
            items
                .iter()
                .find(|i| i["roleRef"]["name"] == role)
                .map(|i| {
                    i["subjects"][0]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
        };
        assert_eq!(
            bound("system:node-bootstrapper").as_deref(),
            Some("system:bootstrappers")
        );
        assert_eq!(
            bound("system:certificates.k8s.io:certificatesigningrequests:nodeclient").as_deref(),
            Some("system:bootstrappers")
        );
        assert_eq!(
            bound("system:certificates.k8s.io:certificatesigningrequests:selfnodeclient")
                .as_deref(),
            Some("system:nodes")
        );
        assert_eq!(
            bound("system:kubelet-api-admin").as_deref(),
            Some("kube-apiserver")
        );
    }
}
