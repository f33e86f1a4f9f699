//! The volume manager on the real runtime: emptyDir on disk and in memory,
//! hostPath types, downwardAPI files, fsGroup (also while the container
//! swaps its files for symlinks to the host's), subPath and subPathExpr, a
//! symlink planted to escape a subPath, unsupported types refused, and
//! teardown (also across an agent restart) that leaves nothing mounted.
//! Pods write what they see into a host directory mounted at `/out`.

mod support;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use evlet_testkit::eventually;
use support::{IMAGE, Running, World, container, e2e, running};

fn out_volume(dir: &Path) -> String {
    format!("  - {{name: out, hostPath: {{path: {}}}}}\n", dir.display())
}

const OUT: &str = "{name: out, mountPath: /out}";

fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .filter(|s| !s.is_empty())
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

/// Mount points under the agent's pod directories.
fn pod_mounts(w: &World) -> Vec<String> {
    let root = w.root.path().join("pods").display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|p| p.starts_with(&root))
        .collect()
}

fn pod_dir(agent: &Running, w: &World, pod: &str) -> PathBuf {
    let uid = agent
        .handles
        .workers
        .views()
        .into_iter()
        .find(|v| v.pod.metadata.name.as_deref() == Some(pod))
        .and_then(|v| v.pod.metadata.uid.clone())
        .expect("pod uid");
    w.root.path().join("pods").join(uid)
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_dirs_host_paths_and_downward_api_files_are_set_up_and_torn_down() {
    e2e(
        "empty_dirs_host_paths_and_downward_api_files_are_set_up_and_torn_down",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            let host = tempfile::tempdir().expect("host");
            let files = tempfile::tempdir().expect("files");
            let file = files.path().join("made-by-agent");
            w.write(
                "vols.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: vols, labels: {{app: shop, tier: \"front end\"}}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n{out}  - {{name: disk, emptyDir: {{}}}}\n  - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}\n  - {{name: dir, hostPath: {{path: {host}, type: Directory}}}}\n  - {{name: file, hostPath: {{path: {file}, type: FileOrCreate}}}}\n  - name: info\n    downwardAPI:\n      items:\n      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}\n      - {{path: pod/name, fieldRef: {{fieldPath: metadata.name}}, mode: 0600}}\n      - {{path: cpu, resourceFieldRef: {{containerName: app, resource: limits.cpu, divisor: 1m}}}}\n  containers:\n  - name: app\n    image: {IMAGE}\n    resources: {{limits: {{cpu: 250m, memory: 64Mi}}}}\n    command: [sh, -c, 'stat -c %a /disk > /out/disk-mode; df -k /mem | tail -1 > /out/mem-df; ls /dir > /out/dir-ls; cat /info/labels > /out/labels; cat /info/pod/name > /out/name; stat -L -c %a /info/pod/name > /out/name-mode; echo hi > /file; cat /info/cpu > /out/cpu; exec sleep 3600']\n    volumeMounts: [{OUT}, {{name: disk, mountPath: /disk}}, {{name: mem, mountPath: /mem}}, {{name: dir, mountPath: /dir}}, {{name: file, mountPath: /file}}, {{name: info, mountPath: /info}}]\n",
                    out = out_volume(out.path()),
                    host = host.path().display(),
                    file = file.display(),
                ),
            );
            std::fs::write(host.path().join("seen-inside"), "x").expect("host file");
            let agent = w.start().await;
            let pod = w.pod_name("vols");
            agent.running_id(&pod, "app").await;
            // The cpu file is the script's last write.
            eventually(Duration::from_secs(20), "the pod's report", || async {
                read(out.path(), "cpu").map(|_| ())
            })
            .await;
            assert_eq!(read(out.path(), "disk-mode").as_deref(), Some("777\n"));
            let df = read(out.path(), "mem-df").expect("df");
            let size_kib: u64 = df.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("size");
            assert_eq!(size_kib, 16 * 1024, "tmpfs sized by sizeLimit: {df}");
            assert!(df.starts_with("tmpfs"), "{df}");
            assert_eq!(read(out.path(), "dir-ls").as_deref(), Some("seen-inside\n"));
            assert_eq!(
                read(out.path(), "labels").as_deref(),
                Some("app=\"shop\"\ntier=\"front end\"")
            );
            assert_eq!(read(out.path(), "name"), Some(pod.clone()));
            assert_eq!(read(out.path(), "name-mode").as_deref(), Some("600\n"));
            assert_eq!(read(out.path(), "cpu").as_deref(), Some("250"));
            assert_eq!(std::fs::read_to_string(&file).expect("FileOrCreate").trim(), "hi");
            let dir = pod_dir(&agent, &w, &pod);
            let mem = dir.join("volumes/kubernetes.io~empty-dir/mem");
            assert!(pod_mounts(&w).contains(&mem.display().to_string()), "the tmpfs is the agent's");

            w.remove("vols.yaml");
            eventually(Duration::from_secs(30), "the pod's directory and mounts gone", || async {
                (!dir.exists() && pod_mounts(&w).is_empty()).then_some(())
            })
            .await;
            assert!(host.path().join("seen-inside").exists(), "a hostPath is never removed");
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_that_cannot_be_set_up_holds_the_pod_with_failed_mount_until_it_can() {
    e2e(
        "a_volume_that_cannot_be_set_up_holds_the_pod_with_failed_mount_until_it_can",
        |w| async move {
            let host = tempfile::tempdir().expect("host");
            let missing = host.path().join("later");
            w.write(
                "wait.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: wait}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: h, hostPath: {{path: {}, type: Directory}}}}\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600'], volumeMounts: [{{name: h, mountPath: /h}}]}}\n",
                    missing.display()
                ),
            );
            w.write(
                "nfs.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: nfs}}\nspec:\n  volumes:\n  - {{name: share, nfs: {{server: 192.0.2.1, path: /exports}}}}\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600'], volumeMounts: [{{name: share, mountPath: /share}}]}}\n"
                ),
            );
            let agent = w.start().await;
            let expected = format!(
                "MountVolume.SetUp failed for volume \"h\" : hostPath {} doesn't exist",
                missing.display()
            );
            eventually(Duration::from_secs(20), "FailedMount events", || async {
                let failed = events(&agent, "FailedMount");
                failed.contains(&expected).then_some(())
            })
            .await;
            let (sandboxes, containers) = w.runtime_objects("wait").await;
            assert!(
                sandboxes.is_empty() && containers.is_empty(),
                "nothing starts without its volumes"
            );
            let s = agent.status(&w.pod_name("wait")).expect("status");
            assert_eq!(
                container(&s, "app")
                    .and_then(|c| c.state.as_ref())
                    .and_then(|st| st.waiting.as_ref())
                    .and_then(|wt| wt.reason.as_deref()),
                Some("ContainerCreating")
            );
            std::fs::create_dir(&missing).expect("mkdir");
            agent.running_id(&w.pod_name("wait"), "app").await;
            let (_, nfs) = w.runtime_objects("nfs").await;
            assert!(
                nfs.is_empty(),
                "the nfs pod never runs: refused at validation (no plugin)"
            );
            assert!(
                agent.status(&w.pod_name("nfs")).is_none(),
                "a static pod refused at validation is not a pod of the node"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fs_group_gives_a_non_root_container_a_writable_empty_dir() {
    e2e(
        "fs_group_gives_a_non_root_container_a_writable_empty_dir",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            w.write(
                "fsg.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: fsg}}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}}\n  volumes:\n{}  - {{name: data, emptyDir: {{}}}}\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [sh, -c, 'mkdir /data/sub && touch /data/sub/f && id -G > /out/groups; exec sleep 3600']\n    volumeMounts: [{OUT}, {{name: data, mountPath: /data}}]\n",
                    out_volume(out.path())
                ),
            );
            std::fs::set_permissions(out.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .expect("chmod out");
            let agent = w.start().await;
            let pod = w.pod_name("fsg");
            agent.running_id(&pod, "app").await;
            let groups = eventually(Duration::from_secs(20), "the container's groups", || async {
                read(out.path(), "groups")
            })
            .await;
            assert!(
                groups.split_whitespace().any(|g| g == "2000"),
                "fsGroup is a supplemental group: {groups}"
            );
            let data = pod_dir(&agent, &w, &pod).join("volumes/kubernetes.io~empty-dir/data");
            let made = std::fs::metadata(data.join("sub/f")).expect("the container's file");
            assert_eq!((made.uid(), made.gid()), (1000, 2000), "setgid directory gives new files the group");
            let root = std::fs::metadata(&data).expect("volume");
            assert_eq!((root.gid(), root.mode() & 0o2000), (2000, 0o2000));
            agent.stop().await;
        },
    )
    .await;
}

/// Owner, group and mode of each path.
fn owners(paths: &[PathBuf]) -> Vec<(u32, u32, u32)> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(p).expect("host file");
            (m.uid(), m.gid(), m.mode() & 0o7777)
        })
        .collect()
}

/// Runs the fsGroup walk over `volume` `times` times, off the async threads.
async fn walk(volume: &Path, times: usize) {
    let volume = volume.to_owned();
    tokio::task::spawn_blocking(move || {
        for _ in 0..times {
            // Its outcome is in what the walk changed; the test looks at that.
            let _ = evlet::volume::ownership::apply(&volume, 4321, false, false);
        }
    })
    .await
    .expect("walks");
}

#[tokio::test(flavor = "multi_thread")]
async fn fs_group_never_changes_a_host_file_a_container_swaps_into_its_empty_dir() {
    e2e(
        "fs_group_never_changes_a_host_file_a_container_swaps_into_its_empty_dir",
        |w| async move {
            // A file and a directory of the host's that the pod cannot reach,
            // and whose names it writes as symlinks into its emptyDir, in
            // place of files and directories, again and again.
            let host = tempfile::tempdir().expect("host");
            let victim = host.path().join("victim");
            let victim_dir = host.path().join("victim-dir");
            let inner = victim_dir.join("inner");
            std::fs::write(&victim, "host\n").expect("victim");
            std::fs::create_dir(&victim_dir).expect("victim dir");
            std::fs::write(&inner, "host\n").expect("inner");
            for (p, mode) in [(&victim, 0o600), (&victim_dir, 0o700), (&inner, 0o600)] {
                std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                    .expect("chmod");
            }
            let watched = [victim.clone(), victim_dir.clone(), inner.clone()];
            let before = owners(&watched);
            let swap = format!(
                "cd /data; while :; do for n in 0 1 2 3 4 5 6 7; do rm -rf f$n d$n; ln -s {f} f$n; ln -s {d} d$n; rm -f f$n d$n; echo x > f$n; mkdir d$n; echo y > d$n/x; done; touch started; done",
                f = victim.display(),
                d = victim_dir.display(),
            );
            w.write(
                "swap.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: swap}}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {{fsGroup: 4321}}\n  volumes: [{{name: data, emptyDir: {{}}}}]\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [sh, -c, '{swap}']\n    volumeMounts: [{{name: data, mountPath: /data}}]\n"
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("swap");
            agent.running_id(&pod, "app").await;
            let data = pod_dir(&agent, &w, &pod).join("volumes/kubernetes.io~empty-dir/data");
            eventually(Duration::from_secs(30), "the container swapping its entries", || async {
                data.join("started").exists().then_some(())
            })
            .await;
            // The walk the agent runs at set-up, run over and over while the
            // container swaps; then an agent restart, whose syncs set the
            // volume up again (before the fix, every sync walked it), and
            // more walks.
            let mut walks = 0;
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(8) {
                walk(&data, 100).await;
                walks += 100;
                assert_eq!(owners(&watched), before, "a host file changed after {walks} walks");
            }
            agent.stop().await;
            let agent = w.start().await;
            agent.running_id(&pod, "app").await;
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(6) {
                walk(&data, 100).await;
                walks += 100;
                assert_eq!(owners(&watched), before, "a host file changed after {walks} walks and a restart");
            }
            let root = std::fs::metadata(&data).expect("volume");
            assert_eq!((root.gid(), root.mode() & 0o2000), (4321, 0o2000), "the volume itself has the group");
            w.remove("swap.yaml");
            eventually(Duration::from_secs(30), "the pod's directory gone", || async {
                (!data.exists()).then_some(())
            })
            .await;
            assert_eq!(owners(&watched), before, "the teardown left the host files alone");
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sub_paths_stay_in_their_volume_even_when_the_container_plants_a_symlink() {
    e2e(
        "sub_paths_stay_in_their_volume_even_when_the_container_plants_a_symlink",
        |w| async move {
            let out = tempfile::tempdir().expect("out");
            // First run: write through the subPaths, then replace the subPath
            // directory with a symlink to / and exit. The restart must not
            // mount the host's root at /sub.
            w.write(
                "sub.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: sub}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n{}  - {{name: data, emptyDir: {{}}}}\n  containers:\n  - name: app\n    image: {IMAGE}\n    env: [{{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]\n    command: [sh, -c, 'ls / > /out/listing-$(cat /data/runs 2>/dev/null || echo 0); echo x >> /data/runs; echo mine > /sub/file; echo expr > /byname/file; if [ $(wc -l < /data/runs) = 1 ]; then rm -rf /data/escape; ln -s / /data/escape; exit 1; fi; exec sleep 3600']\n    volumeMounts: [{OUT}, {{name: data, mountPath: /data}}, {{name: data, mountPath: /sub, subPath: escape}}, {{name: data, mountPath: /byname, subPathExpr: '$(POD)'}}]\n",
                    out_volume(out.path())
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("sub");
            eventually(Duration::from_secs(30), "the first run's listing", || async {
                read(out.path(), "listing-0").map(|_| ())
            })
            .await;
            let dir = pod_dir(&agent, &w, &pod);
            let data = dir.join("volumes/kubernetes.io~empty-dir/data");
            // The listing is the script's first write; the subPathExpr file
            // comes a few commands later.
            let by_name = eventually(Duration::from_secs(10), "the file written through subPathExpr", || async {
                std::fs::read_to_string(data.join(&pod).join("file")).ok().filter(|s| s.ends_with('\n'))
            })
            .await;
            assert_eq!(by_name, "expr\n", "subPathExpr expanded from the container's env");
            let s = agent
                .wait_status(&pod, "the restart refused", Duration::from_secs(30), |s| {
                    let wt = container(s, "app")?.state.as_ref()?.waiting.clone()?;
                    (wt.reason.as_deref() == Some("CreateContainerConfigError")).then(|| (s.clone(), wt))
                })
                .await;
            let message = s.1.message.unwrap_or_default();
            assert!(
                message.contains("failed to prepare subPath for volumeMount \"data\" of container \"app\""),
                "{message}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(
                read(out.path(), "listing-x").is_none() && !running(&s.0, "app"),
                "the container never ran with the host's root mounted"
            );
            let host_root_mounted = pod_mounts(&w)
                .iter()
                .any(|p| p.contains("volume-subpaths") && std::fs::read_dir(p).is_ok_and(|d| d.flatten().any(|e| e.file_name() == "proc")));
            assert!(!host_root_mounted, "no subPath mount shows the host's root");
            w.remove("sub.yaml");
            eventually(Duration::from_secs(30), "nothing left mounted", || async {
                (!dir.exists() && pod_mounts(&w).is_empty()).then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_restart_keeps_one_mount_per_volume_and_still_tears_down() {
    e2e(
        "an_agent_restart_keeps_one_mount_per_volume_and_still_tears_down",
        |w| async move {
            w.write(
                "mem.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: mem}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: m, emptyDir: {{medium: Memory}}}}]\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600'], volumeMounts: [{{name: m, mountPath: /m, subPath: deep/dir}}]}}\n"
                ),
            );
            let agent = w.start().await;
            let pod = w.pod_name("mem");
            agent.running_id(&pod, "app").await;
            let before = pod_mounts(&w);
            assert_eq!(before.len(), 2, "one tmpfs and one subPath bind: {before:?}");
            agent.stop().await;
            let agent = w.start().await;
            agent.running_id(&pod, "app").await;
            // Several syncs of the adopted pod.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut after = pod_mounts(&w);
            after.sort();
            let mut expected = before.clone();
            expected.sort();
            assert_eq!(after, expected, "set-up is idempotent across restarts");
            w.remove("mem.yaml");
            eventually(Duration::from_secs(30), "nothing left mounted", || async {
                pod_mounts(&w).is_empty().then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}
