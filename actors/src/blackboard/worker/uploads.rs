//! Uploads: a file received in chunks by a worker becomes, once whole and checked, one
//! `artex.uploads` row and the task that names it, written by one statement (so once,
//! however many times the last chunk comes) behind a lock on the flow it joins; then what
//! the worker's sweeper needs to delete files whose task ended, and the reaper's failing
//! of tasks whose file's host is gone for good. See migrations/V9__uploads.sql and V11__stranded_uploads.sql.

use serde::Serialize;
use uuid::Uuid;

use super::WorkerBoard;
use crate::blackboard::Tx;
use crate::error::{Error, Result};
use crate::submission::{Facts, NewTask, Submission};

/// A whole, checked file on a worker's disk, about to be recorded.
#[derive(Debug, Clone)]
pub struct NewUpload {
    /// The upload's id (the one its chunks were sent under).
    pub id: Uuid,
    /// The host whose disk holds it.
    pub host: String,
    /// Where it lies on that host.
    pub path: String,
    /// Its size in bytes.
    pub size: i64,
    /// Its sha256, lowercase hex.
    pub sha256: String,
    /// How many chunks it came in.
    pub chunks: i32,
    /// The client's name for it (never used as a path).
    pub name: Option<String>,
    /// On storage the whole fleet sees: the task is bound to no host.
    pub shared: bool,
    /// The flow its task joins, as a root task named `upload:<id>`.
    pub flow: Option<Uuid>,
}

/// An upload as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct UploadRow {
    /// Its id.
    pub id: Uuid,
    /// The host whose disk holds it.
    pub host: String,
    /// Where it lies on that host.
    pub path: String,
    /// Size in bytes.
    pub size: i64,
    /// sha256, lowercase hex.
    pub sha256: String,
    /// `complete` or `deleted`.
    pub state: String,
    /// On storage shared by the fleet.
    pub shared: bool,
    /// The task that names it.
    pub task: Uuid,
}

// One statement writes the upload's row and its task, or (the row already there: a last
// chunk sent twice, two processes finishing at once) nothing. The final select cannot see
// a row a concurrent statement committed after this one's snapshot; `record_upload` then
// asks again, in a new statement (a new snapshot).
// With a flow ($15), the task joins it as a root named `upload:<id>`. The flow was
// unfinished when the upload started; if every task of it ended since (it was canceled,
// say), the task is held `paused` with the reason, for a person to resume or cancel,
// rather than run in a flow that is over. If every unfinished task of it is paused (the
// flow is `paused`, as `flow show` says), the task is held paused with them: resuming
// the flow runs it too. Those readings are only sound after LOCK_FLOW.
// (A flow whose last task ends on its own at that very moment is not covered: the task
// may then join it `pending`, and the flow runs again for it.)
const RECORD: &str = "with up as (
        insert into artex.uploads (id, host, path, size, sha256, chunks, name, shared, task_id)
        values ($3, $4, $5, $6, $7, $8, $9, $10, $11)
        on conflict (id) do nothing
        returning task_id
    ),
    flow as (
        select $15::uuid is null
               or exists (select 1 from artex.tasks f
                          where f.flow_id = $15::uuid
                            and f.status not in ('succeeded', 'failed', 'timeout', 'canceled'))
               as open,
               $15::uuid is not null
               and exists (select 1 from artex.tasks f
                           where f.flow_id = $15::uuid and f.status = 'paused')
               and not exists (select 1 from artex.tasks f
                               where f.flow_id = $15::uuid
                                 and f.status not in ('succeeded', 'failed', 'timeout',
                                                      'canceled', 'paused'))
               as paused
    ),
    t as (
        insert into artex.tasks (id, kind, payload, priority, host, flow_id, flow_task, status,
                                 error, max_retries)
        select $11, $12, $13, $14, case when $10 then null else $4 end,
               $15::uuid, case when $15::uuid is not null then 'upload:' || $3::text end,
               case when flow.open and not flow.paused then 'pending'
                    else 'paused' end::artex.task_status,
               case when not flow.open
                    then format('flow %s had ended when upload %s completed: held paused '
                                '(resume it to run it, or cancel it)', $15::uuid, $3::uuid)
                    when flow.paused
                    then format('flow %s was paused when upload %s completed: held paused '
                                'with it (resuming the flow runs it)', $15::uuid, $3::uuid)
               end,
               artex.default_max_retries($12)
        from artex.set_context($1, $2) ctx, up, flow
        where ctx
        returning id
    )
    select coalesce((select id from t), (select task_id from artex.uploads where id = $3)),
           exists (select 1 from t)";

// Taken on the flow's row in a statement of its own, before RECORD in the same
// transaction. A whole-flow pause, resume or cancel locks that row `for update` before it
// reads which tasks to change (flows/mod.rs, LOCK_FLOW_TO_CONTROL), and `for key share`
// is the one mode that conflicts with it and with nothing else: uploads joining one flow
// never wait for each other, and the task's foreign key takes this very lock anyway.
// RECORD's snapshot, taken after it, sees a control that came first (the flow is over or
// paused: the task is held paused); a control that comes later waits for this
// transaction, then sees the task and changes it with the rest. Locking inside RECORD
// would come too late: under READ COMMITTED a statement keeps the snapshot it started
// with, whatever lock it waits for, so the control and the upload could each miss the
// other and leave, say, a pending task in a canceled flow.
const LOCK_FLOW: &str = "select 1 from artex.flows where id = $1 for key share";

const UPLOAD: &str = "select id, host, path, size, sha256, state, shared, task_id
    from artex.uploads where id = $1";

// Files whose task ended at least $2 seconds ago, on this host (or shared), in the upload
// folder $3 (its path and a '/'). Another folder's rows (another worker's on this host,
// or a shared upload in a folder this worker does not serve) are not this worker's to
// delete: were they in the batch, a hundred of them left by a worker that is gone would
// fill every batch, and this folder's files would stay for ever.
const ENDED: &str = "select u.id, u.path from artex.uploads u
    join artex.tasks t on t.id = u.task_id
    where u.state = 'complete' and (u.host = $1 or u.shared) and starts_with(u.path, $3)
      and t.status in ('succeeded', 'failed', 'timeout', 'canceled')
      and coalesce(t.finished_at, t.updated_at) < now() - make_interval(secs => $2::float8)
    order by u.id
    limit 100";

const MARK_DELETED: &str = "update artex.uploads set state = 'deleted', deleted_at = now()
    where id = any($1::uuid[]) and state = 'complete'";

const KNOWN: &str = "select id from artex.uploads where id = any($1::uuid[])";

// Whether the flow exists, and whether a task of it has not ended (an upload's task may
// join it then).
const FLOW_OPEN: &str = "select exists (select 1 from artex.flows where id = $1),
        exists (select 1 from artex.tasks where flow_id = $1
                and status not in ('succeeded', 'failed', 'timeout', 'canceled'))";

impl WorkerBoard {
    /// What checking the task an upload will create needs (the payload limit, the kinds
    /// workers declared): see [`Facts`].
    pub async fn submission_facts(&self, submission: &Submission<'_>) -> Result<Facts> {
        self.bb.submission_facts(submission).await
    }

    /// Records `upload` and submits `task` naming it, in one transaction: exactly once per
    /// upload id. Returns the task's id and whether this call wrote it.
    pub async fn record_upload(
        &self,
        upload: &NewUpload,
        task: &NewTask,
        actor: &str,
    ) -> Result<(Uuid, bool)> {
        task.validate()?;
        let tx = Tx::new(self.bb.client().await?);
        tx.begin().await?;
        if let Some(flow) = upload.flow {
            tx.query(LOCK_FLOW, &[&flow]).await?;
        }
        let task_id = Uuid::now_v7();
        for _ in 0..5 {
            let row = tx
                .query_one(
                    RECORD,
                    &[
                        &actor,
                        &"upload complete",
                        &upload.id,
                        &upload.host,
                        &upload.path,
                        &upload.size,
                        &upload.sha256,
                        &upload.chunks,
                        &upload.name,
                        &upload.shared,
                        &task_id,
                        &task.kind,
                        &task.payload,
                        &task.priority,
                        &upload.flow,
                    ],
                )
                .await?;
            if let Some(id) = row.try_get::<_, Option<Uuid>>(0)? {
                let wrote = row.try_get(1)?;
                tx.commit().await?;
                return Ok((id, wrote));
            }
        }
        Err(Error::Invalid(format!(
            "upload {}: recorded concurrently, yet its row cannot be read",
            upload.id
        )))
    }

    /// The upload `id`, if recorded.
    pub async fn upload(&self, id: Uuid) -> Result<Option<UploadRow>> {
        let client = self.bb.client().await?;
        let Some(r) = client.query_opt(UPLOAD, &[&id]).await? else {
            return Ok(None);
        };
        Ok(Some(UploadRow {
            id: r.try_get(0)?,
            host: r.try_get(1)?,
            path: r.try_get(2)?,
            size: r.try_get(3)?,
            sha256: r.try_get(4)?,
            state: r.try_get(5)?,
            shared: r.try_get(6)?,
            task: r.try_get(7)?,
        }))
    }

    /// Uploads on `host` (or shared) in the upload folder `folder` (ending in '/') whose
    /// task ended more than `keep_secs` ago: their files can go. At most 100 per call.
    pub async fn uploads_ended(
        &self,
        host: &str,
        folder: &str,
        keep_secs: f64,
    ) -> Result<Vec<(Uuid, String)>> {
        let client = self.bb.client().await?;
        client
            .query(ENDED, &[&host, &keep_secs, &folder])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Marks these uploads' files deleted.
    pub async fn mark_uploads_deleted(&self, ids: &[Uuid]) -> Result<u64> {
        let client = self.bb.client().await?;
        client.execute(MARK_DELETED, &[&ids]).await
    }

    /// Whether flow `id` is unfinished (`Some(true)`), ended (`Some(false)`) or unknown.
    pub async fn flow_open(&self, id: Uuid) -> Result<Option<bool>> {
        let client = self.bb.client().await?;
        let r = client.query_one(FLOW_OPEN, &[&id]).await?;
        let (exists, open): (bool, bool) = (r.try_get(0)?, r.try_get(1)?);
        Ok(exists.then_some(open))
    }

    /// Which of `ids` are recorded (complete or deleted).
    pub async fn uploads_known(&self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        let client = self.bb.client().await?;
        client
            .query(KNOWN, &[&ids])
            .await?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }
}
