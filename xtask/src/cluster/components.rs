//! The control-plane components and their command lines.
//!
//! The flags follow upstream's `hack/local-up-cluster.sh` and kubeadm's static
//! pod manifests (`cmd/kubeadm/app/phases/controlplane/manifests.go`), reduced
//! to one loopback machine: plain-HTTP etcd on 127.0.0.1, the apiserver on its
//! own port with Node and RBAC authorization, bootstrap tokens and
//! `NodeRestriction`, and the controller manager signing kubelet CSRs with the
//! cluster CA. The apiserver writes an audit log of every request a node makes
//! ([`AUDIT_POLICY`]), which evlet's tests read to see what the agent sent.
//! Building the lists is pure, so they are unit-tested here.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::Ports;
use super::pki;

/// The service CIDR; the apiserver's Service IP is its first address.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

/// The `kubernetes` Service IP (first address of [`SERVICE_CIDR`]).
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// The service-account token issuer (as local-up-cluster and kubeadm).
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc";

/// The apiserver's audit policy: every request of a node (group
/// `system:nodes`) at `Request` level (metadata and request body, not the
/// response), nothing else. Tests read it as the record of what a kubelet
/// sent, filtered by its user `system:node:<name>`; the `RequestReceived`
/// stage is left out (a request is logged when its response starts, for a
/// watch, and when it completes).
pub const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  userGroups: [\"system:nodes\"]
- level: None
";

/// The audit log's size before the apiserver rotates it (MiB), and how many
/// rotated files it keeps: a full test run writes well under the size.
const AUDIT_LOG_MAX_MIB: u32 = 200;

/// Where one cluster's pieces are: directories, binaries, ports, addresses.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cluster directory (logs, pid files, kubeconfigs, etcd data).
    pub dir: PathBuf,
    /// The PKI directory.
    pub pki: PathBuf,
    /// The directory of the built upstream programs.
    pub bin: PathBuf,
    /// The cluster's ports.
    pub ports: Ports,
    /// The apiserver's advertise address (never loopback).
    pub advertise: Ipv4Addr,
    /// The apiserver's bind address (127.0.0.1 unless widened).
    pub bind: Ipv4Addr,
}

impl Layout {
    /// The log file of `c`.
    pub fn log(&self, c: Component) -> PathBuf {
        self.dir.join(format!("{}.log", c.name()))
    }

    /// The pid file `up` writes for `c`.
    pub fn pid_file(&self, c: Component) -> PathBuf {
        self.dir.join(format!("{}.pid", c.name()))
    }

    /// The program of `c`.
    pub fn binary(&self, c: Component) -> PathBuf {
        self.bin.join(c.name())
    }

    /// The kubeconfig named `name` (`admin`, `controller-manager`, ...).
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.kubeconfig"))
    }

    /// The kubectl built for this cluster's release.
    pub fn kubectl(&self) -> PathBuf {
        self.bin.join("kubectl")
    }

    /// The apiserver's audit policy file ([`AUDIT_POLICY`], written by `up`).
    pub fn audit_policy(&self) -> PathBuf {
        self.dir.join("audit-policy.yaml")
    }

    /// The apiserver's audit log (JSON lines, one event per request and stage).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Writes the audit policy the apiserver's command line names.
    ///
    /// # Errors
    /// If the file cannot be written.
    pub fn write_audit_policy(&self) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let path = self.audit_policy();
        std::fs::write(&path, AUDIT_POLICY)
            .with_context(|| format!("cannot write the audit policy {}", path.display()))
    }

    /// etcd's client URL.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }

    fn pki_file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }
}

/// One control-plane process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The store.
    Etcd,
    /// The API server.
    KubeApiserver,
    /// The controller manager (service accounts, CSR approval and signing, ...).
    KubeControllerManager,
    /// The scheduler.
    KubeScheduler,
}

impl Component {
    /// Every component, in start order.
    pub const ALL: [Component; 4] = [
        Component::Etcd,
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::KubeScheduler,
    ];

    /// The program's name (also of its log and pid files).
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
            Component::KubeScheduler => "kube-scheduler",
        }
    }

    /// The command-line arguments of this component in `layout`.
    pub fn args(self, layout: &Layout) -> Vec<String> {
        match self {
            Component::Etcd => etcd_args(layout),
            Component::KubeApiserver => apiserver_args(layout),
            Component::KubeControllerManager => controller_manager_args(layout),
            Component::KubeScheduler => scheduler_args(layout),
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn flag(name: &str, value: impl fmt::Display) -> String {
    format!("--{name}={value}")
}

fn etcd_args(l: &Layout) -> Vec<String> {
    let peer = format!("http://127.0.0.1:{}", l.ports.etcd_peer);
    vec![
        flag("name", "evlet"),
        flag("data-dir", l.dir.join("etcd").display()),
        flag("listen-client-urls", l.etcd_url()),
        flag("advertise-client-urls", l.etcd_url()),
        flag("listen-peer-urls", &peer),
        flag("initial-advertise-peer-urls", &peer),
        flag("initial-cluster", format!("evlet={peer}")),
        flag("initial-cluster-state", "new"),
        flag("log-level", "warn"),
    ]
}

fn apiserver_args(l: &Layout) -> Vec<String> {
    let p = |name: &str| l.pki_file(name);
    vec![
        flag("etcd-servers", l.etcd_url()),
        flag("bind-address", l.bind),
        flag("secure-port", l.ports.apiserver),
        flag("advertise-address", l.advertise),
        flag("tls-cert-file", p(pki::APISERVER_CRT)),
        flag("tls-private-key-file", p(pki::APISERVER_KEY)),
        flag("client-ca-file", p(pki::CA_CRT)),
        flag("kubelet-client-certificate", p(pki::KUBELET_CLIENT_CRT)),
        flag("kubelet-client-key", p(pki::KUBELET_CLIENT_KEY)),
        flag("kubelet-certificate-authority", p(pki::CA_CRT)),
        flag(
            "kubelet-preferred-address-types",
            "InternalIP,ExternalIP,Hostname",
        ),
        flag("service-account-key-file", p(pki::SA_PUB)),
        flag("service-account-signing-key-file", p(pki::SA_KEY)),
        flag("service-account-issuer", SERVICE_ACCOUNT_ISSUER),
        flag("service-cluster-ip-range", SERVICE_CIDR),
        flag("authorization-mode", "Node,RBAC"),
        flag("enable-admission-plugins", "NodeRestriction"),
        flag("enable-bootstrap-token-auth", true),
        flag("allow-privileged", true),
        flag("requestheader-client-ca-file", p(pki::FRONT_PROXY_CA_CRT)),
        flag("requestheader-allowed-names", pki::FRONT_PROXY_CLIENT_CN),
        flag("requestheader-username-headers", "X-Remote-User"),
        flag("requestheader-group-headers", "X-Remote-Group"),
        flag("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
        flag("proxy-client-cert-file", p(pki::FRONT_PROXY_CLIENT_CRT)),
        flag("proxy-client-key-file", p(pki::FRONT_PROXY_CLIENT_KEY)),
        flag("audit-policy-file", l.audit_policy().display()),
        flag("audit-log-path", l.audit_log().display()),
        flag("audit-log-format", "json"),
        flag("audit-log-maxsize", AUDIT_LOG_MAX_MIB),
        flag("audit-log-maxbackup", 1),
        flag("v", 1),
    ]
}

/// Flags the controller manager and the scheduler share: their kubeconfig for
/// everything, loopback serving, no leader election (one instance; a restart
/// would otherwise wait out the old lease).
fn client_component_args(l: &Layout, kubeconfig: &Path, port: u16) -> Vec<String> {
    let kc = kubeconfig.display();
    vec![
        flag("kubeconfig", &kc),
        flag("authentication-kubeconfig", &kc),
        flag("authorization-kubeconfig", &kc),
        flag("client-ca-file", l.pki_file(pki::CA_CRT)),
        flag(
            "requestheader-client-ca-file",
            l.pki_file(pki::FRONT_PROXY_CA_CRT),
        ),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", port),
        flag("leader-elect", false),
        flag("v", 1),
    ]
}

fn controller_manager_args(l: &Layout) -> Vec<String> {
    let mut args = client_component_args(
        l,
        &l.kubeconfig("controller-manager"),
        l.ports.controller_manager,
    );
    args.extend([
        // bootstrapsigner and tokencleaner are off by default; kubeadm turns them on.
        flag("controllers", "*,bootstrapsigner,tokencleaner"),
        flag("use-service-account-credentials", true),
        flag("service-account-private-key-file", l.pki_file(pki::SA_KEY)),
        flag("root-ca-file", l.pki_file(pki::CA_CRT)),
        flag("cluster-signing-cert-file", l.pki_file(pki::CA_CRT)),
        flag("cluster-signing-key-file", l.pki_file(pki::CA_KEY)),
        flag("service-cluster-ip-range", SERVICE_CIDR),
    ]);
    args
}

fn scheduler_args(l: &Layout) -> Vec<String> {
    client_component_args(l, &l.kubeconfig("scheduler"), l.ports.scheduler)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            dir: PathBuf::from("/c"),
            pki: PathBuf::from("/c/pki"),
            bin: PathBuf::from("/b"),
            ports: Ports::for_minor(34),
            advertise: Ipv4Addr::new(192, 0, 2, 2),
            bind: Ipv4Addr::LOCALHOST,
        }
    }

    fn value(args: &[String], name: &str) -> Option<String> {
        let prefix = format!("--{name}=");
        let found: Vec<&String> = args.iter().filter(|a| a.starts_with(&prefix)).collect();
        assert!(found.len() <= 1, "--{name} given twice: {found:?}");
        found.first().map(|a| a[prefix.len()..].to_string())
    }

    #[test]
    fn the_apiserver_authorizes_nodes_and_restricts_them() {
        let args = Component::KubeApiserver.args(&layout());
        assert_eq!(
            value(&args, "authorization-mode").as_deref(),
            Some("Node,RBAC")
        );
        assert!(
            value(&args, "enable-admission-plugins").is_some_and(|v| v.contains("NodeRestriction"))
        );
        assert_eq!(
            value(&args, "enable-bootstrap-token-auth").as_deref(),
            Some("true")
        );
        assert_eq!(value(&args, "allow-privileged").as_deref(), Some("true"));
        assert_eq!(
            value(&args, "service-cluster-ip-range").as_deref(),
            Some("10.0.0.0/24")
        );
        assert_eq!(
            value(&args, "etcd-servers").as_deref(),
            Some("http://127.0.0.1:16341")
        );
        assert_eq!(value(&args, "secure-port").as_deref(), Some("16343"));
        assert_eq!(value(&args, "bind-address").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            value(&args, "advertise-address").as_deref(),
            Some("192.0.2.2")
        );
        assert_eq!(
            value(&args, "kubelet-certificate-authority").as_deref(),
            Some("/c/pki/ca.crt")
        );
        assert_eq!(
            value(&args, "service-account-issuer").as_deref(),
            Some(SERVICE_ACCOUNT_ISSUER)
        );
    }

    #[test]
    fn the_apiserver_audits_every_node_request_into_the_cluster_dir() {
        let args = Component::KubeApiserver.args(&layout());
        assert_eq!(
            value(&args, "audit-policy-file").as_deref(),
            Some("/c/audit-policy.yaml")
        );
        assert_eq!(
            value(&args, "audit-log-path").as_deref(),
            Some("/c/audit.log")
        );
        assert_eq!(value(&args, "audit-log-format").as_deref(), Some("json"));
        // Nodes at Request level (bodies kept), everyone else not at all.
        let rules = AUDIT_POLICY.split_once("rules:").expect("rules").1;
        let node = rules.find("level: Request").expect("a Request rule");
        let none = rules.find("level: None").expect("a catch-all None rule");
        assert!(node < none, "the node rule comes first:\n{AUDIT_POLICY}");
        assert!(rules.contains("userGroups: [\"system:nodes\"]"));
        assert!(AUDIT_POLICY.contains("omitStages: [RequestReceived]"));
    }

    #[test]
    fn the_controller_manager_signs_and_approves_kubelet_csrs_with_the_cluster_ca() {
        let args = Component::KubeControllerManager.args(&layout());
        assert_eq!(
            value(&args, "controllers").as_deref(),
            Some("*,bootstrapsigner,tokencleaner")
        );
        assert_eq!(
            value(&args, "cluster-signing-cert-file").as_deref(),
            Some("/c/pki/ca.crt")
        );
        assert_eq!(
            value(&args, "cluster-signing-key-file").as_deref(),
            Some("/c/pki/ca.key")
        );
        assert_eq!(
            value(&args, "root-ca-file").as_deref(),
            Some("/c/pki/ca.crt")
        );
        assert_eq!(
            value(&args, "use-service-account-credentials").as_deref(),
            Some("true")
        );
        assert_eq!(
            value(&args, "kubeconfig").as_deref(),
            Some("/c/controller-manager.kubeconfig")
        );
        assert_eq!(value(&args, "secure-port").as_deref(), Some("16347"));
    }

    #[test]
    fn etcd_listens_on_loopback_only_with_its_data_in_the_cluster_dir() {
        let args = Component::Etcd.args(&layout());
        for name in [
            "listen-client-urls",
            "listen-peer-urls",
            "advertise-client-urls",
        ] {
            let v = value(&args, name).expect(name);
            assert!(v.starts_with("http://127.0.0.1:"), "{name}={v}");
        }
        assert_eq!(value(&args, "data-dir").as_deref(), Some("/c/etcd"));
    }

    #[test]
    fn every_component_names_its_own_files() {
        let l = layout();
        assert_eq!(
            l.log(Component::KubeScheduler),
            Path::new("/c/kube-scheduler.log")
        );
        assert_eq!(l.pid_file(Component::Etcd), Path::new("/c/etcd.pid"));
        assert_eq!(
            l.binary(Component::KubeApiserver),
            Path::new("/b/kube-apiserver")
        );
        let sched = Component::KubeScheduler.args(&l);
        assert_eq!(
            value(&sched, "kubeconfig").as_deref(),
            Some("/c/scheduler.kubeconfig")
        );
        assert_eq!(value(&sched, "leader-elect").as_deref(), Some("false"));
    }
}
