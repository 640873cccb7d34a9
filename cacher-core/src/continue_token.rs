//! Continue tokens for paginated lists.
//!
//! Kubernetes counterpart: `storage/continue.go` (`EncodeContinue`, `DecodeContinue`): base64
//! (URL alphabet, no padding) of `{"v":"meta.k8s.io/v1","rv":N,"start":"<key after prefix>"}`,
//! with the start key cleaned so a client cannot range above the list's prefix.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::status::Status;

/// A decoded continue token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContinueToken {
    /// The full key to continue from (inclusive).
    pub start_key: Vec<u8>,
    /// The resourceVersion of the first page (negative: an inconsistent continuation).
    pub rv: i64,
}

/// Encodes the token for continuing at `key` (a full key under `prefix`) at `rv`.
pub fn encode(key: &[u8], prefix: &[u8], rv: u64) -> Option<String> {
    let rest = key.strip_prefix(prefix)?;
    let rest = core::str::from_utf8(rest).ok()?;
    let mut json = String::from("{\"v\":\"meta.k8s.io/v1\",\"rv\":");
    json.push_str(&format!("{rv}"));
    json.push_str(",\"start\":");
    push_json_string(&mut json, rest);
    json.push('}');
    Some(base64_url_encode(json.as_bytes()))
}

/// Decodes a token for a list whose keys start with `prefix` (ending in `/`).
pub fn decode(token: &str, prefix: &[u8]) -> Result<ContinueToken, Status> {
    let invalid = |why: &str| Status::bad_request(format!("continue key is not valid: {why}"));
    let data = base64_url_decode(token).ok_or_else(|| invalid("illegal base64 data"))?;
    let text = core::str::from_utf8(&data).map_err(|_| invalid("not UTF-8"))?;
    let fields = parse_flat_object(text).map_err(|e| invalid(&e))?;
    let mut version = None;
    let mut rv = 0i64;
    let mut start = String::new();
    for (k, v) in fields {
        match (k.as_str(), v) {
            ("v", Json::Str(s)) => version = Some(s),
            ("rv", Json::Int(n)) => rv = n,
            ("start", Json::Str(s)) => start = s,
            ("v" | "rv" | "start", _) => {
                return Err(invalid(&format!("field {k:?} has the wrong type")))
            }
            _ => {}
        }
    }
    match version.as_deref() {
        Some("meta.k8s.io/v1") => {}
        Some(v) => {
            return Err(invalid(&format!("server does not recognize this encoded version {v:?}")))
        }
        None => return Err(invalid("server does not recognize this encoded version \"\"")),
    }
    if rv == 0 {
        return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    if start.is_empty() {
        return Err(invalid("encoded start key empty (version meta.k8s.io/v1)"));
    }
    let key = if start.starts_with('/') { start.clone() } else { format!("/{start}") };
    if clean_path(&key) != key {
        return Err(invalid(&start));
    }
    let mut full = prefix.to_vec();
    full.extend_from_slice(&key.as_bytes()[1..]);
    Ok(ContinueToken { start_key: full, rv })
}

/// Go's `path.Clean` for rooted paths: resolves `.` and `..`, collapses `//`, drops a
/// trailing `/`.
fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = String::from("/");
    out.push_str(&parts.join("/"));
    out
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64_url_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn base64_url_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|p| p as u32);
    let bytes = s.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        for i in 0..produced {
            out.push((n >> (16 - 8 * i)) as u8);
        }
        // Non-canonical trailing bits are rejected, as Go's strict decoder does.
        let used_bits = produced * 8;
        let total_bits = chunk.len() * 6;
        if total_bits > used_bits
            && (n >> (24 - total_bits)) & ((1 << (total_bits - used_bits)) - 1) != 0
        {
            return None;
        }
    }
    Some(out)
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

enum Json {
    Str(String),
    Int(i64),
    Other,
}

/// Parses a JSON object whose values are strings, integers, booleans or null.
fn parse_flat_object(s: &str) -> Result<Vec<(String, Json)>, String> {
    let mut p = JsonParser { s: s.as_bytes(), i: 0 };
    p.ws();
    p.expect(b'{')?;
    let mut out = Vec::new();
    p.ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        loop {
            p.ws();
            let k = p.string()?;
            p.ws();
            p.expect(b':')?;
            p.ws();
            let v = match p.peek() {
                Some(b'"') => Json::Str(p.string()?),
                Some(b'-' | b'0'..=b'9') => Json::Int(p.int()?),
                Some(b't') => p.literal("true").map(|_| Json::Other)?,
                Some(b'f') => p.literal("false").map(|_| Json::Other)?,
                Some(b'n') => p.literal("null").map(|_| Json::Other)?,
                _ => return Err(String::from("unsupported value")),
            };
            out.push((k, v));
            p.ws();
            match p.next() {
                Some(b',') => continue,
                Some(b'}') => break,
                _ => return Err(String::from("expected ',' or '}'")),
            }
        }
    }
    p.ws();
    if p.i != p.s.len() {
        return Err(String::from("trailing data"));
    }
    Ok(out)
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += 1;
        c
    }
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.next() == Some(c) {
            Ok(())
        } else {
            Err(format!("expected '{}'", c as char))
        }
    }
    fn literal(&mut self, word: &str) -> Result<(), String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(())
        } else {
            Err(String::from("invalid literal"))
        }
    }
    fn int(&mut self) -> Result<i64, String> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(String::from("resourceVersion must be an integer"));
        }
        core::str::from_utf8(&self.s[start..self.i])
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .ok_or_else(|| String::from("invalid integer"))
    }
    fn hex4(&mut self) -> Result<u32, String> {
        let h = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
        self.i += 4;
        let t = core::str::from_utf8(h).map_err(|_| String::from("bad \\u escape"))?;
        u32::from_str_radix(t, 16).map_err(|_| String::from("bad \\u escape"))
    }
    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            match self.next() {
                None => return Err(String::from("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => {
                    let c = match self.next() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let hi = self.hex4()?;
                            let cp = if (0xd800..0xdc00).contains(&hi) {
                                if self.next() != Some(b'\\') || self.next() != Some(b'u') {
                                    return Err(String::from("lone surrogate"));
                                }
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return Err(String::from("lone surrogate"));
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(cp).ok_or("invalid code point")?
                        }
                        _ => return Err(String::from("invalid escape")),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Some(c) if c < 0x20 => return Err(String::from("control character in string")),
                Some(c) => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| String::from("invalid UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = encode(b"/pods/ns/a\0", b"/pods/", 42).unwrap();
        let d = decode(&t, b"/pods/").unwrap();
        assert_eq!(d.start_key, b"/pods/ns/a\0");
        assert_eq!(d.rv, 42);
        assert!(encode(b"/other/a", b"/pods/", 1).is_none());
    }

    #[test]
    fn kubernetes_token_decodes() {
        // {"v":"meta.k8s.io/v1","rv":12,"start":"ns/b\u0000"} as apiserver encodes it.
        let json = br#"{"v":"meta.k8s.io/v1","rv":12,"start":"ns/b\u0000"}"#;
        let t = base64_url_encode(json);
        let d = decode(&t, b"/registry/pods/").unwrap();
        assert_eq!(d.start_key, b"/registry/pods/ns/b\0");
    }

    #[test]
    fn bad_tokens_are_400() {
        for t in [
            "!!!",
            "e30", // {}
            &base64_url_encode(br#"{"v":"v2","rv":1,"start":"a"}"#),
            &base64_url_encode(br#"{"v":"meta.k8s.io/v1","rv":0,"start":"a"}"#),
            &base64_url_encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":""}"#),
            &base64_url_encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../../secrets/x"}"#),
            &base64_url_encode(br#"{"v":"meta.k8s.io/v1","rv":1.5,"start":"a"}"#),
            &base64_url_encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"a"} x"#),
            &base64_url_encode(b"not json"),
        ] {
            let e = decode(t, b"/pods/").expect_err(t);
            assert_eq!(e.code(), 400);
            assert!(e.message.starts_with("continue key is not valid"), "{}", e.message);
        }
    }

    #[test]
    fn base64_round_trips_all_lengths() {
        for n in 0..40 {
            let data: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(base64_url_decode(&base64_url_encode(&data)).unwrap(), data);
        }
    }
}
