//! The manager over the fake CSR API (`fake.rs`): bootstrap, restart,
//! restart mid-bootstrap, rotation, denial; real time, certificates of
//! seconds.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::fake::{FakeApi, Policy};
use crate::certificate::{
    CertificateManager, Clients, Settings, csr, kubeconfig, rotation::KubeconfigState,
};
use tokio_util::sync::CancellationToken;

const NODE: &str = "system:node:node-1";
const BOOTSTRAPPER: &str = "system:bootstrap:abcdef";

fn settings(dir: &std::path::Path, rotate: bool) -> Settings {
    let bootstrap = dir.join("bootstrap.kubeconfig");
    std::fs::write(
        &bootstrap,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .expect("bootstrap kubeconfig");
    Settings {
        node_name: "node-1".into(),
        cert_dir: dir.join("pki"),
        kubeconfig: dir.join("kubelet.kubeconfig"),
        bootstrap_kubeconfig: Some(bootstrap),
        rotate_certificates: rotate,
        server_tls_bootstrap: Some((vec!["node-1".into()], vec!["10.0.0.5".parse().expect("ip")])),
        requested_duration: None,
        metrics: crate::metrics::CertificateMetrics::new(),
    }
}

struct Running {
    manager: Arc<CertificateManager>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(api: &FakeApi, s: Settings) -> Self {
        let manager = Arc::new(CertificateManager::new(s).expect("manager"));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&manager).run(
            Clients {
                node: api.client(NODE),
                bootstrap: Some(api.client(BOOTSTRAPPER)),
            },
            shutdown.clone(),
        ));
        Self {
            manager,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the manager stops on shutdown")
            .expect("no panic");
    }
}

async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(v) = f() {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn bootstrap_writes_the_pair_and_kubeconfig_and_a_restart_makes_no_new_csr() {
    let api = FakeApi::new(Policy::Issue(Duration::from_secs(3600)));
    let dir = tempfile::tempdir().expect("tmp");
    let s = settings(dir.path(), false);
    let running = Running::start(&api, s.clone());
    assert!(running.manager.client_certificate().is_none());
    tokio::time::timeout(Duration::from_secs(20), running.manager.client_ready())
        .await
        .expect("the client certificate arrives");
    until("the serving certificate", || {
        running.manager.serving_certificate()
    })
    .await;

    let created = api.created();
    let (bootstrap_csr, _) = created
        .iter()
        .find(|(n, u)| n.starts_with("node-csr-") && u == BOOTSTRAPPER)
        .expect("a node-csr made with the bootstrap credentials");
    let o = api.csr(bootstrap_csr).expect("csr");
    assert_eq!(o.spec.signer_name, csr::CLIENT_SIGNER);
    assert_eq!(
        o.spec.usages.as_deref(),
        Some(&["digital signature".to_owned(), "client auth".to_owned()][..])
    );
    let (serving_csr, _) = created
        .iter()
        .find(|(n, u)| n.starts_with("csr-") && u == NODE)
        .expect("a serving CSR made by the node");
    assert_eq!(
        api.csr(serving_csr).expect("csr").spec.signer_name,
        csr::SERVING_SIGNER
    );

    let pki = dir.path().join("pki");
    let current = std::fs::read_link(pki.join("kubelet-client-current.pem")).expect("link");
    assert!(
        current
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("kubelet-client-2")),
        "{current:?}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&current)
        .expect("pair")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!pki.join("kubelet-client.key.tmp").exists());
    assert!(std::fs::read_link(pki.join("kubelet-server-current.pem")).is_ok());
    let kc = kubeconfig::read(&s.kubeconfig).expect("the node's kubeconfig");
    assert_eq!(kc.server, "https://127.0.0.1:6443");
    assert_eq!(kc.ca_data.as_deref(), Some("Zm9v"));
    assert_eq!(
        kc.client_certificate,
        Some(kubeconfig::Source::File(
            pki.join("kubelet-client-current.pem")
        ))
    );
    assert!(matches!(
        kubeconfig::state(&s.kubeconfig, SystemTime::now()),
        KubeconfigState::Valid(_)
    ));
    let (_, ttl_until) = running.manager.client_certificate().expect("in use");
    running.manager.metrics().refresh(SystemTime::now());
    let ttl = running.manager.metrics().client_ttl.get();
    assert!(ttl > 3500.0 && ttl <= 3600.0, "{ttl}");
    running.stop().await;

    // A restart finds both certificates and asks for nothing.
    let again = Running::start(&api, s);
    assert_eq!(
        again.manager.client_certificate().map(|c| c.1),
        Some(ttl_until)
    );
    assert!(again.manager.serving_certificate().is_some());
    tokio::time::sleep(Duration::from_millis(500)).await;
    again.stop().await;
    assert_eq!(api.created().len(), created.len(), "no new CSR");
}

#[tokio::test]
async fn a_restart_mid_bootstrap_asks_with_the_same_key_and_csr() {
    let api = FakeApi::new(Policy::Hold);
    let dir = tempfile::tempdir().expect("tmp");
    let mut s = settings(dir.path(), false);
    s.server_tls_bootstrap = None;
    let first = Running::start(&api, s.clone());
    let name = until("the bootstrap CSR", || {
        api.created().first().map(|c| c.0.clone())
    })
    .await;
    let key = std::fs::read(dir.path().join("pki/kubelet-client.key.tmp")).expect("key.tmp");
    first.stop().await;

    let second = Running::start(&api, s);
    until("the existing CSR reused", || {
        (api.conflicts() == 1).then_some(())
    })
    .await;
    assert_eq!(api.created().len(), 1);
    api.issue(&name, Duration::from_secs(3600));
    tokio::time::timeout(Duration::from_secs(20), second.manager.client_ready())
        .await
        .expect("issued");
    assert!(!dir.path().join("pki/kubelet-client.key.tmp").exists());
    let pair =
        std::fs::read_to_string(dir.path().join("pki/kubelet-client-current.pem")).expect("pair");
    let key = String::from_utf8(key).expect("pem");
    assert!(
        pair.contains(key.trim()),
        "the pair holds the bootstrap key"
    );
    second.stop().await;
}

#[tokio::test]
async fn short_lived_certificates_are_renewed_by_the_node_without_a_restart() {
    let api = FakeApi::new(Policy::Issue(Duration::from_secs(4)));
    let dir = tempfile::tempdir().expect("tmp");
    let running = Running::start(&api, settings(dir.path(), true));
    tokio::time::timeout(Duration::from_secs(20), running.manager.client_ready())
        .await
        .expect("bootstrapped");
    let (first, _) = running.manager.client_certificate().expect("in use");
    let (second, _) = until("a rotated client certificate", || {
        running
            .manager
            .client_certificate()
            .filter(|(path, _)| *path != first)
    })
    .await;
    let link = std::fs::read_link(dir.path().join("pki/kubelet-client-current.pem"));
    assert_eq!(link.ok(), Some(second));
    let renewal = api
        .created()
        .into_iter()
        .find(|(n, u)| {
            u == NODE
                && api
                    .csr(n)
                    .is_some_and(|c| c.spec.signer_name == csr::CLIENT_SIGNER)
        })
        .expect("the renewal is asked by the node's own certificate");
    assert!(renewal.0.starts_with("csr-"), "{renewal:?}");
    until("a rotated serving certificate", || {
        (running.manager.metrics().server_rotation.get_sample_count() > 0).then_some(())
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn a_denied_csr_is_counted_and_asked_again() {
    let api = FakeApi::new(Policy::Deny);
    let dir = tempfile::tempdir().expect("tmp");
    let mut s = settings(dir.path(), false);
    s.server_tls_bootstrap = None;
    let running = Running::start(&api, s);
    until("a renewal error", || {
        (running.manager.metrics().client_renew_errors.get() >= 1).then_some(())
    })
    .await;
    api.set_policy(Policy::Issue(Duration::from_secs(3600)));
    tokio::time::timeout(Duration::from_secs(30), running.manager.client_ready())
        .await
        .expect("issued after the denial");
    let created = api.created();
    assert!(created.len() >= 2, "{created:?}");
    assert_ne!(
        created[0].0, created[1].0,
        "after a denial the next bootstrap CSR has a new key, so a new name"
    );
    running.stop().await;
}
