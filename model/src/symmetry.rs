//! Symmetry reduction: tasks start alike, planners are alike and so are the plain workers,
//! so states that differ only by a renaming of them are one state to the checker. The
//! representative sorts each kind by what it holds and renames every reference to it
//! (a sound reduction: every property is blind to names; one representative per class
//! is not guaranteed, which costs states, never coverage).

use crate::state::{Role, State};

/// The state, its tasks, plain workers and planners renamed into a sorted order.
pub fn representative(s: &State) -> State {
    let s = sort_tasks(s);
    let s = sort_plain_workers(&s);
    sort_planners(&s)
}

fn sort_tasks(s: &State) -> State {
    let n = s.tasks.len();
    let mut order: Vec<usize> = (0..n).collect();
    let key = |t: usize| {
        (
            s.tasks[t].clone(),
            s.procs
                .iter()
                .map(|p| p.held[t].clone())
                .collect::<Vec<_>>(),
            s.ghost.suspended_at[t],
        )
    };
    order.sort_by_key(|&t| key(t));
    let mut new_of = vec![0u8; n];
    for (new, &old) in order.iter().enumerate() {
        new_of[old] = new as u8;
    }
    let mut r = s.clone();
    r.tasks = order.iter().map(|&t| s.tasks[t].clone()).collect();
    for (rp, sp) in r.procs.iter_mut().zip(&s.procs) {
        rp.held = order.iter().map(|&t| sp.held[t].clone()).collect();
    }
    r.ghost.suspended_at = order.iter().map(|&t| s.ghost.suspended_at[t]).collect();
    for c in r.claims.iter_mut().flatten() {
        c.0 = new_of[c.0 as usize];
    }
    for p in r.pushes.iter_mut().flatten() {
        p.1 = new_of[p.1 as usize];
    }
    r
}

fn sort_plain_workers(s: &State) -> State {
    let plain: Vec<usize> = (0..s.procs.len())
        .filter(|&w| s.procs[w].role == Role::Plain)
        .collect();
    let key = |w: usize| {
        (
            s.procs[w].clone(),
            s.tasks
                .iter()
                .map(|r| r.holder == Some(w as u8))
                .collect::<Vec<_>>(),
            s.unreachable
                .iter()
                .map(|u| u & (1 << w) != 0)
                .collect::<Vec<_>>(),
        )
    };
    let mut sorted = plain.clone();
    sorted.sort_by_key(|&w| key(w));
    // The worker at plain[i] is renamed plain[i]'s slot for the i-th in sorted order.
    let mut new_of: Vec<u8> = (0..s.procs.len() as u8).collect();
    for (slot, &old) in plain.iter().zip(&sorted) {
        new_of[old] = *slot as u8;
    }
    let mut r = s.clone();
    for (&slot, &old) in plain.iter().zip(&sorted) {
        r.procs[slot] = s.procs[old].clone();
    }
    for row in r.tasks.iter_mut() {
        row.holder = row.holder.map(|w| new_of[w as usize]);
    }
    for c in r.claims.iter_mut().flatten() {
        c.1 = new_of[c.1 as usize];
    }
    for p in r.pushes.iter_mut().flatten() {
        p.0 = new_of[p.0 as usize];
    }
    for (ru, &su) in r.unreachable.iter_mut().zip(&s.unreachable) {
        *ru = (0..s.procs.len())
            .filter(|&w| su & (1 << w) != 0)
            .fold(0, |acc, w| acc | (1 << new_of[w]));
    }
    r
}

fn sort_planners(s: &State) -> State {
    let mut planners: Vec<_> = (0..s.claims.len())
        .map(|p| (s.claims[p], s.pushes[p], s.unreachable[p]))
        .collect();
    planners.sort();
    let mut r = s.clone();
    for (p, (c, pu, u)) in planners.into_iter().enumerate() {
        r.claims[p] = c;
        r.pushes[p] = pu;
        r.unreachable[p] = u;
    }
    r
}
