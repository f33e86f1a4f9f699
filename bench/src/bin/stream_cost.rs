//! What the kubelet API's streams cost, on the real runtime.
//!
//! Starts the release `evlet` standalone on the private containerd with its
//! secured port (client certificates from a CA made here, `AlwaysAllow`) and
//! two static pods: `writer` prints 100-byte lines as fast as it can, `idle`
//! sleeps. Then it measures:
//! * **`logs -f` throughput**: `GET /containerLogs/...?follow=true` over TLS,
//!   bytes received per second over a window, next to what the runtime wrote
//!   to the log file meanwhile (the most a follower could get);
//! * **exec round trip**: `exec -- true` over WebSocket (`v4.channel.k8s.io`,
//!   what the runtime's streaming server speaks) from the request to the exit
//!   status, through evlet (TLS, authentication, CRI `Exec`, the proxy), and
//!   straight to the runtime's streaming server (CRI `Exec`, then its URL);
//! * **pod start with volumes**: manifest written → container started, one
//!   pod at a time, without volumes and with five (emptyDir on disk and in
//!   memory, hostPath, downwardAPI, projected), so the volume manager's share
//!   of a start shows.
//!
//! Output: `<out>/stream-cost-<timestamp>.{json,md,png}` (and
//! `latest-stream-cost.*` for full runs). Run it through xtask, which brings
//! up the containerd 1.7 node:
//!
//! ```sh
//! cargo xtask bench --suite streams            # 30 s window, 200 execs, 20 starts each
//! cargo xtask bench --suite streams --quick    # 5 s, 20 execs, 3 starts each
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evlet_bench::{Agent, AgentSpec, NODE};
use futures_util::StreamExt as _;
use serde::Serialize;
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

#[derive(Debug, Parser)]
struct Args {
    /// 5 s window and 20 execs: proves the harness works.
    #[arg(long)]
    quick: bool,
    /// The evlet binary.
    #[arg(long, env = "EVLET_BIN")]
    evlet: PathBuf,
    /// Where results go.
    #[arg(long)]
    out: PathBuf,
    /// Scratch space.
    #[arg(long)]
    work: PathBuf,
    /// The command line to print in the report.
    #[arg(long, default_value = "cargo xtask bench --suite streams")]
    command: String,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    samples: usize,
}

#[derive(Debug, Serialize)]
struct Results {
    started: String,
    /// `release` or `debug`: the profile of the evlet binary measured.
    build: String,
    command: String,
    quick: bool,
    kernel: String,
    cpus: usize,
    window_s: f64,
    logs_follow_mb_s: f64,
    runtime_wrote_mb_s: f64,
    logs_text_share: f64,
    exec_via_evlet: Latency,
    exec_direct: Latency,
    /// Manifest written → container started (CRI `startedAt`), no volumes.
    start_no_volumes: Latency,
    /// The same with five volumes (emptyDir on disk and in memory, hostPath,
    /// downwardAPI, projected downwardAPI).
    start_five_volumes: Latency,
}

struct Node {
    endpoint: String,
    cgroup_root: String,
    image: String,
}

impl Node {
    fn from_env() -> Result<Self> {
        let var = |k: &str| {
            std::env::var(k)
                .with_context(|| format!("{k} is not set: run through `cargo xtask bench`"))
        };
        Ok(Self {
            endpoint: var("EVLET_CRI_ENDPOINT")?,
            cgroup_root: format!("{}/stream-bench", var("EVLET_CGROUP_ROOT")?),
            image: var("EVLET_TEST_IMAGE")?,
        })
    }
}

/// A CA and a client certificate it signed (CN `bench`), as PEM files.
struct Certs {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn certs(dir: &Path) -> Result<Certs> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "stream-bench-ca");
    let ca_cert = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "bench");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca_cert, &ca_key)?;
    let out = Certs {
        ca: dir.join("ca.crt"),
        cert: dir.join("client.crt"),
        key: dir.join("client.key"),
    };
    std::fs::write(&out.ca, ca_cert.pem())?;
    std::fs::write(&out.cert, cert.pem())?;
    std::fs::write(&out.key, key.serialize_pem())?;
    Ok(out)
}

/// TLS to evlet: its self-signed certificate accepted, our client certificate presented.
fn tls(certs: &Certs) -> Result<tokio_rustls::TlsConnector> {
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = rustls_pemfile::certs(&mut std::fs::read(&certs.cert)?.as_slice())
        .collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut std::fs::read(&certs.key)?.as_slice())?
        .context("client key")?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn connect(
    tls: &tokio_rustls::TlsConnector,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    Ok(tls.connect(name, tcp).await?)
}

fn percentiles(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Latency {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        samples: samples.len(),
    }
}

/// Runs one exec over a WebSocket already connected with `request`, until
/// its status arrives on channel 3; fails unless it is `Success`.
async fn exec_once<S>(stream: S, url: &str) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "v4.channel.k8s.io".parse()?);
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream).await?;
    while let Some(msg) = ws.next().await {
        if let Message::Binary(data) = msg?
            && data.first() == Some(&3)
        {
            let status: serde_json::Value = serde_json::from_slice(&data[1..])?;
            if status["status"] != "Success" {
                bail!("exec failed: {status}");
            }
            let _ = ws.close(None).await;
            return Ok(());
        }
    }
    bail!("the exec stream ended without a status")
}

async fn pods_running(agent: &Agent, names: &[String]) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = agent.http.json("/pods").await?.context("/pods")?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let all = names.iter().all(|n| {
            items.iter().any(|p| {
                p["metadata"]["name"] == n.as_str()
                    && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
            })
        });
        if all {
            return Ok(list);
        }
        if Instant::now() > deadline {
            bail!("the pods did not run within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The ID of `pod`'s first container in a `/pods` list.
fn container_id(list: &serde_json::Value, pod: &str) -> Option<String> {
    list["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == pod)?["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .map(|s| s.trim_start_matches("containerd://").to_owned())
}

/// Pods started one after another to time their start.
struct Starts<'a> {
    agent: &'a Agent,
    cri: &'a evlet_cri::RuntimeClient,
    manifests: &'a Path,
    image: &'a str,
    count: usize,
}

impl Starts<'_> {
    /// Starts `count` pods named `<kind><i>`, each with `volumes` (YAML, may
    /// be empty) mounted by `mounts`, and times manifest written → the
    /// runtime's own `startedAt` (nanoseconds; the API's timestamps have only
    /// seconds) of the container `/pods` shows running.
    async fn latency(&self, kind: &str, volumes: &str, mounts: &str) -> Result<Latency> {
        let mut samples = Vec::new();
        for i in 0..self.count {
            let name = format!("{kind}{i}");
            let yaml = format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: bench}}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{volumes}  containers:\n  - name: main\n    image: {}\n    command: [sleep, '86400']\n{mounts}",
                self.image
            );
            let written = jiff::Timestamp::now();
            write_manifest(self.manifests, &format!("{name}.yaml"), &yaml)?;
            let full = format!("{name}-{NODE}");
            let list = pods_running(self.agent, std::slice::from_ref(&full)).await?;
            let id =
                container_id(&list, &full).with_context(|| format!("{full}'s container ID"))?;
            let started_ns = self
                .cri
                .container_status(&evlet_cri::ContainerId::new(&id))
                .await?
                .started_at;
            let took = i128::from(started_ns) - written.as_nanosecond();
            let took = u64::try_from(took)
                .with_context(|| format!("{full} started before its manifest was written"))?;
            samples.push(Duration::from_nanos(took));
        }
        Ok(percentiles(samples))
    }
}

async fn measure(
    args: &Args,
    node: &Node,
    agent: &Agent,
    certs: &Certs,
    port: u16,
) -> Result<Results> {
    let (window, execs) = if args.quick {
        (Duration::from_secs(5), 20)
    } else {
        (Duration::from_secs(30), 200)
    };
    let writer = format!("writer-{NODE}");
    let idle = format!("idle-{NODE}");
    let list = pods_running(agent, &[writer.clone(), idle.clone()]).await?;
    let idle_id = container_id(&list, &idle).context("the idle container's ID")?;
    let cri = evlet_cri::RuntimeClient::connect(&node.endpoint, evlet_cri::Options::default())?;
    let writer_id = container_id(&list, &writer).context("the writer's ID")?;
    let log_path = PathBuf::from(
        cri.container_status(&evlet_cri::ContainerId::new(&writer_id))
            .await?
            .log_path,
    );
    let tls = tls(certs)?;

    // logs -f
    let mut stream = connect(&tls, port).await?;
    let request = format!(
        "GET /containerLogs/default/{writer}/main?follow=true&tailLines=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    );
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await?;
    let file_start = std::fs::metadata(&log_path)?.len();
    let t0 = Instant::now();
    let mut received = 0_u64;
    let mut buf = vec![0_u8; 256 * 1024];
    while t0.elapsed() < window {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) => bail!("the log stream ended"),
            Ok(Ok(n)) => received += n as u64,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {}
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let file_end = std::fs::metadata(&log_path)?.len();
    drop(stream);
    // A record is `<time> stdout F <100-byte line>\n`: the text's share of it.
    let record = std::fs::read_to_string(&log_path)
        .ok()
        .and_then(|t| t.lines().last().map(|l| l.len() + 1))
        .unwrap_or(140);
    let text_share = 101.0 / record as f64;

    // exec -- true, through evlet and straight to the runtime.
    let mut via = Vec::new();
    let mut direct = Vec::new();
    for _ in 0..execs {
        let t = Instant::now();
        let s = connect(&tls, port).await?;
        exec_once(
            s,
            &format!(
                "wss://127.0.0.1:{port}/exec/default/{idle}/main?command=true&output=1&error=1"
            ),
        )
        .await?;
        via.push(t.elapsed());
        let t = Instant::now();
        let url = cri
            .exec(evlet_cri::api::ExecRequest {
                container_id: idle_id.clone(),
                cmd: vec!["true".into()],
                tty: false,
                stdin: false,
                stdout: true,
                stderr: true,
            })
            .await?;
        let u: hyper::Uri = url.parse()?;
        let tcp =
            tokio::net::TcpStream::connect((u.host().context("host")?, u.port_u16().unwrap_or(80)))
                .await?;
        tcp.set_nodelay(true)?;
        exec_once(tcp, &url.replacen("http://", "ws://", 1)).await?;
        direct.push(t.elapsed());
    }
    let count = if args.quick { 3 } else { 20 };
    let manifests = args.work.join("stream-manifests");
    let host = args.work.join("stream-host");
    std::fs::create_dir_all(&host)?;
    let starts = Starts {
        agent,
        cri: &cri,
        manifests: &manifests,
        image: &node.image,
        count,
    };
    let start_no_volumes = starts.latency("plain", "", "").await?;
    let volumes = format!(
        "  volumes:\n  - {{name: disk, emptyDir: {{}}}}\n  - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}\n  - {{name: host, hostPath: {{path: {}, type: Directory}}}}\n  - {{name: info, downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}}}\n  - {{name: proj, projected: {{sources: [{{downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}}}]}}}}\n",
        host.display()
    );
    let mounts = "    volumeMounts: [{name: disk, mountPath: /disk}, {name: mem, mountPath: /mem}, {name: host, mountPath: /host}, {name: info, mountPath: /info}, {name: proj, mountPath: /proj}]\n";
    let start_five_volumes = starts.latency("vols", &volumes, mounts).await?;
    Ok(Results {
        start_no_volumes,
        start_five_volumes,
        started: String::new(),
        build: if args.evlet.components().any(|c| c.as_os_str() == "release") {
            "release"
        } else {
            "debug"
        }
        .to_owned(),
        command: args.command.clone(),
        quick: args.quick,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        window_s: took,
        logs_follow_mb_s: received as f64 / took / 1e6,
        runtime_wrote_mb_s: file_end.saturating_sub(file_start) as f64 / took / 1e6,
        logs_text_share: text_share,
        exec_via_evlet: percentiles(via),
        exec_direct: percentiles(direct),
    })
}

fn markdown(r: &Results) -> String {
    format!(
        "Run {} on {} CPUs, kernel {}, containerd 1.7, evlet {} build, standalone with client certificates.\nCommand: `{}`\n\n\
         | stream | through evlet | runtime alone |\n|---|---:|---:|\n\
         | `logs -f` of a container writing 100-byte lines flat out (MB/s of text) | {:.1} | {:.1} written ({:.1} MB/s of records) |\n\
         | `exec -- true` round trip p50 (ms) | {:.2} | {:.2} |\n\
         | `exec -- true` round trip p99 (ms) | {:.2} | {:.2} |\n\n\
         Pod start (manifest written → container started, p50 / p99 ms, {} pods each, one at a time): no volumes {:.0} / {:.0}; five volumes (emptyDir, emptyDir in memory, hostPath, downwardAPI, projected) {:.0} / {:.0}.\n\n\
         Window {:.0} s; {} execs each way. \"Runtime alone\" for exec is CRI `Exec` and its streaming URL dialled directly; for logs it is what the runtime wrote to the file meanwhile (the most any reader could follow).\n",
        r.started,
        r.cpus,
        r.kernel,
        r.build,
        r.command,
        r.logs_follow_mb_s,
        r.runtime_wrote_mb_s * r.logs_text_share,
        r.runtime_wrote_mb_s,
        r.exec_via_evlet.p50_ms,
        r.exec_direct.p50_ms,
        r.exec_via_evlet.p99_ms,
        r.exec_direct.p99_ms,
        r.start_no_volumes.samples,
        r.start_no_volumes.p50_ms,
        r.start_no_volumes.p99_ms,
        r.start_five_volumes.p50_ms,
        r.start_five_volumes.p99_ms,
        r.window_s,
        r.exec_via_evlet.samples,
    )
}

fn chart(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    evlet_bench::report::register_font()?;
    let root = BitMapBackend::new(path, (720, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let bars = [
        ("p50 via evlet", r.exec_via_evlet.p50_ms, BLUE),
        ("p50 direct", r.exec_direct.p50_ms, GREEN),
        ("p99 via evlet", r.exec_via_evlet.p99_ms, BLUE),
        ("p99 direct", r.exec_direct.p99_ms, GREEN),
    ];
    let top = bars.iter().map(|b| b.1).fold(1.0_f64, f64::max) * 1.2;
    let mut c = ChartBuilder::on(&root)
        .caption("exec -- true round trip (ms)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0..bars.len(), 0.0..top)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|i| bars.get(*i).map(|b| b.0.to_owned()).unwrap_or_default())
        .y_desc("ms")
        .draw()?;
    for (i, (_, v, color)) in bars.iter().enumerate() {
        c.draw_series(std::iter::once(Rectangle::new(
            [(i, 0.0), (i + 1, *v)],
            color.mix(0.6).filled(),
        )))?;
    }
    root.present()?;
    Ok(())
}

fn write_manifest(dir: &Path, name: &str, yaml: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let node = Node::from_env()?;
    let manifests = args.work.join("stream-manifests");
    let root = args.work.join("stream-root");
    for d in [&manifests, &root] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    std::fs::create_dir_all(&args.out)?;
    let certs = certs(&args.work)?;
    let line = "x".repeat(100);
    let pod = |name: &str, command: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    command: {command}\n",
            node.image
        )
    };
    write_manifest(
        &manifests,
        "writer.yaml",
        &pod("writer", &format!("[yes, '{}']", &line[..99])),
    )?;
    write_manifest(&manifests, "idle.yaml", &pod("idle", "[sleep, '86400']"))?;
    // No rotation during the window: the follower reads one file.
    let config = args.work.join("stream-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerLogMaxSize: 8Gi\npodLogsDir: {}\n",
            root.join("logs").display()
        ),
    )?;
    let port = 10259_u16;
    let log = args.work.join("stream-cost.log");
    let agent = Agent::start(&AgentSpec {
        binary: args.evlet.clone(),
        mode: "ebpf".into(),
        manifests: manifests.clone(),
        root: root.clone(),
        endpoint: node.endpoint.clone(),
        cgroup_root: node.cgroup_root.clone(),
        address: "127.0.0.1:10258".into(),
        log: log.clone(),
        extra: vec![
            "--config".into(),
            config.display().to_string(),
            "--port".into(),
            port.to_string(),
            "--client-ca-file".into(),
            certs.ca.display().to_string(),
            "--eviction-hard".into(),
            evlet_bench::EVICTION_HARD.into(),
        ],
    })
    .await?;
    let started = jiff::Timestamp::now();
    let measured = measure(&args, &node, &agent, &certs, port).await;
    for e in std::fs::read_dir(&manifests)?.flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let gone = Instant::now() + Duration::from_secs(60);
    while Instant::now() < gone {
        let left = agent
            .http
            .json("/pods")
            .await
            .ok()
            .flatten()
            .and_then(|l| l["items"].as_array().map(Vec::len))
            .unwrap_or(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    agent.stop().await?;
    let mut results = measured.with_context(|| format!("log {}", log.display()))?;
    results.started = started.strftime("%Y-%m-%d %H:%M UTC").to_string();
    let md = markdown(&results);
    evlet_bench::report::write_results(
        &args.out,
        "stream-cost",
        started,
        &results,
        &md,
        results.quick,
        |png| chart(&results, png),
    )?;
    println!("{md}");
    Ok(())
}
