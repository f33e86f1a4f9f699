//! Authentication and authorization of the secured kubelet API, as upstream's
//! `server/auth.go` and the delegating authenticator and authorizer do it:
//! a client certificate signed by `clientCAFile`, or a bearer token the API
//! server vouches for (TokenReview, cached for `cacheTTL`), or anonymous when
//! allowed; then each request maps to checks on `nodes/<node>` subresources
//! that `AlwaysAllow` passes or the API server decides (SubjectAccessReview,
//! allowed and denied answers cached apart). A request that fails gets
//! upstream's 401 or 403 text before any handler (or stream) runs. The
//! caches are bounded by entries as well as TTL ([`auth_cache`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use futures_util::future::BoxFuture;
use sha2::{Digest as _, Sha256};

use super::auth_cache::{self, TtlCache};

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// The user name (a certificate's CN).
    pub name: String,
    /// The UID, if the authenticator knows one.
    pub uid: String,
    /// Groups (a certificate's O values).
    pub groups: Vec<String>,
    /// Extra attributes from a TokenReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The name anonymous requests run as.
pub const ANONYMOUS: &str = "system:anonymous";
const AUTHENTICATED: &str = "system:authenticated";
const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The WebSocket subprotocol prefix that carries a bearer token.
const WS_BEARER_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// One authorization check: `verb` on `nodes/<node>/<subresource>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Check {
    /// `get`, `create`, `update`, `patch`, `delete` (or "" for other methods).
    pub verb: &'static str,
    /// `proxy`, `stats`, `metrics`, `log`, `pods`, `healthz`, `configz`, ...
    pub subresource: &'static str,
}

/// The API verb of an HTTP method.
pub fn verb(method: &str) -> &'static str {
    match method {
        "POST" => "create",
        "GET" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
}

fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The checks a request must pass one of, in order (upstream's fine-grained
/// mapping: `/pods` is `nodes/pods` or `nodes/proxy`; exec, attach,
/// port-forward and container logs are `nodes/proxy`).
pub fn checks(method: &str, path: &str) -> Vec<Check> {
    let verb = verb(method);
    let check = |subresource| Check { verb, subresource };
    let subresources: &[&'static str] = if is_subpath(path, "/stats") {
        &["stats"]
    } else if is_subpath(path, "/metrics") {
        &["metrics"]
    } else if is_subpath(path, "/logs") {
        &["log"]
    } else if is_subpath(path, "/checkpoint") {
        &["checkpoint"]
    } else if is_subpath(path, "/pods") || is_subpath(path, "/runningpods") {
        &["pods", "proxy"]
    } else if is_subpath(path, "/healthz") {
        &["healthz", "proxy"]
    } else if is_subpath(path, "/configz") {
        &["configz", "proxy"]
    } else {
        &["proxy"]
    };
    subresources.iter().map(|s| check(s)).collect()
}

/// What the API server answers for the webhook modes. Declared here, by its
/// consumer; `api::reviews` implements it over TokenReview and SubjectAccessReview.
pub trait Reviews: Send + Sync + std::fmt::Debug {
    /// The user a bearer token belongs to; `Ok(None)` when the API server says
    /// the token is not valid.
    ///
    /// # Errors
    /// The review could not be made.
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<User>, String>>;

    /// May `user` do `check` on this node?
    ///
    /// # Errors
    /// The review could not be made.
    fn review_access<'a>(
        &'a self,
        user: &'a User,
        node: &'a str,
        check: Check,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// Why a request was refused, with upstream's status and body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// 401: no acceptable credentials.
    #[error("Unauthorized")]
    Unauthorized,
    /// 403: authenticated, not allowed.
    #[error("{0}")]
    Forbidden(String),
    /// 500: the authorizer failed.
    #[error("{0}")]
    Failed(String),
}

impl Refused {
    /// The response status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// How requests are authorized (`authorization.mode`).
#[derive(Debug, Clone)]
pub enum Mode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// The API server decides; answers are cached (`cacheAuthorizedTTL`,
    /// `cacheUnauthorizedTTL`).
    Webhook {
        /// The API server.
        reviews: Arc<dyn Reviews>,
        /// How long an allow is cached.
        allow_ttl: Duration,
        /// How long a deny is cached.
        deny_ttl: Duration,
    },
}

/// The settings of [`Auth`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name (the object every check is on).
    pub node: String,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook`: the API server and `cacheTTL`.
    pub tokens: Option<(Arc<dyn Reviews>, Duration)>,
    /// `authorization.mode`.
    pub mode: Mode,
}

type TokenKey = [u8; 32];
type AccessKey = (String, Vec<String>, Check);

/// The authenticator and authorizer of the secured port.
#[derive(Debug)]
pub struct Auth {
    settings: Settings,
    /// TokenReview answers (a valid token's user, or None), by the token's
    /// SHA-256, each for `cacheTTL`.
    tokens: TtlCache<TokenKey, Option<User>>,
    /// SubjectAccessReview answers, each for its allow or deny TTL.
    access: TtlCache<AccessKey, bool>,
}

impl Auth {
    /// An authenticator and authorizer with `settings`.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            tokens: TtlCache::new(auth_cache::TOKENS),
            access: TtlCache::new(auth_cache::DECISIONS),
        }
    }

    /// Token answers cached now (bounded by [`auth_cache::TOKENS`]).
    pub fn cached_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Authenticates and authorizes `method path`: `cert` is the verified
    /// client certificate's user, if one was presented.
    ///
    /// # Errors
    /// [`Refused`] with upstream's status and body.
    pub async fn check(
        &self,
        cert: Option<&User>,
        headers: &HeaderMap,
        method: &str,
        path: &str,
    ) -> Result<User, Refused> {
        let user = self.authenticate(cert, headers).await?;
        self.authorize(&user, method, path).await?;
        Ok(user)
    }

    async fn authenticate(
        &self,
        cert: Option<&User>,
        headers: &HeaderMap,
    ) -> Result<User, Refused> {
        if let Some(user) = cert {
            return Ok(with_group(user.clone(), AUTHENTICATED));
        }
        if let (Some(token), Some((reviews, ttl))) = (bearer(headers), &self.settings.tokens) {
            let key: TokenKey = Sha256::digest(token.as_bytes()).into();
            let user = match self.tokens.get(&key) {
                Some(user) => user,
                None => {
                    let answer = reviews.review_token(&token).await.map_err(|e| {
                        tracing::warn!(error = %e, "unable to authenticate the request due to an error");
                        Refused::Unauthorized
                    })?;
                    self.tokens.insert(key, answer.clone(), *ttl);
                    answer
                }
            };
            // An invalid token is an error: no fallback to anonymous (upstream).
            return user
                .map(|u| with_group(u, AUTHENTICATED))
                .ok_or(Refused::Unauthorized);
        }
        if self.settings.anonymous {
            return Ok(User {
                name: ANONYMOUS.into(),
                groups: vec![UNAUTHENTICATED.into()],
                ..User::default()
            });
        }
        Err(Refused::Unauthorized)
    }

    async fn authorize(&self, user: &User, method: &str, path: &str) -> Result<(), Refused> {
        let checks = checks(method, path);
        let Mode::Webhook {
            reviews,
            allow_ttl,
            deny_ttl,
        } = &self.settings.mode
        else {
            return Ok(());
        };
        for check in &checks {
            let key = (user.name.clone(), user.groups.clone(), *check);
            let allowed = match self.access.get(&key) {
                Some(a) => a,
                None => {
                    let answer = reviews
                        .review_access(user, &self.settings.node, *check)
                        .await
                        .map_err(|e| {
                            tracing::warn!(error = %e, user = %user.name, "authorization error");
                            Refused::Failed(format!(
                                "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                                user.name, check.verb, check.subresource
                            ))
                        })?;
                    let ttl = if answer { *allow_ttl } else { *deny_ttl };
                    self.access.insert(key, answer, ttl);
                    answer
                }
            };
            if allowed {
                return Ok(());
            }
        }
        let verb = checks.first().map_or("", |c| c.verb);
        let subresources: Vec<&str> = checks.iter().map(|c| c.subresource).collect();
        Err(Refused::Forbidden(format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
            user.name,
            subresources.join(" ")
        )))
    }
}

fn with_group(mut user: User, group: &str) -> User {
    if !user.groups.iter().any(|g| g == group) {
        user.groups.push(group.to_owned());
    }
    user
}

/// The bearer token of a request: `Authorization: Bearer <token>`, or the
/// WebSocket subprotocol `base64url.bearer.authorization.k8s.io.<token>`.
fn bearer(headers: &HeaderMap) -> Option<String> {
    if let Some(value) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let (scheme, token) = value.trim().split_once(' ')?;
        let token = token.trim();
        return (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty())
            .then(|| token.to_owned());
    }
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_BEARER_PREFIX))
        .and_then(|encoded| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded.trim_end_matches('='))
                .ok()
        })
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        let subs = |m: &str, p: &str| -> Vec<&str> {
            checks(m, p).iter().map(|c| c.subresource).collect()
        };
        assert_eq!(subs("GET", "/stats/summary"), ["stats"]);
        assert_eq!(subs("GET", "/metrics/resource"), ["metrics"]);
        assert_eq!(subs("GET", "/pods"), ["pods", "proxy"]);
        assert_eq!(subs("GET", "/healthz"), ["healthz", "proxy"]);
        assert_eq!(subs("GET", "/containerLogs/ns/p/c"), ["proxy"]);
        assert_eq!(subs("POST", "/exec/ns/p/c"), ["proxy"]);
        assert_eq!(subs("GET", "/logs/syslog"), ["log"]);
        assert_eq!(subs("GET", "/debug/pleg"), ["proxy"], "evlet's diagnostics");
        assert_eq!(subs("GET", "/events"), ["proxy"]);
        assert_eq!(subs("GET", "/pods/ns/p"), ["pods", "proxy"]);
        assert_eq!(
            subs("GET", "/statsfoo"),
            ["proxy"],
            "a prefix is not a subpath"
        );
        assert_eq!(checks("POST", "/exec/a/b/c")[0].verb, "create");
        assert_eq!(verb("HEAD"), "");
    }

    /// Tokens `good` (user alice, until `expired`) and `bad`; alice may use
    /// `proxy` only.
    #[derive(Debug, Default)]
    struct Api {
        token_reviews: AtomicU32,
        access_reviews: AtomicU32,
        expired: std::sync::atomic::AtomicBool,
    }

    impl Reviews for Api {
        fn review_token<'a>(
            &'a self,
            token: &'a str,
        ) -> BoxFuture<'a, Result<Option<User>, String>> {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            let valid = token == "good" && !self.expired.load(Ordering::SeqCst);
            let user = valid.then(|| User {
                name: "alice".into(),
                groups: vec!["devs".into()],
                ..User::default()
            });
            Box::pin(std::future::ready(Ok(user)))
        }

        fn review_access<'a>(
            &'a self,
            user: &'a User,
            node: &'a str,
            check: Check,
        ) -> BoxFuture<'a, Result<bool, String>> {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
            let allowed = user.name == "alice" && node == "n1" && check.subresource == "proxy";
            Box::pin(std::future::ready(Ok(allowed)))
        }
    }

    fn auth(api: &Arc<Api>, anonymous: bool) -> Auth {
        Auth::new(Settings {
            node: "n1".into(),
            anonymous,
            tokens: Some((Arc::clone(api) as _, Duration::from_secs(120))),
            mode: Mode::Webhook {
                reviews: Arc::clone(api) as _,
                allow_ttl: Duration::from_secs(300),
                deny_ttl: Duration::from_secs(30),
            },
        })
    }

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header"),
        );
        h
    }

    #[tokio::test]
    async fn tokens_are_reviewed_once_and_checks_go_to_the_api_server() {
        let api = Arc::new(Api::default());
        let a = auth(&api, false);
        let user = a
            .check(None, &headers("good"), "POST", "/exec/ns/p/c")
            .await
            .expect("allowed");
        assert_eq!(user.groups, ["devs", "system:authenticated"]);
        a.check(None, &headers("good"), "GET", "/containerLogs/ns/p/c")
            .await
            .expect("cached");
        assert_eq!(
            api.token_reviews.load(Ordering::SeqCst),
            1,
            "the token answer is cached"
        );
        let err = a
            .check(None, &headers("good"), "GET", "/stats/summary")
            .await
            .expect_err("denied");
        assert_eq!(
            err,
            Refused::Forbidden(
                "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[stats])\n".into()
            )
        );
        assert_eq!(err.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            a.check(None, &headers("bad"), "GET", "/pods").await,
            Err(Refused::Unauthorized)
        );
        assert_eq!(
            a.check(None, &HeaderMap::new(), "GET", "/pods").await,
            Err(Refused::Unauthorized)
        );
    }

    #[tokio::test]
    async fn a_flood_of_bad_tokens_holds_a_bounded_number_of_cached_answers() {
        let api = Arc::new(Api::default());
        let a = auth(&api, false);
        let flood = auth_cache::TOKENS + 1000;
        for i in 0..flood {
            assert_eq!(
                a.check(None, &headers(&format!("bad-{i}")), "GET", "/pods")
                    .await,
                Err(Refused::Unauthorized)
            );
        }
        assert_eq!(a.cached_tokens(), auth_cache::TOKENS, "bounded by entries");
        a.check(None, &headers("good"), "GET", "/exec/a/b/c")
            .await
            .expect("a good token still authenticates");
        assert_eq!(
            api.token_reviews.load(Ordering::SeqCst),
            u32::try_from(flood + 1).expect("count"),
            "each new token is reviewed once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_token_is_refused_once_its_cached_answer_is_older_than_the_ttl() {
        let api = Arc::new(Api::default());
        let a = auth(&api, false);
        a.check(None, &headers("good"), "GET", "/pods")
            .await
            .expect("allowed while valid");
        api.expired.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(119)).await;
        a.check(None, &headers("good"), "GET", "/pods")
            .await
            .expect("the cached answer stands for cacheTTL, as upstream");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            a.check(None, &headers("good"), "GET", "/pods").await,
            Err(Refused::Unauthorized),
            "after cacheTTL the token is reviewed again and refused"
        );
        assert_eq!(api.token_reviews.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn anonymous_users_are_checked_like_any_other_and_bad_tokens_never_fall_back() {
        let api = Arc::new(Api::default());
        let a = auth(&api, true);
        let err = a
            .check(None, &HeaderMap::new(), "GET", "/pods")
            .await
            .expect_err("denied");
        assert_eq!(
            err,
            Refused::Forbidden(
                "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])\n".into()
            )
        );
        assert_eq!(
            a.check(None, &headers("bad"), "GET", "/pods").await,
            Err(Refused::Unauthorized)
        );
    }

    #[tokio::test]
    async fn client_certificates_authenticate_and_websocket_protocols_carry_tokens() {
        let api = Arc::new(Api::default());
        let a = auth(&api, false);
        let cert = User {
            name: "alice".into(),
            groups: vec!["ops".into()],
            ..User::default()
        };
        let user = a
            .check(Some(&cert), &HeaderMap::new(), "GET", "/exec/a/b/c")
            .await
            .expect("cert user");
        assert_eq!(user.groups, ["ops", "system:authenticated"]);
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::SEC_WEBSOCKET_PROTOCOL,
            "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.Z29vZA"
                .parse()
                .expect("header"),
        );
        assert_eq!(
            a.check(None, &h, "GET", "/exec/a/b/c")
                .await
                .map(|u| u.name),
            Ok("alice".into())
        );
    }
}
