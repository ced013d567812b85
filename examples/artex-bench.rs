//! The benchmark's worker binary (scripts/bench.sh), built on the artex crate the way a
//! user builds their own worker: the stock kinds plus one,
//! `stamp`, whose result is the wall-clock time its handler started (`{"t_us": …}`, Unix
//! microseconds), so enqueue → handler start is measured where the handler runs, not
//! where the database thinks the task started. `artex-bench dispatch-sql` prints the
//! planner round's read (its roster and claim in one statement), for `EXPLAIN ANALYZE`
//! against a backlog or a large fleet.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use artex::TaskContext;
use serde_json::json;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("dispatch-sql") {
        println!("{}", artex_actors::blackboard::DISPATCH_SQL);
        return ExitCode::SUCCESS;
    }
    let mut handlers = artex::handlers::stock();
    handlers.register("stamp", |_ctx: TaskContext| async move {
        let t_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(json!({ "t_us": t_us }))
    });
    artex::cli::main_with(handlers)
}
