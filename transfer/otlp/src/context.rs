//! W3C trace context (<https://www.w3.org/TR/trace-context/>): a span's place in a trace,
//! read from and written as a `traceparent` header value.

use std::fmt;

/// A span's identity in a trace: what a `traceparent` carries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace's id (never all zeros).
    pub trace_id: [u8; 16],
    /// The span's id (never all zeros).
    pub span_id: [u8; 8],
    /// Whether the trace is recorded (the `sampled` flag).
    pub sampled: bool,
}

impl fmt::Debug for SpanContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.traceparent().as_str())
    }
}

impl SpanContext {
    /// A new sampled trace's root: random ids.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero(rand::random::<u128>()).to_be_bytes(),
            span_id: new_span_id(),
            sampled: true,
        }
    }

    /// A new span of this one's trace.
    pub fn child(&self) -> Self {
        Self {
            span_id: new_span_id(),
            ..*self
        }
    }

    /// Parses a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`). `None` for anything
    /// else: a wrong length or separator, upper-case or non-hex digits, an all-zero id,
    /// version `ff`. A later version is read by its first four fields, as the
    /// specification asks, when a `-` follows them.
    pub fn parse(value: &[u8]) -> Option<Self> {
        if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff || (version == 0 && value.len() != 55) {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// This context as a `traceparent` value (version 00).
    pub fn traceparent(&self) -> TraceParent {
        let mut out = [b'-'; 55];
        out[0] = b'0';
        out[1] = b'0';
        write_hex(&self.trace_id, &mut out[3..35]);
        write_hex(&self.span_id, &mut out[36..52]);
        write_hex(&[u8::from(self.sampled)], &mut out[53..55]);
        TraceParent(out)
    }
}

/// A `traceparent` value, written without allocating.
#[derive(Clone, Copy)]
pub struct TraceParent([u8; 55]);

impl TraceParent {
    /// The value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits and dashes are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn new_span_id() -> [u8; 8] {
    nonzero(rand::random::<u64>()).to_be_bytes()
}

fn nonzero<T: Default + PartialEq + From<u8>>(v: T) -> T {
    if v == T::default() { T::from(1) } else { v }
}

/// Lower-case hex only, as the specification writes it.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

fn write_hex(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let cx = SpanContext::parse(GOOD.as_bytes()).unwrap();
        assert!(cx.sampled);
        assert_eq!(cx.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(cx.traceparent().as_str(), GOOD);
        let unsampled = GOOD.replace("-01", "-00");
        let cx = SpanContext::parse(unsampled.as_bytes()).unwrap();
        assert!(!cx.sampled);
        assert_eq!(cx.traceparent().as_str(), unsampled);
        let child = cx.child();
        assert_eq!(child.trace_id, cx.trace_id);
        assert_ne!(child.span_id, cx.span_id);
        let root = SpanContext::new_root();
        assert_eq!(
            SpanContext::parse(root.traceparent().as_bytes()),
            Some(root)
        );
    }

    #[test]
    fn malformed_values_are_refused() {
        let zero_trace = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            &zero_trace,
            zero_span,
        ] {
            assert_eq!(SpanContext::parse(bad.as_bytes()), None, "{bad}");
        }
        // A later version with more fields is read by the first four.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever";
        assert!(SpanContext::parse(later.as_bytes()).is_some());
    }
}
