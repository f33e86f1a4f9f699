//! Cluster-facing pod behaviour on the real runtime: `/etc/resolv.conf` per
//! `dnsPolicy`, the managed `/etc/hosts` with `hostAliases`, security
//! contexts (a privileged container mounts, an unprivileged one cannot;
//! `runAsNonRoot` refuses the root image; users and groups; seccomp
//! `RuntimeDefault` blocks `unshare`), `activeDeadlineSeconds`, and a
//! duplicate static-pod name refused. Pods write what they see into a host
//! directory mounted at `/out`.

mod support;

use std::path::Path;
use std::time::Duration;

use evlet_testkit::eventually;
use support::{IMAGE, Running, container, e2e};

fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .filter(|s| !s.is_empty())
}

async fn wait_file(dir: &Path, name: &str) -> String {
    eventually(Duration::from_secs(60), name, || async { read(dir, name) }).await
}

/// A pod with `spec` (indented two spaces) whose container `app` runs `script`
/// with the host directory `out` at `/out`.
fn manifest(name: &str, out: &Path, spec: &str, script: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}  volumes: [{{name: out, hostPath: {{path: {out}}}}}]\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [sh, -c, '{script}; exec sleep 3600']\n    volumeMounts: [{{name: out, mountPath: /out}}]\n{container_extra}",
        out = out.display()
    )
}

fn events(agent: &Running, reason: &str) -> Vec<String> {
    agent
        .handles
        .diagnostics
        .events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| e.message)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn resolv_conf_follows_the_dns_policy_and_etc_hosts_carries_the_names() {
    e2e(
        "resolv_conf_follows_the_dns_policy_and_etc_hosts_carries_the_names",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            let node_resolv = out.path().join("node-resolv.conf");
            std::fs::write(
                &node_resolv,
                "nameserver 192.0.2.53\nsearch corp.example\noptions edns0\n",
            )
            .expect("node resolv.conf");
            let dump = |file: &str| format!("cat /etc/resolv.conf > /out/{file}");
            for (name, spec) in [
                ("cluster", "  hostname: db\n  subdomain: replicas\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}]\n"),
                ("default", "  dnsPolicy: Default\n"),
                ("none", "  dnsPolicy: None\n  dnsConfig: {nameservers: [198.51.100.7], searches: [svc.example], options: [{name: ndots, value: \"2\"}]}\n"),
                ("merged", "  dnsConfig: {nameservers: [198.51.100.8], options: [{name: ndots, value: \"3\"}, {name: edns0}]}\n"),
                ("hostnet", "  hostNetwork: true\n"),
            ] {
                let script = if name == "cluster" {
                    format!("{}; cat /etc/hosts > /out/hosts; hostname > /out/hostname", dump(name))
                } else {
                    dump(name)
                };
                w.write(&format!("{name}.yaml"), &manifest(name, out.path(), spec, &script, ""));
            }
            let mut config = w.config();
            config.pods.cluster_dns = vec!["10.96.0.10".into()];
            config.pods.cluster_domain = "cluster.local".into();
            config.pods.resolv_conf = Some(node_resolv.clone());
            let agent = w.start_with(config).await;

            let cluster = wait_file(out.path(), "cluster").await;
            assert_eq!(
                cluster,
                "search default.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.96.0.10\noptions ndots:5\n",
                "ClusterFirst: the cluster's server, its search path before the node's"
            );
            let hosts = wait_file(out.path(), "hosts").await;
            assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"), "{hosts}");
            let ip = agent
                .wait_status(&w.pod_name("cluster"), "the pod IP", Duration::from_secs(30), |s| {
                    s.pod_ip.clone()
                })
                .await;
            assert!(
                hosts.contains(&format!("{ip}\tdb.replicas.default.svc.cluster.local\tdb\n")),
                "the pod's own line: {hosts}"
            );
            assert!(
                hosts.contains("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"),
                "{hosts}"
            );
            assert_eq!(wait_file(out.path(), "hostname").await, "db\n");

            assert_eq!(
                wait_file(out.path(), "default").await,
                "search corp.example\nnameserver 192.0.2.53\noptions edns0\n",
                "Default: the node's resolver"
            );
            assert_eq!(
                wait_file(out.path(), "none").await,
                "search svc.example\nnameserver 198.51.100.7\noptions ndots:2\n",
                "None: only dnsConfig"
            );
            assert_eq!(
                wait_file(out.path(), "merged").await,
                "search default.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.96.0.10\nnameserver 198.51.100.8\noptions ndots:3 edns0\n",
                "dnsConfig merged into ClusterFirst"
            );
            assert_eq!(
                wait_file(out.path(), "hostnet").await,
                "search corp.example\nnameserver 192.0.2.53\noptions edns0\n",
                "ClusterFirst on the host network falls back to Default"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn security_contexts_privilege_users_and_seccomp_are_enforced() {
    e2e(
        "security_contexts_privilege_users_and_seccomp_are_enforced",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            // Writable for the pod that runs as user 1000.
            std::fs::set_permissions(out.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .expect("chmod");
            let try_mount = |file: &str| {
                format!("mkdir -p /m && if mount -t tmpfs none /m; then echo mounted > /out/{file}; else echo refused > /out/{file}; fi")
            };
            let try_unshare = |file: &str| {
                format!("if unshare -U true; then echo allowed > /out/{file}; else echo blocked > /out/{file}; fi")
            };
            w.write("priv.yaml", &manifest("priv", out.path(), "", &try_mount("priv"), "    securityContext: {privileged: true}\n"));
            w.write("plain.yaml", &manifest("plain", out.path(), "", &try_mount("plain"), ""));
            w.write(
                "users.yaml",
                &manifest(
                    "users",
                    out.path(),
                    "  securityContext: {runAsUser: 1000, runAsGroup: 3000, supplementalGroups: [4000], runAsNonRoot: true}\n",
                    "id > /out/users",
                    "",
                ),
            );
            w.write(
                "rootimage.yaml",
                &manifest("rootimage", out.path(), "", "true", "    securityContext: {runAsNonRoot: true}\n"),
            );
            w.write("unconfined.yaml", &manifest("unconfined", out.path(), "", &try_unshare("unconfined"), ""));
            w.write(
                "confined.yaml",
                &manifest(
                    "confined",
                    out.path(),
                    "  securityContext: {seccompProfile: {type: RuntimeDefault}}\n",
                    &try_unshare("confined"),
                    "",
                ),
            );
            let agent = w.start().await;

            assert_eq!(wait_file(out.path(), "priv").await, "mounted\n");
            assert_eq!(wait_file(out.path(), "plain").await, "refused\n");
            assert_eq!(
                wait_file(out.path(), "users").await,
                "uid=1000 gid=3000 groups=3000,4000\n"
            );
            let pod = w.pod_name("rootimage");
            let message = agent
                .wait_status(&pod, "CreateContainerConfigError", Duration::from_secs(60), |s| {
                    let waiting = container(s, "app")?.state.as_ref()?.waiting.clone()?;
                    (waiting.reason.as_deref() == Some("CreateContainerConfigError"))
                        .then_some(waiting.message)
                        .flatten()
                })
                .await;
            assert!(
                message.starts_with("container has runAsNonRoot and image will run as root (pod: "),
                "{message}"
            );
            assert_eq!(wait_file(out.path(), "unconfined").await, "allowed\n");
            assert_eq!(
                wait_file(out.path(), "confined").await,
                "blocked\n",
                "RuntimeDefault seccomp blocks unshare"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_active_deadline_ends_the_pod_and_a_duplicate_static_name_is_refused() {
    e2e(
        "an_active_deadline_ends_the_pod_and_a_duplicate_static_name_is_refused",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            w.write(
                "deadline.yaml",
                &manifest(
                    "deadline",
                    out.path(),
                    "  activeDeadlineSeconds: 3\n",
                    "true",
                    "",
                ),
            );
            w.write(
                "a-first.yaml",
                &manifest("twin", out.path(), "", "echo first > /out/twin", ""),
            );
            w.write(
                "b-second.yaml",
                &manifest("twin", out.path(), "", "echo second > /out/twin", ""),
            );
            let agent = w.start().await;
            let pod = w.pod_name("deadline");
            agent.running_id(&pod, "app").await;
            let status = agent
                .wait_status(&pod, "phase Failed", Duration::from_secs(30), |s| {
                    (s.phase.as_deref() == Some("Failed")).then(|| s.clone())
                })
                .await;
            let stopped = agent
                .wait_status(
                    &pod,
                    "the container stopped",
                    Duration::from_secs(30),
                    |s| container(s, "app")?.state.as_ref()?.terminated.clone(),
                )
                .await;
            assert_eq!(stopped.exit_code, 137, "killed: {stopped:?}");
            assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
            assert_eq!(
                status.message.as_deref(),
                Some("Pod was active on the node longer than the specified deadline")
            );

            assert_eq!(wait_file(out.path(), "twin").await, "first\n");
            let refused = events(&agent, "FailedValidation");
            let twin = w.pod_name("twin");
            assert!(
                refused
                    .iter()
                    .any(|m| m.contains(&format!("due to duplicate pod name \"{twin}\""))),
                "{refused:?}"
            );
            let twins = agent
                .handles
                .workers
                .views()
                .into_iter()
                .filter(|v| v.pod.metadata.name.as_deref() == Some(twin.as_str()))
                .count();
            assert_eq!(twins, 1, "one pod of that name runs");
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_are_linked_for_shippers_rotated_compressed_and_bounded() {
    e2e(
        "logs_are_linked_for_shippers_rotated_compressed_and_bounded",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            let links = tempfile::tempdir().expect("links");
            let pod_logs = tempfile::tempdir().expect("pod logs");
            // About 200 KiB a second of numbered lines.
            w.write(
                "chatty.yaml",
                &manifest("chatty", out.path(), "", "i=0; while true; do i=$((i+1)); echo line $i $(head -c 2000 /dev/zero | tr \"\\\\0\" x); [ $((i % 100)) -eq 0 ] && sleep 1; done", ""),
            );
            let mut config = w.config();
            config.pods.pod_logs_dir = Some(pod_logs.path().to_path_buf());
            config.pods.container_log_links = Some(links.path().to_path_buf());
            config.pods.container_log_max_size = 64 << 10;
            config.pods.container_log_max_files = 3;
            config.pods.container_log_monitor_interval = Duration::from_millis(500);
            let agent = w.start_with(config).await;
            let pod = w.pod_name("chatty");
            let id = agent.running_id(&pod, "app").await;
            let id = id.trim_start_matches("containerd://").to_owned();
            let link = links.path().join(format!("{pod}_default_app-{id}.log"));
            let target = std::fs::read_link(&link).expect("the shipper's link");
            assert!(target.starts_with(pod_logs.path()), "{}", target.display());
            assert!(target.ends_with("app/0.log"), "{}", target.display());
            let dir = target.parent().expect("dir").to_path_buf();
            let rotated = eventually(Duration::from_secs(60), "two rotations, one compressed", || async {
                let names: Vec<String> = std::fs::read_dir(&dir)
                    .ok()?
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect();
                let gz = names.iter().filter(|n| n.ends_with(".gz")).count();
                (gz >= 1 && names.len() == 3).then_some(names)
            })
            .await;
            // Keep watching: the number of files stays bounded.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let count = std::fs::read_dir(&dir).expect("dir").count();
            assert!(count <= 3, "at most containerLogMaxFiles files: {count} ({rotated:?})");
            // Between the rename and the runtime's reopen there is no 0.log.
            let current = eventually(Duration::from_secs(5), "the current log, not mid-rotation", || async {
                std::fs::read_to_string(&target).ok()
            })
            .await;
            assert!(current.len() < 4 << 20, "the current file was reopened");
            w.remove("chatty.yaml");
            eventually(Duration::from_secs(30), "the link removed with the container", || async {
                (!link.exists() && std::fs::symlink_metadata(&link).is_err()).then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}

/// What the node cannot honour is refused, never run as if absent: fields no
/// part of evlet honours (`hostUsers: false`, an nfs volume, an unknown
/// seccomp profile type) at validation, so the static pod never becomes the
/// node's, and `supplementalGroupsPolicy: Strict` at admission where the
/// runtime does not report enforcing it (containerd 1.6 and 1.7 would merge
/// the image's groups silently); on 2.1, which enforces it, the pod runs.
#[tokio::test(flavor = "multi_thread")]
async fn fields_the_node_cannot_honour_are_refused_before_anything_runs() {
    e2e(
        "fields_the_node_cannot_honour_are_refused_before_anything_runs",
        |w| async move {
            let sleeper = format!("  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n");
            for (name, spec) in [
                ("userns", "  hostUsers: false\n"),
                (
                    "nfs",
                    "  volumes: [{name: share, nfs: {server: 192.0.2.1, path: /exports}}]\n",
                ),
                (
                    "seccomp",
                    "  securityContext: {seccompProfile: {type: Permissive}}\n",
                ),
                ("strict", "  securityContext: {supplementalGroupsPolicy: Strict}\n"),
                ("plain", ""),
            ] {
                w.write(
                    &format!("{name}.yaml"),
                    &format!(
                        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{spec}  terminationGracePeriodSeconds: 1\n  containers:\n{sleeper}"
                    ),
                );
            }
            let agent = w.start().await;
            agent.running_id(&w.pod_name("plain"), "app").await;
            let enforces_strict = w.node.containerd_version == "2.1";
            if enforces_strict {
                agent.running_id(&w.pod_name("strict"), "app").await;
            } else {
                let status = agent
                    .wait_status(
                        &w.pod_name("strict"),
                        "the Strict pod rejected",
                        Duration::from_secs(20),
                        |s| (s.phase.as_deref() == Some("Failed")).then(|| s.clone()),
                    )
                    .await;
                assert_eq!(
                    status.reason.as_deref(),
                    Some("SupplementalGroupsPolicyNotSupported")
                );
                assert!(
                    status
                        .message
                        .as_deref()
                        .is_some_and(|m| m.contains("spec.securityContext.supplementalGroupsPolicy")),
                    "{status:?}"
                );
            }
            for name in ["userns", "nfs", "seccomp"] {
                assert!(
                    agent.status(&w.pod_name(name)).is_none(),
                    "{name}: refused at validation, never the node's pod"
                );
            }
            for name in ["userns", "nfs", "seccomp", "strict"] {
                let (sandboxes, containers) = w.runtime_objects(name).await;
                if name == "strict" && enforces_strict {
                    continue;
                }
                assert!(
                    sandboxes.is_empty() && containers.is_empty(),
                    "{name}: nothing of it reached the runtime"
                );
            }
            agent.stop().await;
        },
    )
    .await;
}
