//! Service environment variables, as upstream's `envvars.FromServices`: for
//! each service with a cluster IP, `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`
//! (and one per named port), and the Docker-link style `<NAME>_PORT`,
//! `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT` and `_ADDR`. Pure.

use k8s_openapi::api::core::v1::Service;

/// `my-svc` → `MY_SVC`.
fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// Does the service have a cluster IP (not headless, not unset)?
pub fn has_cluster_ip(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The variables of `services` (those without a cluster IP are skipped).
pub fn from_services<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services.into_iter().filter(|s| has_cluster_ip(s)) {
        let Some(spec) = &s.spec else { continue };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let name = var_name(s.metadata.name.as_deref().unwrap_or(""));
        let ports = spec.ports.clone().unwrap_or_default();
        let host_port = |port: i32| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        };
        out.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        if let Some(first) = ports.first() {
            out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in &ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{name}_SERVICE_PORT_{}", var_name(port_name)),
                    p.port.to_string(),
                ));
            }
        }
        if let Some(first) = ports.first() {
            let proto = first.protocol.as_deref().unwrap_or("TCP").to_lowercase();
            out.push((
                format!("{name}_PORT"),
                format!("{proto}://{}", host_port(first.port)),
            ));
        }
        for p in &ports {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let prefix = format!("{name}_PORT_{}_{}", p.port, proto.to_uppercase());
            let lower = proto.to_lowercase();
            out.push((prefix.clone(), format!("{lower}://{}", host_port(p.port))));
            out.push((format!("{prefix}_PROTO"), lower));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubernetes_service_gives_upstreams_variables() {
        let s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}
        }))
        .expect("service");
        let vars = from_services([&s]);
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.0.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.0.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.0.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.0.0.1"));
        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}
        }))
        .expect("service");
        assert!(from_services([&headless]).is_empty());
    }
}
