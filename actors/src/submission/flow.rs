//! The rules on a flow as a whole: a name, tasks with unique names, each task valid as a
//! task or as a wait (one wait per signal name), dependencies on tasks of this flow, and
//! no cycle (the one found is named).

use std::collections::HashMap;

use super::task::task_rules;
use super::wait::wait_rules;
use super::{Field, FlowSpec, Reason, Refusal};

/// Why a text holding U+0000 is refused.
const NUL: &str = "contains the character \\u0000, which PostgreSQL cannot store";

/// The flow's rules (see [`FlowSpec::validate`]); per task, what it depends on.
pub(super) fn flow_rules(spec: &FlowSpec) -> std::result::Result<Vec<Vec<usize>>, Refusal> {
    let whole = |field, reason| Refusal {
        task: None,
        task_name: None,
        field,
        reason,
    };
    if spec.name.trim().is_empty() {
        return Err(whole(
            Field::FlowName,
            Reason::Invalid("must not be empty".into()),
        ));
    }
    // PostgreSQL's text cannot hold U+0000: the insert would fail in the database.
    if spec.name.contains('\0') {
        return Err(whole(Field::FlowName, Reason::Invalid(NUL.into())));
    }
    if spec.tasks.is_empty() {
        return Err(whole(
            Field::Tasks,
            Reason::Flow(format!(
                "flow '{}' has no tasks; expected at least one",
                spec.name
            )),
        ));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(spec.tasks.len());
    let mut signals: HashMap<&str, usize> = HashMap::new();
    for (i, t) in spec.tasks.iter().enumerate() {
        if t.name.trim().is_empty() {
            let why = format!(
                "task #{} (kind '{}'): name must not be empty",
                i + 1,
                t.kind
            );
            return Err(Refusal::of_task(
                i,
                None,
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        if t.name.contains('\0') {
            let why = format!("task #{} (kind '{}'): name {NUL}", i + 1, t.kind);
            return Err(Refusal::of_task(
                i,
                None,
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        if let Some(first) = index.insert(&t.name, i) {
            let why = format!(
                "task '{}' is defined twice (tasks #{} and #{}); task names must be unique in \
                 a flow",
                t.name,
                first + 1,
                i + 1
            );
            return Err(Refusal::of_task(
                i,
                Some(&t.name),
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        let rules = match &t.wait {
            Some(w) => wait_rules(t, w),
            None if t.kind.is_empty() => Err((
                Field::Kind,
                "must not be empty; a flow task has a kind, or is a wait ({\"wait\": {\"signal\": …}})"
                    .to_string(),
            )),
            None => task_rules(t),
        };
        rules.map_err(|(field, why)| {
            Refusal::of_task(i, Some(&t.name), field, Reason::Invalid(why))
        })?;
        // A signal names one wait of its flow: `artex flow signal` completes that one.
        if let Some(signal) = t.wait.as_ref().and_then(|w| w.signal.as_deref()) {
            if let Some(first) = signals.insert(signal, i) {
                let why = format!(
                    "tasks '{}' and '{}' both wait for signal '{signal}'; a signal is waited \
                     for by one wait of a flow",
                    spec.tasks[first].name, t.name
                );
                return Err(Refusal::of_task(
                    i,
                    Some(&t.name),
                    Field::Wait,
                    Reason::Flow(why),
                ));
            }
        }
    }
    let mut deps = Vec::with_capacity(spec.tasks.len());
    for (i, t) in spec.tasks.iter().enumerate() {
        let refuse =
            |why: String| Refusal::of_task(i, Some(&t.name), Field::DependsOn, Reason::Flow(why));
        let mut mine: Vec<usize> = Vec::with_capacity(t.depends_on.len());
        for d in &t.depends_on {
            if d == &t.name {
                return Err(refuse(format!(
                    "task '{}' depends on itself (a cycle)",
                    t.name
                )));
            }
            let Some(&j) = index.get(d.as_str()) else {
                return Err(refuse(format!(
                    "task '{}' depends on '{d}', which is not a task of flow '{}'",
                    t.name, spec.name
                )));
            };
            if mine.contains(&j) {
                return Err(refuse(format!(
                    "task '{}' lists '{d}' twice in depends_on",
                    t.name
                )));
            }
            mine.push(j);
        }
        deps.push(mine);
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&i| spec.tasks[i].name.as_str()).collect();
        let why = format!(
            "task '{}' is part of a dependency cycle: {} (each depends on the next)",
            names[0],
            names.join(" -> ")
        );
        return Err(Refusal::of_task(
            cycle[0],
            Some(names[0]),
            Field::DependsOn,
            Reason::Flow(why),
        ));
    }
    Ok(deps)
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
