//! Every relative link in README.md and docs/ leads somewhere: the file it names exists,
//! and an `#anchor` into a Markdown file names one of its headings. A broken one fails
//! naming file:line.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// README.md and every Markdown file under docs/.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out
}

/// The lines of `text` outside fenced code blocks, numbered from 1, inline code blanked.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // `code` may hold brackets and parentheses that are no link.
        let mut plain = String::new();
        for (j, part) in line.split('`').enumerate() {
            if j % 2 == 0 {
                plain.push_str(part);
            } else {
                plain.push_str(&" ".repeat(part.len()));
            }
        }
        out.push((i + 1, plain));
    }
    out
}

/// The targets of the inline links `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = after[..end].split_whitespace().next().unwrap_or("");
                out.push(target.to_string());
                rest = &after[end..];
            }
            None => break,
        }
    }
    out
}

/// The anchors of a Markdown file's headings (a repeated heading gets `-1`, `-2` …).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = artex::cli::docs::anchor(line.trim_start_matches('#'));
        let mut name = base.clone();
        let mut n = 0;
        while seen.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        seen.insert(name);
    }
    seen
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(root).unwrap().display().to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, fragment) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(file)
                };
                if !dest.exists() {
                    broken.push(format!("{shown}:{n}: {target}: no such file"));
                    continue;
                }
                if let Some(fragment) = fragment {
                    if dest.extension().is_some_and(|e| e == "md") {
                        let text = std::fs::read_to_string(&dest).unwrap();
                        if !anchors(&text).contains(fragment) {
                            broken.push(format!("{shown}:{n}: {target}: no such heading"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_parser_finds_links_and_anchors() {
    assert_eq!(
        link_targets("see [a](b.md#c) and [`x`](y/) but not `[p](q)`"),
        ["b.md#c", "y/", "q"]
    );
    assert_eq!(prose_lines("`[p](q)` [a](b)")[0].1.trim(), "[a](b)");
    assert!(anchors("## Submitting from SQL, in your own transaction\n")
        .contains("submitting-from-sql-in-your-own-transaction"));
    assert!(anchors("# A\n## A\n").contains("a-1"));
}
