//! The pki directory, laid out as upstream's client-go file store: each
//! certificate with its key in one file `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`
//! (mode 0600), `<prefix>-current.pem` a symlink to the one in use, swapped
//! through `<prefix>-updated.pem` and a rename; and the bootstrap key kept in
//! `kubelet-client.key.tmp` until its certificate arrives.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::Error;

/// The client certificate's prefix.
pub const CLIENT: &str = "kubelet-client";
/// The serving certificate's prefix.
pub const SERVER: &str = "kubelet-server";
/// Where the bootstrap key waits for its certificate (upstream's name).
pub const TMP_KEY: &str = "kubelet-client.key.tmp";

/// A certificate chain and its key, as read from a file.
#[derive(Debug)]
pub struct Pair {
    /// The chain, leaf first.
    pub certs: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
    /// The file it came from.
    pub path: PathBuf,
}

/// One certificate's files under the pki directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    prefix: &'static str,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem` for `at` (UTC; upstream formats
/// the local time the same way).
pub fn file_name(prefix: &str, at: SystemTime) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let t = time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{prefix}-{:04}-{:02}-{:02}-{:02}-{:02}-{:02}.pem",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Reads a certificate chain and a key from PEM text (one file or two).
///
/// # Errors
/// [`Error::Pem`] naming `path` when either is missing.
pub fn parse_pair(cert_pem: &[u8], key_pem: &[u8], path: &Path) -> Result<Pair, Error> {
    let pem = |problem: &str| Error::Pem {
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    let certs = rustls_pemfile::certs(&mut &*cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| pem("unreadable CERTIFICATE block"))?;
    if certs.is_empty() {
        return Err(pem("no CERTIFICATE block"));
    }
    let key = rustls_pemfile::private_key(&mut &*key_pem)
        .map_err(|_| pem("unreadable PRIVATE KEY block"))?
        .ok_or_else(|| pem("no PRIVATE KEY block"))?;
    Ok(Pair {
        certs,
        key,
        path: path.to_owned(),
    })
}

/// Writes `bytes` to `path` with mode 0600, replacing it.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    // An older file keeps its mode through `open`.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

impl Store {
    /// The files of `prefix` ([`CLIENT`], [`SERVER`]) under `dir`.
    pub fn new(dir: impl Into<PathBuf>, prefix: &'static str) -> Self {
        Self {
            dir: dir.into(),
            prefix,
        }
    }

    /// `<prefix>-current.pem`: what a kubeconfig names as its certificate and key.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    fn updated_path(&self) -> PathBuf {
        self.dir.join(format!("{}-updated.pem", self.prefix))
    }

    /// `kubelet-client.key.tmp`.
    pub fn tmp_key_path(&self) -> PathBuf {
        self.dir.join(TMP_KEY)
    }

    /// Finishes a swap a crash interrupted: `-updated` becomes `-current`
    /// when there is no `-current` (upstream's `recover`).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn recover(&self) -> Result<(), Error> {
        let current = self.current_path();
        let updated = self.updated_path();
        if std::fs::symlink_metadata(&current).is_ok() {
            return Ok(());
        }
        match std::fs::symlink_metadata(&updated) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::rename(&updated, &current).map_err(io(&updated))
            }
            Ok(_) => Err(Error::Pem {
                path: updated,
                problem: "expected a symlink, found a file".into(),
            }),
            Err(_) => Ok(()),
        }
    }

    /// The pair `-current.pem` points to; None when there is none.
    ///
    /// # Errors
    /// [`Error`] naming the file when it exists but cannot be read.
    pub fn current(&self) -> Result<Option<Pair>, Error> {
        let path = self.current_path();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        // Named by the file the symlink points to, as it was when written.
        let file = std::fs::read_link(&path)
            .map(|t| self.dir.join(t))
            .unwrap_or(path);
        parse_pair(&text, &text, &file).map(Some)
    }

    /// Writes a new pair (certificate PEM, then key PEM) as
    /// `<prefix>-<now>.pem` and points `-current.pem` at it; returns the
    /// new file.
    ///
    /// # Errors
    /// [`Error`] naming the file; `-current.pem` is untouched then, and a
    /// `-current.pem` that is a regular file (not a symlink) is refused, as
    /// upstream refuses it.
    pub fn update(&self, cert_pem: &str, key_pem: &str, now: SystemTime) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let current = self.current_path();
        if let Ok(m) = std::fs::symlink_metadata(&current)
            && !m.file_type().is_symlink()
        {
            return Err(Error::Pem {
                path: current,
                problem: "expected a symlink, found a file".into(),
            });
        }
        let file = self.dir.join(file_name(self.prefix, now));
        let mut text = cert_pem.trim_end().to_owned();
        text.push('\n');
        text.push_str(key_pem.trim_end());
        text.push('\n');
        parse_pair(text.as_bytes(), text.as_bytes(), &file)?;
        write_private(&file, text.as_bytes())?;
        let target = if file.is_absolute() {
            file.clone()
        } else {
            std::env::current_dir().map_err(io(&file))?.join(&file)
        };
        let updated = self.updated_path();
        match std::fs::remove_file(&updated) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&updated)(e)),
        }
        std::os::unix::fs::symlink(&target, &updated).map_err(io(&updated))?;
        // rename(2) replaces the old symlink atomically: a reader sees the
        // old pair or the new one, never none.
        std::fs::rename(&updated, &current).map_err(io(&current))?;
        Ok(file)
    }

    /// The bootstrap key: the one in `kubelet-client.key.tmp` (a restart
    /// mid-bootstrap asks with the same key, so the same CSR), else a new
    /// ECDSA P-256 key written there first.
    ///
    /// # Errors
    /// [`Error`] naming the file.
    pub fn tmp_key(&self) -> Result<rcgen::KeyPair, Error> {
        let path = self.tmp_key_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => match rcgen::KeyPair::from_pem(&text) {
                Ok(key) => return Ok(key),
                Err(e) => tracing::warn!(
                    file = %path.display(), error = %e,
                    "unusable bootstrap key; making a new one"
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
        let key = new_key()?;
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        write_private(&path, key.serialize_pem().as_bytes())?;
        Ok(key)
    }

    /// Removes `kubelet-client.key.tmp` (its certificate arrived).
    pub fn remove_tmp_key(&self) {
        let path = self.tmp_key_path();
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove the bootstrap key");
        }
    }
}

/// A new ECDSA P-256 key (upstream's default `ECDSAP256`).
///
/// # Errors
/// [`Error::Generate`].
pub fn new_key() -> Result<rcgen::KeyPair, Error> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::Generate(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::{Duration, UNIX_EPOCH};

    pub(crate) fn self_signed(cn: &str) -> (String, String) {
        let key = new_key().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn file_names_carry_the_utc_time_as_upstream_formats_it() {
        // 2026-11-25 20:18:01 UTC
        let at = UNIX_EPOCH + Duration::from_secs(1_795_637_881);
        assert_eq!(
            file_name(CLIENT, at),
            "kubelet-client-2026-11-25-20-18-01.pem"
        );
        assert_eq!(
            file_name(SERVER, UNIX_EPOCH),
            "kubelet-server-1970-01-01-00-00-00.pem"
        );
    }

    #[test]
    fn an_update_writes_a_private_pair_and_swaps_the_current_symlink() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::new(dir.path().join("pki"), CLIENT);
        assert!(store.current().expect("none yet").is_none());
        let (c1, k1) = self_signed("first");
        let t1 = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let f1 = store.update(&c1, &k1, t1).expect("first");
        assert_eq!(
            f1.file_name().and_then(|n| n.to_str()),
            Some("kubelet-client-2001-09-09-01-46-40.pem")
        );
        let mode = std::fs::metadata(&f1).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let link = std::fs::read_link(store.current_path()).expect("a symlink");
        assert_eq!(link, f1, "an absolute target");
        let pair = store.current().expect("read").expect("a pair");
        assert_eq!(pair.certs.len(), 1);
        assert_eq!(pair.path, f1, "named by the file, not the symlink");
        let text = std::fs::read_to_string(&f1).expect("text");
        assert!(
            text.find("CERTIFICATE").expect("cert") < text.find("PRIVATE KEY").expect("key"),
            "certificate first, then key: {text}"
        );

        let (c2, k2) = self_signed("second");
        let f2 = store
            .update(&c2, &k2, t1 + Duration::from_secs(60))
            .expect("second");
        assert_eq!(std::fs::read_link(store.current_path()).expect("link"), f2);
        assert!(f1.exists(), "the old pair stays, as upstream's");
        assert!(!dir.path().join("pki/kubelet-client-updated.pem").exists());
    }

    #[test]
    fn a_bad_pair_leaves_the_current_one_and_a_regular_current_file_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::new(dir.path(), SERVER);
        let (c, k) = self_signed("good");
        let good = store.update(&c, &k, UNIX_EPOCH).expect("good");
        let err = store
            .update("garbage", &k, UNIX_EPOCH + Duration::from_secs(1))
            .expect_err("no certificate");
        assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
        assert_eq!(
            std::fs::read_link(store.current_path()).expect("link"),
            good
        );

        let other = tempfile::tempdir().expect("tmp");
        let store = Store::new(other.path(), SERVER);
        std::fs::write(store.current_path(), "x").expect("write");
        let err = store.update(&c, &k, UNIX_EPOCH).expect_err("a file");
        assert!(err.to_string().contains("expected a symlink"), "{err}");
    }

    #[test]
    fn an_interrupted_swap_is_finished_at_start() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::new(dir.path(), CLIENT);
        let (c, k) = self_signed("n");
        let file = store.update(&c, &k, UNIX_EPOCH).expect("update");
        std::fs::rename(store.current_path(), store.updated_path()).expect("mv");
        store.recover().expect("recover");
        assert_eq!(
            std::fs::read_link(store.current_path()).expect("link"),
            file
        );
        store.recover().expect("nothing to do");
    }

    #[test]
    fn the_bootstrap_key_survives_until_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::new(dir.path().join("pki"), CLIENT);
        let first = store.tmp_key().expect("made");
        let path = dir.path().join("pki/kubelet-client.key.tmp");
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = store.tmp_key().expect("read");
        assert_eq!(first.public_key_der(), again.public_key_der(), "reused");
        store.remove_tmp_key();
        assert!(!path.exists());
        let third = store.tmp_key().expect("made again");
        assert_ne!(first.public_key_der(), third.public_key_der());
        store.remove_tmp_key();
        store.remove_tmp_key();
    }
}
