//! A strict reader of the text format, for tests and tools: every line must be a
//! `# HELP`, a `# TYPE` or a sample of the family last declared; no series twice; a
//! histogram's buckets cumulative and ending at `+Inf` equal to its `_count`.

use std::collections::{BTreeMap, HashSet};

/// One sample read.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its name, with any `_bucket`, `_sum` or `_count` suffix.
    pub name: String,
    /// Its labels, by name.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Reads `text`; says what is wrong, and on which line, otherwise.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    let mut family: Option<(String, String)> = None;
    let mut families = HashSet::new();
    let mut series = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            check_name(name).map_err(at)?;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            check_name(name).map_err(at)?;
            if !["counter", "gauge", "histogram"].contains(&kind) {
                return Err(at(format!("unknown type {kind:?}")));
            }
            if !families.insert(name.to_string()) {
                return Err(at(format!("family {name} declared twice")));
            }
            family = Some((name.to_string(), kind.to_string()));
            continue;
        }
        if line.starts_with('#') {
            return Err(at("a comment that is neither HELP nor TYPE".into()));
        }
        let sample = sample(line).map_err(at)?;
        let Some((fam, kind)) = &family else {
            return Err(at("a sample before any # TYPE".into()));
        };
        let belongs = match kind.as_str() {
            "histogram" => [
                format!("{fam}_bucket"),
                format!("{fam}_sum"),
                format!("{fam}_count"),
            ]
            .contains(&sample.name),
            _ => &sample.name == fam,
        };
        if !belongs {
            return Err(at(format!("not a sample of family {fam}")));
        }
        if kind == "counter" && !fam.ends_with("_total") {
            return Err(at(format!("counter {fam} not named *_total")));
        }
        let key = format!("{}{:?}", sample.name, sample.labels);
        if !series.insert(key) {
            return Err(at("the same series twice".into()));
        }
        samples.push(sample);
    }
    check_histograms(&samples)?;
    Ok(samples)
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
        });
    if ok {
        Ok(())
    } else {
        Err(format!("invalid metric name {name:?}"))
    }
}

fn sample(line: &str) -> Result<Sample, String> {
    let (head, value) = line.rsplit_once(' ').ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("invalid value {v:?}"))?,
    };
    let (name, labels) = match head.split_once('{') {
        None => (head, BTreeMap::new()),
        Some((name, rest)) => {
            let body = rest.strip_suffix('}').ok_or("labels not closed")?;
            (name, labels(body)?)
        }
    };
    check_name(name)?;
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn labels(mut body: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    while !body.is_empty() {
        let (k, rest) = body.split_once("=\"").ok_or("a label without =\"")?;
        check_name(k)?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("a label value not closed".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    _ => return Err("an invalid escape in a label value".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if out.insert(k.to_string(), value).is_some() {
            return Err(format!("label {k} twice"));
        }
        body = &rest[end + 1..];
        body = match body.strip_prefix(',') {
            Some(b) => b,
            None if body.is_empty() => body,
            None => return Err("labels not separated by a comma".into()),
        };
    }
    Ok(out)
}

/// Each histogram series: buckets cumulative, the last `+Inf`, equal to `_count`.
fn check_histograms(samples: &[Sample]) -> Result<(), String> {
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name.ends_with("_bucket")) {
        let mut labels = s.labels.clone();
        let le = labels
            .remove("le")
            .ok_or(format!("{} without le", s.name))?;
        let le: f64 = match le.as_str() {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .map_err(|_| format!("{}: invalid le {v:?}", s.name))?,
        };
        let base = s.name.trim_end_matches("_bucket");
        buckets
            .entry(format!("{base}{labels:?}"))
            .or_default()
            .push((le, s.value));
    }
    for (series, b) in &buckets {
        if b.windows(2).any(|w| w[1].0 <= w[0].0 || w[1].1 < w[0].1) {
            return Err(format!("{series}: buckets not increasing and cumulative"));
        }
        let (last_le, last_n) = b[b.len() - 1];
        if last_le != f64::INFINITY {
            return Err(format!("{series}: no +Inf bucket"));
        }
        let count = samples
            .iter()
            .find(|s| {
                let mut l = s.labels.clone();
                l.remove("le");
                s.name.ends_with("_count")
                    && format!("{}{l:?}", s.name.trim_end_matches("_count")) == *series
            })
            .ok_or(format!("{series}: no _count"))?;
        if count.value != last_n {
            return Err(format!("{series}: _count differs from the +Inf bucket"));
        }
    }
    Ok(())
}
