-- The insert alone, to subtract: 500 tasks.
insert into artex.tasks (kind, payload) select 'noop', '{}' from generate_series(1, 500);
