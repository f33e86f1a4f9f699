//! The CRI client against the private real containerd (`cargo xtask test` runs this
//! once per containerd line: 1.6, 1.7, 2.1). Needs root and a node; in CI a
//! missing node fails the test instead of skipping it.

mod support;

use std::time::Duration;

use evlet_cri::{ContainerFilter, ErrorKind, SandboxFilter, api};
use evlet_testkit::{eventually, within};
use support::{LABEL, case};
use tokio_stream::StreamExt as _;

#[tokio::test(flavor = "multi_thread")]
async fn container_exit_code_and_cri_log_line_are_reported() {
    case(
        "container_exit_code_and_cri_log_line_are_reported",
        |c| async move {
            let sandbox = c.sandbox("exit").await;
            let status = c
                .client
                .pod_sandbox_status(&sandbox, false)
                .await
                .expect("sandbox status");
            let ip = status
                .status
                .and_then(|s| s.network)
                .map(|n| n.ip)
                .unwrap_or_default();
            assert!(
                ip.starts_with("10.2"),
                "pod IP from the node's CNI range, got {ip:?}"
            );

            let id = c
                .start(&sandbox, "exit", "app", "echo hello-evlet; exit 3")
                .await;
            let status = c.wait_exited(&id).await;
            assert_eq!(status.exit_code, 3);
            assert_eq!(status.reason, "Error");
            // containerd stamps started_at after the task starts, so a fast exit can
            // carry a finished_at a little before it; both must be set.
            assert!(status.started_at > 0 && status.finished_at > 0);

            let log = std::fs::read_to_string(&status.log_path).expect("container log exists");
            let line = log.lines().next().expect("one log line");
            // CRI log format: <RFC3339Nano> <stream> <P|F> <content>
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            assert_eq!(
                fields[1..],
                ["stdout", "F", "hello-evlet"],
                "log line {line:?}"
            );
            assert!(fields[0].contains('T'), "timestamp in {line:?}");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_sync_returns_output_and_exit_code() {
    case("exec_sync_returns_output_and_exit_code", |c| async move {
        let sandbox = c.sandbox("exec").await;
        let id = c.start(&sandbox, "exec", "app", "sleep 3600").await;
        let pid = c
            .client
            .container_pid(&id)
            .await
            .expect("verbose status")
            .expect("containerd reports the init pid");
        // The init is the shell that runs the command until it execs `sleep`.
        eventually(
            Duration::from_secs(5),
            "the init pid to run sleep",
            || async {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .expect("the pid is a live host process");
                (comm.trim() == "sleep").then_some(())
            },
        )
        .await;
        let out = c
            .client
            .exec_sync(
                &id,
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "echo out; echo err >&2; exit 7".into(),
                ],
                Duration::from_secs(10),
            )
            .await
            .expect("exec runs");
        assert_eq!(out.exit_code, 7);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
        let url = c
            .client
            .exec(api::ExecRequest {
                container_id: id.to_string(),
                cmd: vec!["sh".into()],
                stdout: true,
                ..Default::default()
            })
            .await
            .expect("exec url");
        assert!(url.starts_with("http"), "streaming URL, got {url}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_cover_running_containers_and_sandboxes() {
    case(
        "stats_cover_running_containers_and_sandboxes",
        |c| async move {
            let sandbox = c.sandbox("stats").await;
            let id = c.start(&sandbox, "stats", "app", "sleep 3600").await;
            let stats = c
                .client
                .container_stats(&id)
                .await
                .expect("container stats");
            assert_eq!(stats.attributes.map(|a| a.id), Some(id.to_string()));
            let working_set = stats
                .memory
                .and_then(|m| m.working_set_bytes)
                .map(|v| v.value)
                .unwrap_or(0);
            assert!(working_set > 0, "a running container uses memory");
            let listed = c
                .client
                .list_container_stats(ContainerFilter::new().sandbox(&sandbox))
                .await
                .expect("list stats");
            assert_eq!(listed.len(), 1);
            let pod = c
                .client
                .pod_sandbox_stats(&sandbox)
                .await
                .expect("sandbox stats");
            assert_eq!(pod.attributes.map(|a| a.id), Some(sandbox.to_string()));
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_filters_select_by_label_state_and_sandbox() {
    case(
        "list_filters_select_by_label_state_and_sandbox",
        |c| async move {
            let a = c.sandbox("a").await;
            let b = c.sandbox("b").await;
            let running = c.start(&a, "a", "run", "sleep 3600").await;
            let done = c.start(&b, "b", "done", "exit 0").await;
            c.wait_exited(&done).await;

            let only_a = c
                .client
                .list_pod_sandbox(
                    SandboxFilter::new()
                        .label(LABEL, c.name.clone())
                        .label("pod", "a"),
                )
                .await
                .expect("list");
            assert_eq!(
                only_a.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
                [a.as_str()]
            );
            let ready = c
                .client
                .list_pod_sandbox(
                    SandboxFilter::new()
                        .id(&b)
                        .state(api::PodSandboxState::SandboxReady),
                )
                .await
                .expect("list");
            assert_eq!(ready.len(), 1);

            let mine = ContainerFilter::new().label(LABEL, c.name.clone());
            let running_list = c
                .client
                .list_containers(mine.clone().state(api::ContainerState::ContainerRunning))
                .await
                .expect("list");
            assert_eq!(
                running_list
                    .iter()
                    .map(|x| x.id.as_str())
                    .collect::<Vec<_>>(),
                [running.as_str()]
            );
            let exited = c
                .client
                .list_containers(mine.clone().state(api::ContainerState::ContainerExited))
                .await
                .expect("list");
            assert_eq!(
                exited.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
                [done.as_str()]
            );
            let in_b = c
                .client
                .list_containers(ContainerFilter::new().sandbox(&b))
                .await
                .expect("list");
            assert_eq!(in_b.len(), 1);

            c.client
                .stop_container(&running, Duration::from_secs(1))
                .await
                .expect("stop");
            c.client.remove_container(&running).await.expect("remove");
            let err = c
                .client
                .container_status(&running)
                .await
                .expect_err("removed");
            assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_images_have_status_and_foreign_pulls_fail_clearly() {
    case(
        "local_images_have_status_and_foreign_pulls_fail_clearly",
        |c| async move {
            let image = c
                .client
                .image_status(&c.node.test_image)
                .await
                .expect("image status")
                .expect("test image is local");
            assert!(
                image.repo_tags.contains(&c.node.test_image),
                "{:?}",
                image.repo_tags
            );
            assert!(
                c.client
                    .image_status(&c.node.pause_image)
                    .await
                    .expect("status")
                    .is_some()
            );
            assert!(
                c.client
                    .image_status("example.invalid/absent:1")
                    .await
                    .expect("status")
                    .is_none()
            );
            let listed = c.client.list_images(None).await.expect("list images");
            assert!(listed.len() >= 2);
            let fs = c.client.image_fs_info().await.expect("image fs info");
            assert!(!fs.image_filesystems.is_empty());

            let err = within(
                Duration::from_secs(60),
                "a failing pull",
                c.client.pull_image("example.invalid/absent:1", None, None),
            )
            .await
            .expect_err("no registry is reachable");
            assert!(
                err.to_string().contains("example.invalid/absent:1"),
                "error names the image: {err}"
            );
            assert_eq!(err.call, "PullImage");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn container_events_stream_started_and_stopped_or_is_unsupported() {
    case(
        "container_events_stream_started_and_stopped_or_is_unsupported",
        |c| async move {
            let events = c.client.container_events().await;
            if !c.node.has_container_events() {
                let err = events
                    .err()
                    .expect("containerd 1.6 has no GetContainerEvents");
                assert_eq!(err.kind, ErrorKind::Unsupported, "{err}");
                return;
            }
            let mut events = events.expect("stream opens on 1.7+");
            let sandbox = c.sandbox("events").await;
            let id = c
                .start(&sandbox, "events", "app", "sleep 0.3; exit 4")
                .await;
            let mut seen = Vec::new();
            within(
                Duration::from_secs(30),
                "STARTED and STOPPED events",
                async {
                    while let Some(event) = events.next().await {
                        let event = event.expect("event");
                        if event.container_id == id.as_str() {
                            seen.push(event.container_event_type);
                            if event.container_event_type
                                == api::ContainerEventType::ContainerStoppedEvent as i32
                            {
                                break;
                            }
                        }
                    }
                },
            )
            .await;
            assert!(
                seen.contains(&(api::ContainerEventType::ContainerStartedEvent as i32)),
                "{seen:?}"
            );
            assert!(
                seen.contains(&(api::ContainerEventType::ContainerStoppedEvent as i32)),
                "{seen:?}"
            );
        },
    )
    .await;
}
