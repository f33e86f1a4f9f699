//! The event recorder: the agent's Kubernetes-style events (Pulled, Created,
//! Started, Killing, BackOff, Failed, OOMKilling with the kernel's record) as
//! `core/v1` Events, like client-go's recorder in upstream kubelet:
//!
//! * a repeat of the same event (object, container, reason, message) is not a
//!   new object: the existing Event's `count` and `lastTimestamp` are patched;
//! * each pod has a token bucket (burst 25, one more every 5 min: client-go's
//!   spam filter), so a crash-looping pod cannot flood the API server;
//! * a failed write is retried a few times, then dropped: events are best effort.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as V1Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::is_not_found;
use crate::diagnostics::Event;

/// Events queued for the API server at most (more are kept locally only).
pub const QUEUE: usize = 1000;
/// client-go's spam filter: burst per object.
pub const BURST: f64 = 25.0;
/// client-go's spam filter: one token per this period.
pub const REFILL: Duration = Duration::from_secs(300);
/// Attempts per write.
const ATTEMPTS: u32 = 3;
/// Aggregation entries kept at most.
const KEEP: usize = 4096;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = (now - self.at).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + refill).min(BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

type Key = (String, String, Option<String>, String, String);

#[derive(Debug)]
struct Seen {
    name: String,
    count: i32,
}

fn time(rfc3339: &str) -> Time {
    rfc3339
        .parse()
        .map(Time)
        .unwrap_or_else(|_| crate::clock::now())
}

/// The Event object for `e`, first seen now.
pub fn object(e: &Event, node: &str, name: String) -> V1Event {
    let t = time(&e.time);
    V1Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(e.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some(if e.node { "Node" } else { "Pod" }.into()),
            name: Some(e.pod.clone()),
            namespace: (!e.node).then(|| e.namespace.clone()),
            uid: Some(e.pod_uid.clone()),
            field_path: e.field_path.clone(),
            ..Default::default()
        },
        reason: Some(e.reason.clone()),
        message: Some(e.message.clone()),
        type_: Some(e.kind.clone()),
        count: Some(1),
        first_timestamp: Some(t.clone()),
        last_timestamp: Some(t),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.to_owned()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.to_owned()),
        ..Default::default()
    }
}

/// Whether a failed write is worth another attempt. As client-go's recorder
/// (`recordEvent`): not when the API server refused it, which it would do
/// again (a namespace being deleted or gone, an invalid object); only when
/// no answer came, or the server was overloaded (429, 5xx). Events go out one
/// at a time, so each needless retry (1 s, then 2 s) held up every event
/// behind it: after the conformance suite deleted its namespaces, a new pod's
/// `Started` event came minutes late and specs that wait for it timed out.
fn retryable(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// The event's namespace is gone or being deleted (expected at the end of a
/// pod's life; upstream logs it quietly too).
fn namespace_gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s)
        if s.code == 404 || (s.code == 403 && s.message.contains("is being terminated")))
}

/// Sends the agent's events until `shutdown`.
pub async fn run(
    client: kube::Client,
    node: String,
    mut events: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
) {
    let mut buckets: HashMap<String, Bucket> = HashMap::new();
    let mut seen: HashMap<Key, Seen> = HashMap::new();
    let mut dropped: u64 = 0;
    loop {
        let e = tokio::select! {
            () = shutdown.cancelled() => return,
            e = events.recv() => match e { Some(e) => e, None => return },
        };
        let now = Instant::now();
        let bucket = buckets.entry(e.pod_uid.clone()).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        if !bucket.take(now) {
            dropped += 1;
            tracing::debug!(pod = %format!("{}/{}", e.namespace, e.pod), reason = %e.reason, dropped, "event rate limited");
            continue;
        }
        if seen.len() > KEEP {
            seen.clear();
            buckets.retain(|_, b| b.tokens < BURST);
        }
        let api: Api<V1Event> = Api::namespaced(client.clone(), &e.namespace);
        let key = (
            e.namespace.clone(),
            e.pod_uid.clone(),
            e.container.clone(),
            e.reason.clone(),
            e.message.clone(),
        );
        for attempt in 1..=ATTEMPTS {
            let result = match seen.get(&key) {
                Some(s) => {
                    let patch = serde_json::json!({
                        "count": s.count + 1,
                        "lastTimestamp": time(&e.time),
                    });
                    match api
                        .patch(&s.name, &PatchParams::default(), &Patch::Strategic(&patch))
                        .await
                    {
                        Ok(_) => Ok(s.count + 1),
                        Err(err) if is_not_found(&err) => {
                            seen.remove(&key);
                            continue;
                        }
                        Err(err) => Err(err),
                    }
                }
                None => {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos());
                    let name = format!("{}.{nanos:x}", e.pod);
                    match api
                        .create(&PostParams::default(), &object(&e, &node, name.clone()))
                        .await
                    {
                        Ok(_) => {
                            seen.insert(key.clone(), Seen { name, count: 0 });
                            Ok(1)
                        }
                        Err(err) => Err(err),
                    }
                }
            };
            match result {
                Ok(count) => {
                    if let Some(s) = seen.get_mut(&key) {
                        s.count = count;
                    }
                    break;
                }
                Err(err) if attempt == ATTEMPTS || !retryable(&err) => {
                    if namespace_gone(&err) {
                        tracing::debug!(pod = %format!("{}/{}", e.namespace, e.pod), reason = %e.reason, error = %err, "event for a namespace being deleted; dropped");
                    } else {
                        tracing::warn!(pod = %format!("{}/{}", e.namespace, e.pod), reason = %e.reason, error = %err, "could not record event; dropped");
                    }
                    break;
                }
                Err(_) => {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1) * attempt) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_one_per_refill_period() {
        let start = Instant::now();
        let mut b = Bucket {
            tokens: BURST,
            at: start,
        };
        let allowed = (0..30).filter(|_| b.take(start)).count();
        assert_eq!(allowed, 25);
        assert!(!b.take(start + Duration::from_secs(299)));
        assert!(b.take(start + Duration::from_secs(301)));
    }

    #[test]
    fn refusals_are_final_and_only_unanswered_or_overloaded_writes_are_retried() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        let terminating = api(
            403,
            "unable to create new content in namespace ns because it is being terminated",
        );
        assert!(!retryable(&terminating));
        assert!(namespace_gone(&terminating));
        assert!(!retryable(&api(404, "namespaces \"ns\" not found")));
        assert!(namespace_gone(&api(404, "namespaces \"ns\" not found")));
        assert!(!retryable(&api(422, "invalid")));
        assert!(!namespace_gone(&api(422, "invalid")));
        assert!(retryable(&api(429, "slow down")));
        assert!(retryable(&api(503, "unavailable")));
        assert!(retryable(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }

    #[test]
    fn the_event_names_the_pod_and_container_like_upstream() {
        let e = Event {
            node: false,
            kind: "Normal".into(),
            reason: "Started".into(),
            message: "Started container app".into(),
            namespace: "ns".into(),
            pod: "web".into(),
            pod_uid: "u1".into(),
            container: Some("app".into()),
            field_path: Some("spec.containers{app}".into()),
            time: "2026-11-23T08:00:00Z".into(),
        };
        let o = object(&e, "n1", "web.1".into());
        assert_eq!(
            o.involved_object.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        assert_eq!(o.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(o.source.and_then(|s| s.host).as_deref(), Some("n1"));
        assert_eq!(o.count, Some(1));
    }
}
