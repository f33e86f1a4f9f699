//! The certificate in use: a cell the manager's loop writes and rustls
//! reads on every handshake, through [`ClientResolver`] (the API client's
//! `ResolvesClientCert`) and [`ServingResolver`] (the secured port's
//! `ResolvesServerCert`). A new certificate serves new connections at once;
//! no client or server is rebuilt.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::Error;
use super::rotation::Facts;
use super::store::Pair;

/// A certificate ready for rustls, with what it says about itself.
#[derive(Debug)]
pub struct Issued {
    /// The chain and its signing key.
    pub key: Arc<CertifiedKey>,
    /// Its validity, subject and SANs.
    pub facts: Facts,
    /// The file it came from.
    pub path: PathBuf,
}

impl Issued {
    /// Checks `pair` (the key matches the leaf, the leaf parses) for rustls.
    ///
    /// # Errors
    /// [`Error::Pem`] naming the file.
    pub fn from_pair(pair: Pair) -> Result<Self, Error> {
        let bad = |problem: String| Error::Pem {
            path: pair.path.clone(),
            problem,
        };
        let leaf = pair
            .certs
            .first()
            .ok_or_else(|| bad("no certificate".into()))?;
        let facts =
            Facts::from_der(leaf).ok_or_else(|| bad("the certificate does not parse".into()))?;
        let provider = rustls::crypto::ring::default_provider();
        let key = CertifiedKey::from_der(pair.certs.clone(), pair.key.clone_key(), &provider)
            .map_err(|e| bad(format!("certificate and key: {e}")))?;
        Ok(Self {
            key: Arc::new(key),
            facts,
            path: pair.path,
        })
    }
}

/// The certificate in use, and how many times it changed.
#[derive(Debug, Default)]
pub struct Cell {
    current: Mutex<Option<Arc<Issued>>>,
    /// Bumped on every change: the API client's connections made before
    /// carry an older number and are not reused (upstream closes them).
    generation: Arc<AtomicU64>,
}

impl Cell {
    /// The certificate in use.
    pub fn get(&self) -> Option<Arc<Issued>> {
        crate::lock::lock(&self.current).clone()
    }

    /// Puts `issued` in use; returns the one it replaces.
    pub fn set(&self, issued: Issued) -> Option<Arc<Issued>> {
        let old = crate::lock::lock(&self.current).replace(Arc::new(issued));
        self.generation.fetch_add(1, Ordering::SeqCst);
        old
    }

    /// The change counter.
    pub fn generation(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.generation)
    }
}

/// The API client's certificate: the cell's, whatever it is now (none yet:
/// the handshake goes on without one, as upstream's, and the API server
/// answers 401 or 403).
#[derive(Debug)]
pub struct ClientResolver(pub Arc<Cell>);

impl ResolvesClientCert for ClientResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.get().map(|c| Arc::clone(&c.key))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The secured port's certificate: the cell's; none yet fails the
/// handshake, as upstream's `GetCertificate` does ("no serving certificate
/// available for the kubelet"): the port serves nothing it cannot serve
/// securely.
#[derive(Debug)]
pub struct ServingResolver(pub Arc<Cell>);

impl ResolvesServerCert for ServingResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.0.get();
        if current.is_none() {
            tracing::debug!(
                "TLS handshake refused: no serving certificate available for the kubelet \
                 (serverTLSBootstrap: its CSR is not issued yet)"
            );
        }
        current.map(|c| Arc::clone(&c.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::store::{self, tests::self_signed};

    fn issued(cn: &str) -> Issued {
        let (cert, key) = self_signed(cn);
        let pair =
            store::parse_pair(cert.as_bytes(), key.as_bytes(), "/x.pem".as_ref()).expect("pair");
        Issued::from_pair(pair).expect("issued")
    }

    #[test]
    fn the_resolvers_follow_the_cell_and_count_changes() {
        let cell = Arc::new(Cell::default());
        let client = ClientResolver(Arc::clone(&cell));
        assert!(client.has_certs());
        assert!(client.resolve(&[], &[]).is_none());
        let generation = cell.generation();
        assert!(cell.set(issued("one")).is_none());
        let first = client.resolve(&[], &[]).expect("one");
        assert_eq!(generation.load(Ordering::SeqCst), 1);
        let old = cell.set(issued("two")).expect("the first");
        assert_eq!(old.facts.common_name, "one");
        let second = client.resolve(&[], &[]).expect("two");
        assert_ne!(first.cert, second.cert);
        assert_eq!(generation.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let (cert, _) = self_signed("a");
        let (_, key) = self_signed("b");
        let pair =
            store::parse_pair(cert.as_bytes(), key.as_bytes(), "/x.pem".as_ref()).expect("pair");
        let err = Issued::from_pair(pair).expect_err("mismatch");
        assert!(
            err.to_string().starts_with("/x.pem: certificate and key"),
            "{err}"
        );
    }
}
