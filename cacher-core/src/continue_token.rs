//! Continue tokens for paginated lists.
//!
//! Kubernetes counterpart: `storage/continue.go` (`EncodeContinue`, `DecodeContinue`): base64
//! (URL alphabet, no padding) of `{"v":"meta.k8s.io/v1","rv":N,"start":"<key after prefix>"}`,
//! with the start key cleaned so a client cannot range above the list's prefix. Decoding is
//! Go's, error for error: `base64.RawURLEncoding` (lenient: trailing bits are ignored, line
//! breaks skipped), then `encoding/json` (its syntax errors, then its type errors), so a bad
//! token fails where and how Kubernetes' fails.

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
    let data = base64_url_decode(token)
        .map_err(|at| invalid(&format!("illegal base64 data at input byte {at}")))?;
    let fields = json::decode_token(&data).map_err(|e| invalid(&e))?;
    if fields.version != "meta.k8s.io/v1" {
        return Err(Status::bad_request(format!(
            "continue key is not valid: server does not recognize this encoded version {}",
            fields.version
        )));
    }
    if fields.rv == 0 {
        return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    if fields.start.is_empty() {
        return Err(invalid("encoded start key empty (version meta.k8s.io/v1)"));
    }
    let start = fields.start;
    let key = if start.starts_with('/') { start.clone() } else { format!("/{start}") };
    if clean_path(&key) != key {
        return Err(invalid(&start));
    }
    let mut full = prefix.to_vec();
    full.extend_from_slice(&key.as_bytes()[1..]);
    Ok(ContinueToken { start_key: full, rv: fields.rv })
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

/// `base64.RawURLEncoding.DecodeString`: quantum by quantum, `\r` and `\n` skipped, trailing
/// bits ignored; the error is the offset Go's `CorruptInputError` names.
fn base64_url_decode(s: &str) -> Result<Vec<u8>, usize> {
    let val = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|p| p as u32);
    let src = s.as_bytes();
    let mut out = Vec::with_capacity(src.len() * 3 / 4);
    let mut si = 0;
    loop {
        let mut dbuf = [0u32; 4];
        let mut dlen = 4;
        let mut j = 0;
        while j < 4 {
            if si == src.len() {
                match j {
                    0 => return Ok(out),
                    1 => return Err(si - j),
                    _ => {}
                }
                dlen = j;
                break;
            }
            let c = src[si];
            si += 1;
            if let Some(v) = val(c) {
                dbuf[j] = v;
                j += 1;
                continue;
            }
            if c == b'\n' || c == b'\r' {
                continue;
            }
            return Err(si - 1);
        }
        let v = (dbuf[0] << 18) | (dbuf[1] << 12) | (dbuf[2] << 6) | dbuf[3];
        let bytes = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        out.extend_from_slice(&bytes[..dlen - 1]);
        if dlen < 4 {
            return Ok(out);
        }
    }
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

/// `encoding/json` as `json.Unmarshal(data, &continueToken{})` runs it: the syntax check of
/// the whole input first (`checkValid`, Go's scanner and its messages), then the fields, matched
/// by name without regard to case, the last one winning, type mismatches reported as Go does.
mod json {
    use alloc::format;
    use alloc::string::String;
    use alloc::vec::Vec;

    pub(super) struct Fields {
        pub version: String,
        pub rv: i64,
        pub start: String,
    }

    /// `quoteChar`: how the scanner names a byte.
    fn quote_char(c: u8) -> String {
        match c {
            b'\'' => String::from("'\\''"),
            b'"' => String::from("'\"'"),
            c => {
                let q = crate::status::go_quote(&String::from(char::from(c)));
                format!("'{}'", &q[1..q.len() - 1])
            }
        }
    }

    fn is_space(c: u8) -> bool {
        matches!(c, b' ' | b'\t' | b'\r' | b'\n')
    }

    /// Go's scanner (`encoding/json/scanner.go`), as a recursive descent with its messages.
    struct Scan<'a> {
        s: &'a [u8],
        i: usize,
        depth: usize,
    }

    type R = Result<(), String>;

    impl Scan<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.i).copied()
        }
        fn err(&self, c: u8, context: &str) -> String {
            format!("invalid character {} {context}", quote_char(c))
        }
        fn eof() -> String {
            String::from("unexpected end of JSON input")
        }
        fn space(&mut self) {
            while self.peek().is_some_and(is_space) {
                self.i += 1;
            }
        }
        fn top(&mut self) -> R {
            self.space();
            self.value()?;
            self.space();
            match self.peek() {
                None => Ok(()),
                Some(c) => Err(self.err(c, "after top-level value")),
            }
        }
        fn value(&mut self) -> R {
            self.space();
            let Some(c) = self.peek() else { return Err(Self::eof()) };
            match c {
                b'{' => self.object(),
                b'[' => self.array(),
                b'"' => self.string(),
                b'-' | b'0'..=b'9' => self.number(),
                b't' => self.literal(b"true", "true"),
                b'f' => self.literal(b"false", "false"),
                b'n' => self.literal(b"null", "null"),
                c => Err(self.err(c, "looking for beginning of value")),
            }
        }
        fn nest(&mut self) -> R {
            self.depth += 1;
            if self.depth > 10_000 {
                return Err(String::from("exceeded max depth"));
            }
            Ok(())
        }
        fn object(&mut self) -> R {
            self.nest()?;
            self.i += 1;
            self.space();
            if self.peek() == Some(b'}') {
                self.i += 1;
                self.depth -= 1;
                return Ok(());
            }
            loop {
                self.space();
                match self.peek() {
                    None => return Err(Self::eof()),
                    Some(b'"') => self.string()?,
                    Some(c) => {
                        return Err(self.err(c, "looking for beginning of object key string"))
                    }
                }
                self.space();
                match self.peek() {
                    None => return Err(Self::eof()),
                    Some(b':') => self.i += 1,
                    Some(c) => return Err(self.err(c, "after object key")),
                }
                self.value()?;
                self.space();
                match self.peek() {
                    None => return Err(Self::eof()),
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        self.depth -= 1;
                        return Ok(());
                    }
                    Some(c) => return Err(self.err(c, "after object key:value pair")),
                }
            }
        }
        fn array(&mut self) -> R {
            self.nest()?;
            self.i += 1;
            self.space();
            if self.peek() == Some(b']') {
                self.i += 1;
                self.depth -= 1;
                return Ok(());
            }
            loop {
                self.value()?;
                self.space();
                match self.peek() {
                    None => return Err(Self::eof()),
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        self.depth -= 1;
                        return Ok(());
                    }
                    Some(c) => return Err(self.err(c, "after array element")),
                }
            }
        }
        fn string(&mut self) -> R {
            self.i += 1;
            loop {
                let Some(c) = self.peek() else { return Err(Self::eof()) };
                self.i += 1;
                match c {
                    b'"' => return Ok(()),
                    b'\\' => {
                        // At the end Go's scanner steps once more with a space (`eof`).
                        let e = self.peek().unwrap_or(b' ');
                        self.i += 1;
                        match e {
                            b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {}
                            b'u' => {
                                for _ in 0..4 {
                                    let h = self.peek().unwrap_or(b' ');
                                    if !h.is_ascii_hexdigit() {
                                        return Err(
                                            self.err(h, "in \\u hexadecimal character escape")
                                        );
                                    }
                                    self.i += 1;
                                }
                            }
                            e => return Err(self.err(e, "in string escape code")),
                        }
                    }
                    c if c < 0x20 => return Err(self.err(c, "in string literal")),
                    _ => {}
                }
            }
        }
        fn digits(&mut self) {
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        fn number(&mut self) -> R {
            if self.peek() == Some(b'-') {
                self.i += 1;
                match self.peek().unwrap_or(b' ') {
                    b'0'..=b'9' => {}
                    c => return Err(self.err(c, "in numeric literal")),
                }
            }
            if self.peek() == Some(b'0') {
                self.i += 1;
            } else {
                self.digits();
            }
            if self.peek() == Some(b'.') {
                self.i += 1;
                match self.peek().unwrap_or(b' ') {
                    b'0'..=b'9' => self.digits(),
                    c => return Err(self.err(c, "after decimal point in numeric literal")),
                }
            }
            if matches!(self.peek(), Some(b'e' | b'E')) {
                self.i += 1;
                if matches!(self.peek(), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                match self.peek().unwrap_or(b' ') {
                    b'0'..=b'9' => self.digits(),
                    c => return Err(self.err(c, "in exponent of numeric literal")),
                }
            }
            Ok(())
        }
        fn literal(&mut self, word: &[u8], name: &str) -> R {
            self.i += 1;
            for &want in &word[1..] {
                match self.peek().unwrap_or(b' ') {
                    c if c == want => self.i += 1,
                    c => {
                        return Err(self.err(
                            c,
                            &format!("in literal {name} (expecting {})", quote_char(want)),
                        ))
                    }
                }
            }
            Ok(())
        }
    }

    /// A value already checked by the scanner.
    enum Val {
        Str(String),
        Num(String),
        Bool,
        Null,
        Object(Vec<(String, Val)>),
        Array,
    }

    impl Val {
        fn kind(&self) -> &'static str {
            match self {
                Val::Str(_) => "string",
                Val::Num(_) => "number",
                Val::Bool => "bool",
                Val::Null => "null",
                Val::Object(_) => "object",
                Val::Array => "array",
            }
        }
    }

    /// Reads a value the scanner accepted (so nothing here can fail).
    struct Read<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Read<'_> {
        fn space(&mut self) {
            while self.s.get(self.i).copied().is_some_and(is_space) {
                self.i += 1;
            }
        }
        fn value(&mut self) -> Val {
            self.space();
            match self.s.get(self.i).copied() {
                Some(b'{') => {
                    self.i += 1;
                    let mut out = Vec::new();
                    loop {
                        self.space();
                        match self.s.get(self.i).copied() {
                            Some(b'}') | None => {
                                self.i += 1;
                                return Val::Object(out);
                            }
                            Some(b',') => self.i += 1,
                            _ => {
                                let Val::Str(k) = self.value() else { continue };
                                self.space();
                                self.i += 1; // ':'
                                let v = self.value();
                                out.push((k, v));
                            }
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    loop {
                        self.space();
                        match self.s.get(self.i).copied() {
                            Some(b']') | None => {
                                self.i += 1;
                                return Val::Array;
                            }
                            Some(b',') => self.i += 1,
                            _ => {
                                self.value();
                            }
                        }
                    }
                }
                Some(b'"') => Val::Str(self.string()),
                Some(b't') => {
                    self.i += 4;
                    Val::Bool
                }
                Some(b'f') => {
                    self.i += 5;
                    Val::Bool
                }
                Some(b'n') => {
                    self.i += 4;
                    Val::Null
                }
                _ => {
                    let start = self.i;
                    while self.s.get(self.i).is_some_and(|c| {
                        c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')
                    }) {
                        self.i += 1;
                    }
                    Val::Num(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
                }
            }
        }
        fn hex4(&mut self) -> u32 {
            let h = &self.s[self.i..self.i + 4];
            self.i += 4;
            h.iter().fold(0, |n, &c| n * 16 + char::from(c).to_digit(16).unwrap_or(0))
        }
        /// Go's `unquote`: escapes resolved, bad surrogates and bad UTF-8 become U+FFFD.
        fn string(&mut self) -> String {
            self.i += 1;
            let mut out: Vec<u8> = Vec::new();
            loop {
                let c = self.s[self.i];
                self.i += 1;
                match c {
                    b'"' => break,
                    b'\\' => {
                        let e = self.s[self.i];
                        self.i += 1;
                        let ch = match e {
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let hi = self.hex4();
                                if (0xd800..0xdc00).contains(&hi)
                                    && self.s.get(self.i..self.i + 2) == Some(b"\\u")
                                {
                                    let save = self.i;
                                    self.i += 2;
                                    let lo = self.hex4();
                                    if (0xdc00..0xe000).contains(&lo) {
                                        char::from_u32(
                                            0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00),
                                        )
                                        .unwrap_or('\u{fffd}')
                                    } else {
                                        self.i = save;
                                        '\u{fffd}'
                                    }
                                } else {
                                    char::from_u32(hi).unwrap_or('\u{fffd}')
                                }
                            }
                            other => char::from(other),
                        };
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    c => out.push(c),
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        }
    }

    pub(super) fn decode_token(data: &[u8]) -> Result<Fields, String> {
        Scan { s: data, i: 0, depth: 0 }.top()?;
        let v = Read { s: data, i: 0 }.value();
        let Val::Object(members) = v else {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type storage.continueToken",
                v.kind()
            ));
        };
        let mut f = Fields { version: String::new(), rv: 0, start: String::new() };
        let mut first_err: Option<String> = None;
        let mut type_err = |field: &str, ty: &str, what: String| {
            if first_err.is_none() {
                first_err = Some(format!(
                    "json: cannot unmarshal {what} into Go struct field continueToken.{field} of type {ty}"
                ));
            }
        };
        for (k, v) in members {
            let name = ["v", "rv", "start"].into_iter().find(|n| k.eq_ignore_ascii_case(n));
            match (name, v) {
                (None, _) | (Some(_), Val::Null) => {}
                (Some("v"), Val::Str(s)) => f.version = s,
                (Some("start"), Val::Str(s)) => f.start = s,
                (Some("rv"), Val::Num(n)) => match n.parse::<i64>() {
                    Ok(rv) => f.rv = rv,
                    Err(_) => type_err("rv", "int64", format!("number {n}")),
                },
                (Some(field), other) => {
                    let ty = if field == "rv" { "int64" } else { "string" };
                    type_err(field, ty, String::from(other.kind()));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(f),
        }
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
    fn bad_tokens_fail_as_in_go() {
        // DecodeContinue's messages: base64.RawURLEncoding (lenient), then encoding/json.
        let enc = |j: &[u8]| base64_url_encode(j);
        for (token, msg) in [
            ("not-a-token", "invalid character '\\u009e' looking for beginning of value"),
            ("abc", "invalid character 'i' looking for beginning of value"),
            ("!!!", "illegal base64 data at input byte 0"),
            ("abcde", "illegal base64 data at input byte 4"),
            ("ab=c", "illegal base64 data at input byte 2"),
            ("", "unexpected end of JSON input"),
            (&enc(br#"{"v":"x""#), "unexpected end of JSON input"),
            (&enc(br#"{"v" "x"}"#), "invalid character '\"' after object key"),
            (&enc(br#"{"v":"x" "rv":1}"#), "invalid character '\"' after object key:value pair"),
            (&enc(br#"{v:1}"#), "invalid character 'v' looking for beginning of object key string"),
            (&enc(br#"{"rv":tru}"#), "invalid character '}' in literal true (expecting 'e')"),
            (&enc(br#"{"rv":1.}"#), "invalid character '}' after decimal point in numeric literal"),
            (&enc(br#"{} {}"#), "invalid character '{' after top-level value"),
            (&enc(b"\"a\nb\""), "invalid character '\\n' in string literal"),
            (&enc(br#"[1]"#), "json: cannot unmarshal array into Go value of type storage.continueToken"),
            (
                &enc(br#"{"v":"meta.k8s.io/v1","rv":"5","start":"a"}"#),
                "json: cannot unmarshal string into Go struct field continueToken.rv of type int64",
            ),
            (
                &enc(br#"{"v":"meta.k8s.io/v1","rv":1.5,"start":"a"}"#),
                "json: cannot unmarshal number 1.5 into Go struct field continueToken.rv of type int64",
            ),
            (&enc(br#"{"v":"v2","rv":1,"start":"a"}"#), "server does not recognize this encoded version v2"),
            (&enc(br#"{"rv":1,"start":"a"}"#), "server does not recognize this encoded version "),
            (&enc(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../x"}"#), "../x"),
        ] {
            let e = decode(token, b"/pods/").expect_err(token);
            assert_eq!(e.message, format!("continue key is not valid: {msg}"), "{token}");
        }
        // Field names match without regard to case; trailing base64 bits are ignored.
        let t = enc(br#"{"V":"meta.k8s.io/v1","RV":3,"Start":"a"}"#);
        assert_eq!(decode(&t, b"/p/").unwrap().start_key, b"/p/a");
        let mut loose = enc(br#"{"v":"meta.k8s.io/v1","rv":3,"start":"a"}"#);
        let last = loose.pop().unwrap();
        let bumped = ALPHABET[(ALPHABET.iter().position(|&c| c as char == last).unwrap() | 1) % 64];
        loose.push(bumped as char);
        assert!(decode(&loose, b"/p/").is_ok());
    }

    #[test]
    fn base64_round_trips_all_lengths() {
        for n in 0..40 {
            let data: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(base64_url_decode(&base64_url_encode(&data)).unwrap(), data);
        }
    }
}
