//! The side file of the stock `journal` and `journal-checkpoint` kinds (src/handlers.rs):
//! one line per execution's start and end, written in one `write` each, so the file's
//! order is the order they happened in across processes.

use std::path::Path;

use uuid::Uuid;

/// One line: `<task> <attempt> <pid> start <unix ms>` or
/// `<task> <attempt> <pid> end <unix ms> <how> <unix ms its code last ran>`.
#[derive(Debug, Clone)]
pub struct Line {
    /// The task.
    pub task: Uuid,
    /// Its attempt.
    pub attempt: i32,
    /// The process that ran it.
    pub pid: i32,
    /// "start" or "end".
    pub what: String,
    /// When the line was written, unix ms.
    pub at_ms: u128,
    /// How it ended ("ok", "canceled", "stopped": its future dropped); empty for a start.
    pub how: String,
    /// When its code last ran, unix ms (an end only; a worker's drop of a stopped
    /// execution comes later and runs none of it).
    pub active_ms: Option<u128>,
}

/// Every line of `file` (none if it does not exist yet).
pub fn read(file: &Path) -> Vec<Line> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let field = |i: usize| -> &str {
                f.get(i).copied().unwrap_or_else(|| {
                    panic!(
                        "journal {}: a line not of the kind's form: {l:?}",
                        file.display()
                    )
                })
            };
            let number = |i: usize| -> u128 {
                field(i).parse().unwrap_or_else(|_| {
                    panic!(
                        "journal {}: field {i} of {l:?} is no number",
                        file.display()
                    )
                })
            };
            Line {
                task: field(0)
                    .parse()
                    .unwrap_or_else(|_| panic!("journal {}: no task id in {l:?}", file.display())),
                attempt: number(1) as i32,
                pid: number(2) as i32,
                what: field(3).to_string(),
                at_ms: number(4),
                how: f.get(5).unwrap_or(&"").to_string(),
                active_ms: f.get(6).and_then(|v| v.parse().ok()),
            }
        })
        .collect()
}
