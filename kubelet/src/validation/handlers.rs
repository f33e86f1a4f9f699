//! Probes and lifecycle hooks, validated as the API server does
//! (`validateProbe`, `validateLifecycle`, `validateHandler`): exactly one
//! handler, ports by valid number or IANA service name, non-negative numbers,
//! `successThreshold` 1 for liveness and startup, a sleep no longer than the
//! grace period, and none of it on init containers that run to completion.

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::Errors;

/// Validates `c`'s probes and hooks; `run_to_completion` for a regular init
/// container (which may have neither); `grace` is the pod's grace period.
pub(super) fn validate(
    c: &Container,
    path: &str,
    run_to_completion: bool,
    grace: i64,
    e: &mut Errors,
) {
    if run_to_completion {
        for (field, set) in [
            ("livenessProbe", c.liveness_probe.is_some()),
            ("readinessProbe", c.readiness_probe.is_some()),
            ("startupProbe", c.startup_probe.is_some()),
            ("lifecycle", c.lifecycle.is_some()),
        ] {
            if set {
                e.add(
                    format!("{path}.{field}"),
                    "Forbidden: may not be set for init containers without restartPolicy=Always",
                );
            }
        }
        return;
    }
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            validate_probe(p, &format!("{path}.{field}"), field == "readinessProbe", e);
        }
    }
    if let Some(lifecycle) = &c.lifecycle {
        for (field, hook) in [
            ("postStart", &lifecycle.post_start),
            ("preStop", &lifecycle.pre_stop),
        ] {
            let Some(h) = hook else { continue };
            let fld = format!("{path}.lifecycle.{field}");
            let handlers = [
                (
                    "exec",
                    h.exec.as_ref().map(|x| Handler::Exec(x.command.as_deref())),
                ),
                ("httpGet", h.http_get.as_ref().map(Handler::Http)),
                (
                    "tcpSocket",
                    h.tcp_socket.as_ref().map(|t| Handler::Port(&t.port)),
                ),
                ("sleep", h.sleep.as_ref().map(|s| Handler::Sleep(s.seconds))),
            ];
            validate_handler(&handlers, &fld, grace, e);
        }
    }
}

/// One handler of a probe or hook, as much of it as validation reads.
enum Handler<'a> {
    Exec(Option<&'a [String]>),
    Http(&'a k8s_openapi::api::core::v1::HTTPGetAction),
    Port(&'a IntOrString),
    Grpc(i32),
    Sleep(i64),
}

fn validate_probe(p: &Probe, fld: &str, readiness: bool, e: &mut Errors) {
    let handlers = [
        (
            "exec",
            p.exec.as_ref().map(|x| Handler::Exec(x.command.as_deref())),
        ),
        ("httpGet", p.http_get.as_ref().map(Handler::Http)),
        (
            "tcpSocket",
            p.tcp_socket.as_ref().map(|t| Handler::Port(&t.port)),
        ),
        ("grpc", p.grpc.as_ref().map(|g| Handler::Grpc(g.port))),
    ];
    validate_handler(&handlers, fld, 0, e);
    for (field, value) in [
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("periodSeconds", p.period_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if let Some(v) = value.filter(|v| *v < 0) {
            e.add(
                format!("{fld}.{field}"),
                format!("Invalid value: {v}: must be greater than or equal to 0"),
            );
        }
    }
    // successThreshold defaults to 1; liveness and startup probes may not change it.
    if !readiness && let Some(v) = p.success_threshold.filter(|v| *v != 1 && *v > 0) {
        e.add(
            format!("{fld}.successThreshold"),
            format!("Invalid value: {v}: must be 1"),
        );
    }
    match p.termination_grace_period_seconds {
        Some(v) if readiness => e.add(
            format!("{fld}.terminationGracePeriodSeconds"),
            format!("Invalid value: {v}: must not be set for readinessProbes"),
        ),
        Some(v) if v <= 0 => e.add(
            format!("{fld}.terminationGracePeriodSeconds"),
            format!("Invalid value: {v}: must be greater than 0"),
        ),
        _ => {}
    }
}

fn validate_handler(
    handlers: &[(&str, Option<Handler<'_>>)],
    fld: &str,
    grace: i64,
    e: &mut Errors,
) {
    let mut seen = false;
    for (name, handler) in handlers {
        let Some(h) = handler else { continue };
        let at = format!("{fld}.{name}");
        if seen {
            e.add(at, "Forbidden: may not specify more than 1 handler type");
            continue;
        }
        seen = true;
        match h {
            Handler::Exec(cmd) => {
                if cmd.is_none_or(|c| c.is_empty()) {
                    e.add(format!("{at}.command"), "Required value");
                }
            }
            Handler::Http(get) => {
                if get.path.as_deref() == Some("") {
                    e.add(format!("{at}.path"), "Required value");
                }
                port(&get.port, &format!("{at}.port"), e);
                if let Some(s) = get
                    .scheme
                    .as_deref()
                    .filter(|s| !matches!(*s, "HTTP" | "HTTPS"))
                {
                    e.add(
                        format!("{at}.scheme"),
                        format!("Unsupported value: {s:?}: supported values: \"HTTP\", \"HTTPS\""),
                    );
                }
                for h in get.http_headers.iter().flatten() {
                    if h.name.is_empty() || !h.name.bytes().all(is_token_char) {
                        e.add(
                            format!("{at}.httpHeaders"),
                            format!("Invalid value: {:?}: a valid HTTP header must consist of alphanumeric characters or '-'", h.name),
                        );
                    }
                }
            }
            Handler::Port(p) => port(p, &format!("{at}.port"), e),
            Handler::Grpc(n) => port(&IntOrString::Int(*n), &format!("{at}.port"), e),
            Handler::Sleep(seconds) => {
                if *seconds < 0 || *seconds > grace {
                    e.add(
                        format!("{at}.seconds"),
                        format!("Invalid value: {seconds}: must be non-negative and less than terminationGracePeriodSeconds ({grace})"),
                    );
                }
            }
        }
    }
    if !seen {
        e.add(fld, "Required value: must specify a handler type");
    }
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `ValidatePortNumOrName`: a number 1–65535, or an IANA service name.
fn port(p: &IntOrString, fld: &str, e: &mut Errors) {
    match p {
        IntOrString::Int(n) if !(1..=65535).contains(n) => e.add(
            fld,
            format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
        ),
        IntOrString::Int(_) => {}
        IntOrString::String(name) => {
            if let Some(problem) = port_name_problem(name) {
                e.add(fld, format!("Invalid value: {name:?}: {problem}"));
            }
        }
    }
}

/// Why `name` is not an IANA_SVC_NAME, in apimachinery's words.
fn port_name_problem(name: &str) -> Option<&'static str> {
    if name.len() > 15 {
        return Some("must be no more than 15 characters");
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if name.contains("--") {
        return Some("must not contain consecutive hyphens");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        return Some("must contain at least one letter (a-z)");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("must not begin or end with a hyphen");
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::validation::validate;

    fn errors(containers: &str) -> Vec<String> {
        let pod = serde_yaml::from_str(&format!(
            "metadata: {{name: p}}\nspec:\n  terminationGracePeriodSeconds: 10\n{containers}"
        ))
        .expect("pod");
        match validate(&pod) {
            Ok(()) => Vec::new(),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn every_kind_of_handler_is_accepted() {
        let ok = errors(
            "  containers:\n  - name: a\n    image: i\n    ports: [{name: http, containerPort: 80}]\n    livenessProbe: {httpGet: {path: /h, port: http, scheme: HTTPS, httpHeaders: [{name: X-A, value: b}]}, terminationGracePeriodSeconds: 5}\n    readinessProbe: {tcpSocket: {port: 80}}\n    startupProbe: {grpc: {port: 9090}}\n    lifecycle: {postStart: {exec: {command: [x]}}, preStop: {sleep: {seconds: 10}}}\n  - name: b\n    image: i\n    lifecycle: {postStart: {httpGet: {port: 80}}, preStop: {tcpSocket: {port: 80}}}\n",
        );
        assert_eq!(ok, Vec::<String>::new());
    }

    #[test]
    fn bad_probes_and_hooks_name_the_field_as_the_api_server_does() {
        let got = errors(
            "  initContainers:\n  - name: i\n    image: i\n    livenessProbe: {exec: {command: [x]}}\n  containers:\n  - name: a\n    image: i\n    livenessProbe: {exec: {command: [x]}, tcpSocket: {port: 80}, successThreshold: 2}\n    readinessProbe: {periodSeconds: -1, terminationGracePeriodSeconds: 3}\n    startupProbe: {httpGet: {port: Bad_Name}}\n    lifecycle: {preStop: {sleep: {seconds: 11}}, postStart: {exec: {}}}\n",
        );
        assert_eq!(
            got,
            [
                "spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
                "spec.containers[0].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
                "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
                "spec.containers[0].readinessProbe: Required value: must specify a handler type",
                "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
                "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 3: must not be set for readinessProbes",
                "spec.containers[0].startupProbe.httpGet.port: Invalid value: \"Bad_Name\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "spec.containers[0].lifecycle.postStart.exec.command: Required value",
                "spec.containers[0].lifecycle.preStop.sleep.seconds: Invalid value: 11: must be non-negative and less than terminationGracePeriodSeconds (10)",
            ]
        );
    }
}
