//! The OTLP/HTTP exporter: its configuration from the standard variables, and a blocking
//! HTTP/1.1 client on the export thread (one keep-alive connection) that posts each batch
//! as `protobuf` encodes it, into one reused buffer.
//!
//! # Limits
//! - A response's status line and each header line: [`MAX_LINE`]; its headers:
//!   [`MAX_HEADERS`]; its body: [`MAX_BODY`]. Past one, the export fails and the
//!   connection is closed.
//! - Each export (connect, send, answer) ends by the timeout
//!   (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

use super::protobuf::{encode_request, partial_success, resource_fields};

/// The longest response line read (status or header).
pub const MAX_LINE: u64 = 8 * 1024;
/// The most response headers read.
pub const MAX_HEADERS: usize = 100;
/// The largest response body read (a collector's answer is a few bytes).
pub const MAX_BODY: usize = 64 * 1024;

/// Where and how spans are sent, from the standard variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportConfig {
    /// The host to connect to (a name, or an address without brackets).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// `host:port` as the `Host` header says it (brackets kept).
    pub authority: String,
    /// The request's path (and query).
    pub path: String,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`, then the traces' own).
    pub headers: Vec<(String, String)>,
    /// An export's deadline.
    pub timeout: Duration,
}

impl ExportConfig {
    /// From the environment; `Ok(None)` when neither endpoint is set. A variable that is
    /// set but unusable is an error naming it.
    pub fn from_env() -> Result<Option<Self>, String> {
        let get = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name.to_string(), v))
        };
        let (url_var, url, path) = if let Some((n, v)) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            (n, v, None)
        } else if let Some((n, v)) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
            (n, v, Some("/v1/traces"))
        } else {
            return Ok(None);
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ] {
            if let Some((n, v)) = get(name) {
                if v.trim() != "none" {
                    return Err(format!(
                        "{n}={v:?}: artex sends traces uncompressed (\"none\")"
                    ));
                }
            }
        }
        let mut headers = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some((n, v)) = get(name) {
                for (key, value) in parse_headers(&v).map_err(|e| format!("{n}: {e}"))? {
                    headers.retain(|(k, _): &(String, String)| !k.eq_ignore_ascii_case(&key));
                    headers.push((key, value));
                }
            }
        }
        let timeout = match get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| get("OTEL_EXPORTER_OTLP_TIMEOUT"))
        {
            None => Duration::from_secs(10),
            Some((n, v)) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(format!(
                        "{n}={v:?}: expected milliseconds, a positive whole number"
                    ))
                }
            },
        };
        let (host, port, authority, given_path) =
            parse_url(url.trim()).map_err(|e| format!("{url_var}={url:?}: {e}"))?;
        let path = match path {
            Some(signal) => format!("{}{signal}", given_path.trim_end_matches('/')),
            None if given_path.is_empty() => "/".to_string(),
            None => given_path,
        };
        Ok(Some(ExportConfig {
            host,
            port,
            authority,
            path,
            headers,
            timeout,
        }))
    }
}

/// `http://host[:port][/path]` as (host, port, authority, path). `https` is refused:
/// artex is built without TLS for the exporter.
fn parse_url(url: &str) -> Result<(String, u16, String, String), String> {
    let rest = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err("https: artex is built without TLS for the exporter; \
                        use http:// to a collector on the host"
                .into())
        }
        _ => return Err("expected a URL that starts with http://".into()),
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(
            "credentials in the URL are not supported; use OTEL_EXPORTER_OTLP_HEADERS".into(),
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address without its ']'")?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None => 80,
        Some(p) => p.parse::<u16>().map_err(|_| format!("port {p:?}"))?,
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if path.chars().any(|c| c.is_ascii_control() || c == ' ') {
        return Err("a path with spaces or control characters".into());
    }
    Ok((host.to_string(), port, authority.to_string(), path))
}

/// `key=value,key2=value2` (W3C baggage's form, values percent-encoded) as pairs.
fn parse_headers(list: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not key=value"))?;
        let k = k.trim();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if k.is_empty() || !k.chars().all(token) {
            return Err(format!("{k:?} is not a header name"));
        }
        let v = percent_decode(v.trim()).ok_or_else(|| format!("{k}: a bad %-escape"))?;
        if v.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            return Err(format!("{k}: a value with a line break"));
        }
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The exporter the export thread owns.
pub struct Exporter {
    config: ExportConfig,
    /// The request head, built once (its content length follows).
    head: String,
    /// The encoded `Resource` message's fields.
    resource: Vec<u8>,
    /// The resource's schema URL.
    schema_url: String,
    /// The request body, reused.
    body: Vec<u8>,
    conn: Option<BufReader<TcpStream>>,
}

/// What one export came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The collector took every span.
    All,
    /// The collector refused this many (an OTLP partial success), saying why.
    Partly(u64, String),
}

impl Exporter {
    /// An exporter for `config`, with an empty resource until [`Exporter::set_resource`].
    pub fn new(config: ExportConfig) -> Self {
        let mut head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-protobuf\r\n",
            config.path, config.authority
        );
        for (k, v) in &config.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("content-length: ");
        Exporter {
            config,
            head,
            resource: Vec::new(),
            schema_url: String::new(),
            body: Vec::new(),
            conn: None,
        }
    }

    /// The provider's resource, sent with every batch.
    pub fn set_resource(&mut self, resource: &Resource) {
        self.resource.clear();
        resource_fields(&mut self.resource, resource);
        self.schema_url = resource.schema_url().unwrap_or_default().to_string();
    }

    /// Sends `spans` as one request; an error says what failed.
    pub fn export(&mut self, spans: &[SpanData]) -> Result<Sent, String> {
        self.body.clear();
        encode_request(&self.resource, &self.schema_url, spans, &mut self.body);
        let deadline = Instant::now() + self.config.timeout;
        let reused = self.conn.is_some();
        match self.send(deadline) {
            // The collector closed the idle connection: once more, on a new one.
            Err(Failure::Before(_)) if reused => self.send(deadline),
            other => other,
        }
        .map_err(Failure::into_message)
    }

    /// One request, on the kept connection or a new one; the connection is kept again
    /// only when the answer leaves it open (a failure drops it).
    fn send(&mut self, deadline: Instant) -> Result<Sent, Failure> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => BufReader::new(connect(&self.config, deadline).map_err(Failure::Other)?),
        };
        let head = format!("{}{}\r\n\r\n", self.head, self.body.len());
        let stream = conn.get_mut();
        let io = |e: std::io::Error| Failure::Before(format!("sending: {e}"));
        set_timeouts(stream, deadline).map_err(io)?;
        stream.write_all(head.as_bytes()).map_err(io)?;
        stream.write_all(&self.body).map_err(io)?;
        let (status, keep, body) = read_response(&mut conn, deadline)?;
        if keep {
            self.conn = Some(conn);
        }
        if !(200..300).contains(&status) {
            let said = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            return Err(Failure::Other(format!(
                "the collector answered {status}: {said}"
            )));
        }
        Ok(match partial_success(&body) {
            Some((n, why)) if n > 0 => Sent::Partly(n, why),
            _ => Sent::All,
        })
    }
}

/// Why a send failed: `Before` the collector answered anything (a closed keep-alive
/// connection looks so, and is retried once), or otherwise.
enum Failure {
    Before(String),
    Other(String),
}

impl Failure {
    fn into_message(self) -> String {
        match self {
            Failure::Before(m) | Failure::Other(m) => m,
        }
    }
}

fn remaining(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the export timeout passed",
        ));
    }
    Ok(left)
}

fn set_timeouts(s: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = remaining(deadline)?;
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

fn connect(c: &ExportConfig, deadline: Instant) -> Result<TcpStream, String> {
    let addrs = (c.host.as_str(), c.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {}: {e}", c.host))?;
    let mut last = format!("{} resolves to no address", c.host);
    for addr in addrs {
        let left = remaining(deadline).map_err(|e| e.to_string())?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = format!("connecting to {addr}: {e}"),
        }
    }
    Err(last)
}

/// One response: its status, whether the connection stays open, and its body (at most
/// [`MAX_BODY`]).
fn read_response(
    conn: &mut BufReader<TcpStream>,
    deadline: Instant,
) -> Result<(u16, bool, Vec<u8>), Failure> {
    let mut first = true;
    loop {
        let other = |e: String| Failure::Other(e);
        set_timeouts(conn.get_ref(), deadline).map_err(|e| other(e.to_string()))?;
        let line = match read_line(conn) {
            Ok(l) if l.is_empty() && first => {
                return Err(Failure::Before("the connection closed".into()))
            }
            Err(e) if first && e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(Failure::Before(format!("reading the answer: {e}")))
            }
            Ok(l) => l,
            Err(e) => return Err(other(format!("reading the answer: {e}"))),
        };
        first = false;
        let mut parts = line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .ok_or_else(|| other(format!("not an HTTP answer: {line:?}")))?;
        let mut keep = version != "HTTP/1.0";
        let (mut length, mut chunked) = (None, false);
        for n in 0.. {
            if n == MAX_HEADERS {
                return Err(other(format!("more than {MAX_HEADERS} headers")));
            }
            let h = read_line(conn).map_err(|e| other(format!("reading the headers: {e}")))?;
            if h.is_empty() {
                break;
            }
            let Some((k, v)) = h.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(
                    v.parse::<usize>()
                        .map_err(|_| other(format!("content-length {v:?}")))?,
                );
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.to_ascii_lowercase().contains("chunked");
            } else if k.eq_ignore_ascii_case("connection") {
                keep = !v.eq_ignore_ascii_case("close");
            }
        }
        if (100..200).contains(&status) {
            continue;
        }
        let body = if chunked {
            read_chunked(conn)
        } else if let Some(n) = length {
            if n > MAX_BODY {
                return Err(other(format!(
                    "an answer of {n} bytes (at most {MAX_BODY})"
                )));
            }
            let mut b = vec![0; n];
            conn.read_exact(&mut b).map(|_| b)
        } else {
            keep = false;
            let mut b = Vec::new();
            conn.by_ref()
                .take(MAX_BODY as u64)
                .read_to_end(&mut b)
                .map(|_| b)
        }
        .map_err(|e| other(format!("reading the answer's body: {e}")))?;
        return Ok((status, keep, body));
    }
}

/// A line without its CRLF; empty at the end of the headers or of the stream.
fn read_line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    r.by_ref().take(MAX_LINE).read_line(&mut line)?;
    if !line.is_empty() && !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {MAX_LINE} bytes, or cut short"),
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(size, 16).map_err(|_| bad(format!("chunk size {size:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(r)?.is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(bad(format!("an answer over {MAX_BODY} bytes")));
        }
        let at = body.len();
        body.resize(at + size, 0);
        r.read_exact(&mut body[at..])?;
        read_line(r)?;
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Duration;

    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    use super::super::testing::{collector, resource, spans};
    use super::*;

    #[test]
    fn endpoints_headers_and_timeouts_come_from_the_standard_variables() {
        for v in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ] {
            std::env::remove_var(v);
        }
        assert_eq!(ExportConfig::from_env(), Ok(None));
        // Where a configuration sends: host, port, `Host` header, path.
        let target = |c: ExportConfig| (c.host, c.port, c.authority, c.path);
        let strings = |h: &str, p: u16, a: &str, path: &str| {
            (h.to_string(), p, a.to_string(), path.to_string())
        };
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/");
        let c = ExportConfig::from_env().unwrap().unwrap();
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(
            target(c),
            strings("collector", 4318, "collector:4318", "/v1/traces")
        );
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1]/base");
        assert_eq!(
            target(ExportConfig::from_env().unwrap().unwrap()),
            strings("::1", 80, "[::1]", "/base/v1/traces")
        );
        // The traces' own endpoint is used as it is, and wins.
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4000",
        );
        assert_eq!(ExportConfig::from_env().unwrap().unwrap().path, "/");
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4000/t?x=1",
        );
        assert_eq!(ExportConfig::from_env().unwrap().unwrap().path, "/t?x=1");
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20abc, x-tenant = blue",
        );
        std::env::set_var("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=green");
        std::env::set_var("OTEL_EXPORTER_OTLP_TIMEOUT", "2000");
        std::env::set_var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250");
        let c = ExportConfig::from_env().unwrap().unwrap();
        assert_eq!(
            c.headers,
            vec![
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("X-Tenant".to_string(), "green".to_string())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(250));
        std::env::set_var("OTEL_EXPORTER_OTLP_COMPRESSION", "none");
        assert!(ExportConfig::from_env().is_ok());
        // Each unusable value is refused, naming its variable and the value.
        for (var, value, said) in [
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", "uncompressed"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "milliseconds"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "novalue", "key=value"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a b=c", "header name"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "a=%0d%0a",
                "line break",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=%zz", "%-escape"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://c:4318",
                "TLS",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "collector:4318",
                "http://",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:port",
                "port",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://u:p@c",
                "credentials",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://:4318",
                "no host",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://[::1:4318",
                "']'",
            ),
        ] {
            let kept = std::env::var(var).ok();
            std::env::set_var(var, value);
            let e = ExportConfig::from_env().unwrap_err();
            assert!(e.contains(var) && e.contains(said), "{var}={value}: {e}");
            match kept {
                Some(k) => std::env::set_var(var, k),
                None => std::env::remove_var(var),
            }
        }
    }

    #[test]
    fn the_client_keeps_its_connection_reconnects_once_and_says_what_failed() {
        // partial_success { rejected_spans: 2, error_message: "no" }
        let partial = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                       3\r\n\x0a\x06\x08\r\n5\r\n\x02\x12\x02no\r\n0\r\n\r\n";
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        let busy = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
        let (config, got) = collector(vec![
            Some(ok),
            Some(partial),
            None,
            Some("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            Some(busy),
        ]);
        let mut e = Exporter::new(config);
        e.set_resource(&resource());
        let spans = spans();
        assert_eq!(e.export(&spans[..1]), Ok(Sent::All));
        let (head, body) = got.recv().unwrap();
        assert!(head.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf\r\n"),
            "{head}"
        );
        assert!(head.contains("authorization: Bearer abc\r\n"), "{head}");
        let req = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        assert_eq!(req.resource_spans[0].scope_spans[0].spans.len(), 1);
        assert_eq!(e.export(&spans), Ok(Sent::Partly(2, "no".into())));
        got.recv().unwrap();
        // The collector closes the kept connection without answering: the same batch goes
        // again, once, on a new one (answered 100 then 200).
        assert_eq!(e.export(&spans[..2]), Ok(Sent::All));
        assert_eq!(got.recv().unwrap().1, got.recv().unwrap().1);
        let err = e.export(&spans[..1]).unwrap_err();
        assert!(err.contains("503") && err.contains("busy"), "{err}");
        got.recv().unwrap();
        // No answer at all: the timeout ends the export.
        let started = Instant::now();
        let err = e.export(&spans[..1]).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        assert!(err.contains("reading the answer"), "{err}");
    }

    #[test]
    fn a_collector_that_is_not_there_is_an_error_naming_it() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut e = Exporter::new(ExportConfig {
            host: "127.0.0.1".into(),
            port,
            authority: format!("127.0.0.1:{port}"),
            path: "/".into(),
            headers: vec![],
            timeout: Duration::from_secs(1),
        });
        let err = e.export(&spans()[..1]).unwrap_err();
        assert!(
            err.contains(&format!("connecting to 127.0.0.1:{port}")),
            "{err}"
        );
    }
}
