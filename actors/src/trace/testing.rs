//! What the trace modules' tests share: spans of every shape, a resource, and a
//! collector on 127.0.0.1 that answers as it is told.

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;

use super::otlp::ExportConfig;

fn context(trace: u128, span: u64, remote: bool) -> SpanContext {
    let state = TraceState::from_key_value([("vendor", "v1")]).unwrap();
    SpanContext::new(
        TraceId::from(trace),
        SpanId::from(span),
        TraceFlags::SAMPLED,
        remote,
        state,
    )
}

/// Every kind of value, events, links, each status, a remote parent, a root, a second
/// scope, and a span over 16 KiB (lengths of three bytes).
pub fn spans() -> Vec<SpanData> {
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_000 + s);
    let values = vec![
        KeyValue::new("s", "text"),
        KeyValue::new("b", false),
        KeyValue::new("i", -42i64),
        KeyValue::new("f", 2.5f64),
        KeyValue::new("bs", Value::Array(Array::Bool(vec![true, false]))),
        KeyValue::new("is", Value::Array(Array::I64(vec![1, -1, i64::MAX]))),
        KeyValue::new("fs", Value::Array(Array::F64(vec![0.5, -0.0]))),
        KeyValue::new(
            "ss",
            Value::Array(Array::String(vec![
                StringValue::from("a"),
                StringValue::from(""),
            ])),
        ),
        KeyValue::new("empty", ""),
    ];
    let artex = InstrumentationScope::builder("artex").build();
    let other = InstrumentationScope::builder("other")
        .with_version("1.2")
        .with_schema_url("https://example.com/schema")
        .with_attributes([KeyValue::new("scoped", 1i64)])
        .build();
    let base = SpanData {
        span_context: context(1, 2, false),
        parent_span_id: SpanId::from(3),
        parent_span_is_remote: true,
        span_kind: SpanKind::Consumer,
        name: Cow::Borrowed("artex.queue"),
        start_time: at(0),
        end_time: at(1_500),
        attributes: values.clone(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: artex.clone(),
    };
    let mut events = SpanEvents::default();
    events
        .events
        .push(Event::new("ev", at(7), values.clone(), 1));
    events.dropped_count = 2;
    let mut links = SpanLinks::default();
    links
        .links
        .push(Link::new(context(9, 8, true), values.clone(), 3));
    links.dropped_count = 4;
    vec![
        base.clone(),
        SpanData {
            span_context: context(u128::MAX, u64::MAX, false),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Owned("root".into()),
            dropped_attributes_count: 5,
            events,
            links,
            status: Status::error("it broke"),
            instrumentation_scope: other,
            ..base.clone()
        },
        SpanData {
            span_kind: SpanKind::Internal,
            status: Status::Ok,
            attributes: vec![KeyValue::new("big", "x".repeat(20_000))],
            ..base.clone()
        },
        SpanData {
            span_kind: SpanKind::Producer,
            ..base.clone()
        },
        SpanData {
            span_kind: SpanKind::Client,
            ..base
        },
    ]
}

pub fn resource() -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "artex"),
            KeyValue::new("artex.role", "worker"),
            KeyValue::new("process.pid", 4242i64),
        ])
        .with_schema_url([], "https://example.com/resource")
        .build()
}

/// A collector on 127.0.0.1 that answers each request in turn with the next of
/// `answers` (`None`: close the connection instead), and passes back what it got.
pub fn collector(
    answers: Vec<Option<&'static str>>,
) -> (ExportConfig, std::sync::mpsc::Receiver<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut answers = answers.into_iter();
        for stream in listener.incoming() {
            let stream = stream.unwrap();
            let mut out = stream.try_clone().unwrap();
            let mut r = BufReader::new(stream);
            loop {
                let mut head = String::new();
                loop {
                    let mut l = String::new();
                    if r.read_line(&mut l).unwrap_or(0) == 0 {
                        break;
                    }
                    head.push_str(&l);
                    if l == "\r\n" {
                        break;
                    }
                }
                if head.is_empty() {
                    break;
                }
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut body = vec![0; length];
                r.read_exact(&mut body).unwrap();
                tx.send((head, body)).unwrap();
                match answers.next() {
                    Some(Some(a)) => out.write_all(a.as_bytes()).unwrap(),
                    Some(None) => break,
                    // Out of answers: never answer (the exporter's timeout ends it).
                    None => std::thread::sleep(Duration::from_secs(60)),
                }
            }
        }
    });
    let config = ExportConfig {
        host: "127.0.0.1".into(),
        port,
        authority: format!("127.0.0.1:{port}"),
        path: "/v1/traces".into(),
        headers: vec![("authorization".into(), "Bearer abc".into())],
        timeout: Duration::from_millis(500),
    };
    (config, rx)
}
