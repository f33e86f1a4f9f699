//! Registry credentials from a pod's `imagePullSecrets`, as upstream's
//! `credentialprovider` keyring: `kubernetes.io/dockerconfigjson`
//! (`{"auths": {...}}`) and legacy `kubernetes.io/dockercfg` secrets; an image
//! gets every entry whose registry (host, same number of labels, `*` labels,
//! port, path prefix) matches it, most specific first, and Docker Hub's entry
//! for images of the default registry. Pure.

use std::collections::BTreeMap;

/// One registry credential (becomes a CRI `AuthConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// `base64(user:password)`, as in the docker config.
    pub auth: String,
    /// The registry the entry was for.
    pub server: String,
}

/// A docker config that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image pull secret {secret:?}: {problem}")]
pub struct BadSecret {
    /// The secret.
    pub secret: String,
    /// What is wrong.
    pub problem: String,
}

#[derive(serde::Deserialize, Default)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

/// The keyring of a pod's pull secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyring {
    /// Registry key (host + path) → credential, most specific first.
    entries: Vec<(String, Credential)>,
}

/// `host[:port][/path]` of a docker config location (scheme and `/v1/`, `/v2/` dropped).
fn location_key(loc: &str) -> Option<String> {
    let rest = loc
        .strip_prefix("https://")
        .or_else(|| loc.strip_prefix("http://"))
        .unwrap_or(loc);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if host.is_empty() {
        return None;
    }
    let path = path
        .strip_prefix("/v2/")
        .or_else(|| path.strip_prefix("/v1/"))
        .map(|p| format!("/{p}"))
        .unwrap_or_else(|| path.to_owned());
    let path = path.trim_end_matches('/');
    Some(if path.is_empty() {
        host.to_owned()
    } else {
        format!("{host}{path}")
    })
}

fn decode_auth(auth: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

impl Keyring {
    /// Adds the entries of secret `name` with data `data` (key → text).
    ///
    /// # Errors
    /// [`BadSecret`] if its docker config is not JSON of the expected shape.
    pub fn add_secret(
        &mut self,
        name: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<(), BadSecret> {
        let bad = |problem: String| BadSecret {
            secret: name.to_owned(),
            problem,
        };
        let entries: BTreeMap<String, Entry> = if let Some(json) = data.get(".dockerconfigjson") {
            #[derive(serde::Deserialize)]
            struct Config {
                #[serde(default)]
                auths: BTreeMap<String, Entry>,
            }
            serde_json::from_str::<Config>(json)
                .map_err(|e| bad(format!(".dockerconfigjson: {e}")))?
                .auths
        } else if let Some(json) = data.get(".dockercfg") {
            serde_json::from_str(json).map_err(|e| bad(format!(".dockercfg: {e}")))?
        } else {
            return Ok(());
        };
        for (loc, e) in entries {
            let Some(key) = location_key(&loc) else {
                continue;
            };
            let (username, password) = if e.username.is_empty() && !e.auth.is_empty() {
                decode_auth(&e.auth).ok_or_else(|| bad("unable to parse auth field".into()))?
            } else {
                (e.username, e.password)
            };
            self.entries.push((
                key.clone(),
                Credential {
                    username,
                    password,
                    auth: e.auth,
                    server: key,
                },
            ));
        }
        // Most specific first (upstream sorts the index in reverse).
        self.entries.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(())
    }

    /// The credentials to try for `image`, in order.
    pub fn lookup(&self, image: &str) -> Vec<Credential> {
        let repo = repository(image);
        let mut found: Vec<Credential> = self
            .entries
            .iter()
            .filter(|(key, _)| urls_match(key, &repo))
            .map(|(_, c)| c.clone())
            .collect();
        if found.is_empty() && is_default_registry(image) {
            found = self
                .entries
                .iter()
                .filter(|(key, _)| key == "index.docker.io" || key == "docker.io")
                .map(|(_, c)| c.clone())
                .collect();
        }
        found
    }

    /// No credentials at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The repository of an image reference, normalized as Docker does
/// (`nginx` → `docker.io/library/nginx`), without tag or digest.
pub fn repository(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    // A tag is after the last ':' that follows the last '/'.
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match without_digest[last_slash..].rfind(':') {
        Some(i) => &without_digest[..last_slash + i],
        None => without_digest,
    };
    let first = repo.split('/').next().unwrap_or("");
    if !repo.contains('/') {
        format!("docker.io/library/{repo}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        repo.to_owned()
    } else {
        format!("docker.io/{repo}")
    }
}

fn is_default_registry(image: &str) -> bool {
    let repo = repository(image);
    let host = repo.split('/').next().unwrap_or("");
    host == "docker.io" || host == "index.docker.io"
}

/// Upstream's `URLsMatchStr`: same port, same number of host labels (each a
/// glob), and the target's path under the entry's path.
fn urls_match(glob: &str, target: &str) -> bool {
    let split = |s: &str| -> (String, String, String) {
        let (hostport, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.to_owned()),
            None => (hostport.to_owned(), String::new()),
        };
        (host, port, path.to_owned())
    };
    let (gh, gp, gpath) = split(glob);
    let (th, tp, tpath) = split(target);
    if gp != tp || !tpath.starts_with(&gpath) {
        return false;
    }
    let gl: Vec<&str> = gh.split('.').collect();
    let tl: Vec<&str> = th.split('.').collect();
    gl.len() == tl.len() && gl.iter().zip(&tl).all(|(g, t)| glob_label(g, t))
}

/// A host label matched against a pattern with `*` (any run of characters).
fn glob_label(pattern: &str, label: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == label,
        Some((head, tail)) => {
            label.len() >= head.len()
                && label.starts_with(head)
                && (0..=label.len() - head.len())
                    .any(|i| glob_label(tail, &label[head.len() + i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring(json: &str) -> Keyring {
        let mut k = Keyring::default();
        k.add_secret(
            "pull",
            &[(".dockerconfigjson".to_owned(), json.to_owned())].into(),
        )
        .expect("secret");
        k
    }

    #[test]
    fn images_match_their_registry_entries() {
        let k = keyring(
            r#"{"auths": {"registry.example.com": {"username": "u", "password": "p"}, "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="}, "*.corp.example": {"username": "c", "password": "x"}}}"#,
        );
        assert_eq!(
            k.lookup("registry.example.com/team/app:1.0")[0].username,
            "u"
        );
        let hub = k.lookup("nginx:1.27");
        assert_eq!(
            (hub[0].username.as_str(), hub[0].password.as_str()),
            ("hub", "secret")
        );
        assert_eq!(k.lookup("eu.corp.example/app")[0].username, "c");
        assert!(
            k.lookup("a.b.corp.example/app").is_empty(),
            "a glob label is one label"
        );
        assert!(k.lookup("other.example/app").is_empty());
    }

    #[test]
    fn repositories_are_normalized_as_docker_does() {
        assert_eq!(repository("nginx"), "docker.io/library/nginx");
        assert_eq!(repository("team/app:2"), "docker.io/team/app");
        assert_eq!(
            repository("localhost:5000/app:2@sha256:ab"),
            "localhost:5000/app"
        );
        assert_eq!(repository("evlet.local/test:v1"), "evlet.local/test");
    }

    #[test]
    fn a_malformed_config_names_the_secret() {
        let mut k = Keyring::default();
        let err = k
            .add_secret(
                "broken",
                &[(".dockerconfigjson".to_owned(), "{".to_owned())].into(),
            )
            .expect_err("bad json");
        assert!(
            err.to_string()
                .starts_with("image pull secret \"broken\": .dockerconfigjson:")
        );
    }
}
