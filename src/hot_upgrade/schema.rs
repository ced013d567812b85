//! The database schema a build needs, in the form a bundle's manifest carries it: this
//! build's own (what `artex schema --json` prints and `artex bundle create` records), and
//! the check the old process makes of a new build's against the database before it
//! spawns anything (a refusal is the upgrade's 409).

use artex_actors::blackboard::{check_range, needed, Needed, SchemaMismatch};
use artex_actors::Blackboard;
use artex_upgrade::{Schema, SchemaMigration};

use super::error::UpgradeError;

/// This build's schema: every migration it knows, all of which it needs.
pub fn this_build() -> Schema {
    Schema {
        needs: needed()
            .into_iter()
            .map(|n| SchemaMigration {
                version: n.version,
                name: n.name,
                checksum: n.checksum,
            })
            .collect(),
    }
}

/// What a manifest's schema asks of the database, in the runner's terms.
fn needs_of(schema: &Schema) -> Vec<Needed> {
    schema
        .needs
        .iter()
        .map(|m| Needed {
            version: m.version,
            name: m.name.clone(),
            checksum: m.checksum.clone(),
        })
        .collect()
}

/// Whether the build of a bundle whose manifest says `schema` runs against `bb`'s
/// database, the same check that build makes at its own start. A bundle that does not say
/// (made before the field, or of a binary that could not tell) passes: the new process
/// still checks for itself, and a refusal there rolls the upgrade back.
pub async fn check_new_build(bb: &Blackboard, schema: Option<&Schema>) -> Result<(), UpgradeError> {
    let Some(schema) = schema else {
        tracing::info!("the bundle does not say which schema it needs; the new process checks");
        return Ok(());
    };
    let applied = bb.maintenance().applied_migrations().await.map_err(|e| {
        let why = format!("reading the database's schema: {e}");
        // Found by the soak: an upgrade sent while PostgreSQL restarted answered 500.
        if e.is_connection() {
            UpgradeError::Unavailable(why)
        } else {
            UpgradeError::Internal(why)
        }
    })?;
    let verdict = match applied {
        Some(applied) => check_range(&applied, &needs_of(schema)),
        None => Err(SchemaMismatch::NoSchema),
    };
    verdict
        .map(|_| ())
        .map_err(|e| UpgradeError::Schema(e.describe("the new build")))
}
