//! `hostPath` volumes, as upstream's plugin: no `..` in the path, then the
//! type's check (`DirectoryOrCreate` and `FileOrCreate` create what is
//! missing; the empty type checks nothing), with upstream's messages.

use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;

/// What kind of file a path is, in upstream's words.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "Directory"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        "File"
    }
}

/// Checks (and for the `…OrCreate` types makes) host path `path` of type `kind`.
///
/// # Errors
/// Upstream's message: `hostPath type check failed: /x is not a directory, it's a File`,
/// `hostPath /x doesn't exist`, an invalid path or type.
pub fn set_up(path: &str, kind: Option<&str>) -> Result<(), String> {
    if Path::new(path)
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(format!("invalid HostPath `{path}`: must not contain '..'"));
    }
    let kind = kind.unwrap_or("");
    let p = Path::new(path);
    let want = match kind {
        "" => return Ok(()),
        "DirectoryOrCreate" => {
            if std::fs::metadata(p).is_err() {
                std::fs::create_dir_all(p).map_err(|e| format!("cannot create {path}: {e}"))?;
            }
            ("Directory", "directory")
        }
        "FileOrCreate" => {
            if std::fs::metadata(p).is_err() {
                // The parent is not created (upstream).
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(p)
                    .map_err(|e| format!("cannot create {path}: {e}"))?;
            }
            ("File", "file")
        }
        "Directory" => ("Directory", "directory"),
        "File" => ("File", "file"),
        "Socket" => ("Socket", "socket file"),
        "CharDevice" => ("CharDevice", "character device"),
        "BlockDevice" => ("BlockDevice", "block device"),
        other => return Err(format!("{other} is an invalid volume type")),
    };
    let meta = std::fs::metadata(p).map_err(|_| format!("hostPath {path} doesn't exist"))?;
    let is = kind_of(&meta);
    if is != want.0 {
        return Err(format!(
            "hostPath type check failed: {path} is not a {}, it's a {is}",
            want.1
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_checks_as_upstream() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().display().to_string();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").expect("file");
        let f = f.display().to_string();
        assert_eq!(set_up(&d, Some("Directory")), Ok(()));
        assert_eq!(
            set_up(&f, Some("Directory")),
            Err(format!(
                "hostPath type check failed: {f} is not a directory, it's a File"
            ))
        );
        assert_eq!(
            set_up(&d, Some("File")),
            Err(format!(
                "hostPath type check failed: {d} is not a file, it's a Directory"
            ))
        );
        assert_eq!(
            set_up("/dev/null", Some("CharDevice")),
            Ok(()),
            "/dev/null is a character device"
        );
        let missing = format!("{d}/missing");
        assert_eq!(
            set_up(&missing, Some("Socket")),
            Err(format!("hostPath {missing} doesn't exist"))
        );
        assert_eq!(set_up(&missing, None), Ok(()), "no type, no check");
        let made = format!("{d}/made/deep");
        assert_eq!(set_up(&made, Some("DirectoryOrCreate")), Ok(()));
        assert!(Path::new(&made).is_dir());
        let file = format!("{d}/new-file");
        assert_eq!(set_up(&file, Some("FileOrCreate")), Ok(()));
        assert!(Path::new(&file).is_file());
        assert!(set_up(&format!("{d}/no/parent"), Some("FileOrCreate")).is_err());
        assert_eq!(
            set_up("/var/../etc", Some("Directory")),
            Err("invalid HostPath `/var/../etc`: must not contain '..'".into())
        );
    }
}
