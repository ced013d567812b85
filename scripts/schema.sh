#!/usr/bin/env bash
# Regenerates migrations/schema.sql: the schema a freshly migrated blackboard has
# (tests/schema.rs, schema_sql_is_the_schema_the_migrations_make, writes it instead of
# comparing). Run it after adding a migration, and commit the file with it.
set -euo pipefail
cd "$(dirname "$0")/.."
ARTEX_UPDATE_SCHEMA=1 scripts/test.sh -E 'binary(schema) & test(schema_sql_is_the_schema_the_migrations_make)'
git --no-pager diff --stat -- migrations/schema.sql
