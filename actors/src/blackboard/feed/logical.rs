//! The logical decoding feed: task changes read from the write-ahead log through a
//! logical replication slot (`test_decoding` plugin), in commit order, resumable from
//! the slot's confirmed LSN.
//!
//! Prefer it over the table feed (`events`, reading `task_transitions`) when a long
//! transaction somewhere in the cluster must not hold delivery back (the table feed waits
//! for every older transaction; the WAL is in commit order already), when the event rate
//! makes polling a table costly, or to see every row change rather than the feed's
//! status changes. History rows decode under their partition's name
//! (`artex.task_transitions_…`, test_decoding has no "via the root" option). Its costs:
//! `wal_level = logical` (a server restart), a role with REPLICATION, one slot per
//! consumer that keeps WAL on disk while its consumer is away (drop the slots you
//! abandon), changes visible only once their WAL is flushed, and a slot position advanced
//! since the last checkpoint can go back after a server crash (events redelivered, never
//! lost). The table feed needs none of that, so it stays the default.
//!
//! Reading is `pg_logical_slot_peek_changes` (whole transactions) and, once the consumer
//! has written them out, `pg_replication_slot_advance` to that transaction's commit: a
//! consumer killed in between reads the same transactions again, never fewer.

use serde::Serialize;
use serde_json::{Map, Value};

use super::FeedBoard;
use crate::error::{Error, Result};

/// One transaction decoded from the slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodedTransaction {
    /// Its transaction id.
    pub xid: i64,
    /// The LSN to confirm once it has been handled (the end of its commit record).
    pub commit_lsn: String,
    /// Its commit time, as the server printed it.
    pub commit_time: Option<String>,
    /// Its row changes, in order.
    pub changes: Vec<RowChange>,
}

/// One decoded row change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowChange {
    /// Schema-qualified table, e.g. `artex.tasks`.
    pub table: String,
    /// INSERT, UPDATE or DELETE.
    pub op: String,
    /// Its columns (the new row; the key for a delete). Text, numbers, booleans and
    /// JSON are typed; other values are their text form.
    pub row: Map<String, Value>,
}

const SLOT_EXISTS: &str = "select plugin, database = current_database()
    from pg_replication_slots where slot_name = $1";

const CREATE_SLOT: &str =
    "select lsn::text from pg_create_logical_replication_slot($1, 'test_decoding')";

// Whole transactions only: the limit is checked after each commit.
const PEEK: &str = "select lsn::text, xid::text::int8, data
    from pg_logical_slot_peek_changes($1, null, $2::int4,
        'include-xids', '1', 'include-timestamp', '1', 'skip-empty-xacts', '1')";

const ADVANCE: &str = "select end_lsn::text from pg_replication_slot_advance($1, $2::text::pg_lsn)";

const DROP_SLOT: &str = "select pg_drop_replication_slot(slot_name) from pg_replication_slots
    where slot_name = $1";

impl FeedBoard {
    /// Creates logical slot `slot` (plugin `test_decoding`) in this database unless it
    /// exists; returns whether it created it. Needs `wal_level = logical`.
    pub async fn ensure_logical_slot(&self, slot: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        if let Some(r) = client.query_opt(SLOT_EXISTS, &[&slot]).await? {
            let plugin: Option<String> = r.try_get(0)?;
            let here: Option<bool> = r.try_get(1)?;
            if plugin.as_deref() != Some("test_decoding") || here != Some(true) {
                return Err(Error::Invalid(format!(
                    "slot '{slot}' exists but is not a test_decoding slot of this database \
                     (plugin {plugin:?}); choose another --slot name"
                )));
            }
            return Ok(false);
        }
        let wal: String = client
            .query_one("select current_setting('wal_level')", &[])
            .await?
            .try_get(0)?;
        if wal != "logical" {
            return Err(Error::Invalid(format!(
                "the logical feed needs wal_level = logical, the server runs with {wal}; set \
                 it and restart PostgreSQL (embedded cluster: artex db stop; artex db start \
                 --logical)"
            )));
        }
        match client.query_one(CREATE_SLOT, &[&slot]).await {
            Ok(_) => Ok(true),
            // Created by a concurrent consumer in the meantime.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads (without consuming) the transactions after the slot's confirmed LSN, whole
    /// ones, stopping after the one in which about `max_changes` rows were reached.
    pub async fn peek_logical(
        &self,
        slot: &str,
        max_changes: i32,
    ) -> Result<Vec<DecodedTransaction>> {
        let client = self.bb.client().await?;
        let rows = client.query(PEEK, &[&slot, &max_changes]).await?;
        let mut out = Vec::new();
        let mut current: Option<DecodedTransaction> = None;
        for r in rows {
            let lsn: String = r.try_get(0)?;
            let xid: Option<i64> = r.try_get(1)?;
            let data: String = r.try_get(2)?;
            if data.starts_with("BEGIN") {
                current = Some(DecodedTransaction {
                    xid: xid.unwrap_or(0),
                    commit_lsn: String::new(),
                    commit_time: None,
                    changes: Vec::new(),
                });
            } else if data.starts_with("COMMIT") {
                let mut tx = current.take().unwrap_or(DecodedTransaction {
                    xid: xid.unwrap_or(0),
                    commit_lsn: String::new(),
                    commit_time: None,
                    changes: Vec::new(),
                });
                tx.commit_lsn = lsn;
                tx.commit_time = data
                    .split_once("(at ")
                    .map(|(_, t)| t.trim_end_matches(')').to_string());
                out.push(tx);
            } else if let Some(change) = parse_change(&data) {
                if let Some(tx) = current.as_mut() {
                    tx.changes.push(change);
                }
            }
        }
        Ok(out)
    }

    /// Confirms everything up to `lsn` (a transaction's `commit_lsn`): the next read
    /// starts after it.
    pub async fn advance_logical_slot(&self, slot: &str, lsn: &str) -> Result {
        let client = self.bb.client().await?;
        client.query_one(ADVANCE, &[&slot, &lsn]).await?;
        Ok(())
    }

    /// Drops the slot (it stops holding WAL); returns whether it existed.
    pub async fn drop_logical_slot(&self, slot: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(!client.query(DROP_SLOT, &[&slot]).await?.is_empty())
    }
}

/// Parses one `test_decoding` change line:
/// `table artex.tasks: UPDATE: id[uuid]:'…' status[artex.task_status]:'running' …`.
pub fn parse_change(line: &str) -> Option<RowChange> {
    let rest = line.strip_prefix("table ")?;
    let (table, rest) = rest.split_once(": ")?;
    let (op, rest) = match rest.split_once(": ") {
        Some((op, rest)) => (op, rest),
        None => (rest.trim_end_matches(':'), ""),
    };
    if !matches!(op, "INSERT" | "UPDATE" | "DELETE") {
        return None;
    }
    // An update that changed the key prints `old-key: … new-tuple: …`: keep the new tuple.
    let rest = rest.split_once("new-tuple: ").map(|x| x.1).unwrap_or(rest);
    let mut row = Map::new();
    let mut s = rest;
    while !s.is_empty() && !s.starts_with('(') {
        let open = s.find('[')?;
        let name = &s[..open];
        let close = s[open..].find("]:")? + open;
        let ty = &s[open + 1..close];
        s = &s[close + 2..];
        let (raw, quoted, after) = if let Some(q) = s.strip_prefix('\'') {
            // Quoted: '' is an escaped quote.
            let mut value = String::new();
            let mut chars = q.char_indices().peekable();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                if c == '\'' {
                    if matches!(chars.peek(), Some((_, '\''))) {
                        value.push('\'');
                        chars.next();
                    } else {
                        end = i + 1;
                        break;
                    }
                } else {
                    value.push(c);
                }
            }
            (value, true, &q[end..])
        } else {
            let end = s.find(' ').unwrap_or(s.len());
            (s[..end].to_string(), false, &s[end..])
        };
        row.insert(name.to_string(), typed(ty, &raw, quoted));
        s = after.trim_start();
    }
    Some(RowChange {
        table: table.to_string(),
        op: op.to_string(),
        row,
    })
}

fn typed(ty: &str, raw: &str, quoted: bool) -> Value {
    if !quoted && raw == "null" {
        return Value::Null;
    }
    match ty {
        "json" | "jsonb" => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.into())),
        "boolean" => Value::Bool(raw == "true"),
        "smallint" | "integer" | "bigint" => raw
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        _ => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_test_decoding_lines() {
        let c = parse_change(
            "table artex.tasks: UPDATE: id[uuid]:'00000000-0000-0000-0000-00000000000a' \
             kind[text]:'echo' payload[jsonb]:'{\"a\": \"it''s\"}' result[jsonb]:null \
             lease_epoch[bigint]:1 run_at[timestamp with time zone]:'2026-11-29 13:41:25+00' \
             kinds[text[]]:'{a,b}'",
        )
        .unwrap();
        assert_eq!(c.table, "artex.tasks");
        assert_eq!(c.op, "UPDATE");
        assert_eq!(c.row["kind"], "echo");
        assert_eq!(c.row["payload"]["a"], "it's");
        assert_eq!(c.row["result"], Value::Null);
        assert_eq!(c.row["lease_epoch"], 1);
        assert_eq!(c.row["run_at"], "2026-11-29 13:41:25+00");
        assert_eq!(c.row["kinds"], "{a,b}");
        assert_eq!(parse_change("BEGIN 12"), None);
        let d = parse_change("table artex.flows: DELETE: (no-tuple-data)").unwrap();
        assert_eq!(d.op, "DELETE");
        assert!(d.row.is_empty());
    }
}
