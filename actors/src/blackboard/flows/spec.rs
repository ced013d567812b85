//! A flow as submitted, before any SQL: parsed from JSON ([`FlowSpec`]), validated
//! (names, references, cycles, each task as a task), and the [`FlowState`] a flow is in
//! given its tasks' statuses. Pure, so it is unit-tested here.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::blackboard::tasks::NewTask;
use crate::blackboard::TaskStatus;
use crate::error::{Error, Result};

/// A flow as submitted: a name and its tasks, each naming the tasks it depends on.
///
/// ```
/// use artex_actors::blackboard::FlowSpec;
/// let spec = FlowSpec::from_json(r#"{"name": "nightly-etl", "tasks": [
///     {"name": "extract", "kind": "echo"},
///     {"name": "load", "kind": "echo", "depends_on": ["extract"]}]}"#).unwrap();
/// assert_eq!(spec.tasks[1].depends_on, ["extract"]);
/// spec.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    /// The flow's name (need not be unique; its id is).
    pub name: String,
    /// Its tasks, in any order.
    pub tasks: Vec<FlowTaskSpec>,
}

/// One task of a [`FlowSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTaskSpec {
    /// Unique within the flow; what `depends_on` refers to.
    pub name: String,
    /// The handler kind.
    pub kind: String,
    /// The handler's input; `{}` by default.
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    /// Names of the tasks that must succeed before this one runs.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Higher runs first; 0 by default.
    #[serde(default)]
    pub priority: i32,
    /// Retries after the first attempt; 3 by default.
    #[serde(default)]
    pub max_retries: Option<i32>,
    /// Per-attempt handler timeout in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<i32>,
    /// Business shard key.
    #[serde(default)]
    pub shard_key: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

impl FlowSpec {
    /// Parses a flow from JSON; a syntax error or an unknown field names line and column.
    pub fn from_json(text: &str) -> Result<FlowSpec> {
        serde_json::from_str(text).map_err(|e| Error::Invalid(format!("flow file: {e}")))
    }

    /// Checks the flow: a name, at least one task, unique task names, valid kinds and
    /// settings, dependencies that name tasks of this flow, and no cycle. Each error names
    /// the offending task. Returns, per task, the indices of the tasks it depends on.
    pub fn validate(&self) -> Result<Vec<Vec<usize>>> {
        if self.name.trim().is_empty() {
            return Err(Error::Invalid("flow name: must not be empty".into()));
        }
        if self.tasks.is_empty() {
            return Err(Error::Invalid(format!(
                "flow '{}' has no tasks; expected at least one",
                self.name
            )));
        }
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.tasks.len());
        for (i, t) in self.tasks.iter().enumerate() {
            if t.name.trim().is_empty() {
                return Err(Error::Invalid(format!(
                    "task #{} (kind '{}'): name must not be empty",
                    i + 1,
                    t.kind
                )));
            }
            if let Some(first) = index.insert(&t.name, i) {
                return Err(Error::Invalid(format!(
                    "task '{}' is defined twice (tasks #{} and #{}); task names must be unique \
                     in a flow",
                    t.name,
                    first + 1,
                    i + 1
                )));
            }
            t.as_new_task()
                .validate()
                .map_err(|e| Error::Invalid(format!("task '{}': {e}", t.name)))?;
        }
        let mut deps = Vec::with_capacity(self.tasks.len());
        for t in &self.tasks {
            let mut mine: Vec<usize> = Vec::with_capacity(t.depends_on.len());
            for d in &t.depends_on {
                if d == &t.name {
                    return Err(Error::Invalid(format!(
                        "task '{}' depends on itself (a cycle)",
                        t.name
                    )));
                }
                let Some(&j) = index.get(d.as_str()) else {
                    return Err(Error::Invalid(format!(
                        "task '{}' depends on '{d}', which is not a task of flow '{}'",
                        t.name, self.name
                    )));
                };
                if mine.contains(&j) {
                    return Err(Error::Invalid(format!(
                        "task '{}' lists '{d}' twice in depends_on",
                        t.name
                    )));
                }
                mine.push(j);
            }
            deps.push(mine);
        }
        if let Some(cycle) = find_cycle(&deps) {
            let names: Vec<&str> = cycle.iter().map(|&i| self.tasks[i].name.as_str()).collect();
            return Err(Error::Invalid(format!(
                "task '{}' is part of a dependency cycle: {} (each depends on the next)",
                names[0],
                names.join(" -> ")
            )));
        }
        Ok(deps)
    }
}

impl FlowTaskSpec {
    fn as_new_task(&self) -> NewTask {
        NewTask {
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            priority: self.priority,
            run_at: None,
            max_retries: self.max_retries,
            timeout_ms: self.timeout_ms,
            shard_key: self.shard_key.clone(),
        }
    }
}

/// A cycle in the dependency graph (`deps[i]` = what task i depends on), as a path that
/// starts and ends on the same task, or `None` for a DAG. Iterative (a chain of 10,000
/// tasks must not overflow the stack): depth-first with colours.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut colour = vec![WHITE; deps.len()];
    for start in 0..deps.len() {
        if colour[start] != WHITE {
            continue;
        }
        // (node, next edge to follow)
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = GREY;
        while let Some(&mut (node, ref mut edge)) = stack.last_mut() {
            if let Some(&next) = deps[node].get(*edge) {
                *edge += 1;
                match colour[next] {
                    WHITE => {
                        colour[next] = GREY;
                        stack.push((next, 0));
                    }
                    GREY => {
                        // `next` is on the current path: the cycle is the path from it.
                        let from = stack.iter().position(|&(n, _)| n == next).unwrap_or(0);
                        let mut cycle: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                        cycle.push(next);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                colour[node] = BLACK;
                stack.pop();
            }
        }
    }
    None
}

/// A flow's overall state, derived from its tasks' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowState {
    /// Some task has not ended and not all of those are paused.
    Running,
    /// Every task that has not ended is paused.
    Paused,
    /// Every task succeeded.
    Succeeded,
    /// Every task ended, and at least one failed or timed out.
    Failed,
    /// Every task ended, none failed, at least one was canceled.
    Canceled,
}

impl FlowState {
    /// The state of a flow whose tasks have these statuses.
    pub fn of(statuses: impl IntoIterator<Item = TaskStatus>) -> FlowState {
        let (mut open, mut paused, mut failed, mut canceled) = (0, 0, 0, 0);
        for s in statuses {
            match s {
                TaskStatus::Succeeded => {}
                TaskStatus::Failed | TaskStatus::Timeout => failed += 1,
                TaskStatus::Canceled => canceled += 1,
                TaskStatus::Paused => {
                    open += 1;
                    paused += 1;
                }
                _ => open += 1,
            }
        }
        if open > 0 {
            if paused == open {
                FlowState::Paused
            } else {
                FlowState::Running
            }
        } else if failed > 0 {
            FlowState::Failed
        } else if canceled > 0 {
            FlowState::Canceled
        } else {
            FlowState::Succeeded
        }
    }

    /// The name shown to people.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::Running => "running",
            FlowState::Paused => "paused",
            FlowState::Succeeded => "succeeded",
            FlowState::Failed => "failed",
            FlowState::Canceled => "canceled",
        }
    }
}

impl std::fmt::Display for FlowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tasks: &[(&str, &[&str])]) -> FlowSpec {
        FlowSpec {
            name: "f".into(),
            tasks: tasks
                .iter()
                .map(|(n, d)| FlowTaskSpec {
                    name: n.to_string(),
                    kind: "echo".into(),
                    payload: empty_object(),
                    depends_on: d.iter().map(|s| s.to_string()).collect(),
                    priority: 0,
                    max_retries: None,
                    timeout_ms: None,
                    shard_key: None,
                })
                .collect(),
        }
    }

    fn err(s: &FlowSpec) -> String {
        s.validate().unwrap_err().to_string()
    }

    #[test]
    fn a_dag_is_accepted_with_its_edges() {
        let s = spec(&[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])]);
        assert_eq!(
            s.validate().unwrap(),
            vec![vec![], vec![0], vec![0], vec![1, 2]]
        );
    }

    #[test]
    fn cycles_are_named() {
        let e = err(&spec(&[
            ("a", &["c"]),
            ("b", &["a"]),
            ("c", &["b"]),
            ("x", &[]),
        ]));
        assert!(e.contains("dependency cycle: a -> c -> b -> a"), "{e}");
        let e = err(&spec(&[("a", &["a"])]));
        assert!(e.contains("task 'a' depends on itself"), "{e}");
    }

    #[test]
    fn bad_references_duplicates_and_empty_flows_are_named() {
        let e = err(&spec(&[("a", &[]), ("b", &["nope"])]));
        assert!(
            e.contains("task 'b' depends on 'nope', which is not a task"),
            "{e}"
        );
        let e = err(&spec(&[("a", &[]), ("a", &[])]));
        assert!(
            e.contains("task 'a' is defined twice (tasks #1 and #2)"),
            "{e}"
        );
        let e = err(&spec(&[("a", &[]), ("b", &["a", "a"])]));
        assert!(e.contains("task 'b' lists 'a' twice"), "{e}");
        let e = err(&spec(&[]));
        assert!(e.contains("has no tasks"), "{e}");
        let mut s = spec(&[("a", &[])]);
        s.tasks[0].kind = String::new();
        assert!(err(&s).contains("task 'a': kind"), "{}", err(&s));
    }

    #[test]
    fn a_long_chain_is_checked_without_recursion() {
        let names: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
        let mut s = spec(&[]);
        for (i, n) in names.iter().enumerate() {
            let mut t = spec(&[(n, &[])]).tasks.remove(0);
            if i > 0 {
                t.depends_on = vec![names[i - 1].clone()];
            }
            s.tasks.push(t);
        }
        assert_eq!(s.validate().unwrap().len(), 100_000);
        s.tasks[0].depends_on = vec!["t99999".into()];
        assert!(err(&s).contains("dependency cycle"));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let e = FlowSpec::from_json(
            r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo", "dependson": []}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `dependson`"), "{e}");
    }

    #[test]
    fn the_flow_state_follows_its_tasks() {
        use TaskStatus::*;
        assert_eq!(FlowState::of([Succeeded, Succeeded]), FlowState::Succeeded);
        assert_eq!(
            FlowState::of([Succeeded, Running, Paused]),
            FlowState::Running
        );
        assert_eq!(FlowState::of([Succeeded, Paused]), FlowState::Paused);
        assert_eq!(FlowState::of([Failed, Canceled]), FlowState::Failed);
        assert_eq!(FlowState::of([Succeeded, Canceled]), FlowState::Canceled);
    }
}
