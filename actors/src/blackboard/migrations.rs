//! The migrations compiled into the binary, in order: each file of `migrations/`, with
//! what it does to the builds that predate it (see [`Change`] and migrations/README.md).
//! The runner and the schema range check that read this list are `migrate`.

use super::migrate::{Change, Migration};

/// Every migration, in order. Append-only: a released file is never edited.
///
/// V1–V5 count as contractions of their own version: the builds that predate them
/// migrated at start and refused any schema newer than they knew, so no build older than
/// a migration ever ran against it, and nothing vouches that one could.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "blackboard",
        sql: include_str!("../../../migrations/V1__blackboard.sql"),
        change: Change::Contract { compatible_from: 1 },
    },
    Migration {
        version: 2,
        name: "flows",
        sql: include_str!("../../../migrations/V2__flows.sql"),
        change: Change::Contract { compatible_from: 2 },
    },
    Migration {
        version: 3,
        name: "batched_hot_path",
        sql: include_str!("../../../migrations/V3__batched_hot_path.sql"),
        change: Change::Contract { compatible_from: 3 },
    },
    Migration {
        version: 4,
        name: "input_limits",
        sql: include_str!("../../../migrations/V4__input_limits.sql"),
        change: Change::Contract { compatible_from: 4 },
    },
    Migration {
        version: 5,
        name: "fleet_capacity_and_liveness",
        sql: include_str!("../../../migrations/V5__fleet_capacity_and_liveness.sql"),
        change: Change::Contract { compatible_from: 5 },
    },
    Migration {
        version: 6,
        name: "planner_shards",
        sql: include_str!("../../../migrations/V6__planner_shards.sql"),
        // New tables only: a build that knows V5 runs on, serving every shard as before.
        change: Change::Expand,
    },
    Migration {
        version: 7,
        name: "time_ordered_ids",
        sql: include_str!("../../../migrations/V7__time_ordered_ids.sql"),
        // A function and column defaults: older builds name their ids or take the
        // default, whichever it is.
        change: Change::Expand,
    },
    Migration {
        version: 8,
        name: "api_indexes",
        sql: include_str!("../../../migrations/V8__api_indexes.sql"),
        // Indexes and a nullable column: older builds run on.
        change: Change::Expand,
    },
    Migration {
        version: 9,
        name: "uploads",
        sql: include_str!("../../../migrations/V9__uploads.sql"),
        // A new table and a nullable column: builds that predate it run on unchanged.
        change: Change::Expand,
    },
    Migration {
        version: 10,
        name: "one_history",
        sql: include_str!("../../../migrations/V10__one_history.sql"),
        // Drops the outbox `task_events`, which builds up to V9 read (their feed) and
        // prune (their Reapers), and replaces `task_transitions` by the partitioned one
        // history: only builds that know V10 run against it. Not split into expand and
        // contract: writing both shapes meanwhile is the double write this removes.
        change: Change::Contract {
            compatible_from: 10,
        },
    },
    Migration {
        version: 11,
        name: "stranded_uploads",
        sql: include_str!("../../../migrations/V11__stranded_uploads.sql"),
        // One more legal move (pending → failed) that older builds never make, and an
        // index: they run on unchanged.
        change: Change::Expand,
    },
    Migration {
        version: 12,
        name: "held_released_apart",
        sql: include_str!("../../../migrations/V12__held_released_apart.sql"),
        // `workers.held` is no longer lowered as tasks are given back (the count moves to
        // `taken` and `worker_released`): builds up to V11, whose planners read `held` as
        // the count, would stop assigning to any worker once it had been full.
        change: Change::Contract {
            compatible_from: 12,
        },
    },
    Migration {
        version: 13,
        name: "blackboard_identity",
        sql: include_str!("../../../migrations/V13__blackboard_identity.sql"),
        // A new table (the blackboard's id), which older builds never read.
        change: Change::Expand,
    },
    Migration {
        version: 14,
        name: "wake_over_http",
        sql: include_str!("../../../migrations/V14__wake_over_http.sql"),
        // A nullable column and one with a default; the trigger treats workers that
        // older builds register (no wake_addr) as before.
        change: Change::Expand,
    },
    Migration {
        version: 15,
        name: "hot_task_rows",
        sql: include_str!("../../../migrations/V15__hot_task_rows.sql"),
        // Replaces the indexes older builds claim, read assignments and list by (their
        // statements, naming `status`, would read the whole table): builds from V15 on
        // name `listed` and the holder instead.
        change: Change::Contract {
            compatible_from: 15,
        },
    },
    Migration {
        version: 16,
        name: "plan_cached_hot_path",
        sql: include_str!("../../../migrations/V16__plan_cached_hot_path.sql"),
        // Functions only, which older builds never call.
        change: Change::Expand,
    },
    Migration {
        version: 17,
        name: "unique_tasks_and_submit",
        sql: include_str!("../../../migrations/V17__unique_tasks_and_submit.sql"),
        // A nullable column older builds never set (so its checks never refuse their
        // inserts), indexes on it, and functions.
        change: Change::Expand,
    },
    Migration {
        version: 18,
        name: "tags_and_limits",
        sql: include_str!("../../../migrations/V18__tags_and_limits.sql"),
        // The round's plan-cached functions change their signatures: an older planner
        // cannot call them.
        change: Change::Contract {
            compatible_from: 18,
        },
    },
    Migration {
        version: 19,
        name: "progress_and_retry_policies",
        sql: include_str!("../../../migrations/V19__progress_and_retry_policies.sql"),
        // Nullable columns older builds neither write nor read, functions, and
        // `artex.submit` with the same signature (its default retry budget may now come
        // from the kind's policy, which only this build's operators set).
        change: Change::Expand,
    },
    Migration {
        version: 20,
        name: "schedules",
        sql: include_str!("../../../migrations/V20__schedules.sql"),
        // New tables, functions and a trigger on them, which older builds never touch.
        change: Change::Expand,
    },
    Migration {
        version: 21,
        name: "start_times_and_unique_windows",
        sql: include_str!("../../../migrations/V21__start_times_and_unique_windows.sql"),
        // Functions redefined: a write that clears `started_at` no longer counts as a
        // start, a unique key's window reaches back 100 years at most; every write older
        // builds make is read as before.
        change: Change::Expand,
    },
    Migration {
        version: 22,
        name: "history_past_a_shortened_retention",
        sql: include_str!("../../../migrations/V22__history_past_a_shortened_retention.sql"),
        // One new function, which only this build's Maintenance calls; older builds
        // prune as before (a shortened retention takes effect once the wide slice ends).
        change: Change::Expand,
    },
    Migration {
        version: 23,
        name: "wake_unreachable",
        sql: include_str!("../../../migrations/V23__wake_unreachable.sql"),
        // One nullable column: older planners never write it (and exclude an
        // unreachable worker as before), older workers never read it.
        change: Change::Expand,
    },
    Migration {
        version: 24,
        name: "hot_statements_live_once",
        sql: include_str!("../../../migrations/V24__hot_statements_live_once.sql"),
        // Comments only.
        change: Change::Expand,
    },
    Migration {
        version: 25,
        name: "hot_path_keeps_its_books",
        sql: include_str!("../../../migrations/V25__hot_path_keeps_its_books.sql"),
        // Functions redefined with the same calls, results and effects, three new ones, a
        // trigger given a condition; the history table renamed with two nullable columns
        // and a view under its old name and columns: older builds read the same rows
        // through it (their feed reads without the index) and write through the triggers.
        change: Change::Expand,
    },
    Migration {
        version: 26,
        name: "flow_task_names_indexed_for_flows_only",
        sql: include_str!("../../../migrations/V26__flow_task_names_indexed_for_flows_only.sql"),
        // The same uniqueness rule under the same name, as a partial index.
        change: Change::Expand,
    },
    Migration {
        version: 27,
        name: "wake_ups_measure_before_they_build",
        sql: include_str!("../../../migrations/V27__wake_ups_measure_before_they_build.sql"),
        // The same function, calls and results: it measures a task before writing it out.
        change: Change::Expand,
    },
    Migration {
        version: 28,
        name: "kind_index_skips_held_tasks",
        sql: include_str!("../../../migrations/V28__kind_index_skips_held_tasks.sql"),
        // The same index name and columns, made partial: older builds' listings of a kind
        // walk the primary key instead.
        change: Change::Expand,
    },
    Migration {
        version: 29,
        name: "limited_kinds_claimed_by_the_head_first",
        sql: include_str!("../../../migrations/V29__limited_kinds_claimed_by_the_head_first.sql"),
        // The same function, calls and results, and one more partial index.
        change: Change::Expand,
    },
    Migration {
        version: 30,
        name: "limits_check_reads_its_tasks_by_id",
        sql: include_str!("../../../migrations/V30__limits_check_reads_its_tasks_by_id.sql"),
        // The same function, calls and results: its tasks read through the primary key.
        change: Change::Expand,
    },
    Migration {
        version: 31,
        name: "per_row_checks_without_function_calls",
        sql: include_str!("../../../migrations/V31__per_row_checks_without_function_calls.sql"),
        // The same rule in the tags' constraint, and the same function: older builds'
        // writes pass it unchanged.
        change: Change::Expand,
    },
    Migration {
        version: 32,
        name: "hot_functions_plan_once",
        sql: include_str!("../../../migrations/V32__hot_functions_plan_once.sql"),
        // The same functions, with a setting of their own: older builds call them alike.
        change: Change::Expand,
    },
    Migration {
        version: 33,
        name: "wake_ups_read_their_tasks_by_id",
        sql: include_str!("../../../migrations/V33__wake_ups_read_their_tasks_by_id.sql"),
        // The same function, calls and results: its tasks read through the primary key.
        change: Change::Expand,
    },
    Migration {
        version: 34,
        name: "rounds_without_limits_run_a_small_statement",
        sql: include_str!(
            "../../../migrations/V34__rounds_without_limits_run_a_small_statement.sql"
        ),
        // The same function, calls and results: a smaller statement when no limited task
        // is pending.
        change: Change::Expand,
    },
    Migration {
        version: 35,
        name: "assignments_and_wake_ups_in_one_statement",
        sql: include_str!("../../../migrations/V35__assignments_and_wake_ups_in_one_statement.sql"),
        // A new function: `assign_round` and `wake_round` stay for older builds.
        change: Change::Expand,
    },
    Migration {
        version: 36,
        name: "tags_checked_without_a_query",
        sql: include_str!("../../../migrations/V36__tags_checked_without_a_query.sql"),
        // The same function and rule.
        change: Change::Expand,
    },
    Migration {
        version: 37,
        name: "limited_keys_walked_when_due",
        sql: include_str!("../../../migrations/V37__limited_keys_walked_when_due.sql"),
        // A sixth argument with a default: a call with five, an older build's, walks as
        // before.
        change: Change::Expand,
    },
    Migration {
        version: 38,
        name: "kinds_paused",
        sql: include_str!("../../../migrations/V38__kinds_paused.sql"),
        // New tables and functions; the round's read keeps its arguments and results.
        change: Change::Expand,
    },
    Migration {
        version: 39,
        name: "no_held_count_on_insert",
        sql: include_str!("../../../migrations/V39__no_held_count_on_insert.sql"),
        // A trigger that could find nothing to do, dropped: the same rules.
        change: Change::Expand,
    },
    Migration {
        version: 40,
        name: "flows_wait_for_signals_and_time",
        sql: include_str!("../../../migrations/V40__flows_wait_for_signals_and_time.sql"),
        // New tables and functions; the status machine allows a wait's ends, which an
        // older build never writes.
        change: Change::Expand,
    },
    Migration {
        version: 41,
        name: "named_tokens",
        sql: include_str!("../../../migrations/V41__named_tokens.sql"),
        // A new table; nothing reads it but the processes that know it.
        change: Change::Expand,
    },
    Migration {
        version: 42,
        name: "fleet_metrics",
        sql: include_str!("../../../migrations/V42__fleet_metrics.sql"),
        // New tables and functions, read by `artex serve`'s /metrics only.
        change: Change::Expand,
    },
    Migration {
        version: 43,
        name: "fair_dispatch",
        sql: include_str!("../../../migrations/V43__fair_dispatch.sql"),
        // A column with a default, which older builds do not write; the round's read
        // keeps its arguments and results.
        change: Change::Expand,
    },
    Migration {
        version: 44,
        name: "fair_turns_in_the_local_queue",
        sql: include_str!("../../../migrations/V44__fair_turns_in_the_local_queue.sql"),
        // The worker's read gains trailing columns (older builds read by position); the
        // round's wake-ups carry the same format, only not a fair kind's tasks.
        change: Change::Expand,
    },
    Migration {
        version: 45,
        name: "traceparent",
        sql: include_str!("../../../migrations/V45__traceparent.sql"),
        // A nullable column, and `artex.submit` with a trailing argument that defaults to
        // none: older builds' calls and inserts work unchanged.
        change: Change::Expand,
    },
    Migration {
        version: 46,
        name: "workers_claim_their_tasks",
        sql: include_str!("../../../migrations/V46__workers_claim_their_tasks.sql"),
        // A new function: older builds read with `read_assigned`, kept, and the planners
        // place their tasks as before.
        change: Change::Expand,
    },
    Migration {
        version: 47,
        name: "claim_says_when_it_found_no_room",
        sql: include_str!("../../../migrations/V47__claim_says_when_it_found_no_room.sql"),
        // The same call, its snapshot row one trailing column longer (`no_room`): V46
        // builds read that row by position and by name and never see it.
        change: Change::Expand,
    },
    Migration {
        version: 48,
        name: "a_place_kept_for_a_fresh_key",
        sql: include_str!("../../../migrations/V48__a_place_kept_for_a_fresh_key.sql"),
        // A nullable column older workers leave null (nothing kept for them), and the
        // round's read two trailing columns longer: V47 planners read its rows by
        // position and never see them.
        change: Change::Expand,
    },
    Migration {
        version: 49,
        name: "limits_counted_without_a_quadratic_join",
        sql: include_str!("../../../migrations/V49__limits_counted_without_a_quadratic_join.sql"),
        // The same function, run with a planner setting: its calls and answers do not
        // change.
        change: Change::Expand,
    },
    Migration {
        version: 50,
        name: "the_limited_head_read_in_order",
        sql: include_str!("../../../migrations/V50__the_limited_head_read_in_order.sql"),
        // The round's read replaced in place: the same signature and rows.
        change: Change::Expand,
    },
    Migration {
        version: 51,
        name: "the_claims_walk_the_queue_in_order",
        sql: include_str!("../../../migrations/V51__the_claims_walk_the_queue_in_order.sql"),
        // A new function, and the round's read and the worker's claim replaced in place:
        // the same signatures and rows.
        change: Change::Expand,
    },
    Migration {
        version: 52,
        name: "new_tasks_say_so_when_they_wake_the_planners",
        sql: include_str!(
            "../../../migrations/V52__new_tasks_say_so_when_they_wake_the_planners.sql"
        ),
        // A trigger function replaced in place; the channel's payload grows a value
        // that earlier planners treat as before.
        change: Change::Expand,
    },
    Migration {
        version: 53,
        name: "a_claim_names_the_traced_tasks_it_took",
        sql: include_str!("../../../migrations/V53__a_claim_names_the_traced_tasks_it_took.sql"),
        // Two columns more at the end of the worker's claim: earlier workers read
        // the ones they know; this build's take their absence as none.
        change: Change::Expand,
    },
    Migration {
        version: 54,
        name: "the_limited_probe_keeps_its_plan",
        sql: include_str!("../../../migrations/V54__the_limited_probe_keeps_its_plan.sql"),
        // A function's body replaced in place: the same signature and answer.
        change: Change::Expand,
    },
    Migration {
        version: 55,
        name: "a_backlog_s_rounds_keep_their_roster",
        sql: include_str!("../../../migrations/V55__a_backlog_s_rounds_keep_their_roster.sql"),
        // A new function; earlier planners never call it.
        change: Change::Expand,
    },
    Migration {
        version: 56,
        name: "a_task_write_s_fixed_costs",
        sql: include_str!("../../../migrations/V56__a_task_write_s_fixed_costs.sql"),
        // Function bodies replaced in place: the same signatures and answers.
        change: Change::Expand,
    },
    Migration {
        version: 57,
        name: "a_task_due_later_wakes_the_planners_when_due",
        sql: include_str!(
            "../../../migrations/V57__a_task_due_later_wakes_the_planners_when_due.sql"
        ),
        // A trigger function's body replaced in place; planners of earlier builds take
        // its new payload as any wake-up.
        change: Change::Expand,
    },
    Migration {
        version: 58,
        name: "a_trace_context_is_checked_when_written",
        sql: include_str!("../../../migrations/V58__a_trace_context_is_checked_when_written.sql"),
        // A check moved from a constraint into the triggers that write the column: the
        // same rule, error code and constraint name for every build.
        change: Change::Expand,
    },
    Migration {
        version: 59,
        name: "a_rows_own_facts_are_checked_where_they_are_written",
        sql: include_str!(
            "../../../migrations/V59__a_rows_own_facts_are_checked_where_they_are_written.sql"
        ),
        // Checks moved from constraints into the triggers that write their columns: the
        // same rules, error code and constraint names for every build.
        change: Change::Expand,
    },
    Migration {
        version: 60,
        name: "an_update_that_makes_a_task_due_later_announces_it",
        sql: include_str!(
            "../../../migrations/V60__an_update_that_makes_a_task_due_later_announces_it.sql"
        ),
        // A trigger function's body replaced in place; planners of earlier builds take
        // its payload as any wake-up, as V57's.
        change: Change::Expand,
    },
    Migration {
        version: 61,
        name: "a_reached_wait_announces_when_it_is_due",
        sql: include_str!("../../../migrations/V61__a_reached_wait_announces_when_it_is_due.sql"),
        // A function's body replaced in place; planners of earlier builds take its new
        // payload as any wake-up.
        change: Change::Expand,
    },
    Migration {
        version: 62,
        name: "a_new_task_is_born_assigned_to_an_idle_worker",
        sql: include_str!(
            "../../../migrations/V62__a_new_task_is_born_assigned_to_an_idle_worker.sql"
        ),
        // A table and functions added, three bodies replaced in place. Workers of earlier
        // builds never offer a slot; planners of earlier builds take `given:` as a hint
        // to run a round, and the worker reads its task at its next poll.
        change: Change::Expand,
    },
    Migration {
        version: 63,
        name: "a_limited_kind_s_new_task_asks_for_a_round_at_once",
        sql: include_str!(
            "../../../migrations/V63__a_limited_kind_s_new_task_asks_for_a_round_at_once.sql"
        ),
        // A function's body replaced in place; planners of earlier builds take its new
        // payload as any request for a round.
        change: Change::Expand,
    },
    Migration {
        version: 64,
        name: "a_fair_kind_s_task_comes_carried",
        sql: include_str!("../../../migrations/V64__a_fair_kind_s_task_comes_carried.sql"),
        // A function's body replaced in place; a worker of an earlier build cannot parse
        // a fair kind's longer carried array, and reads those tasks as it did before.
        change: Change::Expand,
    },
    Migration {
        version: 65,
        name: "a_round_counts_held_tasks_without_a_join",
        sql: include_str!("../../../migrations/V65__a_round_counts_held_tasks_without_a_join.sql"),
        // A function's body replaced in place, its answers the same.
        change: Change::Expand,
    },
    Migration {
        version: 66,
        name: "a_fair_kind_without_limits_is_not_counted",
        sql: include_str!("../../../migrations/V66__a_fair_kind_without_limits_is_not_counted.sql"),
        // A function's body replaced in place, its answers the same.
        change: Change::Expand,
    },
    Migration {
        version: 67,
        name: "a_round_walks_a_limited_kind_s_keys_by_their_index",
        sql: include_str!(
            "../../../migrations/V67__a_round_walks_a_limited_kind_s_keys_by_their_index.sql"
        ),
        // A function's body and settings replaced in place, its answers the same.
        change: Change::Expand,
    },
    Migration {
        version: 68,
        name: "one_prune_of_finished_tasks_at_a_time",
        sql: include_str!("../../../migrations/V68__one_prune_of_finished_tasks_at_a_time.sql"),
        // A function's body replaced in place; a process of an earlier build prunes as
        // before (a deadlock, when two meet, aborts one of them, as it did).
        change: Change::Expand,
    },
    Migration {
        version: 69,
        name: "a_task_s_end_writes_no_finish_time_index_entry",
        sql: include_str!(
            "../../../migrations/V69__a_task_s_end_writes_no_finish_time_index_entry.sql"
        ),
        // An index dropped and a partial one added, a function's body replaced, two
        // functions added: a process of an earlier build prunes and samples as before,
        // by a walk of the primary key.
        change: Change::Expand,
    },
    Migration {
        version: 70,
        name: "a_round_s_limits_check_reads_its_tasks_once",
        sql: include_str!(
            "../../../migrations/V70__a_round_s_limits_check_reads_its_tasks_once.sql"
        ),
        // A function's body replaced in place, its answers the same.
        change: Change::Expand,
    },
    Migration {
        version: 71,
        name: "a_worker_s_read_leaves_out_the_tasks_it_holds",
        sql: include_str!(
            "../../../migrations/V71__a_worker_s_read_leaves_out_the_tasks_it_holds.sql"
        ),
        // Two functions added beside their earlier forms, which call them: a worker of an
        // earlier build reads as before.
        change: Change::Expand,
    },
    Migration {
        version: 72,
        name: "the_looks_for_a_runnable_task_walk_the_queue_in_order",
        sql: include_str!(
            "../../../migrations/V72__the_looks_for_a_runnable_task_walk_the_queue_in_order.sql"
        ),
        // A function added and two replaced with the same answers: an earlier build runs
        // on it as before.
        change: Change::Expand,
    },
    Migration {
        version: 73,
        name: "a_worker_s_outcomes_find_their_tasks_by_key",
        sql: include_str!(
            "../../../migrations/V73__a_worker_s_outcomes_find_their_tasks_by_key.sql"
        ),
        // A function's body replaced in place, its answers the same.
        change: Change::Expand,
    },
    Migration {
        version: 74,
        name: "a_worker_s_outcomes_say_whether_the_planners_must_hear",
        sql: include_str!(
            "../../../migrations/V74__a_worker_s_outcomes_say_whether_the_planners_must_hear.sql"
        ),
        // A function replaced with one more column in its answer, which an earlier build
        // does not read: it runs on it as before.
        change: Change::Expand,
    },
];
