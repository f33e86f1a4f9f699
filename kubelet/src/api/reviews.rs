//! [`ApiReviews`]: the API server's answers for the secured port's webhook
//! modes: `TokenReview` for bearer tokens, `SubjectAccessReview` for each
//! check on `nodes/<node>/<subresource>` (upstream's delegating
//! authenticator and authorizer; the caching is the server's).

use futures_util::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::server::auth::{Check, Reviews, User};

/// Reviews through the API server.
#[derive(Clone)]
pub struct ApiReviews {
    client: kube::Client,
}

impl std::fmt::Debug for ApiReviews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiReviews").finish_non_exhaustive()
    }
}

impl ApiReviews {
    /// Reviews through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviews for ApiReviews {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<User>, String>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: None,
                },
                ..TokenReview::default()
            };
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| e.to_string())?;
            let Some(status) = answer.status else {
                return Err("TokenReview without a status".into());
            };
            if let Some(e) = status.error.filter(|e| !e.is_empty()) {
                return Err(e);
            }
            if !status.authenticated.unwrap_or(false) {
                return Ok(None);
            }
            let user = status.user.unwrap_or_default();
            Ok(Some(User {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn review_access<'a>(
        &'a self,
        user: &'a User,
        node: &'a str,
        check: Check,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(check.verb.to_owned()),
                        version: Some("v1".into()),
                        resource: Some("nodes".into()),
                        subresource: Some(check.subresource.to_owned()),
                        name: Some(node.to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    user: Some(user.name.clone()),
                    groups: Some(user.groups.clone()),
                    uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                    extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| e.to_string())?;
            let status = answer
                .status
                .ok_or("SubjectAccessReview without a status")?;
            if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty())
                && !status.allowed
            {
                return Err(e);
            }
            Ok(status.allowed && !status.denied.unwrap_or(false))
        })
    }
}
