//! What one client may hold of a kubelet API port: how long it may take to
//! send a request's headers, how long an idle connection is kept, how large
//! the headers may be, and how many connections are held at once.
//!
//! The values are upstream's where it has them. Upstream's kubelet servers
//! (`pkg/kubelet/server/server.go`, `ListenAndServeKubeletServer` and
//! `ListenAndServeKubeletReadOnlyServer`) set `IdleTimeout` 90 s and
//! `MaxHeaderBytes` 1 MiB, and no `ReadHeaderTimeout` (Go then uses
//! `ReadTimeout`, 4 h). The header timeout here is the API server's
//! `ReadHeaderTimeout`, 32 s (`k8s.io/apiserver/pkg/server/secure_serving.go`,
//! the same http.Server settings otherwise). Upstream caps no connections;
//! [`Gate`] does.
//!
//! # Connections held
//! A port holds at most [`Limits::max_connections`] connections. One that has
//! not yet shown who it is (no request headers read; on the secured port, no
//! request authenticated) is *pending*, and at most [`Limits::max_pending`]
//! are: a new connection past that closes the oldest pending one, and when
//! every slot is taken a new connection first closes the oldest pending one,
//! and waits (in the listen backlog, accepted in order) only when all held
//! connections are established. So clients that connect and send nothing, or
//! one header byte at a time, hold a bounded number of slots and never keep
//! out a client that sends its request (and credentials) at once: its
//! connection is established within milliseconds, and only that many slow
//! connections opened within those milliseconds could close it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::lock::lock;

/// The limits of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time to send a request's headers: from the connection's start (after
    /// TLS) for its first request, from the first byte for later ones (the
    /// API server's `ReadHeaderTimeout`, 32 s).
    pub header_read_timeout: Duration,
    /// Time an idle keep-alive connection is kept (upstream's `IdleTimeout`, 90 s).
    pub idle_timeout: Duration,
    /// The largest request head (upstream's `MaxHeaderBytes`, 1 MiB).
    pub max_header_bytes: usize,
    /// Time for a TLS handshake (evlet's own, 10 s).
    pub tls_handshake_timeout: Duration,
    /// Connections held at once (evlet's own, 1024; upstream has no cap).
    pub max_connections: usize,
    /// Connections held that have not yet shown who they are (evlet's own, 64).
    pub max_pending: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_pending: 64,
        }
    }
}

/// The connections a port holds: a slot for each, pending ones closed
/// oldest first when the port is full.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    /// One permit per connection held.
    permits: Arc<Semaphore>,
    /// The pending connections, oldest first, each with the token that closes it.
    pending: Mutex<BTreeMap<u64, CancellationToken>>,
    /// The next connection's number (its age).
    next: AtomicU64,
}

impl Gate {
    /// A gate with `limits`.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            pending: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    /// The port's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.limits
            .max_connections
            .max(1)
            .saturating_sub(self.permits.available_permits())
    }

    /// Pending connections held now.
    pub fn pending(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Waits for room for one more connection: a free slot, or the slot of
    /// the oldest pending connection, which is closed for it.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is taken until it returns.
    pub(crate) async fn room(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Some(permit);
        }
        self.close_oldest_pending();
        Arc::clone(&self.permits).acquire_owned().await.ok()
    }

    /// Admits an accepted connection as pending, closing the oldest pending
    /// one if there are [`Limits::max_pending`] already.
    pub(crate) fn admit(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let closed = CancellationToken::new();
        let mut pending = lock(&self.pending);
        while pending.len() >= self.limits.max_pending.max(1) {
            match pending.pop_first() {
                Some((_, oldest)) => oldest.cancel(),
                None => break,
            }
        }
        pending.insert(id, closed.clone());
        drop(pending);
        Slot(Arc::new(SlotInner {
            gate: Arc::clone(self),
            id,
            closed,
            _permit: permit,
        }))
    }

    fn close_oldest_pending(&self) {
        if let Some((_, oldest)) = lock(&self.pending).pop_first() {
            oldest.cancel();
        }
    }
}

/// A held connection's slot: freed when the last clone is dropped (the
/// connection, or the stream it was upgraded to, is gone).
#[derive(Debug, Clone)]
pub struct Slot(Arc<SlotInner>);

#[derive(Debug)]
struct SlotInner {
    gate: Arc<Gate>,
    id: u64,
    /// Cancelled when the gate closes this connection for a newer one.
    closed: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The connection showed who it is: it is no longer closed for newer ones.
    pub fn established(&self) {
        lock(&self.0.gate.pending).remove(&self.0.id);
    }

    /// Resolves when the gate closes this (pending) connection.
    pub(crate) async fn closed(&self) {
        self.0.closed.cancelled().await;
    }
}

impl Drop for SlotInner {
    fn drop(&mut self) {
        lock(&self.gate.pending).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(max_connections: usize, max_pending: usize) -> Arc<Gate> {
        Gate::new(Limits {
            max_connections,
            max_pending,
            ..Limits::default()
        })
    }

    #[tokio::test]
    async fn a_new_connection_past_the_pending_cap_closes_the_oldest_pending_one() {
        let gate = small(10, 2);
        let first = gate.admit(gate.room().await.expect("room"));
        let second = gate.admit(gate.room().await.expect("room"));
        second.established();
        let third = gate.admit(gate.room().await.expect("room"));
        let fourth = gate.admit(gate.room().await.expect("room"));
        assert!(first.0.closed.is_cancelled(), "the oldest pending one");
        assert!(!second.0.closed.is_cancelled(), "established ones stay");
        assert!(!third.0.closed.is_cancelled() && !fourth.0.closed.is_cancelled());
        assert_eq!((gate.held(), gate.pending()), (4, 2));
        drop(first);
        assert_eq!(gate.held(), 3, "a slot is freed when its connection goes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_port_closes_a_pending_connection_and_waits_only_for_established_ones() {
        let gate = small(2, 2);
        let established = gate.admit(gate.room().await.expect("room"));
        established.established();
        let pending = gate.admit(gate.room().await.expect("room"));
        let waiting = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.room().await.map(|p| gate.admit(p)) })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(pending.0.closed.is_cancelled(), "closed to make room");
        assert!(!waiting.is_finished(), "its slot is free once it is gone");
        drop(pending);
        let admitted = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("admitted once the slot is free")
            .expect("task")
            .expect("room");
        established.established();
        admitted.established();
        let blocked = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.room().await.map(|p| gate.admit(p)) })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !blocked.is_finished(),
            "established connections are never closed for a new one"
        );
        drop(established);
        tokio::time::timeout(Duration::from_secs(1), blocked)
            .await
            .expect("admitted in order")
            .expect("task")
            .expect("room");
    }
}
