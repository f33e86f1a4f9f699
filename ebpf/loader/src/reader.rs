//! [`EventReader`]: the ring buffer as an async stream of typed events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use tokio::io::unix::AsyncFd;
use tokio_stream::Stream;

use crate::error::Error;
use crate::event::{Event, decode};
use evlet_ebpf_common::LOST_MAP;

/// Reads the ring buffer as it is filled: each wake-up drains every pending record.
///
/// # Cancel safety
/// [`EventReader::next`] is cancel safe: decoded events wait in an internal queue.
pub struct EventReader {
    fd: AsyncFd<RingBuf<MapData>>,
    lost: Arc<PerCpuArray<MapData, u64>>,
    pending: VecDeque<Event>,
    /// Records that could not be decoded (should stay 0).
    undecodable: u64,
}

impl std::fmt::Debug for EventReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReader")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl EventReader {
    pub(crate) fn new(
        ring: RingBuf<MapData>,
        lost: Arc<PerCpuArray<MapData, u64>>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            // SAFETY: the RingBuf owns its map fd, which stays open and the same for
            // as long as the AsyncFd (its owner) lives.
            fd: unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(std::io::Error::from)?,
            lost,
            pending: VecDeque::new(),
            undecodable: 0,
        })
    }

    /// The next event, waiting for one. `None` only if the ring buffer's fd fails.
    pub async fn next(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Every event already in the ring buffer, without waiting.
    pub fn drain_ready(&mut self, out: &mut Vec<Event>) {
        self.fill();
        out.extend(self.pending.drain(..));
    }

    /// Events lost to a full ring buffer (kernel-side reserve failures), summed over CPUs.
    ///
    /// # Errors
    /// If the counter map cannot be read.
    pub fn lost(&self) -> Result<u64, Error> {
        read_lost(&self.lost)
    }

    /// Records that could not be decoded (a version mismatch; stays 0).
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    fn fill(&mut self) {
        let ring = self.fd.get_mut();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Some(event) => self.pending.push_back(event),
                None => self.undecodable += 1,
            }
        }
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Poll::Ready(Some(event));
            }
            let mut guard = match ready!(self.fd.poll_read_ready_mut(cx)) {
                Ok(guard) => guard,
                Err(err) => {
                    tracing::error!(%err, "eBPF ring buffer fd failed");
                    return Poll::Ready(None);
                }
            };
            guard.clear_ready();
            drop(guard);
            self.fill();
        }
    }
}

impl Stream for EventReader {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.get_mut().poll_event(cx)
    }
}

/// The sum of the per-CPU loss counter (failed ring-buffer reservations).
pub(crate) fn read_lost(lost: &PerCpuArray<MapData, u64>) -> Result<u64, Error> {
    let values = lost.get(&0, 0).map_err(|source| Error::Map {
        map: LOST_MAP,
        source,
    })?;
    Ok(values.iter().sum())
}
