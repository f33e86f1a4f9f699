//! The apiserver's audit log read as the record of what one node sent: JSON
//! lines (`--audit-log-format=json`), one per request and stage, of every
//! node's requests (the cluster's policy, `xtask/src/cluster/components.rs`);
//! only those of this node's user are kept, once each (a watch is logged when
//! its response starts and again when it ends).

use std::collections::HashSet;
use std::io::{Read as _, Seek as _};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::apiserver::Recorded;

/// One node's requests in the audit log, read on demand from where the log
/// ended when the test began.
#[derive(Debug)]
pub struct Audit {
    /// The log file.
    path: PathBuf,
    /// The user whose requests are kept (`system:node:<name>`).
    user: String,
    /// How far the file has been read.
    offset: u64,
    /// A line the apiserver was still writing at the last read.
    partial: String,
    /// Audit IDs already kept.
    seen: HashSet<String>,
    /// This node's requests, in the order the apiserver logged them.
    pub records: Vec<Recorded>,
}

impl Audit {
    /// A reader of `user`'s requests from now on in the log at `path`.
    pub fn from_now(path: &Path, user: &str) -> Self {
        Self {
            path: path.to_owned(),
            user: user.to_owned(),
            offset: std::fs::metadata(path).map_or(0, |m| m.len()),
            partial: String::new(),
            seen: HashSet::new(),
            records: Vec::new(),
        }
    }

    /// Reads what the apiserver logged since the last read. A log shorter
    /// than what was read was rotated: it is read from its start (events
    /// logged between the last read and the rotation are lost; the rotation
    /// size is far above a test run's log).
    pub fn read_new(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            panic!("the audit log {} cannot be read", self.path.display());
        };
        let len = file.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        let mut bytes = Vec::new();
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err()
            || file.read_to_end(&mut bytes).is_err()
        {
            return;
        }
        self.offset += bytes.len() as u64;
        let mut text = std::mem::take(&mut self.partial);
        text.push_str(&String::from_utf8_lossy(&bytes));
        let complete = text.ends_with('\n');
        let mut lines: Vec<&str> = text.split('\n').collect();
        if !complete {
            self.partial = lines.pop().unwrap_or_default().to_owned();
        }
        let needle = format!("\"username\":\"{}\"", self.user);
        for line in lines.into_iter().filter(|l| l.contains(&needle)) {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if event["user"]["username"] != self.user.as_str() {
                continue;
            }
            let id = event["auditID"].as_str().unwrap_or_default().to_owned();
            if self.seen.insert(id) {
                self.records.push(recorded(&event));
            }
        }
    }
}

/// The HTTP method of an audit `verb`.
pub fn method(verb: &str) -> &'static str {
    match verb {
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        _ => "GET",
    }
}

/// An audit event as the mock would have recorded the request: method,
/// path, raw query, body (`requestObject`). Content type and credentials are
/// not in the log; `at` is when the log was read, not when the request came.
fn recorded(event: &Value) -> Recorded {
    let uri = event["requestURI"].as_str().unwrap_or_default();
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    Recorded {
        method: method(event["verb"].as_str().unwrap_or_default()).to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
        content_type: None,
        authorization: None,
        body: event.get("requestObject").cloned(),
        at: tokio::time::Instant::now(),
    }
}
