//! What a client declares when it starts an upload (`POST /api/v1/uploads`), every
//! field checked before anything is written; kept as the upload's `meta.json`. The task
//! it declares is checked as every submission is (`artex_actors::submission`): its shape
//! here, the payload limit and the kinds workers declared when the upload starts.

use artex_actors::blackboard::NewTask;
use artex_actors::submission::{Field, Refusal, Submission};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::error::{Result, UploadError};
use super::settings::{DEFAULT_CHUNK, MAX_CHUNK, MAX_CHUNKS, MAX_NAME, MIN_CHUNK};

/// What the client declared when it started the upload, kept in `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// The upload's id.
    pub id: Uuid,
    /// The whole file's size.
    pub size: u64,
    /// The whole file's sha256, lowercase hex: declared when the upload starts, or given
    /// with `complete` once every chunk is there (`None` until then), so that a client
    /// can send while it hashes.
    #[serde(default)]
    pub sha256: Option<String>,
    /// The client's name for the file (shown, never a path).
    pub name: Option<String>,
    /// Bytes per chunk (the last one may be shorter).
    pub chunk_size: u64,
    /// How many chunks.
    pub chunks: u64,
    /// The task to submit once the file is whole.
    pub task: TaskSpec,
    /// The host of the worker that took the upload (absent in uploads of earlier
    /// builds): on a folder the fleet shares, another host's worker may be the one to
    /// record it, and the row names where it was received, not who swept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The blackboard whose upload this is (`WorkerBoard::blackboard_id`); absent in
    /// uploads of earlier builds. Workers of other blackboards leave it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blackboard: Option<Uuid>,
    /// How the upload is kept on disk ([`LAYOUT`]); absent in the first layout (a file
    /// per chunk, joined at the end), which this build does not resume.
    #[serde(default = "first_layout")]
    pub layout: u32,
}

/// The on-disk layout this build writes and reads: chunks in place in one data file,
/// an empty marker per chunk received (see the module's documentation).
pub const LAYOUT: u32 = 2;

fn first_layout() -> u32 {
    1
}

/// The task an upload submits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Its kind.
    pub kind: String,
    /// Its payload (an object; the upload is added as its `upload` field).
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Its priority.
    #[serde(default)]
    pub priority: Option<i32>,
    /// The flow it joins (an unfinished one; checked when the upload starts), as a root
    /// task named `upload:<upload id>`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "flow_id"
    )]
    pub flow: Option<Uuid>,
    /// Its kind may be one no worker declared yet (its workers start later). Asked when
    /// the upload starts and not kept: `meta.json` stays readable by earlier builds.
    #[serde(default, skip_serializing)]
    pub allow_unregistered_kind: bool,
}

/// How an upload's refusals name a field of its task (`task.kind`), for the JSON
/// `field` of a 422.
pub fn task_field(field: Field) -> &'static str {
    match field {
        Field::Kind => "task.kind",
        Field::Payload => "task.payload",
        Field::Priority => "task.priority",
        _ => "task",
    }
}

/// A refused task as an upload words it.
pub fn refusal_text(r: &Refusal) -> String {
    r.message(
        task_field(r.field),
        "set \"allow_unregistered_kind\": true in the task",
    )
}

impl Meta {
    /// The task this upload submits once whole: the declared payload with the file
    /// named in its `upload` field. `sha256` is the whole file's; before it is known, a
    /// stand-in of the same length measures the payload as it will be.
    pub fn task(&self, sha256: &str) -> NewTask {
        let mut payload = match &self.task.payload {
            Some(Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        payload.insert(
            "upload".into(),
            serde_json::json!({
                "id": self.id, "size": self.size, "sha256": sha256, "name": self.name,
            }),
        );
        NewTask {
            priority: self.task.priority.unwrap_or(0),
            ..NewTask::new(self.task.kind.clone(), Value::Object(payload))
        }
    }

    /// The task as [`Meta::task`], its sha256 a stand-in if not declared yet.
    pub fn task_to_check(&self) -> NewTask {
        let stand_in = "0".repeat(64);
        self.task(self.sha256.as_deref().unwrap_or(&stand_in))
    }
}

/// `task.flow`: a UUID or null, refused with a message naming the field.
fn flow_id<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Uuid>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .and_then(|s| Uuid::parse_str(s).ok())
            .map(Some)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("task.flow: expected a flow id (a UUID), got {v}"))
            }),
    }
}

/// A whole file's sha256 as a client gives it: 64 hex digits, kept lowercase.
pub fn check_sha256(given: &str) -> Result<String> {
    let sha256 = given.to_ascii_lowercase();
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(UploadError::Invalid(format!(
            "sha256: {given:?}; expected 64 hexadecimal digits"
        )));
    }
    Ok(sha256)
}

/// The body of `POST /api/v1/uploads`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The file's size in bytes.
    pub size: u64,
    /// Its sha256, hex; if absent, it is given with `complete` instead.
    #[serde(default)]
    pub sha256: Option<String>,
    /// A name to show (never a path).
    #[serde(default)]
    pub name: Option<String>,
    /// Bytes per chunk.
    #[serde(default)]
    pub chunk_size: Option<u64>,
    /// The task to submit when the file is whole.
    pub task: TaskSpec,
}

impl CreateRequest {
    /// Checks every field; the message names the one refused.
    pub fn check(self) -> Result<Meta> {
        let bad = |m: String| Err(UploadError::Invalid(m));
        if self.size == 0 {
            return bad("size: 0; expected a file of at least one byte".into());
        }
        let chunk_size = self.chunk_size.unwrap_or(DEFAULT_CHUNK);
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
            return bad(format!(
                "chunk_size: {chunk_size}; expected {MIN_CHUNK} to {MAX_CHUNK} bytes"
            ));
        }
        let chunks = self.size.div_ceil(chunk_size);
        // A rule across size and chunk_size, which no schema states: refused (422), not
        // malformed.
        if chunks > MAX_CHUNKS {
            return Err(UploadError::Unprocessable {
                field: "size",
                message: format!(
                    "size: {} bytes in chunks of {chunk_size} makes {chunks} chunks; at most \
                     {MAX_CHUNKS} (send larger chunks)",
                    self.size
                ),
            });
        }
        let sha256 = self.sha256.as_deref().map(check_sha256).transpose()?;
        if let Some(name) = &self.name {
            if name.is_empty()
                || name.len() > MAX_NAME
                || name == "."
                || name == ".."
                || name.contains(['/', '\\'])
                || name.chars().any(char::is_control)
            {
                return bad(format!(
                    "name: {name:?}; expected a plain file name of 1 to {MAX_NAME} bytes, \
                     without '/', '\\\\' or control characters"
                ));
            }
        }
        match &self.task.payload {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.contains_key("upload") => {
                return bad(
                    "task.payload: has a field 'upload'; that field is the worker's \
                     (it names the file)"
                        .into(),
                );
            }
            Some(Value::Object(_)) => {}
            Some(other) => {
                return bad(format!(
                    "task.payload: expected an object (the upload is added as its 'upload' \
                     field), got {other}"
                ))
            }
        }
        let meta = Meta {
            id: Uuid::now_v7(),
            size: self.size,
            sha256,
            name: self.name,
            chunk_size,
            chunks,
            task: self.task,
            host: None,
            blackboard: None,
            layout: LAYOUT,
        };
        // The rules that need nothing from the database; the rest when the upload starts.
        // Refused (422) as a submission's are, naming the field: some (a payload holding
        // \u0000) no schema states.
        Submission::task(&meta.task_to_check(), false)
            .check_shape()
            .map_err(|r| UploadError::Unprocessable {
                field: task_field(r.field),
                message: refusal_text(&r),
            })?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uploads::Uploads;

    fn req(v: serde_json::Value) -> Result<Meta> {
        let r: CreateRequest =
            serde_json::from_value(v).map_err(|e| UploadError::Invalid(e.to_string()))?;
        r.check()
    }

    fn ok() -> serde_json::Value {
        serde_json::json!({"size": 25, "sha256": "a".repeat(64), "chunk_size": 1024,
            "task": {"kind": "echo"}})
    }

    #[test]
    fn a_good_declaration_is_chunked() {
        let mut v = ok();
        v["size"] = 2049.into();
        let m = req(v).unwrap();
        assert_eq!((m.chunks, m.chunk_size), (3, 1024));
        assert_eq!(Uploads::chunk_len(&m, 2).unwrap(), 1);
        assert!(Uploads::chunk_len(&m, 3).is_err());
    }

    #[test]
    fn the_sha256_may_be_left_for_complete() {
        let mut v = ok();
        v["sha256"] = "AB".repeat(32).into();
        assert_eq!(req(v).unwrap().sha256, Some("ab".repeat(32)));
        let mut v = ok();
        v.as_object_mut().unwrap().remove("sha256");
        assert_eq!(req(v).unwrap().sha256, None);
        let mut v = ok();
        v["sha256"] = serde_json::Value::Null;
        assert_eq!(req(v).unwrap().sha256, None);
    }

    #[test]
    fn a_declaration_of_the_first_layout_reads_as_layout_1() {
        let m = req(ok()).unwrap();
        assert_eq!(m.layout, LAYOUT);
        let mut old = serde_json::to_value(&m).unwrap();
        old.as_object_mut().unwrap().remove("layout");
        let old: Meta = serde_json::from_value(old).unwrap();
        assert_eq!(old.layout, 1);
    }

    #[test]
    fn hostile_declarations_are_refused() {
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("size", serde_json::json!(-1)),
            ("size", serde_json::json!(0)),
            ("size", serde_json::json!(u64::MAX)),
            ("chunk_size", serde_json::json!(1)),
            ("chunk_size", serde_json::json!(1u64 << 40)),
            ("sha256", serde_json::json!("xyz")),
            ("sha256", serde_json::json!(7)),
            ("name", serde_json::json!("../../etc/passwd")),
            ("name", serde_json::json!("..")),
            ("name", serde_json::json!("a\nb")),
            ("task", serde_json::json!({"kind": ""})),
            ("task", serde_json::json!({"kind": "echo", "payload": [1]})),
            (
                "task",
                serde_json::json!({"kind": "echo", "payload": {"upload": 1}}),
            ),
            ("extra", serde_json::json!(1)),
        ];
        for (field, value) in cases {
            let mut v = ok();
            v[field] = value.clone();
            assert!(req(v).is_err(), "{field} = {value} accepted");
        }
    }
}
