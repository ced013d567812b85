//! The migrations runner: applies `migrations/V<n>__<name>.sql` in order, each in its own
//! transaction, under an advisory lock so that concurrent processes migrate once, and
//! refuses to run against a database whose applied migrations were edited since.

use super::Blackboard;
use crate::error::{Error, Result};

/// One migration file, compiled into the binary.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The number in `V<n>__`.
    pub version: i32,
    /// The name after `__`.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Every migration, in order. Append-only: a released file is never edited.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "blackboard",
        sql: include_str!("../../../migrations/V1__blackboard.sql"),
    },
    Migration {
        version: 2,
        name: "flows",
        sql: include_str!("../../../migrations/V2__flows.sql"),
    },
    Migration {
        version: 3,
        name: "batched_hot_path",
        sql: include_str!("../../../migrations/V3__batched_hot_path.sql"),
    },
    Migration {
        version: 4,
        name: "input_limits",
        sql: include_str!("../../../migrations/V4__input_limits.sql"),
    },
    Migration {
        version: 5,
        name: "fleet_capacity_and_liveness",
        sql: include_str!("../../../migrations/V5__fleet_capacity_and_liveness.sql"),
    },
    Migration {
        version: 6,
        name: "planner_shards",
        sql: include_str!("../../../migrations/V6__planner_shards.sql"),
    },
];

/// What `migrate` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this call.
    pub applied: Vec<i32>,
    /// Versions that were already there.
    pub already: Vec<i32>,
}

/// An identifier for the set of migrations compiled in (tests name template databases by it).
pub fn fingerprint() -> String {
    let mut all = String::new();
    for m in MIGRATIONS {
        all.push_str(m.sql);
    }
    format!("{:016x}", fnv1a(&all))
}

const LOCK_KEY: i64 = 0x6172_7465_785f_6d69; // "artex_mi"

impl Blackboard {
    /// Applies every migration not yet applied. Safe to call from several processes at once.
    pub async fn migrate(&self) -> Result<MigrationReport> {
        // A connection of its own, closed afterwards: a migration (or the wait for another
        // process's) may outlast the statement timeout, which is lifted for this session
        // only and never handed back to the pool.
        let mut client = deadpool_postgres::Object::take(self.pool.get().await?);
        client
            .batch_execute(
                "set statement_timeout = 0;
                 create schema if not exists artex;
                 create table if not exists artex.schema_migrations (
                     version integer primary key,
                     name text not null,
                     checksum text not null,
                     applied_at timestamptz not null default now())",
            )
            .await
            .or_else(|e| {
                // Two processes racing on "create ... if not exists" can collide on the
                // catalog; the loser retries below under the lock.
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        client
            .execute("select pg_advisory_lock($1)", &[&LOCK_KEY])
            .await?;
        let result = apply_all(&mut client).await;
        let unlock = client
            .execute("select pg_advisory_unlock($1)", &[&LOCK_KEY])
            .await;
        let report = result?;
        unlock?;
        Ok(report)
    }
}

async fn apply_all(client: &mut tokio_postgres::Client) -> Result<MigrationReport> {
    client
        .batch_execute(
            "create table if not exists artex.schema_migrations (
                 version integer primary key,
                 name text not null,
                 checksum text not null,
                 applied_at timestamptz not null default now())",
        )
        .await?;
    let rows = client
        .query(
            "select version, name, checksum from artex.schema_migrations",
            &[],
        )
        .await?;
    let mut report = MigrationReport::default();
    for m in MIGRATIONS {
        let sum = format!("{:016x}", fnv1a(m.sql));
        if let Some(row) = rows.iter().find(|r| r.get::<_, i32>(0) == m.version) {
            let applied: String = row.get(2);
            if applied != sum {
                return Err(Error::Migration {
                    version: m.version,
                    name: m.name.into(),
                    why: format!(
                        "the database applied a different text (checksum {applied}, this \
                         binary has {sum}); released migrations are append-only"
                    ),
                });
            }
            report.already.push(m.version);
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| Error::Migration {
                version: m.version,
                name: m.name.into(),
                why: Error::from(e).to_string(),
            })?;
        tx.execute(
            "insert into artex.schema_migrations (version, name, checksum) values ($1, $2, $3)",
            &[&m.version, &m.name, &sum],
        )
        .await?;
        tx.commit().await?;
        report.applied.push(m.version);
    }
    if let Some(newest) = rows.iter().map(|r| r.get::<_, i32>(0)).max() {
        let known = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0);
        if newest > known {
            return Err(Error::Migration {
                version: newest,
                name: "unknown".into(),
                why: format!(
                    "the database is at V{newest}, newer than this binary knows (V{known}); \
                     upgrade artex"
                ),
            });
        }
    }
    Ok(report)
}

/// The 64-bit FNV-1a hash of `s`: a checksum to notice edited migrations, not a security
/// boundary (so no cryptographic hash, and no dependency for one).
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
