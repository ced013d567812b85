//! Where the change feed ends now: the position a reader starts after when it only wants
//! what happens from now on (`artex submit --wait`, `artex flow show --follow`), instead
//! of reading the whole kept feed first.

use super::events::{parse_xid, EventPosition};
use super::FeedBoard;
use crate::error::Result;

// The last deliverable event: written by a transaction older than every one in flight
// (the feed's horizon, as `events.rs` READ uses). An event not yet deliverable comes from
// a transaction at or above the horizon, so its position is above this one: a reader
// starting here misses nothing committed after it looked. Walks the (xid, id) index
// backwards, past the few entries of transactions in flight. A stored row's last event
// is its end's when it holds a start and an end (V25).
pub(crate) const FEED_HEAD: &str = "select e.xid::text, coalesce(e.end_id, e.id)
    from artex.task_history e
    where e.xid < pg_snapshot_xmin(pg_current_snapshot())
    order by e.xid desc, e.id desc
    limit 1";

impl FeedBoard {
    /// The position of the last event deliverable now (`None` when there is none): read
    /// it, then the state you follow, then follow the feed after it, and no change made
    /// after the state was read is missed.
    pub async fn feed_head(&self) -> Result<Option<EventPosition>> {
        let client = self.bb.client().await?;
        let Some(row) = client.query_opt(FEED_HEAD, &[]).await? else {
            return Ok(None);
        };
        Ok(Some(EventPosition {
            xid: parse_xid(row.try_get(0)?)?,
            id: row.try_get(1)?,
        }))
    }

    /// The position of the newest event a feed reader can be given now (the pruned
    /// position when none is kept): following from it shows what happens next.
    pub async fn events_head(&self) -> Result<EventPosition> {
        match self.feed_head().await? {
            Some(head) => Ok(head),
            None => Ok(self.event_retention().await?.pruned_through),
        }
    }
}
