//! [`TokenManager`]: service-account tokens for projected volumes, through the
//! TokenRequest API (`POST .../serviceaccounts/<name>/token`), bound to the
//! pod, cached per (service account, audience, lifetime, pod) and fetched
//! again once 80 % of a token's lifetime has passed or it is a day old
//! (upstream's `token_manager`). When a token needs refreshing, the pod it
//! belongs to is announced so its volume is written again at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest as ApiTokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;
use crate::pod::PodUid;
use crate::volume::sources::{Token, TokenRequest};

/// A token older than this is fetched again whatever its expiry (upstream's `maxTTL`).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Why a token could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to fetch token: {0}")]
pub struct TokenError(pub String);

#[derive(Debug, Clone)]
struct Cached {
    token: Token,
    /// When it was fetched (Unix seconds).
    fetched: i64,
}

impl Cached {
    /// Upstream's `requiresRefresh`: past 80 % of the lifetime it was given,
    /// or older than a day.
    fn stale(&self, now: i64) -> bool {
        let lifetime = (self.token.expires_at - self.fetched).max(0);
        now >= self.token.expires_at - lifetime / 5
            || now - self.fetched >= MAX_AGE.as_secs() as i64
    }

    /// Seconds until it goes stale.
    fn refresh_in(&self, now: i64) -> u64 {
        let lifetime = (self.token.expires_at - self.fetched).max(0);
        let at =
            (self.token.expires_at - lifetime / 5).min(self.fetched + MAX_AGE.as_secs() as i64);
        u64::try_from(at - now).unwrap_or(0)
    }
}

/// Service-account tokens for projected volumes.
pub struct TokenManager {
    client: kube::Client,
    cache: Mutex<HashMap<TokenRequest, Cached>>,
    /// Pods whose token needs refreshing (the sync loop syncs them).
    refresh: mpsc::UnboundedSender<PodUid>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for TokenManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenManager")
            .field("cached", &lock(&self.cache).len())
            .finish()
    }
}

impl TokenManager {
    /// A manager asking with `client`, announcing pods to refresh on `refresh`.
    pub fn new(
        client: kube::Client,
        refresh: mpsc::UnboundedSender<PodUid>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cache: Mutex::new(HashMap::new()),
            refresh,
            shutdown,
        })
    }

    /// The token `request` asks for: the cached one while fresh, else a new one
    /// (a failed refresh keeps serving a cached token that has not expired).
    ///
    /// # Errors
    /// [`TokenError`] if no usable token can be had.
    pub async fn get(&self, request: &TokenRequest) -> Result<Token, TokenError> {
        let now = crate::clock::unix_ns() / 1_000_000_000;
        let cached = lock(&self.cache).get(request).cloned();
        if let Some(c) = &cached
            && !c.stale(now)
        {
            return Ok(c.token.clone());
        }
        match self.fetch(request).await {
            Ok(token) => {
                let fresh = Cached {
                    token: token.clone(),
                    fetched: now,
                };
                self.schedule_refresh(request, &fresh, now);
                lock(&self.cache).insert(request.clone(), fresh);
                Ok(token)
            }
            Err(e) => match cached {
                Some(c) if c.token.expires_at > now => {
                    tracing::warn!(namespace = %request.namespace, service_account = %request.service_account, error = %e, "couldn't update token; serving the cached one");
                    Ok(c.token)
                }
                Some(_) => Err(TokenError(format!("token expired and refresh failed: {e}"))),
                None => Err(e),
            },
        }
    }

    /// Forgets the tokens bound to pod `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        lock(&self.cache).retain(|r, _| r.pod_uid != uid);
    }

    fn schedule_refresh(&self, request: &TokenRequest, token: &Cached, now: i64) {
        let wait = Duration::from_secs(token.refresh_in(now).max(1));
        let tx = self.refresh.clone();
        let uid = PodUid(request.pod_uid.clone());
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(wait) => { let _ = tx.send(uid); }
            }
        });
    }

    async fn fetch(&self, r: &TokenRequest) -> Result<Token, TokenError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &r.namespace);
        let body = ApiTokenRequest {
            spec: Some(TokenRequestSpec {
                // An empty audience means the API server's own.
                audiences: if r.audience.is_empty() {
                    None
                } else {
                    Some(vec![r.audience.clone()])
                },
                expiration_seconds: Some(r.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(r.pod_name.clone()),
                    uid: Some(r.pod_uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = api
            .create_token_request(&r.service_account, &Default::default(), &body)
            .await
            .map_err(|e| TokenError(e.to_string()))?;
        let status = answer
            .status
            .ok_or_else(|| TokenError("the TokenRequest came back without a status".into()))?;
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| TokenError("the TokenRequest came back without a token".into()))?;
        let expires_at = status
            .expiration_timestamp
            .map(|t| t.0.as_second())
            .ok_or_else(|| TokenError("the TokenRequest came back without an expiry".into()))?;
        Ok(Token { token, expires_at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(fetched: i64, expires_at: i64) -> Cached {
        Cached {
            token: Token {
                token: "t".into(),
                expires_at,
            },
            fetched,
        }
    }

    #[test]
    fn a_token_is_refreshed_at_eighty_percent_of_its_lifetime_or_after_a_day() {
        let c = cached(1000, 1000 + 3600);
        assert!(!c.stale(1000 + 2879));
        assert!(c.stale(1000 + 2880));
        assert_eq!(c.refresh_in(1000), 2880);
        let long = cached(0, 10 * 24 * 3600);
        assert!(long.stale(24 * 3600), "a day old");
    }
}
