//! How the client reaches the runtime: a lazy channel that dials the Unix
//! socket for every new connection and notes which process accepted it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Uri};

/// A lazy channel to `socket`; each connection's peer PID (`SO_PEERCRED`)
/// goes to `peer`.
pub(super) fn channel(socket: Arc<PathBuf>, peer: Arc<watch::Sender<Option<u32>>>) -> Channel {
    // The URI is required by tonic but unused: every connection dials the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = Arc::clone(&socket);
            let peer = Arc::clone(&peer);
            async move {
                let stream = UnixStream::connect(&*socket).await?;
                if let Some(pid) = stream
                    .peer_cred()
                    .ok()
                    .and_then(|c| c.pid())
                    .and_then(|p| u32::try_from(p).ok())
                {
                    peer.send_if_modified(|old| old.replace(pid) != Some(pid));
                }
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
}
