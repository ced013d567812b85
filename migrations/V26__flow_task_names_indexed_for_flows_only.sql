-- V26: the uniqueness of a flow's task names, kept by a partial index (issue 39). Expand:
-- the same rule, under the same name; writes older builds make satisfy it alike.
--
-- `unique (flow_id, flow_task)` (V1) indexed every row version of every task, NULL keys
-- included, though only tasks of flows have a name to keep unique: a status change is
-- not HOT, so each assignment and each end of a task outside any flow put two entries in
-- it, ~140 B of WAL per task of W1 (pg_waldump of the run). The index now holds only the
-- tasks of flows. A duplicate name is refused as before, naming `unique_flow_task`.
alter table artex.tasks drop constraint unique_flow_task;
create unique index unique_flow_task on artex.tasks (flow_id, flow_task)
    where flow_id is not null;

comment on index artex.unique_flow_task is
    'A flow''s task names are unique within it; only tasks of flows are indexed (V26; a table constraint over every task until then).';
