//! Design invariant 1 on the real runtime and kernel: a process that heads a
//! nested PID namespace, or lives in a cgroup made inside a container, is
//! never that container's init. Its exit (and the nested cgroup's removal)
//! leaves the container running, never restarted, one instance in the
//! runtime, whether the container has its own PID namespace, shares the
//! pod's, or uses the host's.

mod support;

use std::time::Duration;

use evlet::config::{Config, PlegMode};
use evlet_testkit::eventually;
use support::{IMAGE, Running, World, container, e2e, running};

fn ebpf(world: &World) -> Config {
    Config {
        pleg_mode: PlegMode::Ebpf,
        ..world.config()
    }
}

/// A pod whose privileged container `app` runs `script`, then prints `done`
/// and sleeps; `pod_spec` adds lines to the pod's spec.
fn pod(name: &str, pod_spec: &str, script: &str) -> String {
    let mut script: String = script.lines().map(|l| format!("      {l}\n")).collect();
    script.push_str("      echo done\n      exec /bin/sleep 3600\n");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{pod_spec}  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {IMAGE}\n    securityContext: {{privileged: true}}\n    command:\n    - /bin/sh\n    - -c\n    - |\n{script}"
    )
}

/// Three nested PID namespaces whose PID 1 exits with code 3.
const UNSHARE: &str =
    "sleep 2; for i in 1 2 3; do unshare -fp sh -c 'sleep 0.3; exit 3'; echo unshare $?; done";

/// Makes a cgroup below the container's own in every cgroup hierarchy it can
/// write (found through `cgroup.procs` listing this shell), moves a child
/// there that runs a nested PID namespace's init, then removes the cgroups.
/// Where the runtime mounted no cgroup2 (a cgroup v1 hybrid host), it mounts
/// one, as Docker-in-Docker and kind do. (No `$$`: the runtime's `$(VAR)`
/// expansion of commands would take it for an escaped `$`; a shell's own PID
/// is the first field of `/proc/self/stat` read by the shell itself.)
const NESTED_CGROUPS: &str = r#"sleep 2
read -r me rest < /proc/self/stat
if ! awk '$3=="cgroup2"{found=1} END{exit !found}' /proc/mounts; then
  mkdir -p /tmp/cg2 && mount -t cgroup2 none /tmp/cg2 && echo "mounted cgroup2"
fi
for m in $(awk '$3=="cgroup"||$3=="cgroup2"{print $2}' /proc/mounts); do
  f=$(find "$m" -maxdepth 12 -name cgroup.procs 2>/dev/null | xargs grep -lx "$me" 2>/dev/null | head -n 1)
  [ -n "$f" ] || continue
  d=$(dirname "$f")/nested
  if mkdir "$d" 2>/dev/null; then
    echo "$d" >> /tmp/nested
    echo "made $(awk -v m="$m" '$2==m{print $3}' /proc/mounts) $d"
  fi
done
[ -s /tmp/nested ] || echo "made nothing: pid $me in $(tr '\n' ' ' < /proc/self/cgroup); mounts $(awk '$3 ~ /cgroup/ {print $2}' /proc/mounts | tr '\n' ' '); memory procs $(head -5 /sys/fs/cgroup/memory/cgroup.procs | tr '\n' ' ')"
sh -c 'read -r me rest < /proc/self/stat; for d in $(cat /tmp/nested); do echo $me > $d/cgroup.procs; done; exec unshare -fp sh -c "sleep 0.3; exit 3"'
echo unshare $?
sleep 0.5
for d in $(cat /tmp/nested); do rmdir "$d" && echo "removed $d"; done"#;

/// The pod's UID.
fn uid(agent: &Running, pod: &str) -> String {
    agent
        .handles
        .workers
        .views()
        .into_iter()
        .find(|v| v.pod.metadata.name.as_deref() == Some(pod))
        .and_then(|v| v.pod.metadata.uid.clone())
        .expect("uid")
}

/// Waits until `pod`'s container `app` printed `done`, and returns its log.
async fn finished(world: &World, agent: &Running, pod: &str) -> String {
    let path = world
        .root
        .path()
        .join("logs/pods")
        .join(format!("default_{pod}_{}", uid(agent, pod)))
        .join("app/0.log");
    eventually(Duration::from_secs(60), "the script to finish", || async {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|t| t.contains("stdout F done"))
    })
    .await
}

/// `app` of `pod` runs, was never restarted, and is the only instance of it
/// in the runtime; no kernel record was refused, no expectation waits, and
/// the hints missed nothing.
async fn assert_one_running_instance(world: &World, agent: &Running, name: &str) {
    let pod = world.pod_name(name);
    // Whatever the exits set off has run by now (the script is done).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = agent.status(&pod).expect("status");
    let app = container(&status, "app").expect("app's status");
    assert!(running(&status, "app"), "{pod}: app runs: {app:?}");
    assert_eq!(app.restart_count, 0, "{pod}: never restarted: {app:?}");
    assert!(
        app.last_state
            .as_ref()
            .is_none_or(|s| s.terminated.is_none()),
        "{pod}: no last termination: {app:?}"
    );
    let (_, containers) = world.runtime_objects(name).await;
    assert_eq!(containers.len(), 1, "{pod}: one instance: {containers:?}");
    let state = world
        .client
        .container_status(&evlet_cri::ContainerId::new(containers[0].clone()))
        .await
        .expect("status");
    assert_eq!(
        state.state,
        evlet_cri::api::ContainerState::ContainerRunning as i32
    );
    assert_eq!(
        agent.metric("evlet_pleg_expectations"),
        0.0,
        "nothing awaited"
    );
    assert_eq!(
        agent
            .handles
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("evlet_pleg_runtime_disagreements_total{field=\"running\"}"))
            .count(),
        0,
        "the kernel side named no living process as dead"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nested_pid_namespaces_init_never_ends_its_container() {
    e2e(
        "a_nested_pid_namespaces_init_never_ends_its_container",
        |w| async move {
            let cases = [
                ("own", ""),
                ("shared", "  shareProcessNamespace: true\n"),
                ("host", "  hostPID: true\n"),
            ];
            for (name, spec) in cases {
                w.write(&format!("{name}.yaml"), &pod(name, spec, UNSHARE));
            }
            let agent = w.start_with(ebpf(&w)).await;
            for (name, _) in cases {
                let pod = w.pod_name(name);
                agent.running_id(&pod, "app").await;
                let log = finished(&w, &agent, &pod).await;
                assert_eq!(
                    log.matches("stdout F unshare 3").count(),
                    3,
                    "{pod}: three nested inits exited with 3: {log}"
                );
            }
            for (name, _) in cases {
                assert_one_running_instance(&w, &agent, name).await;
            }
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cgroup_made_inside_a_container_never_ends_it() {
    e2e(
        "a_cgroup_made_inside_a_container_never_ends_it",
        |w| async move {
            w.write("nested.yaml", &pod("nested", "", NESTED_CGROUPS));
            let agent = w.start_with(ebpf(&w)).await;
            let pod = w.pod_name("nested");
            agent.running_id(&pod, "app").await;
            let log = finished(&w, &agent, &pod).await;
            assert!(
                log.contains("stdout F made cgroup2 "),
                "a nested cgroup in the cgroup2 hierarchy, where the probes look: {log}"
            );
            assert!(log.contains("stdout F unshare 3"), "{log}");
            assert_eq!(
                log.matches("stdout F made ").count(),
                log.matches("stdout F removed ").count(),
                "every nested cgroup was removed: {log}"
            );
            assert_one_running_instance(&w, &agent, "nested").await;
            agent.stop().await;
        },
    )
    .await;
}
