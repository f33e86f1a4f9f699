//! Garbage collection on real containerd.
//!
//! Images: with the image filesystem over `imageGCHighThresholdPercent`, an
//! image no container uses is removed, and the image a running pod uses and
//! the sandbox image stay.
//!
//! Containers: a crash-looping container leaves exactly its newest dead
//! instance behind.
//!
//! The spare image (`evlet.local/spare:v1`, made by `cargo xtask node up`) is
//! imported again with the line's `ctr` at the start, so the test can run
//! repeatedly. Test agents share each containerd line's images, so every
//! other test runs with image GC off.

mod support;

use std::time::Duration;

use evlet::pod::labels;
use evlet_cri::{ContainerFilter, api};
use evlet_testkit::eventually;
use support::{IMAGE, e2e};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: source the node's environment (cargo xtask node up)")
    })
}

/// `ctr images import` of the spare image into the line's containerd.
fn import_spare() {
    let socket = env("EVLET_CRI_ENDPOINT");
    let socket = socket.trim_start_matches("unix://");
    let out = std::process::Command::new(env("EVLET_CTR"))
        .args([
            "--address",
            socket,
            "--namespace",
            "k8s.io",
            "images",
            "import",
        ])
        .arg(env("EVLET_SPARE_IMAGE_ARCHIVE"))
        .output()
        .expect("ctr");
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn image_gc_removes_an_unused_image_and_never_a_used_one() {
    e2e(
        "image_gc_removes_an_unused_image_and_never_a_used_one",
        |w| async move {
            import_spare();
            let spare = env("EVLET_SPARE_IMAGE");
            let pause = env("EVLET_PAUSE_IMAGE");
            let tags = || async {
                w.client
                    .list_images(None)
                    .await
                    .expect("images")
                    .into_iter()
                    .flat_map(|i| i.repo_tags)
                    .collect::<Vec<String>>()
            };
            assert!(tags().await.contains(&spare), "the spare image is there");
            // The pod is there when the agent starts; images count as seen at
            // the first collection, so the minimum age gives it time to run.
            w.write(
                "user.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: user}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sleep, '3600']}}\n"
                ),
            );
            let mut config = w.config();
            // 1 %: any real disk is over it, and 0 % cannot be reached, so each
            // collection removes what it may and reports the shortfall.
            config.image_gc = evlet::image_gc::Policy {
                high_threshold_percent: 1,
                low_threshold_percent: 0,
                min_age: Duration::from_secs(15),
                max_age: Duration::ZERO,
                period: Duration::from_secs(1),
            };
            let agent = w.start_with(config).await;
            let pod = w.pod_name("user");
            agent
                .wait_status(&pod, "app running", Duration::from_secs(15), |s| {
                    support::running(s, "app").then_some(())
                })
                .await;
            eventually(Duration::from_secs(40), "the spare image removed", || async {
                (!tags().await.contains(&spare)).then_some(())
            })
            .await;
            let left = tags().await;
            assert!(left.iter().any(|t| t == IMAGE), "the used image stays: {left:?}");
            assert!(left.contains(&pause), "the sandbox image stays: {left:?}");
            // Counted once the removal returned (the test may list the images
            // between the two).
            eventually(Duration::from_secs(5), "the removal counted", || async {
                agent
                    .handles
                    .metrics
                    .encode()
                    .lines()
                    .any(|l| l == "kubelet_image_garbage_collected_total{reason=\"space\"} 1")
                    .then_some(())
            })
            .await;
            let events = agent.handles.diagnostics.events();
            let shortfall = events
                .iter()
                .find(|e| e.reason == "FreeDiskSpaceFailed")
                .expect("a FreeDiskSpaceFailed event");
            assert!(shortfall.node && shortfall.kind == "Warning", "{shortfall:?}");
            assert!(
                shortfall
                    .message
                    .starts_with("Failed to garbage collect required amount of images. Attempted to free "),
                "{}",
                shortfall.message
            );
            // Still running, its image still there after more collections.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert!(support::running(&agent.status(&pod).expect("status"), "app"));
            assert!(tags().await.iter().any(|t| t == IMAGE));
            agent.stop().await;
            import_spare();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn container_gc_keeps_exactly_the_newest_dead_instance() {
    e2e(
        "container_gc_keeps_exactly_the_newest_dead_instance",
        |w| async move {
            w.write(
                "crashy.yaml",
                &format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: crashy}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}, command: [/bin/sh, -c, 'exit 3']}}\n"
                ),
            );
            let mut config = w.config();
            config.container_gc.period = Duration::from_secs(1);
            let agent = w.start_with(config).await;
            let pod = w.pod_name("crashy");
            // Three instances: the first and two restarts (10 s and 20 s backoff).
            agent
                .wait_status(&pod, "two restarts", Duration::from_secs(60), |s| {
                    (support::container(s, "app")?.restart_count >= 2).then_some(())
                })
                .await;
            let instances = || async {
                let mut cs = w
                    .client
                    .list_containers(ContainerFilter::new().label(labels::POD_NAME, pod.clone()))
                    .await
                    .expect("containers");
                cs.sort_by_key(|c| std::cmp::Reverse(c.created_at));
                cs
            };
            let exited = api::ContainerState::ContainerExited as i32;
            let newest = eventually(Duration::from_secs(10), "one dead instance", || async {
                let cs = instances().await;
                let dead: Vec<&api::Container> = cs.iter().filter(|c| c.state == exited).collect();
                // Exactly one dead instance, and no live one is newer.
                (dead.len() == 1 && cs[0].id == dead[0].id).then(|| dead[0].id.clone())
            })
            .await;
            // The status still shows that instance: terminated now, or the
            // last state of a waiting (backed-off) or restarted container.
            let status = agent.status(&pod).expect("status");
            let app = support::container(&status, "app").expect("app");
            let id = format!("containerd://{newest}");
            let shown = [app.state.as_ref(), app.last_state.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|s| s.terminated.as_ref())
                .any(|t| t.container_id.as_deref() == Some(id.as_str()));
            assert!(shown, "{app:?}");
            agent.assert_no_missed_events().await;
            agent.stop().await;
        },
    )
    .await;
}
