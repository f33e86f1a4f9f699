//! The e2e suite's images, built here from sources and imported into the
//! node's containerd under upstream's exact names (no registry is reachable).
//!
//! `e2e.test --list-images` names what the suite may use; each name whose
//! repository has a [`Recipe`] is built, the rest are reported as not
//! buildable here. Every image is one uncompressed layer on Debian's static
//! busybox (applets linked in `/bin`, `/sbin`, `/usr/bin`, `/usr/sbin`, as
//! its `--list-full` says), written as an OCI layout archive that
//! `ctr images import` takes:
//!
//! * `e2e-test-images/agnhost`: `/agnhost` built from the pinned Go module
//!   (`k8s.io/kubernetes/test/images/agnhost`, `CGO_ENABLED=0`, through
//!   `cargo xtask cluster build --with agnhost`), the `agnhost-2` link,
//!   `/uploads`, porter's `localhost.crt`/`.key` from the module's source,
//!   the image's user 1000 and group 50000 (upstream's Dockerfile), and the
//!   tools specs run inside it: Debian's `curl` and OpenBSD `nc` (the
//!   Dockerfile's `netcat-openbsd`; busybox's `nc` has no `-u`), each with the
//!   shared libraries `ldd` names. Upstream's image also has bind-tools,
//!   iproute2, iperf, bash and coredns; the node specs use none of them.
//! * `e2e-test-images/busybox`: the busybox layer, `CMD ["sh"]`.
//! * `e2e-test-images/nonroot`: busybox with `USER 1234`.
//! * `e2e-test-images/nonewprivs`: busybox with `nnp` (the module's
//!   `test/images/nonewprivs`, static) set-uid root, `CMD ["nnp"]`.
//! * `e2e-test-images/nginx`: busybox with Debian bookworm's `nginx` binary
//!   (the `.deb` fetched with `apt-get download`) and its libraries, a
//!   minimal `nginx.conf` serving `/usr/share/nginx/html` on :80,
//!   `CMD ["nginx", "-g", "daemon off;"]`.
//! * `e2e-test-images/httpd`: busybox's `httpd` serving upstream's
//!   `index.html` ("It works!") from `/usr/local/apache2/htdocs` on :80; not
//!   Apache, which no node spec needs.
//! * `pause`: a tag of the node's own pause image.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::json;

use crate::containerd::{self, Version};
use crate::{cluster, image, paths, sh};

/// The host's static busybox (Debian bookworm's 1.35, package
/// `busybox-static`), the layer every image shares. Its `sh` differs from
/// the 1.36 of upstream's images in one way a spec sees: it drops variables
/// whose names are not shell identifiers (`data-1`, what `envFrom` makes of
/// a ConfigMap's keys) from the environment of the commands it runs, so the
/// `envFrom` specs that print `sh -c env` cannot find them (`known`). Sid's
/// 1.38 keeps them but words its errors differently (`/bin/sh: line 0:
/// can't create ...`), which the read-only root file system spec compares
/// word for word.
const BUSYBOX: &str = "/bin/busybox";

fn busybox() -> Result<PathBuf> {
    if !Path::new(BUSYBOX).is_file() {
        bail!("{BUSYBOX} is missing (Debian package busybox-static): run `cargo xtask setup`");
    }
    Ok(PathBuf::from(BUSYBOX))
}

/// What the image of one repository is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// agnhost: the Go binary plus the tools specs exec in it.
    Agnhost,
    /// Static busybox.
    Busybox,
    /// Busybox running as user 1234.
    NonRoot,
    /// Busybox plus the set-uid `nnp`.
    NoNewPrivs,
    /// Busybox plus Debian's nginx.
    Nginx,
    /// Busybox's httpd serving "It works!".
    Httpd,
    /// A tag of the node's pause image.
    Pause,
}

impl Recipe {
    /// The recipe of an image name (`registry/repo:tag`), if there is one.
    pub fn of(name: &str) -> Option<Recipe> {
        let repo = name.rsplit_once(':').map_or(name, |(r, _)| r);
        Some(match repo {
            "registry.k8s.io/e2e-test-images/agnhost" => Recipe::Agnhost,
            "registry.k8s.io/e2e-test-images/busybox" => Recipe::Busybox,
            "registry.k8s.io/e2e-test-images/nonroot" => Recipe::NonRoot,
            "registry.k8s.io/e2e-test-images/nonewprivs" => Recipe::NoNewPrivs,
            "registry.k8s.io/e2e-test-images/nginx" => Recipe::Nginx,
            "registry.k8s.io/e2e-test-images/httpd" => Recipe::Httpd,
            "registry.k8s.io/pause" => Recipe::Pause,
            _ => return None,
        })
    }

    /// One line on how the image is made, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Recipe::Agnhost => {
                "agnhost from the pinned module (static) + busybox + Debian curl, OpenBSD nc and dash as /bin/sh (with their libraries)"
            }
            Recipe::Busybox => "Debian's static busybox",
            Recipe::NonRoot => "busybox, USER 1234",
            Recipe::NoNewPrivs => "busybox + set-uid nnp from the pinned module (static)",
            Recipe::Nginx => "busybox + Debian bookworm's nginx binary and its libraries",
            Recipe::Httpd => "busybox httpd serving upstream's index.html on :80 (not Apache)",
            Recipe::Pause => "a tag of the node's pause image (evlet's static pause)",
        }
    }
}

/// What `prepare` made of the suite's image list.
#[derive(Debug, Default)]
pub struct Images {
    /// Built and imported: name and how.
    pub built: Vec<(String, &'static str)>,
    /// Listed by the suite, not buildable here.
    pub missing: Vec<String>,
}

impl Images {
    /// Whether `name` is on the node.
    pub fn has(&self, name: &str) -> bool {
        self.built.iter().any(|(n, _)| n == name)
    }
}

/// Inputs built elsewhere.
#[derive(Debug)]
pub struct Inputs {
    /// The static agnhost binary.
    pub agnhost: PathBuf,
    /// The upstream module's directory (`upstream/v1.34`).
    pub module: PathBuf,
}

/// Builds every listed image that has a recipe and imports it into the node
/// of `version` (skipping images already there with the same digest).
///
/// # Errors
/// If a recipe's input cannot be made or an import fails.
pub fn prepare(listed: &[String], inputs: &Inputs, version: Version) -> Result<Images> {
    let dir = paths::tools().join("conformance").join("images");
    fs::create_dir_all(&dir)?;
    let ctr = containerd::binaries(version)?.ctr;
    let socket = crate::node::Node::new(version).socket();
    let ctr_cmd = || {
        let mut c = Command::new(&ctr);
        c.arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io"]);
        c
    };
    let present = sh::output(ctr_cmd().args(["images", "ls"]))?;
    let mut out = Images::default();
    let mut layers: BTreeMap<&'static str, Vec<u8>> = BTreeMap::new();
    for name in listed {
        let Some(recipe) = Recipe::of(name) else {
            out.missing.push(name.clone());
            continue;
        };
        if recipe == Recipe::Pause {
            sh::output(ctr_cmd().args(["images", "tag", "--force", image::PAUSE_IMAGE, name]))
                .with_context(|| format!("cannot tag {} as {name}", image::PAUSE_IMAGE))?;
            out.built.push((name.clone(), recipe.describe()));
            continue;
        }
        let key = recipe_key(recipe);
        if !layers.contains_key(key) {
            eprintln!("conformance: building the {key} image layer");
            layers.insert(key, rootfs(recipe, inputs)?.into_tar()?);
        }
        let layer = &layers[key];
        let (archive, digest) = layout(name, &config(recipe), layer)?;
        if present
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name) && l.contains(&digest))
        {
            out.built.push((name.clone(), recipe.describe()));
            continue;
        }
        let file = dir.join(format!("{}.oci.tar", file_name(name)));
        fs::write(&file, archive).with_context(|| format!("cannot write {}", file.display()))?;
        sh::output(ctr_cmd().args(["images", "import"]).arg(&file))
            .with_context(|| format!("cannot import {name} into containerd {version}"))?;
        eprintln!("conformance: imported {name} ({})", recipe.describe());
        out.built.push((name.clone(), recipe.describe()));
    }
    Ok(out)
}

fn recipe_key(r: Recipe) -> &'static str {
    match r {
        Recipe::Agnhost => "agnhost",
        Recipe::Busybox => "busybox",
        Recipe::NonRoot => "nonroot",
        Recipe::NoNewPrivs => "nonewprivs",
        Recipe::Nginx => "nginx",
        Recipe::Httpd => "httpd",
        Recipe::Pause => "pause",
    }
}

/// A file name for an image name.
pub fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The image config of a recipe (`config` of the OCI image config).
pub fn config(recipe: Recipe) -> serde_json::Value {
    let mut c = json!({
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    });
    let set = |c: &mut serde_json::Value, k: &str, v: serde_json::Value| c[k] = v;
    match recipe {
        Recipe::Agnhost => {
            set(&mut c, "Entrypoint", json!(["/agnhost"]));
            set(&mut c, "Cmd", json!(["pause"]));
            set(
                &mut c,
                "ExposedPorts",
                json!({"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}, "5000/tcp": {}}),
            );
        }
        Recipe::Busybox => set(&mut c, "Cmd", json!(["sh"])),
        Recipe::NonRoot => {
            set(&mut c, "User", json!("1234"));
            set(&mut c, "Cmd", json!(["sh"]));
        }
        Recipe::NoNewPrivs => set(&mut c, "Cmd", json!(["nnp"])),
        Recipe::Nginx => {
            set(&mut c, "Cmd", json!(["nginx", "-g", "daemon off;"]));
            set(&mut c, "ExposedPorts", json!({"80/tcp": {}}));
        }
        Recipe::Httpd => {
            set(
                &mut c,
                "Cmd",
                json!(["httpd", "-f", "-p", "80", "-h", "/usr/local/apache2/htdocs"]),
            );
            set(&mut c, "ExposedPorts", json!({"80/tcp": {}}));
        }
        Recipe::Pause => set(&mut c, "Entrypoint", json!(["/pause"])),
    }
    c
}

/// One entry of a root filesystem.
#[derive(Debug, Clone)]
enum Entry {
    Dir(u32),
    File(Vec<u8>, u32),
    Link(String),
}

/// A root filesystem being assembled: path (no leading `/`) → entry.
#[derive(Debug, Default)]
struct Rootfs {
    entries: BTreeMap<String, Entry>,
}

impl Rootfs {
    fn dir(&mut self, path: &str, mode: u32) {
        let mut acc = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            self.entries.entry(acc.clone()).or_insert(Entry::Dir(0o755));
        }
        self.entries.insert(path.to_string(), Entry::Dir(mode));
    }

    fn parent(&mut self, path: &str) {
        if let Some((parent, _)) = path.rsplit_once('/')
            && !matches!(self.entries.get(parent), Some(Entry::Dir(_)))
        {
            self.dir(parent, 0o755);
        }
    }

    fn file(&mut self, path: &str, bytes: Vec<u8>, mode: u32) {
        self.parent(path);
        self.entries
            .insert(path.to_string(), Entry::File(bytes, mode));
    }

    fn link(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entries
            .insert(path.to_string(), Entry::Link(target.to_string()));
    }

    /// Adds a dynamically linked program at `dest` and every library `ldd`
    /// names for `source`, at the paths it names them by.
    fn dynamic(&mut self, source: &Path, dest: &str) -> Result<()> {
        let bytes =
            fs::read(source).with_context(|| format!("cannot read {}", source.display()))?;
        self.file(dest, bytes, 0o755);
        let out = sh::output(Command::new("ldd").arg(source))?;
        for lib in ldd_paths(&out)
            .with_context(|| format!("ldd {} names a library this host lacks", source.display()))?
        {
            let bytes = fs::read(&lib).with_context(|| format!("cannot read {lib}"))?;
            self.file(lib.trim_start_matches('/'), bytes, 0o755);
        }
        Ok(())
    }

    /// An uncompressed, deterministic tar of the tree.
    fn into_tar(self) -> Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        for (path, entry) in self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(0);
            match entry {
                Entry::Dir(mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(mode);
                    tar.append_data(&mut h, &path, std::io::empty())?;
                }
                Entry::File(bytes, mode) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(mode);
                    h.set_size(bytes.len() as u64);
                    tar.append_data(&mut h, &path, &bytes[..])?;
                }
                Entry::Link(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    tar.append_link(&mut h, &path, &target)?;
                }
            }
        }
        Ok(tar.into_inner()?)
    }
}

/// The absolute library paths in `ldd` output; `Err` if one is not found.
pub fn ldd_paths(out: &str) -> Result<Vec<String>> {
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim) {
        if line.contains("=> not found") {
            bail!("{line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(p.to_string());
        }
    }
    Ok(libs)
}

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
daemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
www-data:x:33:33:www-data:/var/www:/bin/false\n\
nobody:x:65534:65534:nobody:/home:/bin/false\n";
const GROUP: &str = "root:x:0:\ndaemon:x:1:\nwww-data:x:33:\nnogroup:x:65534:\n";

/// The busybox base every image shares.
fn base() -> Result<Rootfs> {
    let busybox_path = busybox()?;
    let mut fs_ = Rootfs::default();
    for dir in [
        "bin",
        "dev",
        "etc",
        "home",
        "lib",
        "proc",
        "root",
        "run",
        "sbin",
        "sys",
        "usr/bin",
        "usr/sbin",
        "usr/local/bin",
        "var",
    ] {
        fs_.dir(dir, 0o755);
    }
    fs_.dir("tmp", 0o1777);
    fs_.dir("root", 0o700);
    let busybox = fs::read(&busybox_path)
        .with_context(|| format!("cannot read {}", busybox_path.display()))?;
    fs_.file("bin/busybox", busybox, 0o755);
    let applets = sh::output(Command::new(&busybox_path).arg("--list-full"))?;
    // Where `--list-full` puts each applet, and in `/bin` too: upstream's
    // busybox image has every applet there (the sysctl specs run
    // `/bin/sysctl`, which Debian's list puts in `/sbin`).
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let name = applet.rsplit_once('/').map_or(applet, |(_, name)| name);
        for path in [applet.to_string(), format!("bin/{name}")] {
            if path != "bin/busybox" {
                fs_.link(&path, "/bin/busybox");
            }
        }
    }
    fs_.file("etc/passwd", PASSWD.as_bytes().to_vec(), 0o644);
    fs_.file("etc/group", GROUP.as_bytes().to_vec(), 0o644);
    fs_.file("etc/nsswitch.conf", b"hosts: files dns\n".to_vec(), 0o644);
    Ok(fs_)
}

fn rootfs(recipe: Recipe, inputs: &Inputs) -> Result<Rootfs> {
    let mut r = base()?;
    match recipe {
        Recipe::Busybox | Recipe::NonRoot | Recipe::Pause => {}
        Recipe::Agnhost => {
            let agnhost = fs::read(&inputs.agnhost)
                .with_context(|| format!("cannot read {}", inputs.agnhost.display()))?;
            r.file("agnhost", agnhost, 0o755);
            r.link("agnhost-2", "agnhost");
            r.dir("uploads", 0o755);
            let porter = module_source(&inputs.module)?.join("test/images/agnhost/porter");
            for f in ["localhost.crt", "localhost.key"] {
                let bytes = fs::read(porter.join(f))
                    .with_context(|| format!("cannot read {}", porter.join(f).display()))?;
                r.file(f, bytes, 0o644);
            }
            r.file(
                "etc/passwd",
                format!("{PASSWD}user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
                    .into_bytes(),
                0o644,
            );
            r.file(
                "etc/group",
                format!(
                    "{GROUP}user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
                )
                .into_bytes(),
                0o644,
            );
            r.dir("home/user-defined-in-image", 0o755);
            let curl = host_or_deb("/usr/bin/curl", "curl", "usr/bin/curl")?;
            r.dynamic(&curl, "usr/bin/curl")?;
            // OpenBSD nc replaces busybox's (which has no -u) everywhere on PATH.
            for applet in ["bin/nc", "usr/bin/nc"] {
                r.entries.remove(applet);
            }
            let nc = host_or_deb("/bin/nc.openbsd", "netcat-openbsd", "bin/nc.openbsd")?;
            r.dynamic(&nc, "usr/bin/nc")?;
            // Debian's static busybox is built "standalone": its sh runs its
            // own applets before searching PATH, so `sh -c "nc -u ..."` ran
            // busybox's nc. Upstream's alpine image looks PATH up (its busybox
            // is not standalone); dash as /bin/sh does the same here.
            let dash = host_or_deb("/bin/dash", "dash", "bin/dash")?;
            r.dynamic(&dash, "bin/dash")?;
            r.link("bin/sh", "dash");
        }
        Recipe::NoNewPrivs => {
            let nnp = go_build(
                &inputs.module,
                "k8s.io/kubernetes/test/images/nonewprivs",
                "nnp",
            )?;
            let bytes = fs::read(&nnp).with_context(|| format!("cannot read {}", nnp.display()))?;
            r.file("usr/local/bin/nnp", bytes, 0o4755);
        }
        Recipe::Nginx => {
            let nginx = host_or_deb("/usr/sbin/nginx", "nginx", "usr/sbin/nginx")?;
            r.dynamic(&nginx, "usr/sbin/nginx")?;
            for dir in [
                "var/log/nginx",
                "var/lib/nginx",
                "var/cache/nginx",
                "var/lock",
            ] {
                r.dir(dir, 0o755);
            }
            r.file(
                "etc/nginx/nginx.conf",
                NGINX_CONF.as_bytes().to_vec(),
                0o644,
            );
            r.file(
                "usr/share/nginx/html/index.html",
                b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>\n".to_vec(),
                0o644,
            );
        }
        Recipe::Httpd => {
            r.file(
                "usr/local/apache2/htdocs/index.html",
                b"<html><body><h1>It works!</h1></body></html>\n".to_vec(),
                0o644,
            );
        }
    }
    Ok(r)
}

const NGINX_CONF: &str = "user nobody nogroup;
worker_processes 1;
error_log stderr;
pid /run/nginx.pid;
events { worker_connections 256; }
http {
    access_log /dev/stdout;
    default_type text/html;
    server {
        listen 80 default_server;
        root /usr/share/nginx/html;
        index index.html;
    }
}
";

/// The source directory of `k8s.io/kubernetes` in the module cache.
fn module_source(module: &Path) -> Result<PathBuf> {
    let out = sh::output(go(module).args(["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"]))?;
    let dir = PathBuf::from(out.trim());
    if !dir.is_dir() {
        bail!(
            "k8s.io/kubernetes is not in the Go module cache ({})",
            dir.display()
        );
    }
    Ok(dir)
}

fn go(module: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(module).env("GOTOOLCHAIN", "local");
    cmd
}

/// Builds a static `main` package of the module into the tools directory
/// (again only when the module's go.sum is newer than the binary).
fn go_build(module: &Path, package: &str, name: &str) -> Result<PathBuf> {
    let out = paths::tools().join("conformance").join("bin").join(name);
    let newer = |a: &Path, b: &Path| {
        let t = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((t(a), t(b)), (Some(x), Some(y)) if x >= y)
    };
    if out.exists() && newer(&out, &module.join("go.sum")) {
        return Ok(out);
    }
    fs::create_dir_all(out.parent().unwrap_or(Path::new(".")))?;
    sh::run(
        go(module)
            .args([
                "build",
                "-mod=readonly",
                "-trimpath",
                "-ldflags=-s -w",
                "-o",
            ])
            .arg(&out)
            .arg(package)
            .env("CGO_ENABLED", "0"),
    )
    .with_context(|| format!("cannot build {package} from {}", module.display()))?;
    Ok(out)
}

/// A program from the host when installed, else from its Debian package
/// (`apt-get download`, unpacked under the tools directory).
fn host_or_deb(host: &str, package: &str, inside: &str) -> Result<PathBuf> {
    if Path::new(host).is_file() {
        return Ok(PathBuf::from(host));
    }
    let debs = paths::tools().join("conformance").join("debs");
    let unpacked = debs.join(package);
    let path = unpacked.join(inside);
    if path.is_file() {
        return Ok(path);
    }
    fs::create_dir_all(&debs)?;
    let prefix = format!("{package}_");
    let find = || {
        fs::read_dir(&debs).ok().and_then(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
            })
        })
    };
    let deb = match find() {
        Some(deb) => deb,
        None => {
            sh::run(
                Command::new("apt-get")
                    .args(["download", package])
                    .current_dir(&debs),
            )
            .with_context(|| format!("cannot download the Debian package {package}"))?;
            find().with_context(|| format!("apt-get download {package} left no .deb"))?
        }
    };
    sh::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))
        .with_context(|| format!("cannot unpack {}", deb.display()))?;
    if !path.is_file() {
        bail!("{} has no {inside}", deb.display());
    }
    Ok(path)
}

/// An OCI image layout archive of one image; returns it and the manifest's digest.
pub fn layout(name: &str, config: &serde_json::Value, layer: &[u8]) -> Result<(Vec<u8>, String)> {
    image::oci_layout(
        name,
        config,
        "cargo xtask conformance (evlet local image)",
        layer,
    )
}

/// The suite's image list (`e2e.test --list-images`).
///
/// # Errors
/// If `e2e.test` cannot run.
pub fn listed(e2e: &Path) -> Result<Vec<String>> {
    let out = sh::output(Command::new(e2e).arg("--list-images"))?;
    let mut names: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains(' '))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The module directory of the cluster's pinned release (for callers).
pub fn module() -> PathBuf {
    cluster::module_dir(cluster::Version::V1_34)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_are_found_by_repository_whatever_the_tag() {
        assert_eq!(
            Recipe::of("registry.k8s.io/e2e-test-images/agnhost:2.56"),
            Some(Recipe::Agnhost)
        );
        assert_eq!(
            Recipe::of("registry.k8s.io/e2e-test-images/busybox:1.36.1-1"),
            Some(Recipe::Busybox)
        );
        assert_eq!(
            Recipe::of("registry.k8s.io/pause:3.10.1"),
            Some(Recipe::Pause)
        );
        assert_eq!(
            Recipe::of("gcr.io/k8s-authenticated-test/agnhost:2.6"),
            None
        );
        assert_eq!(
            Recipe::of("registry.k8s.io/e2e-test-images/kitten:1.7"),
            None
        );
    }

    #[test]
    fn ldd_output_gives_the_library_paths_and_refuses_missing_ones() {
        let out = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                   \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            ldd_paths(out).expect("paths"),
            vec![
                "/lib/x86_64-linux-gnu/libz.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
        assert!(ldd_paths("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn a_layout_names_the_image_and_its_digest_is_stable() {
        let (a, da) = layout(
            "registry.k8s.io/x/y:1.0",
            &config(Recipe::NonRoot),
            b"layer",
        )
        .expect("a");
        let (_, db) = layout(
            "registry.k8s.io/x/y:1.0",
            &config(Recipe::NonRoot),
            b"layer",
        )
        .expect("b");
        assert_eq!(da, db);
        let mut archive = tar::Archive::new(&a[..]);
        let mut index = None;
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            if entry.path().expect("path").to_str() == Some("index.json") {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut entry, &mut s).expect("read");
                index = Some(s);
            }
        }
        let index: serde_json::Value = serde_json::from_str(&index.expect("index")).expect("json");
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "registry.k8s.io/x/y:1.0"
        );
        assert_eq!(index["manifests"][0]["digest"], da);
        assert_eq!(config(Recipe::NonRoot)["User"], "1234");
    }

    #[test]
    fn a_rootfs_makes_parents_and_keeps_modes() {
        let mut r = Rootfs::default();
        r.file("usr/local/bin/nnp", b"x".to_vec(), 0o4755);
        r.link("agnhost-2", "agnhost");
        let tar = r.into_tar().expect("tar");
        let mut archive = tar::Archive::new(&tar[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().expect("entries") {
            let entry = entry.expect("entry");
            let mode = entry.header().mode().expect("mode");
            seen.push((entry.path().expect("path").display().to_string(), mode));
        }
        assert!(seen.contains(&("usr".to_string(), 0o755)));
        assert!(seen.contains(&("usr/local/bin".to_string(), 0o755)));
        assert!(seen.contains(&("usr/local/bin/nnp".to_string(), 0o4755)));
    }
}
