//! The OTLP trace export's protobuf, written straight from the SDK's span data (fields
//! in the schema's order: opentelemetry/proto/collector/trace/v1/trace_service.proto and
//! trace/v1/trace.proto), and the little of the collector's answer that is read back.

use std::time::UNIX_EPOCH;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

/// An `ExportTraceServiceResponse`'s partial success: spans refused and why.
pub fn partial_success(body: &[u8]) -> Option<(u64, String)> {
    let inner = fields(body).find_map(|(f, v)| match (f, v) {
        (1, Field::Bytes(b)) => Some(b),
        _ => None,
    })?;
    let (mut n, mut why) = (0, String::new());
    for (f, v) in fields(inner) {
        match (f, v) {
            (1, Field::Varint(r)) => n = r,
            (2, Field::Bytes(b)) => why = String::from_utf8_lossy(b).into_owned(),
            _ => {}
        }
    }
    Some((n, why))
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// A message's fields, up to the first that does not decode.
fn fields(mut b: &[u8]) -> impl Iterator<Item = (u64, Field<'_>)> {
    std::iter::from_fn(move || {
        let key = read_varint(&mut b)?;
        let field = match key & 7 {
            0 => Field::Varint(read_varint(&mut b)?),
            2 => {
                let n = usize::try_from(read_varint(&mut b)?).ok()?;
                let (v, rest) = (b.get(..n)?, b.get(n..)?);
                b = rest;
                Field::Bytes(v)
            }
            1 => {
                b = b.get(8..)?;
                Field::Fixed
            }
            5 => {
                b = b.get(4..)?;
                Field::Fixed
            }
            _ => return None,
        };
        Some((key >> 3, field))
    })
}

fn read_varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

// The protobuf writer: wire types, and fields written in the schema's order.
// opentelemetry/proto/collector/trace/v1/trace_service.proto and trace/v1/trace.proto.

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A text field, left out when empty (proto3's default).
fn text(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        bytes(out, field, s.as_bytes());
    }
}

fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        key(out, field, VARINT);
        varint(out, v);
    }
}

/// A nested message: its length is known once `body` wrote it, so one byte is kept
/// for it and widened when the message is 128 bytes or more.
fn nested(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    key(out, field, LEN);
    let at = out.len();
    out.push(0);
    body(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = Vec::with_capacity(10);
        varint(&mut prefix, len as u64);
        out.splice(at..at + 1, prefix);
    }
}

fn nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `AnyValue`: oneof string 1, bool 2, int 3, double 4, array 5.
fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::String(s) => bytes(out, 1, s.as_str().as_bytes()),
        Value::Bool(b) => {
            key(out, 2, VARINT);
            varint(out, u64::from(*b));
        }
        Value::I64(i) => {
            key(out, 3, VARINT);
            varint(out, *i as u64);
        }
        Value::F64(f) => {
            key(out, 4, FIXED64);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Value::Array(a) => nested(out, 5, |out| match a {
            Array::Bool(v) => v
                .iter()
                .for_each(|b| nested(out, 1, |out| any_value(out, &Value::Bool(*b)))),
            Array::I64(v) => v
                .iter()
                .for_each(|i| nested(out, 1, |out| any_value(out, &Value::I64(*i)))),
            Array::F64(v) => v
                .iter()
                .for_each(|f| nested(out, 1, |out| any_value(out, &Value::F64(*f)))),
            Array::String(v) => v
                .iter()
                .for_each(|s| nested(out, 1, |out| bytes(out, 1, s.as_str().as_bytes()))),
            // A kind of array this version does not know: its text.
            other => nested(out, 1, |out| bytes(out, 1, other.to_string().as_bytes())),
        }),
        other => bytes(out, 1, other.as_str().as_bytes()),
    }
}

/// A `Resource` message's fields: its attributes.
pub fn resource_fields(out: &mut Vec<u8>, r: &Resource) {
    for (k, v) in r.iter() {
        key_value(out, 1, k.as_str(), v);
    }
}

/// `KeyValue` as field `field` of its message: key 1, value 2.
fn key_value(out: &mut Vec<u8>, field: u32, k: &str, v: &Value) {
    nested(out, field, |out| {
        text(out, 1, k);
        nested(out, 2, |out| any_value(out, v));
    });
}

fn attributes(out: &mut Vec<u8>, field: u32, kvs: &[KeyValue]) {
    for kv in kvs {
        key_value(out, field, kv.key.as_str(), &kv.value);
    }
}

/// `Span.flags`: the W3C flags, and whether the parent is remote (known, bit 8; remote,
/// bit 9), as the SDK's own exporter sets them.
fn flags(trace_flags: u8, parent_is_remote: bool) -> u32 {
    u32::from(trace_flags) | 0x100 | if parent_is_remote { 0x200 } else { 0 }
}

fn span(out: &mut Vec<u8>, s: &SpanData) {
    let sc = &s.span_context;
    bytes(out, 1, &sc.trace_id().to_bytes());
    bytes(out, 2, &sc.span_id().to_bytes());
    text(out, 3, &sc.trace_state().header());
    if s.parent_span_id != SpanId::INVALID {
        bytes(out, 4, &s.parent_span_id.to_bytes());
    }
    text(out, 5, &s.name);
    let kind = match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    uint(out, 6, kind);
    key(out, 7, FIXED64);
    out.extend_from_slice(&nanos(s.start_time).to_le_bytes());
    key(out, 8, FIXED64);
    out.extend_from_slice(&nanos(s.end_time).to_le_bytes());
    attributes(out, 9, &s.attributes);
    uint(out, 10, s.dropped_attributes_count.into());
    for e in s.events.iter() {
        nested(out, 11, |out| {
            key(out, 1, FIXED64);
            out.extend_from_slice(&nanos(e.timestamp).to_le_bytes());
            text(out, 2, &e.name);
            attributes(out, 3, &e.attributes);
            uint(out, 4, e.dropped_attributes_count.into());
        });
    }
    uint(out, 12, s.events.dropped_count.into());
    for l in s.links.iter() {
        nested(out, 13, |out| {
            let lc = &l.span_context;
            bytes(out, 1, &lc.trace_id().to_bytes());
            bytes(out, 2, &lc.span_id().to_bytes());
            text(out, 3, &lc.trace_state().header());
            attributes(out, 4, &l.attributes);
            uint(out, 5, l.dropped_attributes_count.into());
            key(out, 6, FIXED32);
            out.extend_from_slice(&flags(lc.trace_flags().to_u8(), lc.is_remote()).to_le_bytes());
        });
    }
    uint(out, 14, s.links.dropped_count.into());
    // `Status`: message 2, code 3 (unset 0, ok 1, error 2); written even when unset, as
    // the SDK's exporter does.
    match &s.status {
        Status::Unset => nested(out, 15, |_| {}),
        Status::Ok => nested(out, 15, |out| uint(out, 3, 1)),
        Status::Error { description } => nested(out, 15, |out| {
            text(out, 2, description);
            uint(out, 3, 2);
        }),
    }
    key(out, 16, FIXED32);
    out.extend_from_slice(&flags(sc.trace_flags().to_u8(), s.parent_span_is_remote).to_le_bytes());
}

fn scope(out: &mut Vec<u8>, s: &InstrumentationScope) {
    text(out, 1, s.name());
    text(out, 2, s.version().unwrap_or_default());
    for kv in s.attributes() {
        key_value(out, 3, kv.key.as_str(), &kv.value);
    }
}

/// The `ExportTraceServiceRequest` of `spans`: one `ResourceSpans` (the process's
/// `resource`, already encoded) holding a `ScopeSpans` per instrumentation scope.
pub fn encode_request(resource: &[u8], schema_url: &str, spans: &[SpanData], out: &mut Vec<u8>) {
    let mut scopes: Vec<&InstrumentationScope> = Vec::new();
    for s in spans {
        if !scopes.contains(&&s.instrumentation_scope) {
            scopes.push(&s.instrumentation_scope);
        }
    }
    nested(out, 1, |out| {
        nested(out, 1, |out| out.extend_from_slice(resource));
        for sc in scopes {
            nested(out, 2, |out| {
                nested(out, 1, |out| scope(out, sc));
                for s in spans.iter().filter(|s| &s.instrumentation_scope == sc) {
                    nested(out, 2, |out| span(out, s));
                }
                text(out, 3, sc.schema_url().unwrap_or_default());
            });
        }
        text(out, 3, schema_url);
    });
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message;

    use super::super::testing::{resource, spans};
    use super::*;

    #[test]
    fn a_batch_decodes_as_the_sdk_s_own_exporter_builds_it() {
        let (resource, spans) = (resource(), spans());
        let mut fields = Vec::new();
        resource_fields(&mut fields, &resource);
        let mut ours = Vec::new();
        let schema_url = resource.schema_url().unwrap_or_default();
        encode_request(&fields, schema_url, &spans, &mut ours);
        let decoded = ExportTraceServiceRequest::decode(&ours[..]).expect("our protobuf decodes");
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(decoded, theirs);
        // And byte for byte what prost writes of it: the same fields, in the same order.
        assert_eq!(ours, theirs.encode_to_vec());
    }

    #[test]
    fn lengths_of_every_width_are_written_in_their_shortest_form() {
        for len in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_152] {
            let mut out = Vec::new();
            nested(&mut out, 1, |out| out.resize(out.len() + len, 7));
            let mut b = &out[1..];
            assert_eq!(read_varint(&mut b), Some(len as u64));
            assert_eq!(b.len(), len, "{len}");
            let mut canonical = Vec::new();
            varint(&mut canonical, len as u64);
            assert_eq!(&out[1..1 + canonical.len()], &canonical[..], "{len}");
        }
    }
}
