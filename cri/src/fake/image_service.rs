//! `ImageService` of the fake runtime.

use tonic::{Request, Status};

use super::runtime_service::Reply;
use super::state::{State, now_ns};
use super::{FakeRuntime, lock};
use crate::api::{self, image_service_server::ImageService};

fn image(name: &str) -> api::Image {
    api::Image {
        id: format!("sha256:fake-{name}"),
        repo_tags: vec![name.to_owned()],
        repo_digests: vec![],
        size: 1 << 20,
        spec: Some(api::ImageSpec {
            image: name.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A request that names one image.
trait NamesImage {
    fn image(self) -> Option<api::ImageSpec>;
}

macro_rules! names_image {
    ($($req:ty),*) => {$(
        impl NamesImage for $req {
            fn image(self) -> Option<api::ImageSpec> {
                self.image
            }
        }
    )*};
}
names_image!(
    api::ImageStatusRequest,
    api::PullImageRequest,
    api::RemoveImageRequest
);

impl FakeRuntime {
    /// Answers an RPC about one image: `f` gets its name and the model.
    async fn on_image<Req: NamesImage, Resp>(
        &self,
        call: &'static str,
        req: Request<Req>,
        f: impl FnOnce(String, &mut State) -> Result<Resp, Status>,
    ) -> Reply<Resp> {
        self.answer(call, req, |req| {
            let name = req
                .image()
                .map(|s| s.image)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| Status::invalid_argument("no image name"))?;
            f(name, &mut lock(&self.shared.state))
        })
        .await
    }
}

#[tonic::async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(
        &self,
        req: Request<api::ListImagesRequest>,
    ) -> Reply<api::ListImagesResponse> {
        self.answer("ListImages", req, |req| {
            let want = req
                .filter
                .and_then(|f| f.image)
                .map(|i| i.image)
                .unwrap_or_default();
            let images = lock(&self.shared.state)
                .images
                .iter()
                .filter(|name| want.is_empty() || **name == want)
                .map(|name| image(name))
                .collect();
            Ok(api::ListImagesResponse { images })
        })
        .await
    }

    async fn image_status(
        &self,
        req: Request<api::ImageStatusRequest>,
    ) -> Reply<api::ImageStatusResponse> {
        self.on_image("ImageStatus", req, |name, state| {
            let present = state.images.contains(&name);
            Ok(api::ImageStatusResponse {
                image: present.then(|| image(&name)),
                info: Default::default(),
            })
        })
        .await
    }

    async fn pull_image(
        &self,
        req: Request<api::PullImageRequest>,
    ) -> Reply<api::PullImageResponse> {
        self.answer("PullImage", req, |req| {
            let name = req
                .image
                .map(|s| s.image)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| Status::invalid_argument("no image name"))?;
            let mut state = lock(&self.shared.state);
            state.pulls.push((name.clone(), req.auth.clone()));
            if let Some((user, password)) = state.private.get(&name).cloned() {
                let ok = req
                    .auth
                    .as_ref()
                    .is_some_and(|a| a.username == user && a.password == password);
                if !ok {
                    return Err(Status::unknown(format!(
                        "failed to pull and unpack image \"{name}\": failed to resolve reference \"{name}\": pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials"
                    )));
                }
            }
            if !state.pullable.contains(&name) && !state.images.contains(&name) {
                return Err(Status::not_found(format!(
                    "failed to pull and unpack image \"{name}\": failed to resolve reference \"{name}\": not found"
                )));
            }
            state.add_image(&name);
            Ok(api::PullImageResponse {
                image_ref: format!("sha256:fake-{name}"),
            })
        })
        .await
    }

    async fn remove_image(
        &self,
        req: Request<api::RemoveImageRequest>,
    ) -> Reply<api::RemoveImageResponse> {
        self.on_image("RemoveImage", req, |name, state| {
            state.images.remove(&name);
            Ok(api::RemoveImageResponse {})
        })
        .await
    }

    async fn image_fs_info(
        &self,
        req: Request<api::ImageFsInfoRequest>,
    ) -> Reply<api::ImageFsInfoResponse> {
        self.answer("ImageFsInfo", req, |_| {
            let count = lock(&self.shared.state).images.len() as u64;
            Ok(api::ImageFsInfoResponse {
                image_filesystems: vec![api::FilesystemUsage {
                    timestamp: now_ns(),
                    fs_id: Some(api::FilesystemIdentifier {
                        mountpoint: "/fake".into(),
                    }),
                    used_bytes: Some(api::UInt64Value { value: count << 20 }),
                    inodes_used: Some(api::UInt64Value { value: count }),
                }],
                container_filesystems: vec![],
            })
        })
        .await
    }
}
