//! How a statement of artex reaches PostgreSQL, the same way directly and through a
//! transaction pooler (pgbouncer in `pool_mode = transaction`), which hands each
//! transaction whichever server connection is free:
//!
//! - **Unnamed statements.** Each statement is parsed, bound and run in one round trip
//!   (tokio-postgres' `query_typed`) and leaves nothing on the server connection: a named
//!   prepared statement would live on one server connection and be asked for on another
//!   (pgbouncer 1.18 does not track them). Its parameters are typed by their Rust types
//!   ([`Param`]), so no `describe` round trip is needed either. The price is a parse and
//!   plan per call, which the batched hot path pays once per batch (measured in
//!   docs/bench/2026-12-02.md, "Before V15: every statement unnamed").
//! - **No session state.** Nothing is `set` for a session: a session setting made through
//!   a transaction pooler lands on one server connection and stays there for whoever gets
//!   it next (the relaxed pool's `synchronous_commit = off` would reach task outcomes).
//!   What must hold for a transaction is `set local` in it: [`Conn::begin`] sets the
//!   idle-in-transaction timeout, [`Conn::relaxed`] runs a statement without waiting for
//!   the WAL flush.
//! - **The statement timeout is artex's own.** A statement that runs past
//!   [`DbLimits::statement_timeout`](super::DbLimits) is cancelled by a cancel request
//!   (which pgbouncer forwards to the server connection running it), and the caller gets
//!   [`Error::StatementTimeout`]. A connection whose statement does not come back even
//!   then is closed, not handed back to the pool.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::Future;
use tokio_postgres::types::{Json, ToSql, Type};
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use crate::error::{Error, Result};

/// A session left idle inside a transaction (a bug, a hung process) is ended by the
/// server after this long, so its row locks do not stall the fleet. Set for each
/// transaction artex begins ([`Conn::begin`]).
pub(crate) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// A statement parameter: a value and the PostgreSQL type it is sent as, told by its
/// Rust type (`i64` is `int8`, `Vec<Uuid>` is `uuid[]`, `None::<String>` is a null
/// `text`, …). A statement that wants another type casts (`$1::int4`).
pub(crate) trait Param: ToSql + Sync {
    /// The type the value is sent as.
    fn pg_type(&self) -> Type;
}

/// A Rust type that is sent as one PostgreSQL type, and arrays of it as that type's
/// array.
pub(crate) trait Typed {
    const SCALAR: Type;
    const ARRAY: Type;
}

macro_rules! typed {
    ($($rust:ty => $pg:ident, $array:ident;)*) => {$(
        impl Typed for $rust {
            const SCALAR: Type = Type::$pg;
            const ARRAY: Type = Type::$array;
        }
    )*};
}

typed! {
    bool => BOOL, BOOL_ARRAY;
    i16 => INT2, INT2_ARRAY;
    i32 => INT4, INT4_ARRAY;
    i64 => INT8, INT8_ARRAY;
    f32 => FLOAT4, FLOAT4_ARRAY;
    f64 => FLOAT8, FLOAT8_ARRAY;
    str => TEXT, TEXT_ARRAY;
    String => TEXT, TEXT_ARRAY;
    Uuid => UUID, UUID_ARRAY;
    DateTime<Utc> => TIMESTAMPTZ, TIMESTAMPTZ_ARRAY;
    serde_json::Value => JSONB, JSONB_ARRAY;
    tokio_postgres::types::PgLsn => PG_LSN, PG_LSN_ARRAY;
}

impl<T: Typed + ?Sized> Typed for &T {
    const SCALAR: Type = T::SCALAR;
    const ARRAY: Type = T::ARRAY;
}

impl<T: Typed> Typed for Option<T> {
    const SCALAR: Type = T::SCALAR;
    const ARRAY: Type = T::ARRAY;
}

impl<T> Typed for Json<T> {
    const SCALAR: Type = Type::JSONB;
    const ARRAY: Type = Type::JSONB_ARRAY;
}

impl<T: Typed + ToSql + Sync + ?Sized> Param for T {
    fn pg_type(&self) -> Type {
        T::SCALAR
    }
}

impl<T: Typed + ToSql + Sync> Param for Vec<T> {
    fn pg_type(&self) -> Type {
        T::ARRAY
    }
}

impl<T: Typed + ToSql + Sync> Param for Option<Vec<T>> {
    fn pg_type(&self) -> Type {
        T::ARRAY
    }
}

impl<T: Typed + ToSql + Sync> Param for &[T] {
    fn pg_type(&self) -> Type {
        T::ARRAY
    }
}

/// When PostgreSQL last answered a statement of this process's pools: a process that
/// talks to the database all the time needs no extra round trip to know it answers
/// (`/health`'s probe asks only when nothing else did lately).
#[derive(Debug)]
pub(crate) struct Heard {
    start: Instant,
    /// Milliseconds from `start` to the last answer, plus one (0: never).
    last: AtomicU64,
}

impl Heard {
    pub(crate) fn new() -> Arc<Heard> {
        Arc::new(Heard {
            start: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    fn note(&self) {
        let ms = self.start.elapsed().as_millis() as u64 + 1;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long ago the last answer came, if one did.
    pub(crate) fn ago(&self) -> Option<Duration> {
        match self.last.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.start
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1)),
            ),
        }
    }
}

/// How [`Conn::walked_one`] begins its transaction.
pub(crate) const WALKED: &str =
    "begin; set local enable_seqscan = off; set local enable_sort = off; set local jit = off";

/// A pooled connection; every statement of artex runs through one (see the
/// [module](self)).
pub(crate) struct Conn {
    client: Option<deadpool_postgres::Client>,
    /// The statement timeout; `None` for a migration's connection.
    timeout: Option<Duration>,
    /// A statement did not come back from its cancel: close the connection on drop.
    broken: AtomicBool,
    heard: Arc<Heard>,
}

impl Conn {
    pub(crate) fn new(
        client: deadpool_postgres::Client,
        timeout: Duration,
        heard: Arc<Heard>,
    ) -> Self {
        Conn {
            client: Some(client),
            timeout: Some(timeout),
            broken: AtomicBool::new(false),
            heard,
        }
    }

    /// The same connection with no statement timeout (a migration may take long; its
    /// transactions lift the server's too).
    pub(crate) fn unbounded(mut self) -> Self {
        self.timeout = None;
        self
    }

    fn raw(&self) -> &tokio_postgres::Client {
        self.client.as_ref().expect("only drop takes the client")
    }

    /// The rows `sql` returns.
    pub(crate) async fn query(&self, sql: &str, params: &[&dyn Param]) -> Result<Vec<Row>> {
        let typed = typed(params);
        self.timed(self.raw().query_typed(sql, &typed)).await
    }

    /// The one row `sql` returns (an error if none or several).
    pub(crate) async fn query_one(&self, sql: &str, params: &[&dyn Param]) -> Result<Row> {
        let typed = typed(params);
        self.timed(self.raw().query_typed_one(sql, &typed)).await
    }

    /// The row `sql` returns, if any (an error if several).
    pub(crate) async fn query_opt(&self, sql: &str, params: &[&dyn Param]) -> Result<Option<Row>> {
        let typed = typed(params);
        self.timed(self.raw().query_typed_opt(sql, &typed)).await
    }

    /// Runs `sql`; the rows it changed.
    pub(crate) async fn execute(&self, sql: &str, params: &[&dyn Param]) -> Result<u64> {
        let typed = typed(params);
        self.timed(self.raw().execute_typed(sql, &typed)).await
    }

    /// Runs `sql`, one or several statements without parameters, in the simple query
    /// protocol (`begin`, `commit`, a migration's script).
    pub(crate) async fn batch(&self, sql: &str) -> Result {
        self.timed(self.raw().batch_execute(sql)).await
    }

    /// Begins a transaction (see [`Tx`]), setting for it what must hold while it is
    /// open. Sent without waiting for an answer when pipelined with the first statement
    /// (join the two futures): the answers come back in order.
    pub(crate) async fn begin(&self) -> Result {
        self.batch(&format!(
            "begin; set local idle_in_transaction_session_timeout = {}",
            IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
        ))
        .await
    }

    /// Runs `sql` in a transaction of its own that does not wait for the WAL flush
    /// (`synchronous_commit = off` for it alone): heartbeats, lease renewals and
    /// wake-ups, rewritten every few seconds, whose loss in a crash costs nothing. One
    /// round trip: the `begin`, the statement and the `commit` are pipelined.
    pub(crate) async fn relaxed(&self, sql: &str, params: &[&dyn Param]) -> Result<Vec<Row>> {
        self.alone(
            "begin; set local synchronous_commit = off",
            self.query(sql, params),
        )
        .await
    }

    /// The one row `sql` returns, run in a transaction of its own with sequential scans and
    /// sorts off: a read whose index walk stops early (a limit, a bound found by a
    /// subquery) that PostgreSQL would otherwise plan as a scan of the whole table, by a
    /// guess at how much of it the walk reads. One round trip, as [`Conn::relaxed`].
    pub(crate) async fn walked_one(&self, sql: &str, params: &[&dyn Param]) -> Result<Row> {
        self.alone(WALKED, self.query_one(sql, params)).await
    }

    /// `statement` in a transaction of its own that `begin` opens, pipelined with it and
    /// the `commit`: the answers come back in the order the three were sent.
    pub(crate) async fn alone<T>(
        &self,
        begin: &str,
        statement: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let (begun, out, committed) =
            futures_util::future::join3(self.batch(begin), statement, self.batch("commit")).await;
        begun?;
        let out = out?;
        committed?;
        Ok(out)
    }

    /// Waits for a statement, cancelling it past the statement timeout.
    async fn timed<T>(
        &self,
        call: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        let Some(after) = self.timeout else {
            return Ok(call.await?);
        };
        tokio::pin!(call);
        if let Ok(done) = tokio::time::timeout(after, &mut call).await {
            if !matches!(&done, Err(e) if e.is_closed()) {
                self.heard.note();
            }
            return Ok(done?);
        }
        // The cancel request goes on a connection of its own; the statement then ends
        // with the server's "canceling statement due to user request". A server or
        // network that answers neither within the timeout again leaves the connection
        // unusable: it is closed.
        let cancel = self.raw().cancel_token();
        let cancelled = tokio::time::timeout(after, cancel.cancel_query(NoTls)).await;
        if matches!(cancelled, Ok(Ok(()))) {
            if let Ok(done) = tokio::time::timeout(after, &mut call).await {
                return match done {
                    Err(e)
                        if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) =>
                    {
                        Err(Error::StatementTimeout { after })
                    }
                    // A pooler may end a client whose statement it was asked to cancel
                    // while it waited for a server connection (pgbouncer does).
                    Err(e) if e.is_closed() => {
                        self.broken.store(true, Ordering::Relaxed);
                        Err(Error::StatementTimeout { after })
                    }
                    // It ended on its own meanwhile.
                    done => Ok(done?),
                };
            }
        }
        self.broken.store(true, Ordering::Relaxed);
        Err(Error::Timeout {
            what: "a statement (even after a cancel request)",
            after,
        })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if self.broken.load(Ordering::Relaxed) {
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

/// The parameters as `query_typed` takes them.
fn typed<'a>(params: &'a [&'a dyn Param]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|p| {
            let value: &(dyn ToSql + Sync) = *p;
            (value, p.pg_type())
        })
        .collect()
}

/// A pooled connection inside a transaction begun by hand ([`Conn::begin`], pipelined
/// with the first statement). Unless [`Tx::ended`] is called after the commit or
/// rollback, dropping it — an error path, a panic in a caller's closure, a future
/// dropped mid-way — closes the connection instead of handing it back to the pool inside
/// the transaction (the server then rolls the transaction back and frees its locks).
pub(crate) struct Tx(Option<Conn>);

impl Tx {
    /// `conn`, about to begin a transaction.
    pub(crate) fn new(conn: Conn) -> Self {
        Tx(Some(conn))
    }

    /// The transaction ended: the connection may go back to the pool.
    pub(crate) fn ended(mut self) {
        self.0.take();
    }

    /// Commits, and hands the connection back.
    pub(crate) async fn commit(self) -> Result {
        self.batch("commit").await?;
        self.ended();
        Ok(())
    }

    /// Rolls back (an error path); the connection goes back to the pool only if the
    /// rollback went through.
    pub(crate) async fn rollback(self) {
        if self.batch("rollback").await.is_ok() {
            self.ended();
        }
    }
}

impl std::ops::Deref for Tx {
    type Target = Conn;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("only `ended` takes the connection, and it consumes self")
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            tracing::warn!("a transaction was abandoned; closing its connection");
            conn.broken.store(true, Ordering::Relaxed);
        }
    }
}

/// `s` as a quoted SQL identifier (a database, a channel, a table name), its double
/// quotes doubled: for the statements that cannot take it as a parameter.
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
