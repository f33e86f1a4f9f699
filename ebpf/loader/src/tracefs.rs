//! tracefs: finding (or mounting) it, and reading tracepoint `format` files.
//!
//! Classic tracepoint payloads change between kernels (`mark_victim` grew from
//! one field to nine in 6.8); field offsets are read from `format` at load time
//! instead of being compiled in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::Error;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Returns a tracefs mount point with `events/`, mounting tracefs at
/// `/sys/kernel/tracing` if none is mounted.
///
/// # Errors
/// [`Error::Tracefs`] if none is mounted and mounting fails (e.g. not root).
pub fn find_or_mount() -> Result<PathBuf, Error> {
    if let Some(found) = CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
    {
        return Ok(found);
    }
    let target = PathBuf::from(CANDIDATES[0]);
    let c_target = std::ffi::CString::new(CANDIDATES[0]).map_err(|e| Error::Tracefs {
        tried: vec![target.clone()],
        reason: e.to_string(),
    })?;
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c_target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 || !target.join("events").is_dir() {
        return Err(Error::Tracefs {
            tried: CANDIDATES.iter().map(PathBuf::from).collect(),
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    tracing::info!(path = %target.display(), "mounted tracefs");
    Ok(target)
}

/// One field of a tracepoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Byte offset in the record.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// The fields of one tracepoint, by name.
#[derive(Debug, Clone, Default)]
pub struct Format {
    /// `category/name`.
    pub tracepoint: String,
    /// The file it was read from.
    pub path: PathBuf,
    fields: HashMap<String, Field>,
}

impl Format {
    /// Reads `<tracefs>/events/<category>/<name>/format`.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read.
    pub fn read(tracefs: &Path, category: &str, name: &str) -> Result<Self, Error> {
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Self::parse(&format!("{category}/{name}"), path, &text))
    }

    /// Parses the text of a `format` file.
    pub fn parse(tracepoint: &str, path: PathBuf, text: &str) -> Self {
        let mut fields = HashMap::new();
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("field:"))
        {
            let mut name = None;
            let mut offset = None;
            let mut size = None;
            for part in line.split(';').map(str::trim) {
                if let Some(decl) = part.strip_prefix("field:") {
                    // "unsigned long total_vm", "char comm[16]", "__data_loc char[] comm"
                    let last = decl.split_whitespace().last().unwrap_or("");
                    name = Some(last.split('[').next().unwrap_or(last).to_owned());
                } else if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            if let (Some(name), Some(offset), Some(size)) = (name, offset, size) {
                fields.insert(name, Field { offset, size });
            }
        }
        Self {
            tracepoint: tracepoint.to_owned(),
            path,
            fields,
        }
    }

    /// The field `name`, if this kernel's tracepoint has it.
    pub fn get(&self, name: &str) -> Option<Field> {
        self.fields.get(name).copied()
    }

    /// The offset of a field the programs need.
    ///
    /// # Errors
    /// [`Error::TracepointField`] if this kernel's tracepoint lacks it.
    pub fn require(&self, name: &'static str) -> Result<u32, Error> {
        self.get(name)
            .map(|f| f.offset)
            .ok_or_else(|| Error::TracepointField {
                tracepoint: self.tracepoint.clone(),
                field: name,
                path: self.path.clone(),
            })
    }

    /// The offset of an optional field, 0 if absent (the programs skip offset 0).
    pub fn optional(&self, name: &str) -> u32 {
        self.get(name).map_or(0, |f| f.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `oom/mark_victim` on 5.10 and on 6.1.192 (measured; research/ebpf-hooks.md §2.5).
    const MARK_VICTIM_5_10: &str = "name: mark_victim\nID: 449\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
        \tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
        \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
        \tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\nprint fmt: \"pid=%d\", REC->pid\n";
    const MARK_VICTIM_6_1: &str = "name: mark_victim\nformat:\n\
        \tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\
        \tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;\n\
        \tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned long file_rss;\toffset:32;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned long shmem_rss;\toffset:40;\tsize:8;\tsigned:0;\n\
        \tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;\n\
        \tfield:unsigned long pgtables;\toffset:56;\tsize:8;\tsigned:0;\n\
        \tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;\n";

    #[test]
    fn old_mark_victim_has_only_pid() {
        let f = Format::parse("oom/mark_victim", PathBuf::new(), MARK_VICTIM_5_10);
        assert_eq!(f.require("pid").expect("pid"), 8);
        assert_eq!(f.optional("anon_rss"), 0);
        assert!(f.require("comm").is_err());
    }

    #[test]
    fn extended_mark_victim_fields_are_located() {
        let f = Format::parse("oom/mark_victim", PathBuf::new(), MARK_VICTIM_6_1);
        assert_eq!(
            f.get("comm"),
            Some(Field {
                offset: 12,
                size: 4
            })
        );
        assert_eq!(f.optional("anon_rss"), 24);
        assert_eq!(
            f.get("oom_score_adj"),
            Some(Field {
                offset: 64,
                size: 2
            })
        );
    }
}
