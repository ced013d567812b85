//! The migrations runner and the schema range check. [`MaintenanceBoard::migrate`](super::MaintenanceBoard::migrate) applies
//! `migrations/V<n>__<name>.sql` in order, each in its own transaction, under an advisory
//! lock so that concurrent processes migrate once; only `artex migrate`, `artex up` and
//! `artex db start` call it. Every other process calls [`MaintenanceBoard::check_schema`](super::MaintenanceBoard::check_schema): it
//! runs only if the database's schema lies within what its build supports.
//!
//! # Compatibility, and how it is recorded
//! A build needs every migration it knows (its code uses all of them), and it can run
//! against migrations it does not know as long as they only *expand* the schema. Each
//! migration says which it is ([`Change`]), and the runner records that in
//! `artex.schema_migrations.compatible_from`: the oldest build, named by the newest
//! migration it knows, that still runs against a database with this migration applied
//! (0 for an expansion). The database's *floor* is the highest such value among its
//! applied migrations, so a build reads "the database needs builds that know at least
//! `V<floor>`" without knowing any migration newer than itself. A build knowing up to
//! `V<k>` runs when every migration it knows is applied (with the same text) and floor ≤ k.
//! See migrations/README.md for the expand → deploy → contract procedure.

use super::{Conn, Tx};
pub use crate::error::SchemaMismatch;
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
    /// What it does to builds that do not know it.
    pub change: Change,
}

/// What a migration does to the builds that predate it: whether they keep running against
/// a database that has it. Decided when the migration is written (migrations/README.md)
/// and recorded in the database, where builds that never heard of it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Only adds (tables, columns that are nullable or have a default, functions,
    /// indexes, values older builds never see): builds that predate it run on unchanged.
    Expand,
    /// Drops, renames or redefines something older builds use, or makes them write what
    /// is now refused: only builds that know at least `V<compatible_from>` run against a
    /// database that has it. Released only once every host runs such a build.
    Contract {
        /// The newest migration the oldest compatible build knows.
        compatible_from: i32,
    },
}

impl Change {
    /// The value recorded in `schema_migrations.compatible_from`: 0 for an expansion
    /// (it never raises the floor).
    pub fn compatible_from(self) -> i32 {
        match self {
            Change::Expand => 0,
            Change::Contract { compatible_from } => compatible_from,
        }
    }
}

impl Migration {
    /// `V<n>__<name>`, as the file is named and as messages show it.
    pub fn label(&self) -> String {
        format!("V{}__{}", self.version, self.name)
    }

    /// Its checksum, as recorded in `schema_migrations.checksum`.
    pub fn checksum(&self) -> String {
        format!("{:016x}", fnv1a(self.sql))
    }
}

pub use super::migrations::MIGRATIONS;

/// What `migrate` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this call.
    pub applied: Vec<i32>,
    /// Versions that were already there.
    pub already: Vec<i32>,
    /// Applied migrations this build does not know (`V<n>__<name>`): expansions made by
    /// a newer build's `artex migrate`.
    pub newer: Vec<String>,
}

/// An identifier for the set of migrations compiled in (tests name template databases by it).
pub fn fingerprint() -> String {
    let mut all = String::new();
    for m in MIGRATIONS {
        all.push_str(m.sql);
        all.push_str(&format!("{:?}", m.change));
    }
    format!("{:016x}", fnv1a(&all))
}

/// A migration a build needs applied, as that build describes it: this build's own
/// ([`needed`]), or another's as a bundle's manifest carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needed {
    /// The number in `V<n>__`.
    pub version: i32,
    /// The name after `__`.
    pub name: String,
    /// Its checksum (see [`Migration::checksum`]).
    pub checksum: String,
}

impl Needed {
    fn label(&self) -> String {
        format!("V{}__{}", self.version, self.name)
    }
}

/// What this build needs: every migration it knows. (A build's code may use anything its
/// migrations made, so it needs them all; that is also what makes "run `artex migrate`
/// with the new build, then roll it out" the whole procedure.)
pub fn needed() -> Vec<Needed> {
    MIGRATIONS
        .iter()
        .map(|m| Needed {
            version: m.version,
            name: m.name.to_string(),
            checksum: m.checksum(),
        })
        .collect()
}

/// One row of `artex.schema_migrations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The number in `V<n>__`.
    pub version: i32,
    /// The name after `__`.
    pub name: String,
    /// The checksum of the text that was applied.
    pub checksum: String,
    /// The oldest build (by the newest migration it knows) that runs against it; rows
    /// recorded before the column existed count as their own version.
    pub compatible_from: i32,
}

impl Applied {
    fn label(&self) -> String {
        format!("V{}__{}", self.version, self.name)
    }
}

/// How a database's schema looks to a build that can run against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaStatus {
    /// The newest migration applied.
    pub newest: i32,
    /// Builds must know at least `V<floor>` to run here.
    pub floor: i32,
    /// Applied migrations the build does not know (`V<n>__<name>`): expansions.
    pub unknown: Vec<String>,
}

/// Whether a build that needs `needs` (in order, oldest first) runs against a database
/// that applied `applied`: every needed migration applied with the same text, and no
/// applied contraction newer than the build. Applied migrations the build does not know
/// are fine when they are expansions. Differences come first, then contractions, then a
/// missing migration (the one `artex migrate` can fix).
pub fn check_range(applied: &[Applied], needs: &[Needed]) -> Result<SchemaStatus, SchemaMismatch> {
    for n in needs {
        let Some(a) = applied.iter().find(|a| a.version == n.version) else {
            continue;
        };
        if a.name != n.name || a.checksum != n.checksum {
            return Err(SchemaMismatch::Differs {
                migration: n.label(),
                why: format!(
                    "it has {} with checksum {}, {} has checksum {}",
                    a.label(),
                    a.checksum,
                    n.label(),
                    n.checksum
                ),
            });
        }
    }
    let knows = needs.iter().map(|n| n.version).max().unwrap_or(0);
    // The highest floor; among equal ones the oldest migration, which raised it first.
    let floor = applied
        .iter()
        .max_by_key(|a| (a.compatible_from, std::cmp::Reverse(a.version)));
    if let Some(top) = floor.filter(|a| a.compatible_from > knows) {
        return Err(SchemaMismatch::Contracted {
            migration: top.label(),
            compatible_from: top.compatible_from,
            knows,
        });
    }
    if let Some(n) = needs
        .iter()
        .find(|n| !applied.iter().any(|a| a.version == n.version))
    {
        return Err(SchemaMismatch::Missing {
            migration: n.label(),
        });
    }
    Ok(SchemaStatus {
        newest: applied.iter().map(|a| a.version).max().unwrap_or(0),
        floor: floor.map(|a| a.compatible_from).unwrap_or(0),
        unknown: applied
            .iter()
            .filter(|a| !needs.iter().any(|n| n.version == a.version))
            .map(Applied::label)
            .collect(),
    })
}

/// The runner's own table. `compatible_from` came after the first releases: added by the
/// runner when missing, and read so that a database without it still works (see
/// [`READ_APPLIED`]).
pub(super) const CREATE_TABLE: &str = "create table if not exists artex.schema_migrations (
         version integer primary key,
         name text not null,
         checksum text not null,
         applied_at timestamptz not null default now(),
         compatible_from integer)";

/// Every applied migration. Through `to_jsonb` of the row, a database migrated before
/// `compatible_from` existed reads as null (its column is missing), so a build can check
/// it without altering it; null counts as the row's own version (older runners refused any
/// schema newer than they knew: nothing older ever ran against those migrations).
pub(super) const READ_APPLIED: &str = "select version, name, checksum,
         coalesce((to_jsonb(m) ->> 'compatible_from')::integer, version)
     from artex.schema_migrations m
     order by version";

pub(super) fn applied_from(rows: &[tokio_postgres::Row]) -> Vec<Applied> {
    rows.iter()
        .map(|r| Applied {
            version: r.get(0),
            name: r.get(1),
            checksum: r.get(2),
            compatible_from: r.get(3),
        })
        .collect()
}

// Each step of a migration run is one transaction under this transaction-scoped lock
// (the key is "artex_mi", the one older builds took as a session lock)
// (two processes migrating at once take turns; none holds anything across
// transactions, so the run works through a transaction pooler too), with the statement
// timeout lifted for it alone: a migration may take long.
const BEGIN_LOCKED: &str = "begin; set local statement_timeout = 0;
     select pg_advisory_xact_lock(7021802748184063337)";

const RECORD_APPLIED: &str =
    "insert into artex.schema_migrations (version, name, checksum, compatible_from)
     values ($1, $2, $3, $4)";

const IS_APPLIED: &str = "select 1 from artex.schema_migrations where version = $1";

const FILL_COMPATIBLE_FROM: &str = "update artex.schema_migrations set compatible_from = $2
     where version = $1 and compatible_from is null";

/// Applies the migrations `conn`'s database lacks, each in a transaction of its own
/// under the migration lock (see [`BEGIN_LOCKED`]).
pub(super) async fn apply_all(conn: Conn) -> Result<MigrationReport> {
    let tx = Tx::new(conn);
    tx.batch(&format!(
        "{BEGIN_LOCKED};
         create schema if not exists artex;
         {CREATE_TABLE};
         alter table artex.schema_migrations add column if not exists compatible_from integer"
    ))
    .await?;
    let applied = applied_from(&tx.query(READ_APPLIED, &[]).await?);
    tx.batch("commit").await?;
    let needs = needed();
    match check_range(&applied, &needs) {
        Ok(_) | Err(SchemaMismatch::Missing { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let mut report = MigrationReport::default();
    for m in MIGRATIONS {
        if applied.iter().any(|a| a.version == m.version) {
            report.already.push(m.version);
            continue;
        }
        tx.batch(BEGIN_LOCKED).await?;
        // Another process may have applied it while this one waited for the lock.
        if tx.query_opt(IS_APPLIED, &[&m.version]).await?.is_some() {
            tx.batch("commit").await?;
            report.already.push(m.version);
            continue;
        }
        tx.batch(m.sql).await.map_err(|e| Error::Migration {
            version: m.version,
            name: m.name.into(),
            why: e.to_string(),
        })?;
        tx.execute(
            RECORD_APPLIED,
            &[
                &m.version,
                &m.name,
                &m.checksum(),
                &m.change.compatible_from(),
            ],
        )
        .await?;
        tx.batch("commit").await?;
        report.applied.push(m.version);
    }
    // Rows recorded before the column existed say what this build knows of them.
    for m in MIGRATIONS {
        tx.execute(
            FILL_COMPATIBLE_FROM,
            &[&m.version, &m.change.compatible_from()],
        )
        .await?;
    }
    let applied = applied_from(&tx.query(READ_APPLIED, &[]).await?);
    tx.ended();
    report.newer = check_range(&applied, &needs)?.unknown;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn applied_of(needs: &[Needed]) -> Vec<Applied> {
        needs
            .iter()
            .map(|n| Applied {
                version: n.version,
                name: n.name.clone(),
                checksum: n.checksum.clone(),
                compatible_from: n.version,
            })
            .collect()
    }

    fn newer(version: i32, compatible_from: i32) -> Applied {
        Applied {
            version,
            name: format!("future_{version}"),
            checksum: "0".repeat(16),
            compatible_from,
        }
    }

    #[test]
    fn a_build_runs_on_exactly_its_migrations() {
        let needs = needed();
        let status = check_range(&applied_of(&needs), &needs).unwrap();
        let knows = MIGRATIONS.last().unwrap().version;
        assert_eq!((status.newest, status.floor), (knows, knows));
        assert!(status.unknown.is_empty());
    }

    #[test]
    fn an_older_build_runs_on_expansions_it_does_not_know() {
        let needs = needed();
        let knows = MIGRATIONS.last().unwrap().version;
        let mut applied = applied_of(&needs);
        applied.push(newer(knows + 1, 0));
        applied.push(newer(knows + 2, knows));
        let status = check_range(&applied, &needs).unwrap();
        assert_eq!(status.newest, knows + 2);
        assert_eq!(
            status.unknown,
            vec![
                format!("V{}__future_{}", knows + 1, knows + 1),
                format!("V{}__future_{}", knows + 2, knows + 2)
            ]
        );
    }

    #[test]
    fn a_contraction_beyond_the_build_is_refused_naming_it() {
        let needs = needed();
        let knows = MIGRATIONS.last().unwrap().version;
        let mut applied = applied_of(&needs);
        applied.push(newer(knows + 1, 0));
        applied.push(newer(knows + 2, knows + 1));
        let err = check_range(&applied, &needs).unwrap_err();
        assert_eq!(
            err,
            SchemaMismatch::Contracted {
                migration: format!("V{}__future_{}", knows + 2, knows + 2),
                compatible_from: knows + 1,
                knows,
            }
        );
        assert!(err.to_string().contains("this build knows up to"), "{err}");
    }

    #[test]
    fn a_missing_migration_is_named_with_what_to_run() {
        let needs = needed();
        let applied = applied_of(&needs[..needs.len() - 1]);
        let err = check_range(&applied, &needs).unwrap_err();
        let last = MIGRATIONS.last().unwrap();
        assert_eq!(
            err,
            SchemaMismatch::Missing {
                migration: last.label()
            }
        );
        assert!(err.to_string().contains("run `artex migrate`"), "{err}");
    }

    #[test]
    fn an_edited_migration_is_refused_before_anything_else() {
        let needs = needed();
        let mut applied = applied_of(&needs[..2]);
        applied[1].checksum = "f".repeat(16);
        let err = check_range(&applied, &needs).unwrap_err();
        assert!(
            matches!(&err, SchemaMismatch::Differs { migration, .. } if *migration == MIGRATIONS[1].label()),
            "{err:?}"
        );
    }

    #[test]
    fn released_migrations_keep_their_marks() {
        // Changing a released migration's mark changes what older builds may do against
        // databases that already have it: it is as append-only as the SQL.
        for m in &MIGRATIONS[..5] {
            assert_eq!(
                m.change,
                Change::Contract {
                    compatible_from: m.version
                },
                "{}",
                m.label()
            );
        }
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "numbered without gaps");
            if let Change::Contract { compatible_from } = m.change {
                assert!(
                    (1..=m.version).contains(&compatible_from),
                    "{}: a contraction names a build that knows it",
                    m.label()
                );
            }
        }
    }
}
