-- V36: a tagged task's check costs no query (issue 39). Expand: the same rule, the same
-- results, the same function and constraint.
--
-- The tags' CHECK constraint runs at every row version of a task: the insert, the
-- assignment, the end, each renewal. `artex.tags_valid` was a SQL function with a
-- subquery, which PostgreSQL cannot inline, so each check started an executor for it.
-- V31 spared the tasks without tags; a task with tags still paid at every write: "two
-- tags a task" fell to 0.77x of W1 from idle as W1 itself got cheaper. The same rule in
-- PL/pgSQL evaluates simple expressions only, with no executor and no plan.
create or replace function artex.tags_valid(tags text[]) returns boolean
language plpgsql immutable as $$
declare
    tag text;
begin
    if tags is null then
        return true;
    end if;
    if cardinality(tags) not between 1 and 20 or array_ndims(tags) <> 1 then
        return false;
    end if;
    foreach tag in array tags loop
        if tag is null or tag = '' or octet_length(tag) > 64 then
            return false;
        end if;
    end loop;
    return true;
end
$$;
