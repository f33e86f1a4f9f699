//! The client against the fake runtime: lifecycle, deadlines, retries across
//! restarts, and event-stream drops. Unprivileged and fast.

use std::time::Duration;

use evlet_cri::fake::{FakeServer, Fault};
use evlet_cri::{ContainerFilter, ErrorKind, Options, RuntimeClient, SandboxFilter, api};
use evlet_testkit::within;
use tokio_stream::StreamExt as _;

const IMAGE: &str = "evlet.local/test:v1";

fn sandbox_config(name: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    }
}

fn container_config(name: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn setup(options: Options) -> (FakeServer, RuntimeClient) {
    let server = FakeServer::start(&[IMAGE])
        .await
        .expect("fake server starts");
    let client = RuntimeClient::connect(&server.endpoint(), options).expect("valid endpoint");
    (server, client)
}

#[tokio::test]
async fn lifecycle_round_trips_through_the_fake() {
    let (server, client) = setup(Options::default()).await;
    let sandbox = client
        .run_pod_sandbox(sandbox_config("web"), "")
        .await
        .expect("run sandbox");
    let container = client
        .create_container(&sandbox, container_config("app"), sandbox_config("web"))
        .await
        .expect("create");
    client.start_container(&container).await.expect("start");
    let listed = client
        .list_containers(
            ContainerFilter::new()
                .sandbox(&sandbox)
                .state(api::ContainerState::ContainerRunning),
        )
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert!(server.runtime().exit_container(&container, 3, "Error"));
    let status = client.container_status(&container).await.expect("status");
    assert_eq!(
        (status.state, status.exit_code),
        (api::ContainerState::ContainerExited as i32, 3)
    );
    client.stop_pod_sandbox(&sandbox).await.expect("stop");
    client.remove_pod_sandbox(&sandbox).await.expect("remove");
    assert!(
        client
            .list_pod_sandbox(SandboxFilter::new())
            .await
            .expect("list")
            .is_empty()
    );
    let err = client
        .container_status(&container)
        .await
        .expect_err("container is gone");
    assert_eq!(err.kind, ErrorKind::NotFound);
}

#[tokio::test]
async fn a_hanging_call_fails_with_deadline_exceeded() {
    let options = Options {
        status_timeout: Duration::from_millis(200),
        ..Options::default()
    };
    let (server, client) = setup(options).await;
    server.runtime().inject("Version", Fault::Hang, None);
    let err = within(Duration::from_secs(5), "the deadline", client.version())
        .await
        .expect_err("hung call must fail");
    assert_eq!(err.kind, ErrorKind::DeadlineExceeded, "{err}");
}

#[tokio::test]
async fn reads_retry_unavailable_and_writes_do_not() {
    let (server, client) = setup(Options::default()).await;
    let rt = server.runtime();
    rt.inject(
        "ListPodSandbox",
        Fault::Error(tonic::Code::Unavailable, "restarting".into()),
        Some(2),
    );
    client
        .list_pod_sandbox(SandboxFilter::new())
        .await
        .expect("third try succeeds");
    assert_eq!(rt.calls("ListPodSandbox"), 3);

    rt.inject(
        "RunPodSandbox",
        Fault::Error(tonic::Code::Unavailable, "restarting".into()),
        Some(1),
    );
    let err = client
        .run_pod_sandbox(sandbox_config("x"), "")
        .await
        .expect_err("no retry of writes");
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert_eq!(rt.calls("RunPodSandbox"), 1);
}

#[tokio::test]
async fn client_reconnects_after_the_runtime_restarts() {
    let (mut server, client) = setup(Options::default()).await;
    client.version().await.expect("first call");
    server.restart().await.expect("restart");
    let version = within(
        Duration::from_secs(10),
        "a call after restart",
        client.version(),
    )
    .await
    .expect("the next call succeeds");
    assert_eq!(version.runtime_name, "evlet-fake");
}

#[tokio::test]
async fn a_dropped_event_stream_ends_with_an_error() {
    let (server, client) = setup(Options::default()).await;
    let mut events = client.container_events().await.expect("stream opens");
    let sandbox = client
        .run_pod_sandbox(sandbox_config("ev"), "")
        .await
        .expect("run");
    let id = client
        .create_container(&sandbox, container_config("c"), sandbox_config("ev"))
        .await
        .expect("create");
    let first = within(Duration::from_secs(5), "CREATED event", events.next())
        .await
        .expect("an item")
        .expect("an event");
    assert_eq!(first.container_id, id.as_str());
    assert_eq!(
        first.container_event_type,
        api::ContainerEventType::ContainerCreatedEvent as i32
    );

    server.runtime().drop_event_streams();
    let err = within(Duration::from_secs(5), "the stream error", events.next())
        .await
        .expect("an item")
        .expect_err("stream drop is an error");
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert!(
        within(Duration::from_secs(5), "stream end", events.next())
            .await
            .is_none()
    );
}

#[tokio::test]
async fn pulling_an_unknown_image_is_not_found() {
    let (_server, client) = setup(Options::default()).await;
    let err = client
        .pull_image("example.invalid/nope:1", None, None)
        .await
        .expect_err("not pullable");
    assert_eq!(err.kind, ErrorKind::NotFound);
    assert!(
        client
            .image_status("example.invalid/nope:1")
            .await
            .expect("status")
            .is_none()
    );
    assert!(client.image_status(IMAGE).await.expect("status").is_some());
}
