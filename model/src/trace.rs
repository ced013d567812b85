//! A path of the model printed as a trace a person can follow: each step with the SQL it
//! stands for, then the blackboard's rows and each process's memory after it.

use std::fmt::Write;

use stateright::Path;

use crate::actions::Action;
use crate::state::{Doing, State};

/// The path as numbered steps, each followed by the state it led to.
pub fn render(path: &Path<State, Action>) -> String {
    let mut out = String::new();
    let steps = path.clone().into_vec();
    for (i, (state, action)) in steps.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "  0. start\n{}", describe(state));
        }
        if let Some(a) = action {
            let sql: Vec<String> = a.statements().iter().map(|s| s.label()).collect();
            let sql = if sql.is_empty() {
                String::new()
            } else {
                format!("  [{}]", sql.join(", "))
            };
            let after = &steps.get(i + 1).map(|(s, _)| s);
            let _ = writeln!(out, "{:>3}. {a:?}{sql}", i + 1);
            if let Some(after) = after {
                let _ = write!(out, "{}", describe(after));
            }
        }
    }
    out
}

/// One state in a few lines: the clock, each task's row, each process.
pub fn describe(s: &State) -> String {
    let mut out = format!("       clock {} · upgrade {:?}\n", s.now, s.phase);
    for (t, r) in s.tasks.iter().enumerate() {
        let holder = r.holder.map_or("-".to_string(), |w| format!("w{w}"));
        let _ = writeln!(
            out,
            "       t{t}: {:?} by {holder} epoch {} lease until {} retries {} checkpoint {}",
            r.status, r.epoch, r.lease_until, r.retries, r.checkpoint
        );
    }
    for (w, p) in s.procs.iter().enumerate() {
        let held: Vec<String> = p
            .held
            .iter()
            .enumerate()
            .filter_map(|(t, h)| {
                h.as_ref().map(|h| {
                    let what = match h.what {
                        Doing::Running {
                            from,
                            progress,
                            start_written,
                        } => format!(
                            "running from {from} at {progress}{}",
                            if start_written {
                                ""
                            } else {
                                ", start unwritten"
                            }
                        ),
                        Doing::Done { succeeded } => {
                            format!(
                                "done ({}), outcome unwritten",
                                if succeeded { "ok" } else { "failed" }
                            )
                        }
                        Doing::Suspended => "suspended".to_string(),
                    };
                    format!("t{t}@{} knows lease until {}: {what}", h.epoch, h.known_end)
                })
            })
            .collect();
        let _ = writeln!(
            out,
            "       w{w} ({:?}, {:?}{}{}{}): {}",
            p.role,
            p.state,
            if p.alive { "" } else { ", down" },
            if p.connected { "" } else { ", cut off" },
            if p.draining { ", draining" } else { "" },
            if held.is_empty() {
                "holds nothing".to_string()
            } else {
                held.join("; ")
            }
        );
    }
    out
}
