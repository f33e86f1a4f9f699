//! The kubelet API's endpoints as the config file and the flags set them,
//! with upstream's meanings (`cmd/kubelet/app/options/options.go`,
//! `pkg/kubelet/apis/config/v1beta1/defaults.go`): `address` is the IP of both
//! the secured port (`port`, 10250) and the read-only port (`readOnlyPort`,
//! 0: off, the config file's default); `healthzBindAddress`:`healthzPort`
//! (127.0.0.1:10248, 0: off) is upstream's healthz server. A zero duration
//! is unset, as upstream's defaulting reads it.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{KubeletConfiguration, parse_duration};
use crate::server::Limits;

/// The agent's endpoints besides the secured port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpEndpoints {
    /// The read-only port (`address`:`readOnlyPort`); None: off. Port 0
    /// binds a free port (the library's tests; the binary reads 0 as off).
    pub read_only: Option<SocketAddr>,
    /// Upstream's healthz server (`healthzBindAddress`:`healthzPort`); None: off.
    pub healthz: Option<SocketAddr>,
    /// The node-local socket (`<root-dir>/evlet.sock`, root only); None: off.
    pub local_socket: Option<PathBuf>,
    /// The limits every endpoint serves its connections under.
    pub limits: Limits,
}

/// `--address`: an IP, as upstream's flag; `IP:PORT` (evlet's earlier form)
/// is still read, as the IP and `--read-only-port PORT`, with a warning.
///
/// # Errors
/// Neither an IP nor an IP and a port.
pub fn parse_address_flag(value: &str) -> Result<(IpAddr, Option<u16>), String> {
    if let Ok(ip) = value.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    value
        .parse::<SocketAddr>()
        .map(|a| (a.ip(), Some(a.port())))
        .map_err(|_| format!("--address: invalid value {value:?}: must be an IP address"))
}

impl KubeletConfiguration {
    /// `address`: the flag's, the file's, or upstream's default 0.0.0.0.
    ///
    /// # Errors
    /// The file's value is not an IP.
    pub fn address(&self, flags: &ServingFlags) -> Result<IpAddr, String> {
        if let Some(ip) = flags.address {
            return Ok(ip);
        }
        match self.address.as_deref() {
            None | Some("") => Ok(IpAddr::from([0, 0, 0, 0])),
            Some(a) => a
                .parse()
                .map_err(|_| format!("address: Invalid value {a:?}: must be an IP address")),
        }
    }

    /// The read-only port, the healthz port and the local socket under
    /// `root_dir`, with `limits`.
    ///
    /// # Errors
    /// An address that is not an IP, named.
    pub fn endpoints(
        &self,
        flags: &ServingFlags,
        root_dir: &Path,
        limits: Limits,
    ) -> Result<HttpEndpoints, String> {
        let ip = self.address(flags)?;
        let read_only = flags
            .read_only_port
            .or(self.read_only_port)
            .filter(|p| *p != 0)
            .map(|p| SocketAddr::new(ip, p));
        let healthz_ip = match (
            flags.healthz_bind_address,
            self.healthz_bind_address.as_deref(),
        ) {
            (Some(ip), _) => ip,
            (None, None | Some("")) => IpAddr::from([127, 0, 0, 1]),
            (None, Some(a)) => a.parse().map_err(|_| {
                format!("healthzBindAddress: Invalid value {a:?}: must be an IP address")
            })?,
        };
        let healthz = flags.healthz_port.or(self.healthz_port).unwrap_or(10248);
        Ok(HttpEndpoints {
            read_only,
            healthz: (healthz != 0).then(|| SocketAddr::new(healthz_ip, healthz)),
            local_socket: Some(root_dir.join(crate::server::local::SOCKET)),
            limits,
        })
    }
}

/// The secured kubelet API's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecureServing {
    /// `address`:`port` (default `0.0.0.0:10250`).
    pub address: SocketAddr,
    /// `tlsCertFile`; None (with the key): a self-signed pair under `<root-dir>/pki`.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook`: enabled, with its `cacheTTL`.
    pub token_webhook: Option<Duration>,
    /// `authorization.mode`.
    pub authorization: Authorization,
}

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// SubjectAccessReview, with `cacheAuthorizedTTL` and `cacheUnauthorizedTTL`.
    Webhook {
        /// How long an allow is cached.
        allow_ttl: Duration,
        /// How long a deny is cached.
        deny_ttl: Duration,
    },
}

/// `authentication` of a KubeletConfiguration.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authentication {
    /// `x509`.
    #[serde(default)]
    pub x509: X509Authentication,
    /// `webhook`.
    #[serde(default)]
    pub webhook: WebhookAuthentication,
    /// `anonymous`.
    #[serde(default)]
    pub anonymous: AnonymousAuthentication,
}

/// `authentication.x509`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct X509Authentication {
    /// `clientCAFile`.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

/// `authentication.webhook`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAuthentication {
    /// `enabled` (default true).
    pub enabled: Option<bool>,
    /// `cacheTTL` (default 2m).
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<String>,
}

/// `authentication.anonymous`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnonymousAuthentication {
    /// `enabled` (default false).
    pub enabled: Option<bool>,
}

/// `authorization` of a KubeletConfiguration.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationConfig {
    /// `mode`: `Webhook` (default) or `AlwaysAllow`.
    pub mode: Option<String>,
    /// `webhook`.
    #[serde(default)]
    pub webhook: WebhookAuthorization,
}

/// `authorization.webhook`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAuthorization {
    /// `cacheAuthorizedTTL` (default 5m).
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    /// `cacheUnauthorizedTTL` (default 30s).
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}

/// The serving flags; each overrides its config-file field, as upstream's.
#[derive(Debug, Default, Clone)]
pub struct ServingFlags {
    /// `--address`: the IP both ports bind.
    pub address: Option<IpAddr>,
    /// `--port`.
    pub port: Option<u16>,
    /// `--read-only-port` (0: off).
    pub read_only_port: Option<u16>,
    /// `--healthz-port` (0: off).
    pub healthz_port: Option<u16>,
    /// `--healthz-bind-address`.
    pub healthz_bind_address: Option<IpAddr>,
    /// `--tls-cert-file`.
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-private-key-file`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `--client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
    /// `--anonymous-auth`.
    pub anonymous_auth: Option<bool>,
    /// `--authentication-token-webhook`.
    pub token_webhook: Option<bool>,
    /// `--authorization-mode`.
    pub authorization_mode: Option<String>,
}

impl KubeletConfiguration {
    /// The secured port's settings: the file's and the flags', upstream's
    /// config-file defaults for the rest (never anonymous `AlwaysAllow`
    /// unless asked for). Standalone (`api_server` false) nothing can ask
    /// the API server: webhook authentication is off unless asked for (then
    /// an error), `Webhook` authorization becomes `AlwaysAllow` for the
    /// authenticated (client certificates), and with no way to authenticate
    /// at all the port is not served (None).
    ///
    /// # Errors
    /// A setting that cannot work, named.
    pub fn secure_serving(
        &self,
        flags: &ServingFlags,
        api_server: bool,
    ) -> Result<Option<SecureServing>, String> {
        let port = flags.port.or(self.port).unwrap_or(10250);
        if port == 0 {
            return Ok(None);
        }
        let ip = self.address(flags)?;
        // A zero TTL is unset: upstream's defaulting gives it the default
        // (kubeadm writes `cacheTTL: 0s`).
        let ttl =
            |v: Option<&String>, default: Duration, field: &str| -> Result<Duration, String> {
                v.map(|s| parse_duration(s).map_err(|e| format!("{field}: {e}")))
                    .transpose()
                    .map(|d| d.filter(|d| !d.is_zero()).unwrap_or(default))
            };
        let authn = &self.authentication;
        let asked_webhook = flags.token_webhook.or(authn.webhook.enabled);
        let token_webhook = match (asked_webhook, api_server) {
            (Some(true), false) => {
                return Err("authentication.webhook.enabled: the token webhook needs an API server (--kubeconfig)".into());
            }
            (Some(false), _) | (None, false) => None,
            (Some(true) | None, true) => Some(ttl(
                authn.webhook.cache_ttl.as_ref(),
                Duration::from_secs(120),
                "authentication.webhook.cacheTTL",
            )?),
        };
        let client_ca_file = flags
            .client_ca_file
            .clone()
            .or(authn.x509.client_ca_file.clone());
        let anonymous = flags
            .anonymous_auth
            .or(authn.anonymous.enabled)
            .unwrap_or(false);
        let authz = &self.authorization;
        let mode = flags.authorization_mode.clone().or(authz.mode.clone());
        let authorization = match (mode.as_deref(), api_server) {
            (Some("AlwaysAllow"), _) | (None, false) => Authorization::AlwaysAllow,
            (Some("Webhook"), false) => {
                return Err(
                    "authorization.mode: Webhook needs an API server (--kubeconfig)".into(),
                );
            }
            (Some("Webhook") | None, true) => Authorization::Webhook {
                allow_ttl: ttl(
                    authz.webhook.cache_authorized_ttl.as_ref(),
                    Duration::from_secs(300),
                    "authorization.webhook.cacheAuthorizedTTL",
                )?,
                deny_ttl: ttl(
                    authz.webhook.cache_unauthorized_ttl.as_ref(),
                    Duration::from_secs(30),
                    "authorization.webhook.cacheUnauthorizedTTL",
                )?,
            },
            (Some(""), _) => return Err("no authorization mode specified".into()),
            (Some(other), _) => return Err(format!("unknown authorization mode {other}")),
        };
        if token_webhook.is_none() && client_ca_file.is_none() && !anonymous {
            if api_server {
                return Err("no authentication method configured".into());
            }
            return Ok(None);
        }
        Ok(Some(SecureServing {
            address: SocketAddr::new(ip, port),
            tls_cert_file: flags.tls_cert_file.clone().or(self.tls_cert_file.clone()),
            tls_private_key_file: flags
                .tls_private_key_file
                .clone()
                .or(self.tls_private_key_file.clone()),
            client_ca_file,
            anonymous,
            token_webhook,
            authorization,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secured_port_defaults_as_upstreams_config_file_and_never_to_anonymous() {
        let none = ServingFlags::default();
        let cfg = KubeletConfiguration::default();
        let api = cfg
            .secure_serving(&none, true)
            .expect("valid")
            .expect("served");
        assert_eq!(api.address, "0.0.0.0:10250".parse().expect("addr"));
        assert!(!api.anonymous);
        assert_eq!(api.token_webhook, Some(Duration::from_secs(120)));
        assert_eq!(
            api.authorization,
            Authorization::Webhook {
                allow_ttl: Duration::from_secs(300),
                deny_ttl: Duration::from_secs(30)
            }
        );
        assert_eq!(
            cfg.secure_serving(&none, false),
            Ok(None),
            "standalone without a way to authenticate"
        );
        let text = "kind: KubeletConfiguration\naddress: 127.0.0.1\nport: 11250\nauthentication: {x509: {clientCAFile: /etc/ca.crt}}\n";
        let cfg = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect("valid");
        let standalone = cfg
            .secure_serving(&none, false)
            .expect("valid")
            .expect("served");
        assert_eq!(standalone.address, "127.0.0.1:11250".parse().expect("addr"));
        assert_eq!(standalone.authorization, Authorization::AlwaysAllow);
        assert_eq!(
            standalone.client_ca_file.as_deref(),
            Some(Path::new("/etc/ca.crt"))
        );
        let webhook = ServingFlags {
            authorization_mode: Some("Webhook".into()),
            ..ServingFlags::default()
        };
        assert!(
            cfg.secure_serving(&webhook, false)
                .expect_err("no API")
                .contains("needs an API server")
        );
        let odd = ServingFlags {
            authorization_mode: Some("RBAC".into()),
            ..ServingFlags::default()
        };
        assert_eq!(
            cfg.secure_serving(&odd, true),
            Err("unknown authorization mode RBAC".into())
        );
        let off = ServingFlags {
            port: Some(0),
            ..ServingFlags::default()
        };
        assert_eq!(cfg.secure_serving(&off, true), Ok(None));
    }

    #[test]
    fn address_is_both_ports_ip_and_a_zero_read_only_port_is_off() {
        let none = ServingFlags::default();
        let root = Path::new("/var/lib/evlet");
        let defaults = KubeletConfiguration::default()
            .endpoints(&none, root, Limits::default())
            .expect("valid");
        assert_eq!(defaults.read_only, None, "the config file's default is off");
        assert_eq!(
            defaults.healthz,
            Some("127.0.0.1:10248".parse().expect("addr"))
        );
        assert_eq!(
            defaults.local_socket.as_deref(),
            Some(Path::new("/var/lib/evlet/evlet.sock"))
        );
        let text = "kind: KubeletConfiguration\naddress: 10.0.0.5\nport: 11250\nreadOnlyPort: 10255\nhealthzPort: 0\nauthentication: {anonymous: {enabled: true}}\n";
        let cfg = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect("valid");
        let e = cfg
            .endpoints(&none, root, Limits::default())
            .expect("valid");
        assert_eq!(
            e.read_only,
            Some("10.0.0.5:10255".parse().expect("addr")),
            "the same IP, its own port"
        );
        assert_eq!(e.healthz, None, "healthzPort 0 is off");
        let secure = cfg
            .secure_serving(&none, false)
            .expect("valid")
            .expect("served");
        assert_eq!(secure.address, "10.0.0.5:11250".parse().expect("addr"));
        let flags = ServingFlags {
            address: Some("127.0.0.1".parse().expect("ip")),
            read_only_port: Some(0),
            ..ServingFlags::default()
        };
        let e = cfg
            .endpoints(&flags, root, Limits::default())
            .expect("valid");
        assert_eq!(e.read_only, None, "--read-only-port 0 turns it off");
        let secure = cfg
            .secure_serving(&flags, false)
            .expect("valid")
            .expect("served");
        assert_eq!(
            secure.address,
            "127.0.0.1:11250".parse().expect("addr"),
            "--address moves both"
        );
    }

    #[test]
    fn the_address_flag_takes_an_ip_or_evlets_earlier_ip_and_port() {
        assert_eq!(
            parse_address_flag("0.0.0.0"),
            Ok(("0.0.0.0".parse().expect("ip"), None))
        );
        assert_eq!(
            parse_address_flag("::"),
            Ok(("::".parse().expect("ip"), None))
        );
        assert_eq!(
            parse_address_flag("127.0.0.1:10255"),
            Ok(("127.0.0.1".parse().expect("ip"), Some(10255)))
        );
        assert!(
            parse_address_flag("node-1")
                .expect_err("a name")
                .contains("must be an IP address")
        );
    }

    #[test]
    fn zero_cache_ttls_are_upstreams_defaults_as_kubeadm_writes_them() {
        let text = "kind: KubeletConfiguration\nauthentication: {webhook: {enabled: true, cacheTTL: 0s}, x509: {clientCAFile: /ca.crt}}\nauthorization: {mode: Webhook, webhook: {cacheAuthorizedTTL: 0s, cacheUnauthorizedTTL: 0s}}\n";
        let cfg = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect("valid");
        let api = cfg
            .secure_serving(&ServingFlags::default(), true)
            .expect("valid")
            .expect("served");
        assert_eq!(api.token_webhook, Some(Duration::from_secs(120)));
        assert_eq!(
            api.authorization,
            Authorization::Webhook {
                allow_ttl: Duration::from_secs(300),
                deny_ttl: Duration::from_secs(30)
            }
        );
    }
}
