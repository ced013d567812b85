//! A real OTLP/HTTP receiver (protobuf), inside the test: bound to 127.0.0.1 port 0, it
//! decodes every export artex sends and keeps the spans, with their resource's role.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use prost::Message;

/// One span as received.
#[derive(Debug, Clone)]
pub struct Got {
    pub trace: String,
    pub span: String,
    /// Empty for a root span.
    pub parent: String,
    pub name: String,
    /// The `artex.role` of the process that sent it.
    pub role: String,
    /// Its process's pid.
    pub pid: String,
    pub attrs: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Got {
    pub fn attr(&self, name: &str) -> &str {
        self.attrs.get(name).map(String::as_str).unwrap_or("")
    }
}

/// The environment that makes an artex process export its spans to `url`, a batch every
/// 50 ms.
pub fn exporting_to(url: &str) -> [(&'static str, &str); 2] {
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ]
}

/// The receiver; it serves until the test ends.
pub struct Receiver {
    pub url: String,
    spans: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Receiver { url, spans }
    }

    pub fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }
}

fn text(kv: &[KeyValue]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// Requests on one connection (keep-alive) until it closes; each answered 200.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Got>>) {
    let mut out = stream.try_clone().expect("clone the stream");
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().expect("a content length");
                }
            }
        }
        let mut body = vec![0; length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        assert!(line.starts_with("POST /v1/traces "), "{line}");
        let req = ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP trace export");
        let mut got = Vec::new();
        for rs in req.resource_spans {
            let res = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        trace: hex::encode(&s.trace_id),
                        span: hex::encode(&s.span_id),
                        parent: hex::encode(&s.parent_span_id),
                        name: s.name,
                        role: res.get("artex.role").cloned().unwrap_or_default(),
                        pid: res.get("process.pid").cloned().unwrap_or_default(),
                        attrs: text(&s.attributes),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                    });
                }
            }
        }
        kept.lock().unwrap().extend(got);
        let ok =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if out.write_all(ok.as_bytes()).is_err() {
            return;
        }
    }
}
