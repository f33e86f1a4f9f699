//! A pod's DNS and names, as upstream's `network/dns` and `kubelet_pods.go`:
//! the resolver config by `dnsPolicy` (cluster DNS with the pod's search
//! domains and `ndots:5`, the node's resolv.conf, or none), merged with
//! `dnsConfig` and cut to the resolver's limits; the hostname (short, or the
//! FQDN with `setHostnameAsFQDN`); and the kubelet-managed `/etc/hosts`. Pure:
//! the node's resolv.conf and hosts file come in as text.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// Upstream's `MaxDNSNameservers`.
pub const MAX_NAMESERVERS: usize = 3;
/// Upstream's `MaxDNSSearchPaths`.
pub const MAX_SEARCH_PATHS: usize = 32;
/// Upstream's `MaxDNSSearchListChars`.
pub const MAX_SEARCH_CHARS: usize = 2048;
/// A search path longer than a DNS subdomain is dropped.
const MAX_SEARCH_PATH: usize = 253;

/// The node's DNS settings (KubeletConfiguration `clusterDNS`, `clusterDomain`,
/// and the text of `resolvConf`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDns {
    /// `clusterDNS`: the cluster DNS service's IPs.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (e.g. `cluster.local`; "" for none).
    pub cluster_domain: String,
    /// The node's resolv.conf (None: `resolvConf: ""`, no host resolver config).
    pub resolv_conf: Option<String>,
    /// The node's IPs (the fallback nameservers when there is no resolv.conf).
    pub node_ips: Vec<String>,
}

/// The resolver config a sandbox gets (CRI `DNSConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    /// Nameservers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// Options (`ndots:5`, `edns0`).
    pub options: Vec<String>,
}

/// A warning to record as an event about the pod (`MissingClusterDNS`, `DNSConfigForming`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The event reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

/// Parses resolv.conf as upstream does: nameservers accumulate, the last
/// `search` line wins (a trailing dot trimmed, `.` skipped), options merge by
/// name (later wins).
///
/// # Errors
/// `nameserver list is empty ` (with upstream's trailing space) for a bare `nameserver`.
pub fn parse_resolv_conf(text: &str) -> Result<Resolver, String> {
    let mut r = Resolver::default();
    let mut errors = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.first().copied() {
            Some("nameserver") => match fields.get(1) {
                Some(s) => r.servers.push((*s).to_owned()),
                None => errors.push("nameserver list is empty ".to_owned()),
            },
            Some("search") => {
                r.searches = fields[1..]
                    .iter()
                    .map(|s| s.strip_suffix('.').unwrap_or(s))
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            Some("options") => {
                r.options = merge_options(&r.options, fields[1..].iter().map(|s| (*s).to_owned()))
            }
            _ => {}
        }
    }
    if errors.is_empty() {
        Ok(r)
    } else {
        Err(errors.join(", "))
    }
}

/// Options keyed by the name before `:`, later ones overriding earlier ones;
/// the order is the first appearance of each name (upstream's is a Go map's,
/// i.e. random).
fn merge_options(existing: &[String], more: impl Iterator<Item = String>) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for opt in existing.iter().cloned().chain(more) {
        let name = opt.split(':').next().unwrap_or("").to_owned();
        if !values.contains_key(&name) {
            order.push(name.clone());
        }
        values.insert(name, opt);
    }
    order
        .into_iter()
        .filter_map(|n| values.remove(&n))
        .collect()
}

fn omit_duplicates(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    items
        .into_iter()
        .filter(|i| seen.insert(i.clone()))
        .collect()
}

/// The resolver config of `pod` on a node with `node` (upstream's `GetPodDNS`),
/// and the warnings to record.
///
/// # Errors
/// The node's resolv.conf does not parse.
pub fn resolver(pod: &Pod, node: &NodeDns) -> Result<(Resolver, Vec<Warning>), String> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut warnings = Vec::new();
    let host = match &node.resolv_conf {
        Some(text) => parse_resolv_conf(text)
            .map_err(|e| format!("Encountered error while parsing resolv conf file. Error: {e}"))?,
        None => Resolver::default(),
    };
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    #[derive(PartialEq)]
    enum Kind {
        None,
        Cluster,
        Host,
    }
    let mut kind = match policy {
        "None" => Kind::None,
        "ClusterFirstWithHostNet" => Kind::Cluster,
        "ClusterFirst" if !host_network => Kind::Cluster,
        "ClusterFirst" | "Default" => Kind::Host,
        _ => Kind::Cluster,
    };
    if kind == Kind::Cluster && node.cluster_dns.is_empty() {
        warnings.push(Warning {
            reason: "MissingClusterDNS",
            message: format!(
                "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                pod_ref(pod)
            ),
        });
        kind = Kind::Host;
    }
    let mut r = match kind {
        Kind::None => Resolver::default(),
        Kind::Cluster => {
            let ns = crate::pod::namespace(pod);
            let d = &node.cluster_domain;
            let searches = if d.is_empty() {
                host.searches
            } else {
                omit_duplicates(
                    [format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()]
                        .into_iter()
                        .chain(host.searches),
                )
            };
            Resolver {
                servers: node.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        Kind::Host if node.resolv_conf.is_none() => Resolver {
            servers: if node.node_ips.is_empty() {
                vec!["127.0.0.1".into()]
            } else {
                node.node_ips
                    .iter()
                    .map(|ip| if ip.contains(':') { "::1" } else { "127.0.0.1" }.to_owned())
                    .collect()
            },
            searches: vec![".".into()],
            options: Vec::new(),
        },
        Kind::Host => host,
    };
    if let Some(cfg) = spec.and_then(|s| s.dns_config.as_ref()) {
        r.servers = omit_duplicates(
            r.servers
                .into_iter()
                .chain(cfg.nameservers.iter().flatten().cloned()),
        );
        r.searches = omit_duplicates(
            r.searches
                .into_iter()
                .chain(cfg.searches.iter().flatten().cloned()),
        );
        r.options = merge_options(
            &r.options,
            cfg.options.iter().flatten().map(|o| match &o.value {
                Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            }),
        );
    }
    if r.servers.len() > MAX_NAMESERVERS {
        r.servers.truncate(MAX_NAMESERVERS);
        warnings.push(Warning {
            reason: "DNSConfigForming",
            message: format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                r.servers.join(" ")
            ),
        });
    }
    let mut exceeded = false;
    if r.searches.len() > MAX_SEARCH_PATHS {
        r.searches.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let before = r.searches.len();
    r.searches.retain(|s| s.len() <= MAX_SEARCH_PATH);
    exceeded |= r.searches.len() != before;
    while r.searches.join(" ").len() > MAX_SEARCH_CHARS {
        r.searches.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push(Warning {
            reason: "DNSConfigForming",
            message: format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                r.searches.join(" ")
            ),
        });
    }
    Ok((r, warnings))
}

/// Upstream's `format.Pod`: `name_namespace(uid)`.
fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        crate::pod::name(pod),
        crate::pod::namespace(pod),
        crate::pod::uid(pod)
    )
}

/// A pod's names: its (short) hostname and, with a subdomain, its domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// `spec.hostname` or the pod's name, at most 63 characters.
    pub hostname: String,
    /// `<subdomain>.<namespace>.svc.<clusterDomain>`, or "".
    pub domain: String,
    /// What the kernel's hostname is set to: the FQDN with `setHostnameAsFQDN`, else the hostname.
    pub kernel: String,
}

/// The pod's names (upstream's `GeneratePodHostNameAndDomain` and `GetNodenameForKernel`).
///
/// # Errors
/// An FQDN longer than 64 characters, in upstream's words.
pub fn names(pod: &Pod, cluster_domain: &str) -> Result<Names, String> {
    let spec = pod.spec.as_ref();
    if let Some(name) = spec
        .and_then(|s| s.hostname_override.clone())
        .filter(|h| !h.is_empty())
    {
        // `hostnameOverride` replaces the hostname and drops the domain.
        return Ok(Names {
            hostname: name.clone(),
            domain: String::new(),
            kernel: name,
        });
    }
    let mut hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| crate::pod::name(pod).to_owned());
    if hostname.len() > 63 {
        hostname.truncate(63);
        hostname = hostname.trim_end_matches(['-', '.']).to_owned();
        if hostname.is_empty() {
            return Err(format!(
                "hostname for pod {:?} was invalid: {hostname:?}",
                crate::pod::name(pod)
            ));
        }
    }
    let domain = match spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some(sub) => format!("{sub}.{}.svc.{cluster_domain}", crate::pod::namespace(pod)),
        None => String::new(),
    };
    let fqdn = spec.and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false) && !domain.is_empty();
    let kernel = if fqdn {
        let full = format!("{hostname}.{domain}");
        if full.len() > 64 {
            return Err(format!(
                "failed to construct FQDN from pod hostname and cluster domain, FQDN {full} is too long (64 characters is the max, {} characters requested)",
                full.len()
            ));
        }
        full
    } else {
        hostname.clone()
    };
    Ok(Names {
        hostname,
        domain,
        kernel,
    })
}

/// The kubelet-managed `/etc/hosts` of a pod with `ips` (upstream's
/// `managedHostsFileContent`); `node_hosts` is the node's own file, used for
/// hostNetwork pods.
pub fn hosts_file(pod: &Pod, names: &Names, ips: &[String], node_hosts: Option<&str>) -> String {
    let spec = pod.spec.as_ref();
    let mut out = String::new();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        out.push_str("# Kubernetes-managed hosts file (host network).\n");
        out.push_str(node_hosts.unwrap_or(""));
    } else {
        out.push_str("# Kubernetes-managed hosts file.\n");
        out.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n");
        for ip in ips {
            if names.domain.is_empty() {
                out.push_str(&format!("{ip}\t{}\n", names.hostname));
            } else {
                out.push_str(&format!(
                    "{ip}\t{}.{}\t{}\n",
                    names.hostname, names.domain, names.hostname
                ));
            }
        }
    }
    let aliases = spec
        .and_then(|s| s.host_aliases.as_ref())
        .filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            out.push_str(&format!(
                "{}\t{}\n",
                a.ip,
                a.hostnames.clone().unwrap_or_default().join("\t")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: web-0, namespace: shop, uid: u1}}\nspec:\n  containers: [{{name: a}}]\n{spec}"
        ))
        .expect("pod")
    }

    fn node() -> NodeDns {
        NodeDns {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            resolv_conf: Some(
                "nameserver 192.0.2.53\nsearch corp.example. .\noptions edns0 ndots:2\n".into(),
            ),
            node_ips: vec!["192.0.2.10".into()],
        }
    }

    #[test]
    fn each_policy_gets_upstreams_resolver() {
        let (r, w) = resolver(&pod(""), &node()).expect("dns");
        assert_eq!(r.servers, ["10.96.0.10"]);
        assert_eq!(
            r.searches,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(r.options, ["ndots:5"]);
        assert!(w.is_empty());
        let (r, _) = resolver(&pod("  dnsPolicy: Default\n"), &node()).expect("dns");
        assert_eq!(
            (r.servers, r.options),
            (
                vec!["192.0.2.53".to_owned()],
                vec!["edns0".to_owned(), "ndots:2".to_owned()]
            )
        );
        let (r, _) = resolver(&pod("  hostNetwork: true\n"), &node()).expect("dns");
        assert_eq!(
            r.servers,
            ["192.0.2.53"],
            "ClusterFirst on the host network is Default"
        );
        let (r, _) = resolver(
            &pod("  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n"),
            &node(),
        )
        .expect("dns");
        assert_eq!(r.servers, ["10.96.0.10"]);
        let (r, _) = resolver(
            &pod("  dnsPolicy: None\n  dnsConfig: {nameservers: [1.1.1.1], searches: [a.example], options: [{name: ndots, value: '1'}, {name: rotate}]}\n"),
            &node(),
        )
        .expect("dns");
        assert_eq!(
            (r.servers, r.searches, r.options),
            (
                vec!["1.1.1.1".to_owned()],
                vec!["a.example".to_owned()],
                vec!["ndots:1".to_owned(), "rotate".to_owned()]
            )
        );
    }

    #[test]
    fn no_cluster_dns_falls_back_with_a_warning_and_limits_are_enforced() {
        let mut n = node();
        n.cluster_dns.clear();
        let (r, w) = resolver(&pod(""), &n).expect("dns");
        assert_eq!(r.servers, ["192.0.2.53"]);
        assert_eq!(w[0].reason, "MissingClusterDNS");
        assert!(w[0].message.starts_with(
            "pod: \"web-0_shop(u1)\". kubelet does not have ClusterDNS IP configured"
        ));
        let (r, w) = resolver(
            &pod("  dnsConfig: {nameservers: [1.1.1.1, 8.8.8.8, 9.9.9.9]}\n"),
            &node(),
        )
        .expect("dns");
        assert_eq!(r.servers, ["10.96.0.10", "1.1.1.1", "8.8.8.8"]);
        assert_eq!(
            w[0].message,
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.96.0.10 1.1.1.1 8.8.8.8"
        );
    }

    #[test]
    fn hostname_override_replaces_the_name_and_drops_the_domain() {
        let p = pod("  hostname: db\n  subdomain: s\n  hostnameOverride: custom-name\n");
        let n = names(&p, "cluster.local").expect("names");
        assert_eq!(
            (n.hostname.as_str(), n.domain.as_str(), n.kernel.as_str()),
            ("custom-name", "", "custom-name")
        );
    }

    #[test]
    fn names_and_the_hosts_file_follow_hostname_and_subdomain() {
        let p = pod(
            "  hostname: db\n  subdomain: replicas\n  setHostnameAsFQDN: true\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}]\n",
        );
        let n = names(&p, "cluster.local").expect("names");
        assert_eq!(n.kernel, "db.replicas.shop.svc.cluster.local");
        let hosts = hosts_file(&p, &n, &["10.88.0.5".into()], None);
        assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(hosts.contains("10.88.0.5\tdb.replicas.shop.svc.cluster.local\tdb\n"));
        assert!(
            hosts.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n")
        );
        let long = pod(&format!(
            "  hostname: {}\n  subdomain: s\n  setHostnameAsFQDN: true\n",
            "a".repeat(60)
        ));
        assert!(
            names(&long, "cluster.local")
                .expect_err("too long")
                .contains("is too long (64 characters is the max")
        );
    }
}
