//! Container logs in the CRI format the runtime writes
//! (`<RFC 3339 time> <stdout|stderr> <P|F> <text>`, one line per record, `P`
//! for a partial line continued by the next record), and tails of them.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

/// Which stream a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One record of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The runtime's timestamp, as written (RFC 3339 with nanoseconds).
    pub time: &'a str,
    /// The stream.
    pub stream: Stream,
    /// More of the same line follows in the next record.
    pub partial: bool,
    /// The text, without the newline.
    pub text: &'a str,
}

/// A log line that is not in the CRI format, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a CRI log record ({0}): {1:?}")]
pub struct BadRecord(pub &'static str, pub String);

/// Parses one record (without its trailing newline).
///
/// # Errors
/// [`BadRecord`] naming the field that is missing or wrong.
pub fn parse(line: &str) -> Result<Record<'_>, BadRecord> {
    let bad = |what| BadRecord(what, line.chars().take(80).collect());
    let (time, rest) = line.split_once(' ').ok_or_else(|| bad("no timestamp"))?;
    if time.is_empty() || !time.as_bytes()[0].is_ascii_digit() {
        return Err(bad("timestamp"));
    }
    let (stream, rest) = rest.split_once(' ').ok_or_else(|| bad("no stream"))?;
    let stream = match stream {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return Err(bad("stream")),
    };
    // The tag is `P` or `F` (possibly with more `:`-separated tags); the text
    // may be empty, and then the separating space may be missing.
    let (tag, text) = rest.split_once(' ').unwrap_or((rest, ""));
    let partial = match tag.split(':').next() {
        Some("P") => true,
        Some("F") => false,
        _ => return Err(bad("tag")),
    };
    Ok(Record {
        time,
        stream,
        partial,
        text,
    })
}

/// The last `max_bytes` of the file at `path` (fewer if it is shorter).
///
/// # Errors
/// The IO error (a missing file included).
pub fn tail_bytes(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))?;
    let mut out = Vec::new();
    file.take(max_bytes).read_to_end(&mut out)?;
    Ok(out)
}

/// The text of the last `lines` lines of a CRI log file, at most `max_bytes`
/// of it (the end kept): upstream's `readLastStringFromContainerLogs` for
/// termination messages. As upstream's `ReadLogs` with `tailLines`, the lines
/// counted are the file's (records; a line that is not one counts and is
/// skipped), and a record's text is followed by a newline only when the
/// record is full (`F`): a container that wrote `DONE` without one and exited
/// (a last `P` record) ends its message with `DONE`, not `DONE\n`.
///
/// # Errors
/// The IO error reading the file.
pub fn last_text(path: &Path, lines: usize, max_bytes: usize) -> std::io::Result<String> {
    // Enough of the end for the records that make up the last `max_bytes`.
    let window = (max_bytes as u64 + 256) * 8;
    let bytes = tail_bytes(path, window)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut all: Vec<&str> = text.lines().collect();
    if bytes.len() as u64 == window && !all.is_empty() {
        // The window may start inside a record.
        all.remove(0);
    }
    let mut out = String::new();
    for line in &all[all.len().saturating_sub(lines)..] {
        let Ok(r) = parse(line) else {
            continue;
        };
        out.push_str(r.text);
        if !r.partial {
            out.push('\n');
        }
    }
    if out.len() > max_bytes {
        let mut cut = out.len() - max_bytes;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out.drain(..cut);
    }
    Ok(out)
}

/// How a log is read for a client (upstream's `LogOptions` of `ReadLogs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Records older than this are skipped.
    pub since: Option<k8s_openapi::jiff::Timestamp>,
    /// Prefix each line with its time (`RFC3339NanoFixed`).
    pub timestamps: bool,
}

/// The bytes a client gets for one raw log line: the text, with its newline
/// unless the record is partial, after the time with `timestamps`; None when
/// the line is not a record or is older than `since`.
pub fn render(line: &str, opts: &ReadOptions) -> Option<Vec<u8>> {
    let record = parse(line).ok()?;
    let time = if opts.since.is_some() || opts.timestamps {
        record.time.parse::<k8s_openapi::jiff::Timestamp>().ok()
    } else {
        None
    };
    if let (Some(since), Some(t)) = (opts.since, time)
        && t < since
    {
        return None;
    }
    let mut out = Vec::with_capacity(record.text.len() + 32);
    if opts.timestamps {
        match time {
            Some(t) => out.extend_from_slice(
                format!(
                    "{}.{:09}Z ",
                    t.strftime("%Y-%m-%dT%H:%M:%S"),
                    t.subsec_nanosecond()
                )
                .as_bytes(),
            ),
            None => return None,
        }
    }
    out.extend_from_slice(record.text.as_bytes());
    if !record.partial {
        out.push(b'\n');
    }
    Some(out)
}

/// Where the last `lines` lines of `file` start (upstream's
/// `FindTailLineStartIndex`: an unterminated last line is not counted).
///
/// # Errors
/// The IO error.
pub fn tail_start(file: &mut std::fs::File, lines: u64) -> std::io::Result<u64> {
    const BLOCK: u64 = 1024;
    let size = file.metadata()?.len();
    let mut pos = size;
    let mut newlines = 0_u64;
    let mut buf = vec![0_u8; BLOCK as usize];
    while pos > 0 {
        let start = pos.saturating_sub(BLOCK);
        let len = usize::try_from(pos - start).unwrap_or(0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..len])?;
        for i in (0..len).rev() {
            if buf[i] == b'\n' {
                newlines += 1;
                if newlines > lines {
                    return Ok(start + i as u64 + 1);
                }
            }
        }
        pos = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_render_as_upstream_writes_them() {
        let plain = ReadOptions::default();
        assert_eq!(
            render("2026-01-01T00:00:00.5Z stdout F hi", &plain).as_deref(),
            Some(&b"hi\n"[..])
        );
        assert_eq!(
            render("2026-01-01T00:00:00.5Z stderr P par", &plain).as_deref(),
            Some(&b"par"[..])
        );
        assert_eq!(render("junk", &plain), None);
        let stamped = ReadOptions {
            timestamps: true,
            since: Some("2026-01-01T00:00:00.2Z".parse().expect("time")),
        };
        assert_eq!(
            render("2026-01-01T00:00:00.5Z stdout F hi", &stamped).as_deref(),
            Some(&b"2026-01-01T00:00:00.500000000Z hi\n"[..])
        );
        assert_eq!(
            render("2026-01-01T00:00:00.1Z stdout F old", &stamped),
            None
        );
    }

    #[test]
    fn the_tail_starts_after_the_last_lines_and_ignores_an_unfinished_one() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("0.log");
        let mut text = String::new();
        for i in 0..500 {
            text.push_str(&format!("2026-01-01T00:00:00Z stdout F line {i}\n"));
        }
        text.push_str("2026-01-01T00:00:00Z stdout F unfinished");
        std::fs::write(&path, &text).expect("write");
        let mut f = std::fs::File::open(&path).expect("open");
        let at = tail_start(&mut f, 2).expect("tail");
        assert!(
            text[usize::try_from(at).expect("offset")..]
                .starts_with("2026-01-01T00:00:00Z stdout F line 498\n")
        );
        assert_eq!(tail_start(&mut f, 10_000).expect("all"), 0);
    }

    #[test]
    fn records_parse_with_their_stream_and_tag() {
        let r = parse("2026-11-24T05:00:00.123456789Z stdout F hello world").expect("record");
        assert_eq!(
            (r.stream, r.partial, r.text),
            (Stream::Stdout, false, "hello world")
        );
        let r = parse("2026-11-24T05:00:00Z stderr P ").expect("record");
        assert_eq!((r.stream, r.partial, r.text), (Stream::Stderr, true, ""));
        assert!(parse("2026-11-24T05:00:00Z stdout F").is_ok_and(|r| r.text.is_empty()));
        assert_eq!(parse("garbage").expect_err("bad").0, "no timestamp");
        assert_eq!(parse("2026 stdin F x").expect_err("bad").0, "stream");
        assert_eq!(parse("2026 stdout X x").expect_err("bad").0, "tag");
    }

    #[test]
    fn the_last_lines_count_records_end_full_ones_with_a_newline_and_keep_the_end() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("0.log");
        std::fs::write(
            &path,
            "2026-01-01T00:00:00Z stdout F one\n\
             2026-01-01T00:00:01Z stderr P tw\n\
             2026-01-01T00:00:01Z stderr F o\n\
             not a record\n\
             2026-01-01T00:00:02Z stdout F three\n",
        )
        .expect("write");
        // Upstream's tailLines counts the file's lines, records or not.
        assert_eq!(last_text(&path, 2, 2048).expect("tail"), "three\n");
        assert_eq!(last_text(&path, 3, 2048).expect("tail"), "o\nthree\n");
        assert_eq!(last_text(&path, 4, 2048).expect("tail"), "two\nthree\n");
        assert_eq!(last_text(&path, 80, 6).expect("tail"), "three\n");
        assert!(last_text(&dir.path().join("missing"), 1, 10).is_err());
        // `echo -n DONE; false`: the last record is partial, and so is the
        // message (the conformance spec "should report termination message
        // from log output if TerminationMessagePolicy FallbackToLogsOnError
        // is set" wants "DONE").
        std::fs::write(&path, "2026-01-01T00:00:00Z stdout P DONE\n").expect("write");
        assert_eq!(last_text(&path, 80, 2048).expect("tail"), "DONE");
    }
}
