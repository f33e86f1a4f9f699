//! The secured kubelet API with the real `kubectl`: the agent joins the real
//! control plane (`support/cluster.rs`), whose apiserver forwards pod `log`,
//! `exec` and `portforward` and node `proxy` requests to the agent's TLS port
//! (verifying its certificate with the cluster CA, presenting its own client
//! certificate); `kubectl logs` (`--tail`, `-f`, `--previous`), `kubectl exec
//! -i` (stdin and exit code), `kubectl port-forward` (a real TCP round trip)
//! and `kubectl get --raw .../proxy/...` run against it. Also: requests
//! straight to the port without credentials, with an unknown token, with a
//! token not allowed, and with client certificates good and bad, judged by
//! the cluster's TokenReview and RBAC.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster::{Api, Backend, api_e2e};
use evlet::config::{Authorization, SecureServing};
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::{IMAGE, Running, World};

/// The secured port's settings: webhook authentication and authorization,
/// the client certificates of `client_ca`, the API server's serving pair if
/// it has one for this node.
fn secure(api: &Api, client_ca: Option<PathBuf>) -> SecureServing {
    let serving = api.serving();
    SecureServing {
        address: "127.0.0.1:0".parse().expect("address"),
        tls_cert_file: serving.as_ref().map(|s| s.cert.clone()),
        tls_private_key_file: serving.as_ref().map(|s| s.key.clone()),
        client_ca_file: client_ca,
        anonymous: false,
        token_webhook: Some(Duration::from_secs(120)),
        authorization: Authorization::Webhook {
            allow_ttl: Duration::from_secs(300),
            deny_ttl: Duration::from_secs(30),
        },
    }
}

/// The agent, and the address of its read-only port.
async fn start(
    w: &World,
    api: &Api,
    client_ca: Option<PathBuf>,
) -> (Running, std::net::SocketAddr) {
    let mut config = w.config();
    let read_only = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    config.http.read_only = Some(read_only);
    config.secure = Some(secure(api, client_ca));
    // On the real cluster the node's address is the machine's own: the
    // apiserver's node proxy refuses loopback ("address not allowed").
    if let (Some(ip), Some(secure)) = (api.host_ip(), config.secure.as_mut()) {
        secure.address = std::net::SocketAddr::new(ip.parse().expect("an IP"), 0);
        config.node_ip = Some(ip);
    }
    let agent = api.start(w, config).await;
    eventually(
        Duration::from_secs(20),
        "node registered with its kubelet port",
        || async {
            let node = api.get("nodes", "", &w.name).await?;
            let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64()?;
            (Some(port) == agent.handles.secure_address.map(|a| u64::from(a.port()))).then_some(())
        },
    )
    .await;
    (agent, read_only)
}

/// kubectl as the admin, in the test's namespace: the cluster's own build
/// and admin kubeconfig, or for the mock `EVLET_KUBECTL` (else the one on
/// `PATH`) and a kubeconfig for the mock served at a loopback port.
struct Kubectl {
    bin: PathBuf,
    config: PathBuf,
    ns: String,
}

impl Kubectl {
    async fn new(api: &Api, dir: &Path) -> Self {
        let ns = api.ns().to_owned();
        if let Some((bin, config)) = api.kubectl() {
            return Self { bin, config, ns };
        }
        let addr = api.mock().serve_http().await;
        let config = dir.join("kubeconfig");
        std::fs::write(
            &config,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster: {{server: \"http://{addr}\"}}\nusers:\n- name: admin\n  user: {{token: admin}}\ncontexts:\n- name: mock\n  context: {{cluster: mock, user: admin, namespace: default}}\ncurrent-context: mock\n"
            ),
        )
        .expect("kubeconfig");
        let bin = std::env::var_os("EVLET_KUBECTL")
            .map_or_else(|| PathBuf::from("kubectl"), PathBuf::from);
        Self { bin, config, ns }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.config)
            .args(["--namespace", &self.ns])
            .args(args);
        cmd
    }

    /// Runs kubectl to the end: (exit code, stdout, stderr).
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let input = stdin.map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            let mut child = cmd
                .spawn()
                .expect("kubectl runs (install it with `cargo xtask setup`)");
            if let Some(text) = input {
                let mut pipe = child.stdin.take().expect("stdin");
                pipe.write_all(text.as_bytes()).expect("write stdin");
            }
            let out = child.wait_with_output().expect("kubectl output");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .expect("join")
    }
}

/// A pod of one container that stops within a second.
fn api_pod(api: &Api, w: &World, name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["terminationGracePeriodSeconds"] = json!(1);
    api.pod(w, name, spec)
}

async fn running(api: &Api, pod: &str) {
    eventually(
        Duration::from_secs(60),
        &format!("{pod} running"),
        || async {
            let p = api.get("pods", api.ns(), pod).await?;
            (p["status"]["containerStatuses"][0]["state"]["running"].is_object()).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_exec_port_forward_and_node_proxy_reach_the_agent() {
    api_e2e(
        "kubectl_logs_exec_port_forward_and_node_proxy_reach_the_agent",
        Backend::Real,
        |w, api| async move {
            let dir = tempfile::tempdir().expect("dir");
            let kc = Kubectl::new(&api, dir.path()).await;
            // The apiserver's client certificate is the cluster CA's.
            let client_ca = api.serving().map(|s| s.client_ca);
            let (agent, _) = start(&w, &api, client_ca).await;
            let ns = api.ns();
            let talker = w.pod_name("talker");
            api.create("pods", ns, api_pod(&api, &w, "talker", json!({
                "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c",
                    "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done"]}]
            }))).await;
            let crasher = w.pod_name("crasher");
            api.create("pods", ns, api_pod(&api, &w, "crasher", json!({
                "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c",
                    "echo attempt $(cat /proc/uptime); sleep 1; exit 3"]}]
            }))).await;
            let web = w.pod_name("web");
            api.create("pods", ns, api_pod(&api, &w, "web", json!({
                "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c",
                    "mkdir /www && echo served-by-pod > /www/index.html && exec httpd -f -p 8080 -h /www"]}]
            }))).await;
            api.create("pods", ns, api_pod(&api, &w, "pending", json!({
                "containers": [{"name": "main", "image": "evlet.local/absent:v1", "imagePullPolicy": "Never"}]
            }))).await;
            running(&api, &talker).await;
            running(&api, &web).await;

            // kubectl logs, with --tail.
            let logs = eventually(Duration::from_secs(20), "three lines logged", || async {
                let (code, out, _) = kc.run(&["logs", &talker], None).await;
                (code == 0 && out.contains("line 2\n")).then_some(out)
            })
            .await;
            assert!(logs.starts_with("line 0\nline 1\n"), "{logs}");
            let (code, tail, err) = kc.run(&["logs", "--tail=1", &talker], None).await;
            assert_eq!(code, 0, "{err}");
            assert_eq!(tail.lines().count(), 1, "{tail}");
            assert!(tail.starts_with("line "), "{tail}");

            // kubectl logs -f: lines keep arriving.
            let mut follow = kc.command(&["logs", "-f", "--tail=1", &talker])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("kubectl logs -f");
            let stdout = follow.stdout.take().expect("stdout");
            let followed = tokio::task::spawn_blocking(move || {
                let mut lines = std::io::BufReader::new(stdout).lines();
                (0..4).filter_map(|_| lines.next()?.ok()).collect::<Vec<_>>()
            });
            let followed = tokio::time::timeout(Duration::from_secs(20), followed)
                .await
                .expect("followed lines within 20 s")
                .expect("join");
            let _ = follow.kill();
            let _ = follow.wait();
            let numbers: Vec<u64> = followed
                .iter()
                .filter_map(|l| l.strip_prefix("line ")?.parse().ok())
                .collect();
            assert_eq!(numbers.len(), 4, "{followed:?}");
            assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "consecutive: {numbers:?}");

            // kubectl logs --previous: the run before the restart.
            let previous = eventually(Duration::from_secs(60), "a restart of crasher", || async {
                let (code, out, _) = kc.run(&["logs", "--previous", &crasher], None).await;
                (code == 0 && out.starts_with("attempt ")).then_some(out)
            })
            .await;
            assert_eq!(previous.lines().count(), 1, "{previous}");
            let (code, _, err) = kc.run(&["logs", &w.pod_name("pending")], None).await;
            assert_ne!(code, 0);
            assert!(
                err.contains(&format!("container \"main\" in pod \"{}\" is waiting to start: ", w.pod_name("pending"))),
                "the kubelet's reason reaches kubectl: {err}"
            );

            // kubectl exec -i: stdin in, stdout out, the exit code back.
            let (code, out, err) = kc.run(
                &["exec", "-i", &talker, "--", "sh", "-c", "read x; echo got $x; echo oops >&2; exit 7"],
                Some("hello\n"),
            )
            .await;
            assert_eq!(out, "got hello\n", "{err}");
            assert!(err.contains("oops"), "{err}");
            assert_eq!(code, 7, "the command's exit code: {err}");
            let (code, out, err) = kc.run(&["exec", &talker, "--", "cat", "/proc/1/cmdline"], None).await;
            assert_eq!(code, 0, "{err}");
            assert!(out.starts_with("/bin/sh"), "{out}");

            // kubectl port-forward: a real TCP round trip to the pod's port.
            let mut pf = kc.command(&["port-forward", &format!("pod/{web}"), ":8080"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("kubectl port-forward");
            let pf_out = pf.stdout.take().expect("stdout");
            // kubectl prints a line per connection: keep reading its stdout,
            // or it dies of SIGPIPE on the first connection.
            let (port_tx, port_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(pf_out).lines().map_while(Result::ok) {
                    // "Forwarding from 127.0.0.1:41223 -> 8080"
                    if let Some(port) = line
                        .strip_prefix("Forwarding from 127.0.0.1:")
                        .and_then(|r| r.split(' ').next()?.parse::<u16>().ok())
                    {
                        let _ = port_tx.send(port);
                    }
                }
            });
            let local = tokio::task::spawn_blocking(move || port_rx.recv_timeout(Duration::from_secs(20)))
                .await
                .expect("join")
                .expect("port-forward listening within 20 s");
            let body = tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", local)).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
                s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").expect("request");
                let mut body = String::new();
                let _ = s.read_to_string(&mut body);
                body
            })
            .await
            .expect("join");
            let _ = pf.kill();
            let pf_err = pf.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
            assert!(body.starts_with("HTTP/1.1 200 OK\r\n"), "{body:?}; kubectl said: {pf_err}");
            assert!(body.ends_with("served-by-pod\n"), "{body}");

            // Node proxy: the API server's path to the kubelet's own endpoints.
            let (code, pods, err) = kc.run(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/pods", w.name)], None).await;
            assert_eq!(code, 0, "{err}");
            let pods: Value = serde_json::from_str(&pods).expect("a PodList");
            assert_eq!(pods["kind"], "PodList");
            // kubectl get --raw .../proxy/stats/summary: the stats API, with the pods' containers.
            let (code, summary, err) = kc.run(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/stats/summary", w.name)], None).await;
            assert_eq!(code, 0, "{err}");
            let summary: Value = serde_json::from_str(&summary).expect("a Summary");
            assert_eq!(summary["node"]["nodeName"], w.name.as_str());
            assert!(summary["node"]["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0, "{}", summary["node"]);
            assert!(summary["node"]["fs"]["capacityBytes"].as_u64().unwrap_or(0) > 0);
            let pod = summary["pods"]
                .as_array()
                .and_then(|p| p.iter().find(|p| p["podRef"]["name"] == talker.as_str()))
                .cloned()
                .expect("the talker's stats");
            assert_eq!(pod["containers"][0]["name"], "main");
            assert!(pod["containers"][0]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0, "{pod}");
            assert!(pod["containers"][0]["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0, "{pod}");
            assert!(pod["containers"][0]["logs"]["usedBytes"].as_u64().unwrap_or(0) > 0, "{pod}");
            let (code, metrics, err) = kc.run(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/metrics/resource", w.name)], None).await;
            assert_eq!(code, 0, "{err}");
            assert!(
                metrics.contains(&format!("container_cpu_usage_seconds_total{{container=\"main\",namespace=\"{ns}\",pod=\"{talker}\"}} ")),
                "{metrics}"
            );
            // `evlet diag` from off the node: the diagnostics (not on the
            // read-only port) through the API server's node proxy, as the admin.
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_evlet"))
                .arg("diag")
                .arg("--kubeconfig")
                .arg(&kc.config)
                .args(["--node", &w.name, "-o", "json", "pleg"])
                .output()
                .await
                .expect("evlet diag");
            assert!(out.status.success(), "evlet diag: {}", String::from_utf8_lossy(&out.stderr));
            let pleg: Value = serde_json::from_slice(&out.stdout).expect("the PLEG view");
            assert!(pleg["mode"].is_string(), "{pleg}");
            // Every request reached the kubelet authenticated (the real
            // apiserver's client certificate, the mock's token, checked by
            // TokenReview) and authorized by SubjectAccessReview.
            if !api.is_real() {
                assert!(!api.requests_matching("POST", "/tokenreviews").await.is_empty());
            }
            assert!(!api.requests_matching("POST", "/subjectaccessreviews").await.is_empty());
            agent.stop().await;
        },
    )
    .await;
}

/// GET `path` on the agent's secured port with `token` (and a client
/// certificate, if given): (status, body), or the TLS error.
async fn get(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
    cert: Option<(&Path, &Path)>,
) -> Result<(u16, String), String> {
    let mut args = vec![
        "-sk".to_owned(),
        "-o".into(),
        "-".into(),
        "-w".into(),
        "\n%{http_code}".into(),
        format!("https://{addr}{path}"),
    ];
    if let Some(t) = token {
        args.extend(["-H".into(), format!("Authorization: Bearer {t}")]);
    }
    if let Some((c, k)) = cert {
        args.extend([
            "--cert".into(),
            c.display().to_string(),
            "--key".into(),
            k.display().to_string(),
        ]);
    }
    let out = tokio::process::Command::new("curl")
        .args(&args)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "curl exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (body, code) = text.rsplit_once('\n').ok_or("no status")?;
    Ok((code.parse().map_err(|_| "bad status")?, body.to_owned()))
}

/// A CA and a client certificate it signed for `cn` in group `o`, as PEM files.
fn client_cert(dir: &Path, tag: &str, cn: &str, o: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{tag}-ca"));
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, o);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca_cert, &ca_key).expect("cert");
    let paths = (
        dir.join(format!("{tag}-ca.crt")),
        dir.join(format!("{tag}.crt")),
        dir.join(format!("{tag}.key")),
    );
    std::fs::write(&paths.0, ca_cert.pem()).expect("write");
    std::fs::write(&paths.1, cert.pem()).expect("write");
    std::fs::write(&paths.2, key.serialize_pem()).expect("write");
    paths
}

#[tokio::test(flavor = "multi_thread")]
async fn the_secured_port_authenticates_and_authorizes_every_request() {
    api_e2e(
        "the_secured_port_authenticates_and_authorizes_every_request",
        Backend::Real,
        |w, api| async move {
            let (reader_token, reader) = api.token_for("reader").await;
            api.allow(&reader, "pods").await;
            let dir = tempfile::tempdir().expect("dir");
            // Users of this test alone: the cluster's RBAC is shared.
            let alice = format!("alice-{}", w.name);
            let (ca, alice_cert, alice_key) = client_cert(dir.path(), "good", &alice, "ops");
            let (_, mallory_cert, mallory_key) = client_cert(dir.path(), "rogue", "mallory", "ops");
            api.allow(&alice, "stats").await;
            // Allowed everything, as the API server's own kubelet client.
            let (client_token, client_user) = api.token_for("kubelet-client").await;
            api.allow(&client_user, "*").await;
            let (agent, ro) = start(&w, &api, Some(ca)).await;
            let addr = agent.handles.secure_address.expect("served");

            assert_eq!(get(addr, "/pods", None, None).await, Ok((401, "Unauthorized".into())));
            assert_eq!(get(addr, "/pods", Some("forged"), None).await, Ok((401, "Unauthorized".into())));
            let (code, body) = get(addr, "/pods", Some(&reader_token), None).await.expect("answer");
            assert_eq!(code, 200, "{body}");
            assert_eq!(
                get(addr, "/exec/default/p/c?command=ls&output=1", Some(&reader_token), None).await,
                Ok((403, format!("Forbidden (user={reader}, verb=get, resource=nodes, subresource(s)=[proxy])\n")))
            );
            let (code, summary) = get(addr, "/stats/summary", None, Some((&alice_cert, &alice_key)))
                .await
                .expect("alice's certificate authenticates her and she may read stats");
            assert_eq!(code, 200, "{summary}");
            let summary: Value = serde_json::from_str(&summary).expect("a Summary");
            assert_eq!(summary["node"]["nodeName"], w.name.as_str());
            assert_eq!(
                get(addr, "/pods", None, Some((&alice_cert, &alice_key))).await,
                Ok((403, format!("Forbidden (user={alice}, verb=get, resource=nodes, subresource(s)=[pods proxy])\n")))
            );
            let rogue = get(addr, "/pods", None, Some((&mallory_cert, &mallory_key))).await;
            assert!(rogue.is_err(), "a certificate from another CA is refused in the handshake: {rogue:?}");
            // Errors name the object, in upstream's words.
            let client = Some(client_token.as_str());
            assert_eq!(
                get(addr, "/containerLogs/default/ghost/c", client, None).await,
                Ok((404, "pod \"ghost\" does not exist".into()))
            );
            assert_eq!(
                get(addr, "/exec/default/ghost/c?command=ls&output=1", client, None).await,
                Ok((404, "pod does not exist".into()))
            );
            assert_eq!(
                get(addr, "/containerLogs/default/p/c?tailLines=-1", client, None).await,
                Ok((422, "{\"message\": \"Invalid request.\"}".into()))
            );
            // The read-only port never serves the operator endpoints.
            let (code, _, body) = support::http_get(ro, "/containerLogs/default/p/c").await;
            assert_eq!((code, body.as_str()), (405, "Debug endpoints are disabled.\n"));
            agent.stop().await;
        },
    )
    .await;
}
