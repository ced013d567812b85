//! The tests' one HTTP/1.1 client, over `std::net` (blocking: call it from a thread or
//! `spawn_blocking` inside async tests). Requests say `Connection: close` (but for
//! [`Request::keep_alive`]), so an answer is read to the server's close; an event stream
//! (it never closes) stops after its head. Beyond a plain request: any header, a bearer
//! token, a JSON or raw body, a body sent in parts or never finished
//! ([`Request::length`], [`Exchange::write`]), an event stream read line by line
//! ([`Exchange::head`], [`Exchange::read_line`]), and how the answer ended ([`Ended`]).
//!
//! Raw sockets stay only where they are not a client: the fault proxy ([`crate::proxy`])
//! and the fake server of `tests/uploads/client.rs`. curl stays where the request must
//! come from another network namespace (`tests/common/fleet.rs`), from processes of its
//! own (the load loops of `tests/upgrade/under_load.rs`), or where curl is what is
//! tested: operators upgrade with `curl -T` and `curl -F` (`tests/upgrade/main.rs`,
//! `tests/upgrade/hostile.rs`).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// How long a read may wait unless the request says otherwise.
const TIMEOUT: Duration = Duration::from_secs(20);

/// A request to build and send: `Request::new("POST", "/x").bearer(t).json(&v).send(addr)`.
#[derive(Clone, Debug)]
pub struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    /// `Content-Length` declared without a body: the caller writes it in parts.
    length: Option<usize>,
    timeout: Duration,
    close: bool,
}

/// An answer: protocol and status (`""` and 0 when the server closed without one),
/// headers, body (chunked encoding undone), and how reading it ended.
pub struct Response {
    /// As the status line names it: `HTTP/1.1`.
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub ended: Ended,
}

/// Why reading an answer stopped.
#[derive(Debug)]
pub enum Ended {
    /// The server closed the connection.
    Closed,
    /// The head says `text/event-stream`: the body (which never ends) was not read.
    EventStream,
    /// A read failed (a timeout, a reset) after part of the answer had come.
    Failed(io::Error),
}

/// A status line and headers, read before the body.
#[derive(Debug)]
pub struct Head {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

/// One request on its own connection, under way: its head sent, its body (if it was
/// given whole) too.
pub struct Exchange {
    reader: BufReader<TcpStream>,
}

impl Request {
    /// `method path`, with `Host` and `Connection: close` (see [`Request::keep_alive`])
    /// and nothing else yet.
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            body: None,
            length: None,
            timeout: TIMEOUT,
            close: true,
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `Authorization: Bearer <token>`; no header for `None`.
    pub fn bearer<'t>(self, token: impl Into<Option<&'t str>>) -> Request {
        match token.into() {
            Some(t) => self.header("Authorization", &format!("Bearer {t}")),
            None => self,
        }
    }

    /// The body, sent whole with its `Content-Length` (also when empty).
    pub fn body(mut self, bytes: impl Into<Vec<u8>>) -> Request {
        self.body = Some(bytes.into());
        self
    }

    /// A JSON body given as text (it may be invalid: that is for the server to say).
    pub fn json_text(self, text: &str) -> Request {
        self.header("Content-Type", "application/json").body(text)
    }

    /// A JSON body.
    pub fn json(self, value: &Value) -> Request {
        self.json_text(&value.to_string())
    }

    /// Declares a body of `length` bytes and sends none: the caller writes it, in parts
    /// or not at all, through [`Exchange::write`].
    pub fn length(mut self, length: usize) -> Request {
        self.length = Some(length);
        self
    }

    /// How long each read of the answer may wait (default 20 s).
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = timeout;
        self
    }

    /// Leaves `Connection: close` out, for a test that the server closes the connection
    /// of its own accord (reading the answer still waits for the close).
    pub fn keep_alive(mut self) -> Request {
        self.close = false;
        self
    }

    /// Connects, sends the request and reads the answer. `Err` when the connection or
    /// the head could not be made or no byte of an answer came before a read failed.
    /// A body the server does not read to its end (it answered first, e.g. 413) is no
    /// error: the answer says what happened.
    pub fn send(&self, addr: &str) -> io::Result<Response> {
        self.start(addr)?.response()
    }

    /// Connects and sends the head, and the body if it was given whole (a failure to
    /// write it is ignored, as in [`Request::send`]).
    pub fn start(&self, addr: &str) -> io::Result<Exchange> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(self.timeout))?;
        let mut head = format!("{} {} HTTP/1.1\r\nHost: {addr}\r\n", self.method, self.path);
        if self.close {
            head.push_str("Connection: close\r\n");
        }
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(n) = self.body.as_ref().map(Vec::len).or(self.length) {
            head.push_str(&format!("Content-Length: {n}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        if let Some(b) = &self.body {
            let _ = s.write_all(b);
        }
        Ok(Exchange {
            reader: BufReader::new(s),
        })
    }
}

impl Exchange {
    /// Writes part of a body declared with [`Request::length`].
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let s = self.reader.get_mut();
        s.write_all(bytes)?;
        s.flush()
    }

    /// Changes how long each read may wait from now on.
    pub fn set_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(Some(timeout))
    }

    /// Reads the status line and headers (status 0 and none if the server closed first);
    /// what follows is the body, for [`Exchange::read_line`] or [`Exchange::read_body`].
    pub fn head(&mut self) -> io::Result<Head> {
        self.read_head().map(|(head, _)| head)
    }

    /// The head, and whether any byte of it came (errors after the first byte are
    /// answers cut short, not failures to answer).
    fn read_head(&mut self) -> io::Result<(Head, Option<io::Error>)> {
        let mut head = Head {
            version: String::new(),
            status: 0,
            headers: Vec::new(),
        };
        let mut first = true;
        loop {
            let mut raw = Vec::new();
            match self.reader.read_until(b'\n', &mut raw) {
                Ok(0) => return Ok((head, None)),
                Ok(_) => {}
                Err(e) if first && raw.is_empty() => return Err(e),
                Err(e) => return Ok((head, Some(e))),
            }
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches(['\r', '\n']);
            if first {
                first = false;
                let mut words = line.split_whitespace();
                head.version = words.next().unwrap_or("").to_string();
                head.status = words.next().and_then(|c| c.parse().ok()).unwrap_or(0);
            } else if line.is_empty() {
                return Ok((head, None));
            } else if let Some((k, v)) = line.split_once(':') {
                head.headers
                    .push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }

    /// One line of the body as it comes (an event stream's, chunk-size lines included);
    /// 0 at its end.
    pub fn read_line(&mut self, line: &mut String) -> io::Result<usize> {
        self.reader.read_line(line)
    }

    /// The rest of the body, to the server's close (chunked encoding not undone).
    pub fn read_body(&mut self) -> (Vec<u8>, Ended) {
        let mut body = Vec::new();
        let ended = match self.reader.read_to_end(&mut body) {
            Ok(_) => Ended::Closed,
            Err(e) => Ended::Failed(e),
        };
        (body, ended)
    }

    /// The whole answer (see [`Request::send`]). The connection stays open (as far as
    /// this side goes) until the exchange is dropped.
    pub fn response(&mut self) -> io::Result<Response> {
        let (head, cut) = self.read_head()?;
        let mut r = Response {
            version: head.version,
            status: head.status,
            headers: head.headers,
            body: Vec::new(),
            ended: Ended::Closed,
        };
        if let Some(e) = cut {
            r.ended = Ended::Failed(e);
            return Ok(r);
        }
        if r.is_event_stream() {
            r.ended = Ended::EventStream;
            return Ok(r);
        }
        let (body, ended) = self.read_body();
        r.body = if r
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
        {
            dechunk(&body)
        } else {
            body
        };
        r.ended = ended;
        Ok(r)
    }
}

impl Head {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

impl Response {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics (with the answer) if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text()))
    }

    /// The body as JSON, or `Null` if it is not.
    pub fn json_or_null(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Asserts an artex JSON error (`{"error": …, "field": …}`) with `status`, naming
    /// `field`; returns its message.
    pub fn error(&self, status: u16, field: Option<&str>) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        assert!(
            self.header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "{self:?}"
        );
        let v = self.json();
        // The Error schema requires `field`, null when no field is at fault.
        assert!(v.get("field").is_some(), "no `field`: {}", self.text());
        assert_eq!(v["field"].as_str(), field, "{}", self.text());
        v["error"].as_str().expect("an error message").to_string()
    }

    /// The answer, unless reading it failed midway.
    pub fn complete(self) -> io::Result<Response> {
        match self.ended {
            Ended::Failed(e) => Err(e),
            _ => Ok(self),
        }
    }

    fn is_event_stream(&self) -> bool {
        self.header("content-type")
            .is_some_and(|t| t.to_ascii_lowercase().contains("text/event-stream"))
    }
}

impl std::fmt::Debug for Response {
    /// The body as text: what a failed assertion should show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("version", &self.version)
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.text())
            .field("ended", &self.ended)
            .finish()
    }
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A chunked HTTP body, decoded (up to the last whole chunk).
pub fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = s.windows(2).position(|w| w == b"\r\n") {
        let len = String::from_utf8_lossy(&s[..eol]);
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        let rest = &s[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        s = &rest[n..];
        while let Some(r) = s.strip_prefix(b"\r\n") {
            s = r;
        }
    }
    out
}
