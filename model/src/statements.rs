//! The SQL an action stands for, named and hashed: a function as
//! migrations/schema.sql defines it, or a statement constant as its Rust file holds it.
//! [`check_all`] recomputes every hash from the sources, so a change to a hot-path
//! statement fails a test until the model's action beside it has been reviewed.

use sha2::{Digest, Sha256};

/// Where an action's SQL lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `artex.<name>` in migrations/schema.sql (from `CREATE FUNCTION` to its closing
    /// dollar quote).
    Function(&'static str),
    /// `const <name>: &str = "…";` in a Rust file of the repository.
    Constant {
        /// The file, from the repository's root.
        file: &'static str,
        /// The constant's name.
        name: &'static str,
    },
}

/// One statement an action stands for, and the sha256 of its text when the action was
/// last reviewed against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sql {
    /// Where it is.
    pub source: Source,
    /// Hex sha256 of its text, whitespace collapsed.
    pub sha256: &'static str,
}

impl Sql {
    /// The function `artex.<name>` of migrations/schema.sql.
    pub const fn function(name: &'static str, sha256: &'static str) -> Sql {
        Sql {
            source: Source::Function(name),
            sha256,
        }
    }

    /// The constant `name` of `file`.
    pub const fn constant(file: &'static str, name: &'static str, sha256: &'static str) -> Sql {
        Sql {
            source: Source::Constant { file, name },
            sha256,
        }
    }

    /// What it is called in a message: `artex.dispatch_round` or `RECLAIM (file)`.
    pub fn label(&self) -> String {
        match self.source {
            Source::Function(name) => format!("artex.{name}"),
            Source::Constant { file, name } => format!("{name} ({file})"),
        }
    }
}

/// The sha256 of `text` with every run of whitespace made one space, trimmed.
pub fn digest(text: &str) -> String {
    let normal = text.split_whitespace().collect::<Vec<_>>().join(" ");
    hex::encode(Sha256::digest(normal.as_bytes()))
}

/// The definition of `artex.<name>` in `schema` (the text of migrations/schema.sql):
/// from its `CREATE FUNCTION` line to the line that closes its body.
pub fn function_text<'a>(schema: &'a str, name: &str) -> Result<&'a str, String> {
    let head = format!("CREATE FUNCTION artex.{name}(");
    let start = schema
        .find(&head)
        .ok_or_else(|| format!("migrations/schema.sql defines no function artex.{name}"))?;
    let rest = &schema[start..];
    let mut end = None;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        let l = line.trim();
        if l == "$$;" || l == "$_$;" || l == "$__$;" {
            end = Some(offset);
            break;
        }
    }
    let end = end.ok_or_else(|| format!("artex.{name}: no closing dollar quote found"))?;
    Ok(&rest[..end])
}

/// The string literal of `const <name>: &str = "…";` in `source`.
pub fn constant_text<'a>(source: &'a str, name: &str, file: &str) -> Result<&'a str, String> {
    let head = format!("const {name}: &str =");
    let start = source
        .find(&head)
        .ok_or_else(|| format!("{file} has no `{head}`"))?;
    let rest = &source[start + head.len()..];
    let open = rest
        .find('"')
        .ok_or_else(|| format!("{file}: {name} is not a string literal"))?;
    let body = &rest[open + 1..];
    let close = body
        .find("\";")
        .ok_or_else(|| format!("{file}: {name}'s literal does not end with `\";`"))?;
    Ok(&body[..close])
}

/// The text `sql` names, read from the repository at `root`.
pub fn text_of(root: &std::path::Path, sql: &Sql) -> Result<String, String> {
    let read = |file: &str| {
        std::fs::read_to_string(root.join(file)).map_err(|e| format!("cannot read {file}: {e}"))
    };
    match sql.source {
        Source::Function(name) => {
            let schema = read("migrations/schema.sql")?;
            Ok(function_text(&schema, name)?.to_string())
        }
        Source::Constant { file, name } => {
            let source = read(file)?;
            Ok(constant_text(&source, name, file)?.to_string())
        }
    }
}

/// Recomputes every hash of `table` (an action's name, its SQL) from the sources at
/// `root`: one line per statement whose text changed or cannot be found.
pub fn check_all(root: &std::path::Path, table: &[(&str, &[Sql])]) -> Vec<String> {
    let mut problems = Vec::new();
    for (action, sqls) in table {
        for sql in *sqls {
            match text_of(root, sql) {
                Err(e) => problems.push(format!("{action}: {e}")),
                Ok(text) => {
                    let now = digest(&text);
                    if now != sql.sha256 {
                        problems.push(format!(
                            "{} changed: review the model action {action} against it \
                             (model/src/steps.rs), then update its hash in \
                             model/src/actions.rs to \"{now}\"",
                            sql.label()
                        ));
                    }
                }
            }
        }
    }
    problems
}
