//! A program's bounds, from the optional `NAME.toml` beside it (docs/programs.md):
//! `timeout`, `memory`, `cpu_seconds`, `open_files`, `user` and `resumable`. A pure rule: the file's
//! text in, the bounds (or the line that is wrong, and why) out.
//!
//! The file is TOML limited to what these keys need: `key = value` lines, a value a
//! string (`"…"` or `'…'`), a whole number or a boolean, and `#` comments. Anything else
//! (a table, an array, a key not listed) is refused with its line, not ignored: a bound
//! misspelt would otherwise not bound anything.

use std::time::Duration;

use crate::config::parse_duration;

/// What a program may use per attempt, and who it runs as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    /// The attempt's timeout when the task sets none (`timeout = "30s"`).
    pub timeout: Option<Duration>,
    /// Its address space, bytes (`memory = "512MiB"`): RLIMIT_AS.
    pub memory: Option<u64>,
    /// CPU time, seconds (`cpu_seconds = 60`): RLIMIT_CPU.
    pub cpu_seconds: Option<u64>,
    /// Open descriptors (`open_files = 256`): RLIMIT_NOFILE.
    pub open_files: Option<u64>,
    /// The user it runs as (`user = "nobody"`).
    pub user: Option<String>,
    /// In a hot upgrade, stopped (SIGTERM) at its next checkpoint and started again in
    /// the new process from it (`resumable = true`), rather than run to its end in the old
    /// one.
    pub resumable: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// Reads a bounds file's text; the error names the line.
pub fn parse(text: &str) -> Result<Bounds, String> {
    let mut b = Bounds::default();
    let mut seen: Vec<String> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}", i + 1);
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            return Err(at("tables are not used here; only key = value lines".into()));
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| at(format!("expected key = value, got {line:?}")))?;
        let key = key.trim();
        if seen.iter().any(|k| k == key) {
            return Err(at(format!("{key} is set twice")));
        }
        seen.push(key.to_string());
        let value = scalar(value.trim()).map_err(at)?;
        match key {
            "timeout" => {
                let s = string(key, value).map_err(at)?;
                let d = parse_duration(&s).map_err(at)?;
                if d.is_zero() {
                    return Err(at("timeout must be more than zero".into()));
                }
                b.timeout = Some(d);
            }
            "memory" => b.memory = Some(bytes(value).map_err(at)?),
            "cpu_seconds" => b.cpu_seconds = Some(positive(key, value).map_err(at)?),
            "open_files" => b.open_files = Some(positive(key, value).map_err(at)?),
            "user" => {
                let s = string(key, value).map_err(at)?;
                if s.is_empty() {
                    return Err(at("user must not be empty".into()));
                }
                b.user = Some(s);
            }
            "resumable" => match value {
                Scalar::Bool(v) => b.resumable = v,
                _ => return Err(at("resumable must be true or false".into())),
            },
            other => {
                return Err(at(format!(
                    "unknown key {other:?}; expected timeout, memory, cpu_seconds, open_files, user or resumable"
                )))
            }
        }
    }
    Ok(b)
}

/// The line without a `#` comment (a `#` inside a string stays).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match quote {
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' => return &line[..i],
            None => {}
        }
    }
    line
}

fn scalar(v: &str) -> Result<Scalar, String> {
    if let Some(inner) = v.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        if inner.contains('\'') {
            return Err(format!("a literal string cannot hold a quote: {v}"));
        }
        return Ok(Scalar::Str(inner.to_string()));
    }
    if v.starts_with('"') {
        // A TOML basic string reads as a JSON string for the escapes used here.
        return serde_json::from_str::<String>(v)
            .map(Scalar::Str)
            .map_err(|_| format!("not a string: {v}"));
    }
    match v {
        "true" => return Ok(Scalar::Bool(true)),
        "false" => return Ok(Scalar::Bool(false)),
        _ => {}
    }
    v.replace('_', "")
        .parse::<i64>()
        .map(Scalar::Int)
        .map_err(|_| format!("expected a string, a whole number or true/false, got {v}"))
}

fn string(key: &str, v: Scalar) -> Result<String, String> {
    match v {
        Scalar::Str(s) => Ok(s),
        other => Err(format!("{key} must be a string, got {other:?}")),
    }
}

fn positive(key: &str, v: Scalar) -> Result<u64, String> {
    match v {
        Scalar::Int(n) if n > 0 => Ok(n as u64),
        other => Err(format!(
            "{key} must be a whole number above zero, got {other:?}"
        )),
    }
}

/// `memory`: a number of bytes, or a string with a unit (B, KiB, MiB, GiB, TiB; K, M, G
/// and T mean the same).
fn bytes(v: Scalar) -> Result<u64, String> {
    let s = match v {
        Scalar::Int(n) if n > 0 => return Ok(n as u64),
        Scalar::Str(s) => s,
        other => {
            return Err(format!(
                "memory must be bytes or a size such as \"512MiB\", got {other:?}"
            ))
        }
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("memory: {s:?} is not a size such as \"512MiB\""))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => {
            return Err(format!(
                "memory: unknown unit {other:?}; use B, KiB, MiB, GiB or TiB"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("memory: {s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bound_reads() {
        let b = parse(
            "# resize.toml\ntimeout = \"90s\"\nmemory = '512MiB' # the address space\n\
             cpu_seconds = 1_000\nopen_files = 64\nuser = \"nobody\"\nresumable = true\n",
        )
        .unwrap();
        assert_eq!(
            b,
            Bounds {
                timeout: Some(Duration::from_secs(90)),
                memory: Some(512 << 20),
                cpu_seconds: Some(1000),
                open_files: Some(64),
                user: Some("nobody".into()),
                resumable: true,
            }
        );
        assert_eq!(parse("").unwrap(), Bounds::default());
        assert_eq!(parse("memory = 4096").unwrap().memory, Some(4096));
        assert_eq!(
            parse("user = \"a#b\"").unwrap().user.as_deref(),
            Some("a#b")
        );
    }

    #[test]
    fn a_wrong_line_is_named() {
        let err = |t: &str| parse(t).unwrap_err();
        assert_eq!(
            err("timeout = \"1s\"\nmemroy = 5"),
            "line 2: unknown key \"memroy\"; expected timeout, memory, cpu_seconds, open_files, user or resumable"
        );
        assert_eq!(
            err("[limits]"),
            "line 1: tables are not used here; only key = value lines"
        );
        assert_eq!(
            err("cpu_seconds = 0"),
            "line 1: cpu_seconds must be a whole number above zero, got Int(0)"
        );
        assert_eq!(
            err("open_files = \"many\""),
            "line 1: open_files must be a whole number above zero, got Str(\"many\")"
        );
        assert_eq!(
            err("memory = \"5 parsecs\""),
            "line 1: memory: unknown unit \"parsecs\"; use B, KiB, MiB, GiB or TiB"
        );
        assert_eq!(
            err("timeout = \"soon\""),
            "line 1: 'soon': expected a number with a unit, e.g. 7d, 12h, 90m, 30s"
        );
        assert_eq!(err("user = 'a'\nuser = 'b'"), "line 2: user is set twice");
        assert_eq!(
            err("timeout"),
            "line 1: expected key = value, got \"timeout\""
        );
        assert!(parse("resumable = true").unwrap().resumable);
        assert!(!parse("resumable = false").unwrap().resumable);
        assert_eq!(
            err("resumable = 1"),
            "line 1: resumable must be true or false"
        );
        assert_eq!(
            err("memory = [1]"),
            "line 1: expected a string, a whole number or true/false, got [1]"
        );
    }
}
