//! Label and field selectors: the full Kubernetes syntax, parsed once into types.
//!
//! Kubernetes counterparts: `apimachinery/pkg/labels/selector.go` (lexer, parser and
//! `Requirement.Matches`) and `apimachinery/pkg/fields/selector.go` (`ParseSelector`, escaping,
//! `RequiresExactMatch`), as the cacher uses them through `SelectionPredicate`.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::object::Object;
use crate::status::Status;

/// The operator of one label requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOp {
    /// `key` — the label is present.
    Exists,
    /// `!key` — the label is absent.
    DoesNotExist,
    /// `key=value` or `key==value`.
    Equals,
    /// `key!=value` — absent, or another value.
    NotEquals,
    /// `key in (a,b)`.
    In,
    /// `key notin (a,b)` — absent, or none of the values.
    NotIn,
    /// `key>N` — present and an integer greater than N.
    GreaterThan,
    /// `key<N` — present and an integer less than N.
    LessThan,
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRequirement {
    key: Box<str>,
    op: LabelOp,
    values: Box<[Box<str>]>,
}

impl LabelRequirement {
    /// The label name.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The operator.
    pub fn op(&self) -> LabelOp {
        self.op
    }
    /// The values (empty for exists / does-not-exist).
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|v| &**v)
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match self.op {
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::Equals | LabelOp::In => value.is_some_and(|v| self.has_value(v)),
            LabelOp::NotEquals | LabelOp::NotIn => value.is_none_or(|v| !self.has_value(v)),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let (Some(v), Some(bound)) = (value, self.values.first()) else { return false };
                let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }

    fn has_value(&self, v: &str) -> bool {
        self.values.iter().any(|x| &**x == v)
    }
}

/// A parsed label selector (`labelSelector=`). The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Box<[LabelRequirement]>,
}

impl LabelSelector {
    /// Parses the Kubernetes label selector syntax: requirements separated by `,`, each one of
    /// `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (v1,v2)`, `key notin (v1,v2)`,
    /// `key>N`, `key<N`. Keys are qualified names and values label values, validated as
    /// Kubernetes validates them.
    pub fn parse(s: &str) -> Result<LabelSelector, Status> {
        let tokens = lex(s).map_err(label_err)?;
        let mut p = LabelParser { tokens, pos: 0 };
        let mut reqs = Vec::new();
        if p.peek() == &Tok::Eos {
            return Ok(LabelSelector::default());
        }
        loop {
            reqs.push(p.requirement().map_err(label_err)?);
            match p.next() {
                Tok::Eos => break,
                Tok::Comma => {
                    if p.peek() == &Tok::Eos {
                        return Err(label_err(String::from(
                            "found '', expected: identifier after ','",
                        )));
                    }
                }
                t => {
                    return Err(label_err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        t.text()
                    )))
                }
            }
        }
        Ok(LabelSelector { requirements: reqs.into_boxed_slice() })
    }

    /// True if the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    /// True if an object with these labels is selected.
    pub fn matches(&self, obj: &Object) -> bool {
        self.requirements.iter().all(|r| r.matches(obj.label(&r.key)))
    }

    /// The value a selected object must have for `key`, if the selector pins it
    /// (`key=v`, `key==v` or `key in (v)`), as `RequiresExactMatch`.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        self.requirements.iter().find_map(|r| match r.op {
            LabelOp::Equals | LabelOp::In if &*r.key == key && r.values.len() == 1 => {
                Some(&*r.values[0])
            }
            _ => None,
        })
    }
}

fn label_err(msg: String) -> Status {
    Status::bad_request(format!("unable to parse requirement: {msg}"))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Bang,
    NotEq,
    Eq,
    DoubleEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    Eos,
}

impl Tok {
    fn text(&self) -> &str {
        match self {
            Tok::Ident(s) => s,
            Tok::Bang => "!",
            Tok::NotEq => "!=",
            Tok::Eq => "=",
            Tok::DoubleEq => "==",
            Tok::Gt => ">",
            Tok::Lt => "<",
            Tok::Open => "(",
            Tok::Close => ")",
            Tok::Comma => ",",
            Tok::Eos => "",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some(&(i, c)) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        if is_special(c) {
            it.next();
            let next_is_eq = it.peek().is_some_and(|&(_, n)| n == '=');
            let tok = match c {
                '!' if next_is_eq => {
                    it.next();
                    Tok::NotEq
                }
                '=' if next_is_eq => {
                    it.next();
                    Tok::DoubleEq
                }
                '!' => Tok::Bang,
                '=' => Tok::Eq,
                '>' => Tok::Gt,
                '<' => Tok::Lt,
                '(' => Tok::Open,
                ')' => Tok::Close,
                _ => Tok::Comma,
            };
            out.push(tok);
            continue;
        }
        let start = i;
        let mut end = s.len();
        while let Some(&(j, c)) = it.peek() {
            if c.is_whitespace() || is_special(c) {
                end = j;
                break;
            }
            it.next();
        }
        out.push(Tok::Ident(String::from(&s[start..end])));
    }
    out.push(Tok::Eos);
    Ok(out)
}

struct LabelParser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl LabelParser {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.pos).unwrap_or(&Tok::Eos)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        let mut negated = false;
        let mut tok = self.next();
        if tok == Tok::Bang {
            negated = true;
            tok = self.next();
        }
        let Tok::Ident(key) = tok else {
            return Err(format!("found '{}', expected: identifier", tok.text()));
        };
        validate_label_key(&key)?;
        if negated {
            return Ok(LabelRequirement {
                key: key.into(),
                op: LabelOp::DoesNotExist,
                values: Box::new([]),
            });
        }
        if matches!(self.peek(), Tok::Eos | Tok::Comma) {
            return Ok(LabelRequirement {
                key: key.into(),
                op: LabelOp::Exists,
                values: Box::new([]),
            });
        }
        let op = match self.next() {
            Tok::Eq | Tok::DoubleEq => LabelOp::Equals,
            Tok::NotEq => LabelOp::NotEquals,
            Tok::Gt => LabelOp::GreaterThan,
            Tok::Lt => LabelOp::LessThan,
            Tok::Ident(w) if w == "in" => LabelOp::In,
            Tok::Ident(w) if w == "notin" => LabelOp::NotIn,
            t => {
                return Err(format!("found '{}', expected: in, notin, =, ==, !=, gt, lt", t.text()))
            }
        };
        let values: Vec<Box<str>> = match op {
            LabelOp::In | LabelOp::NotIn => self.value_set()?,
            _ => {
                let v = match self.peek() {
                    Tok::Eos | Tok::Comma => String::new(),
                    Tok::Ident(_) => match self.next() {
                        Tok::Ident(v) => v,
                        _ => String::new(),
                    },
                    t => return Err(format!("found '{}', expected: identifier", t.text())),
                };
                validate_label_value(&v)?;
                if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan)
                    && v.parse::<i64>().is_err()
                {
                    return Err(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer, got {v:?}"
                    ));
                }
                alloc::vec![v.into()]
            }
        };
        Ok(LabelRequirement { key: key.into(), op, values: values.into_boxed_slice() })
    }

    fn value_set(&mut self) -> Result<Vec<Box<str>>, String> {
        let t = self.next();
        if t != Tok::Open {
            return Err(format!("found '{}', expected: '('", t.text()));
        }
        let mut values = Vec::new();
        let mut expect_value = true;
        loop {
            match self.next() {
                Tok::Ident(v) if expect_value => {
                    validate_label_value(&v)?;
                    values.push(v.into());
                    expect_value = false;
                }
                Tok::Comma => {
                    if expect_value {
                        values.push(Box::from(""));
                    }
                    expect_value = true;
                }
                Tok::Close => {
                    if expect_value && !values.is_empty() {
                        values.push(Box::from(""));
                    }
                    break;
                }
                t => return Err(format!("found '{}', expected: ',', ')' or identifier", t.text())),
            }
        }
        if values.is_empty() {
            return Err(String::from("for 'in', 'notin' operators, values set can't be empty"));
        }
        Ok(values)
    }
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.'
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn valid_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| is_name_char(c))
}

fn valid_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

fn validate_label_key(k: &str) -> Result<(), String> {
    let ok = match k.split_once('/') {
        Some((prefix, name)) => {
            valid_dns_subdomain(prefix) && !name.contains('/') && valid_name_part(name)
        }
        None => valid_name_part(k),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid label key {k:?}: name part must consist of alphanumeric characters, '-', '_' \
             or '.', and must start and end with an alphanumeric character (at most 63 \
             characters), with an optional DNS subdomain prefix and '/'"
        ))
    }
}

fn validate_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || valid_name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value: {v:?}: a valid label must be an empty string or consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character (at most 63 characters)"
        ))
    }
}

/// The operator of one field requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOp {
    /// `field=value` or `field==value`.
    Equals,
    /// `field!=value`.
    NotEquals,
}

/// One term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    field: Box<str>,
    op: FieldOp,
    value: Box<str>,
}

impl FieldRequirement {
    /// The field name, e.g. `spec.nodeName`.
    pub fn field(&self) -> &str {
        &self.field
    }
    /// The operator.
    pub fn op(&self) -> FieldOp {
        self.op
    }
    /// The value (unescaped).
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// A parsed field selector (`fieldSelector=`). The empty selector matches everything.
/// A missing field reads as `""`, as Kubernetes' `fields.Set` does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Box<[FieldRequirement]>,
}

impl FieldSelector {
    /// Parses `f1=v1,f2!=v2,f3==v3`; `\,`, `\=` and `\\` escape in values.
    pub fn parse(s: &str) -> Result<FieldSelector, Status> {
        let mut reqs = Vec::new();
        if s.is_empty() {
            return Ok(FieldSelector::default());
        }
        for term in split_unescaped_commas(s) {
            let Some((lhs, op, rhs)) = split_field_term(term) else {
                return Err(Status::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let field = lhs.trim();
            if field.is_empty() {
                return Err(Status::bad_request(format!(
                    "invalid selector: '{s}'; empty field name in '{term}'"
                )));
            }
            let value = unescape_field_value(rhs).map_err(|e| {
                Status::bad_request(format!("invalid field selector value in '{term}': {e}"))
            })?;
            reqs.push(FieldRequirement { field: field.into(), op, value: value.into() });
        }
        Ok(FieldSelector { requirements: reqs.into_boxed_slice() })
    }

    /// True if the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, in the order written.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True if an object with these fields is selected.
    pub fn matches(&self, obj: &Object) -> bool {
        self.requirements.iter().all(|r| {
            let v = obj.field(&r.field).unwrap_or("");
            match r.op {
                FieldOp::Equals => v == &*r.value,
                FieldOp::NotEquals => v != &*r.value,
            }
        })
    }

    /// The value a selected object must have for `field`, if pinned by `=` or `==`.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.op == FieldOp::Equals && &*r.field == field)
            .map(|r| &*r.value)
    }
}

fn split_unescaped_commas(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b',' => {
                parts.push(&s[start..i]);
                start = i + 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    parts.push(&s[start.min(s.len())..]);
    parts
}

fn split_field_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    // Byte-wise: the operators are ASCII, so every split point is a char boundary.
    let b = term.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i..].starts_with(b"!=") {
            return Some((&term[..i], FieldOp::NotEquals, &term[i + 2..]));
        }
        if b[i..].starts_with(b"==") {
            return Some((&term[..i], FieldOp::Equals, &term[i + 2..]));
        }
        if b[i] == b'=' {
            return Some((&term[..i], FieldOp::Equals, &term[i + 1..]));
        }
        i += 1;
    }
    None
}

fn unescape_field_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence '\\{e}'")),
                None => return Err(String::from("unterminated escape sequence")),
            }
        } else if c == ',' || c == '=' {
            return Err(format!("unescaped '{c}'"));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// A label and a field selector together (Kubernetes' `SelectionPredicate` without paging).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// The label selector.
    pub labels: LabelSelector,
    /// The field selector.
    pub fields: FieldSelector,
}

impl Selector {
    /// Parses both selectors.
    pub fn parse(labels: &str, fields: &str) -> Result<Selector, Status> {
        Ok(Selector {
            labels: LabelSelector::parse(labels)?,
            fields: FieldSelector::parse(fields)?,
        })
    }

    /// True if both are empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// True if the object is selected.
    #[inline]
    pub fn matches(&self, obj: &Object) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Attrs;

    fn obj(labels: &[(&str, &str)], fields: &[(&str, &str)]) -> Object {
        Object::new(b"/k", None, 1)
            .with_attrs(Attrs::new(labels.iter().copied(), fields.iter().copied()))
    }

    #[test]
    fn label_operators() {
        let o = obj(&[("app", "web"), ("tier", "front"), ("n", "5")], &[]);
        let cases = [
            ("", true),
            ("app", true),
            ("!app", false),
            ("missing", false),
            ("!missing", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db, cache)", true),
            ("missing notin (x)", true),
            ("app notin (web)", false),
            ("app=web,tier=front", true),
            ("app=web, tier=back", false),
            ("n>4", true),
            ("n>5", false),
            ("n<6", true),
            ("missing>1", false),
            ("  app  =  web  ", true),
            ("example.com/role", false),
            ("app=", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&o), want, "{sel:?}");
        }
    }

    #[test]
    fn label_parse_errors_are_400() {
        for bad in [
            "app=web,",
            ",",
            "app in web",
            "app in ()",
            "=web",
            "app=we b",
            "app===web",
            "app!",
            "-app=x",
            "app=-x",
            "n>x",
            "a/b/c=x",
            "Example.com/x=y",
            "app in (a b)",
            "!app=x",
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert_eq!(err.code(), 400, "{bad}");
            assert!(err.message.starts_with("unable to parse requirement"), "{}", err.message);
        }
    }

    #[test]
    fn exact_matches() {
        let s = LabelSelector::parse("a=1,b in (2),c in (3,4),d!=5").unwrap();
        assert_eq!(s.requires_exact_match("a"), Some("1"));
        assert_eq!(s.requires_exact_match("b"), Some("2"));
        assert_eq!(s.requires_exact_match("c"), None);
        assert_eq!(s.requires_exact_match("d"), None);
        let f = FieldSelector::parse("spec.nodeName=n1,metadata.name!=x").unwrap();
        assert_eq!(f.requires_exact_match("spec.nodeName"), Some("n1"));
        assert_eq!(f.requires_exact_match("metadata.name"), None);
    }

    #[test]
    fn field_selectors() {
        let o = obj(&[], &[("metadata.namespace", "ns1"), ("spec.nodeName", "a,b")]);
        for (sel, want) in [
            ("metadata.namespace=ns1", true),
            ("metadata.namespace==ns1", true),
            ("metadata.namespace!=ns1", false),
            ("spec.nodeName=a\\,b", true),
            ("spec.missing=", true),
            ("spec.missing!=", false),
            ("metadata.namespace=ns1,spec.nodeName!=x", true),
        ] {
            assert_eq!(FieldSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
        for bad in ["foo", "a=b=c", "=x", "a=\\q", "a=b,", "a=b\\", "a\\é", "x=\\é"] {
            assert_eq!(FieldSelector::parse(bad).expect_err(bad).code(), 400, "{bad}");
        }
    }
}
