//! The manager's decisions, without IO: what a certificate says about itself
//! ([`Facts`]), what is asked for ([`Template`]), when to rotate (upstream's
//! jittered 70–90 % deadline), what to do next ([`next`]), which kubeconfig a
//! start uses ([`start`]), and when 401s mean the API server no longer takes
//! the client certificate ([`Rejections`]).

use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a certificate says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Valid from.
    pub not_before: SystemTime,
    /// Valid until.
    pub not_after: SystemTime,
    /// The subject's CN.
    pub common_name: String,
    /// The subject's O values.
    pub organizations: Vec<String>,
    /// DNS SANs, sorted.
    pub dns_names: Vec<String>,
    /// IP SANs, sorted.
    pub ips: Vec<IpAddr>,
}

impl Facts {
    /// Reads a DER certificate; None if it is not one.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let time = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            match u64::try_from(secs) {
                Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
                Err(_) => UNIX_EPOCH,
            }
        };
        let subject = cert.subject();
        let mut dns_names = Vec::new();
        let mut ips = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
                    GeneralName::IPAddress(b) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                            ips.push(IpAddr::from(v4));
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                            ips.push(IpAddr::from(v6));
                        }
                    }
                    _ => {}
                }
            }
        }
        dns_names.sort();
        ips.sort();
        Some(Self {
            not_before: time(cert.validity().not_before),
            not_after: time(cert.validity().not_after),
            common_name: subject
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .unwrap_or_default()
                .to_owned(),
            organizations: subject
                .iter_organization()
                .filter_map(|o| o.as_str().ok().map(str::to_owned))
                .collect(),
            dns_names,
            ips,
        })
    }

    /// Expired at `now`?
    pub fn expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// Whole seconds until expiry (negative once expired), as upstream's
    /// `*_ttl_seconds` gauges.
    pub fn ttl_seconds(&self, now: SystemTime) -> i64 {
        match self.not_after.duration_since(now) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        }
    }
}

/// What the manager asks for: the CSR's subject and SANs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// `system:node:<name>`.
    pub common_name: String,
    /// `system:nodes`.
    pub organizations: Vec<String>,
    /// DNS SANs (the serving certificate's host name), sorted.
    pub dns_names: Vec<String>,
    /// IP SANs (the serving certificate's node IPs), sorted.
    pub ips: Vec<IpAddr>,
}

impl Template {
    /// The client certificate's: upstream's `system:node:<name>` in `system:nodes`, no SANs.
    pub fn client(node_name: &str) -> Self {
        Self {
            common_name: format!("system:node:{node_name}"),
            organizations: vec!["system:nodes".into()],
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// The serving certificate's: the same subject, the node's host names
    /// and IPs as SANs (deduplicated, sorted, as upstream's
    /// `addressesToHostnamesAndIPs`). None without an IP: upstream asks for
    /// none then (its `AllowDNSOnlyNodeCSR` gate is off by default).
    pub fn serving(node_name: &str, hostnames: &[String], ips: &[IpAddr]) -> Option<Self> {
        let mut dns_names: Vec<String> = hostnames
            .iter()
            .filter(|h| !h.is_empty() && h.parse::<IpAddr>().is_err())
            .cloned()
            .collect();
        let mut ips: Vec<IpAddr> = ips
            .iter()
            .copied()
            .chain(hostnames.iter().filter_map(|h| h.parse().ok()))
            .collect();
        dns_names.sort();
        dns_names.dedup();
        ips.sort();
        ips.dedup();
        if ips.is_empty() {
            return None;
        }
        Some(Self {
            dns_names,
            ips,
            ..Self::client(node_name)
        })
    }

    /// Does `facts` carry exactly this subject and these SANs? (upstream's
    /// `certSatisfiesTemplate`: a certificate that does not is rotated at once).
    pub fn satisfied_by(&self, facts: &Facts) -> bool {
        let mut orgs = facts.organizations.clone();
        orgs.sort();
        let mut want = self.organizations.clone();
        want.sort();
        facts.common_name == self.common_name
            && orgs == want
            && facts.dns_names == self.dns_names
            && facts.ips == self.ips
    }
}

/// When a certificate valid from `not_before` to `not_after` is rotated:
/// after 70–90 % of its lifetime, `jitter` in `[0, 1)` choosing where
/// (upstream's `NotBefore + Jitter(d, 0.2) - 0.3·d`, so nodes made together
/// do not all rotate together).
pub fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let total = not_after.duration_since(not_before).unwrap_or_default();
    let fraction = 0.7 + 0.2 * jitter.clamp(0.0, 1.0);
    not_before + total.mul_f64(fraction)
}

/// How a certificate is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// There is no usable client certificate: the bootstrap credentials
    /// ask, with the key kept in `kubelet-client.key.tmp`, as CSR
    /// `node-csr-<hash>` (upstream's `LoadClientCert`).
    Bootstrap,
    /// The current certificate asks for its successor (CSR `csr-<random>`,
    /// a new key; for the client certificate the `selfnodeclient` approval).
    Renew,
}

/// Why a certificate is asked for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// There is none yet.
    Missing,
    /// The current one expired.
    Expired,
    /// The API server refuses the current client certificate (401s).
    Rejected,
    /// The current one is not for this node's name or addresses.
    Mismatch,
    /// Its rotation deadline passed.
    Deadline,
}

impl Reason {
    /// A word for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "no certificate yet",
            Reason::Expired => "the certificate expired",
            Reason::Rejected => "the API server refuses the certificate",
            Reason::Mismatch => "the certificate is not for this node's name or addresses",
            Reason::Deadline => "the rotation deadline passed",
        }
    }
}

/// What a certificate's loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Ask for a certificate now.
    Request(Request, Reason),
    /// Nothing until `until` (the rotation deadline, or the expiry when not rotating).
    WaitUntil(SystemTime),
    /// A certificate is needed and nothing can ask for one (no bootstrap
    /// credentials, or no node IP for a serving certificate).
    Stuck(Reason),
}

/// Who asks for a certificate when there is no usable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The bootstrap kubeconfig's credentials (the client certificate).
    Bootstrap,
    /// The node's own client (the serving certificate).
    NodeClient,
    /// Nobody (a client certificate without a bootstrap kubeconfig).
    Nobody,
}

/// What [`next`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct Situation<'a> {
    /// The certificate in use.
    pub current: Option<&'a Facts>,
    /// What is asked for; None: nothing can be (a serving certificate without a node IP).
    pub template: Option<&'a Template>,
    /// Now.
    pub now: SystemTime,
    /// Rotate before expiry (`rotateCertificates`; always for the serving certificate).
    pub rotate: bool,
    /// The API server refuses the current client certificate.
    pub rejected: bool,
    /// Who asks when there is no usable certificate.
    pub fallback: Fallback,
    /// Where in the 70–90 % window this certificate rotates, `[0, 1)`.
    pub jitter: f64,
}

/// Decides what a certificate's loop does next.
pub fn next(s: &Situation<'_>) -> Next {
    let Some(template) = s.template else {
        return Next::Stuck(Reason::Missing);
    };
    let without = |reason| match s.fallback {
        Fallback::Bootstrap => Next::Request(Request::Bootstrap, reason),
        Fallback::NodeClient => Next::Request(Request::Renew, reason),
        Fallback::Nobody => Next::Stuck(reason),
    };
    let Some(current) = s.current else {
        return without(Reason::Missing);
    };
    if current.expired(s.now) {
        return without(Reason::Expired);
    }
    if s.rejected {
        return without(Reason::Rejected);
    }
    if !template.satisfied_by(current) {
        return Next::Request(Request::Renew, Reason::Mismatch);
    }
    if !s.rotate {
        return Next::WaitUntil(current.not_after);
    }
    let deadline = rotation_deadline(current.not_before, current.not_after, s.jitter);
    if s.now >= deadline {
        Next::Request(Request::Renew, Reason::Deadline)
    } else {
        Next::WaitUntil(deadline)
    }
}

/// The state of the `--kubeconfig` file at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeconfigState {
    /// It does not exist.
    Missing,
    /// Its client certificate is readable and valid until then.
    Valid(SystemTime),
    /// It cannot be used as a node's credentials (why, for the log): no
    /// client certificate, an unreadable or expired one.
    Unusable(String),
}

/// How the node's client starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The kubeconfig's own credentials, as they are: no
    /// `--bootstrap-kubeconfig`, no rotation (evlet's behaviour before TLS
    /// bootstrap, and upstream's).
    Plain,
    /// The kubeconfig's valid client certificate, held by the manager (and
    /// rotated when asked to).
    Reuse,
    /// Bootstrap: the kubeconfig is missing or its certificate unusable, and
    /// the bootstrap kubeconfig asks for a new one; the kubeconfig is
    /// written when it arrives.
    Bootstrap,
    /// Rotation without a bootstrap kubeconfig: the certificate from the
    /// store or the kubeconfig, renewed with the kubeconfig's own
    /// credentials when there is none (upstream's kubeadm path).
    Rotate,
}

/// Which credentials the node starts with (upstream's `LoadClientConfig`
/// and `LoadClientCert` rules): a valid kubeconfig wins over the bootstrap
/// kubeconfig; a missing or unusable one is replaced through bootstrap.
pub fn start(kubeconfig: &KubeconfigState, bootstrap: bool, rotate: bool) -> Start {
    match (bootstrap, kubeconfig) {
        (true, KubeconfigState::Valid(_)) => Start::Reuse,
        (true, _) => Start::Bootstrap,
        (false, _) if rotate => Start::Rotate,
        (false, _) => Start::Plain,
    }
}

/// Consecutive 401 answers to requests made with a current client
/// certificate: the API server no longer takes it (revoked, or the cluster's
/// CA replaced) once they last [`Rejections::AFTER`] and number at least
/// [`Rejections::AT_LEAST`], with no other answer between.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rejections {
    first: Option<Instant>,
    count: u32,
}

impl Rejections {
    /// How long 401s must last.
    pub const AFTER: Duration = Duration::from_secs(30);
    /// How many at least.
    pub const AT_LEAST: u32 = 3;

    /// Records an answer; true once the certificate counts as rejected.
    pub fn observe(&mut self, unauthorized: bool, now: Instant) -> bool {
        if !unauthorized {
            *self = Self::default();
            return false;
        }
        let first = *self.first.get_or_insert(now);
        self.count = self.count.saturating_add(1);
        self.count >= Self::AT_LEAST && now.duration_since(first) >= Self::AFTER
    }

    /// Starts over (a new certificate).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn facts(from: u64, to: u64, template: &Template) -> Facts {
        Facts {
            not_before: at(from),
            not_after: at(to),
            common_name: template.common_name.clone(),
            organizations: template.organizations.clone(),
            dns_names: template.dns_names.clone(),
            ips: template.ips.clone(),
        }
    }

    #[test]
    fn the_rotation_deadline_falls_between_70_and_90_percent_of_the_lifetime() {
        let (from, to) = (at(1000), at(2000));
        assert_eq!(rotation_deadline(from, to, 0.0), at(1700));
        assert_eq!(rotation_deadline(from, to, 0.5), at(1800));
        assert_eq!(rotation_deadline(from, to, 1.0), at(1900));
        for _ in 0..1000 {
            let d = rotation_deadline(from, to, fastrand::f64());
            assert!(d >= at(1700) && d <= at(1900), "{d:?}");
        }
        // Out-of-range jitter and a backwards validity stay sane.
        assert_eq!(rotation_deadline(from, to, 7.0), at(1900));
        assert_eq!(rotation_deadline(to, from, 0.5), to);
    }

    #[test]
    fn a_valid_certificate_waits_for_its_deadline_then_renews() {
        let t = Template::client("n1");
        let f = facts(1000, 2000, &t);
        let mut s = Situation {
            current: Some(&f),
            template: Some(&t),
            now: at(1500),
            rotate: true,
            rejected: false,
            fallback: Fallback::Bootstrap,
            jitter: 0.5,
        };
        assert_eq!(next(&s), Next::WaitUntil(at(1800)));
        s.now = at(1800);
        assert_eq!(next(&s), Next::Request(Request::Renew, Reason::Deadline));
        // Not rotating: nothing until it expires, then bootstrap again.
        s.rotate = false;
        assert_eq!(next(&s), Next::WaitUntil(at(2000)));
        s.now = at(2000);
        assert_eq!(next(&s), Next::Request(Request::Bootstrap, Reason::Expired));
    }

    #[test]
    fn without_a_usable_client_certificate_only_bootstrap_credentials_can_ask() {
        let t = Template::client("n1");
        let f = facts(1000, 2000, &t);
        let mut s = Situation {
            current: None,
            template: Some(&t),
            now: at(1500),
            rotate: true,
            rejected: false,
            fallback: Fallback::Bootstrap,
            jitter: 0.0,
        };
        assert_eq!(next(&s), Next::Request(Request::Bootstrap, Reason::Missing));
        s.current = Some(&f);
        s.rejected = true;
        assert_eq!(
            next(&s),
            Next::Request(Request::Bootstrap, Reason::Rejected)
        );
        s.fallback = Fallback::Nobody;
        assert_eq!(next(&s), Next::Stuck(Reason::Rejected));
        s.current = None;
        assert_eq!(next(&s), Next::Stuck(Reason::Missing));
    }

    #[test]
    fn a_certificate_for_another_name_or_address_is_replaced_at_once() {
        let t = Template::client("n1");
        let other = facts(1000, 2000, &Template::client("n2"));
        let s = Situation {
            current: Some(&other),
            template: Some(&t),
            now: at(1100),
            rotate: false,
            rejected: false,
            fallback: Fallback::Nobody,
            jitter: 0.0,
        };
        assert_eq!(next(&s), Next::Request(Request::Renew, Reason::Mismatch));
        let ip: IpAddr = "10.0.0.5".parse().expect("ip");
        let serving =
            Template::serving("n1", &["node-1".into()], &[ip]).expect("an IP, a template");
        let mut old = facts(1000, 2000, &serving);
        old.ips = vec!["10.0.0.4".parse().expect("ip")];
        let s = Situation {
            current: Some(&old),
            template: Some(&serving),
            ..s
        };
        assert_eq!(next(&s), Next::Request(Request::Renew, Reason::Mismatch));
    }

    #[test]
    fn the_serving_certificate_needs_an_ip_and_asks_with_the_node_client() {
        assert_eq!(Template::serving("n1", &["node-1".into()], &[]), None);
        let ip: IpAddr = "10.0.0.5".parse().expect("ip");
        let t = Template::serving(
            "n1",
            &["node-1".into(), "node-1".into(), "10.0.0.6".into()],
            &[ip, ip],
        )
        .expect("template");
        assert_eq!(t.common_name, "system:node:n1");
        assert_eq!(t.organizations, vec!["system:nodes".to_owned()]);
        assert_eq!(t.dns_names, vec!["node-1".to_owned()]);
        assert_eq!(
            t.ips,
            vec![ip, "10.0.0.6".parse::<IpAddr>().expect("ip")],
            "a host name that is an IP is an IP SAN"
        );
        let s = Situation {
            current: None,
            template: Some(&t),
            now: at(0),
            rotate: true,
            rejected: false,
            fallback: Fallback::NodeClient,
            jitter: 0.0,
        };
        assert_eq!(next(&s), Next::Request(Request::Renew, Reason::Missing));
        let s = Situation {
            template: None,
            ..s
        };
        assert_eq!(next(&s), Next::Stuck(Reason::Missing));
    }

    #[test]
    fn a_valid_kubeconfig_wins_and_a_missing_or_unusable_one_is_bootstrapped() {
        let valid = KubeconfigState::Valid(at(9));
        let unusable = KubeconfigState::Unusable("expired".into());
        assert_eq!(start(&valid, true, false), Start::Reuse);
        assert_eq!(start(&valid, true, true), Start::Reuse);
        assert_eq!(
            start(&KubeconfigState::Missing, true, false),
            Start::Bootstrap
        );
        assert_eq!(start(&unusable, true, true), Start::Bootstrap);
        assert_eq!(start(&valid, false, true), Start::Rotate);
        assert_eq!(start(&unusable, false, true), Start::Rotate);
        assert_eq!(start(&valid, false, false), Start::Plain);
        assert_eq!(start(&KubeconfigState::Missing, false, false), Start::Plain);
    }

    #[test]
    fn only_lasting_unbroken_401s_reject_the_certificate() {
        let t0 = Instant::now();
        let mut r = Rejections::default();
        assert!(!r.observe(true, t0));
        assert!(!r.observe(true, t0 + Duration::from_secs(10)));
        assert!(
            !r.observe(true, t0 + Duration::from_secs(20)),
            "three, but too soon"
        );
        assert!(r.observe(true, t0 + Duration::from_secs(31)));
        // Any other answer starts over.
        assert!(!r.observe(false, t0 + Duration::from_secs(32)));
        assert!(!r.observe(true, t0 + Duration::from_secs(33)));
        assert!(!r.observe(true, t0 + Duration::from_secs(70)), "only two");
        assert!(r.observe(true, t0 + Duration::from_secs(71)));
        r.reset();
        assert!(!r.observe(true, t0 + Duration::from_secs(200)));
    }

    #[test]
    fn ttl_is_negative_once_expired() {
        let t = Template::client("n1");
        let f = facts(1000, 2000, &t);
        assert_eq!(f.ttl_seconds(at(1500)), 500);
        assert_eq!(f.ttl_seconds(at(2500)), -500);
        assert!(f.expired(at(2000)));
        assert!(!f.expired(at(1999)));
    }
}
