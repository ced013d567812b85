//! The W3C `traceparent` (https://www.w3.org/TR/trace-context/#traceparent-header) as
//! artex takes it from a submitter and stores it with a task: parsed and checked here,
//! pure, so every surface (API header, CLI flag, library, `artex.submit`'s own check)
//! refuses the same values with the same words.

use std::fmt;

/// What a traceparent must look like, for messages.
pub const TRACEPARENT_FORMAT: &str = "a W3C traceparent: version-traceid-spanid-flags in \
     lowercase hex (00-<32 hex>-<16 hex>-<2 hex>), ids not all zero, version not ff";

/// A parsed W3C trace context: the trace, the parent span in it, and the flags (bit 0:
/// sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The header's version (00 today).
    pub version: u8,
    /// The trace's id.
    pub trace_id: [u8; 16],
    /// The parent span's id.
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 says the parent was sampled.
    pub flags: u8,
}

impl TraceParent {
    /// Parses `text`, or says what is wrong with it (without naming the field, which the
    /// surface puts before it).
    ///
    /// ```
    /// use artex_actors::trace::TraceParent;
    /// let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    /// assert!(tp.sampled());
    /// assert_eq!(tp.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// assert!(TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            // Debug formatting keeps a newline or a quote in the value on one line; a
            // long value is cut, it is nothing like a traceparent anyway.
            let shown: String = text.chars().take(80).collect();
            Err(format!("{shown:?} is not {TRACEPARENT_FORMAT}: {why}"))
        };
        let parts: Vec<&str> = text.split('-').collect();
        let [version, trace, span, flags] = parts[..] else {
            return bad("expected four parts separated by '-'");
        };
        let lower_hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        for (part, len, name) in [
            (version, 2, "version"),
            (trace, 32, "trace id"),
            (span, 16, "span id"),
            (flags, 2, "flags"),
        ] {
            if part.len() != len || !lower_hex(part) {
                return bad(&format!("the {name} must be {len} lowercase hex digits"));
            }
        }
        if version == "ff" {
            return bad("version ff is invalid");
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        // Both were checked to be hex of the right length just above.
        hex::decode_to_slice(trace, &mut trace_id).map_err(|e| e.to_string())?;
        hex::decode_to_slice(span, &mut span_id).map_err(|e| e.to_string())?;
        if trace_id == [0; 16] {
            return bad("the trace id is all zero");
        }
        if span_id == [0; 8] {
            return bad("the span id is all zero");
        }
        let byte = |s: &str| u8::from_str_radix(s, 16).map_err(|e| e.to_string());
        Ok(TraceParent {
            version: byte(version)?,
            trace_id,
            span_id,
            flags: byte(flags)?,
        })
    }

    /// Whether the parent was sampled (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// The header's text, as stored and as handed to programs (`TRACEPARENT`).
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02x}-{}-{}-{:02x}",
            self.version,
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_good_traceparent_round_trips() {
        let tp = TraceParent::parse(GOOD).unwrap();
        assert_eq!(tp.to_string(), GOOD);
        assert_eq!(tp.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(tp.sampled());
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn bad_traceparents_are_refused_saying_why() {
        let cases = [
            ("", "four parts"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "four parts",
            ),
            (&GOOD.to_uppercase(), "trace id must be"),
            (
                "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version must be",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace id must be",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "trace id must be",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
                "span id must be",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "flags must be",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version ff",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id is all zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "span id is all zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                "four parts",
            ),
        ];
        for (text, why) in cases {
            let e = TraceParent::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
            assert!(e.contains("W3C traceparent"), "{text:?}: {e}");
        }
    }
}
