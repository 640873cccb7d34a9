//! Label and field selectors: the full Kubernetes syntax, parsed once into types.
//!
//! Kubernetes counterparts: `apimachinery/pkg/labels/selector.go` (lexer, parser and
//! `Requirement.Matches`) and `apimachinery/pkg/fields/selector.go` (`ParseSelector`, escaping,
//! `RequiresExactMatch`), as the cacher uses them through `SelectionPredicate`.

use alloc::boxed::Box;
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::object::Object;
use crate::status::{go_quote, Status};

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
    /// Kubernetes validates them. This is apimachinery's parser step for step (`labels.Parse`:
    /// its lexer, its recursive descent, `NewRequirement`), so that what it accepts (`app in ()`
    /// is the set `{""}`), the order of its checks and its messages are Kubernetes' own.
    pub fn parse(s: &str) -> Result<LabelSelector, Status> {
        let mut p = LabelParser { items: lex(s), pos: 0 };
        let mut reqs = p.parse().map_err(Status::bad_request)?;
        // `sort.Sort(ByKey(items))`: insertion sort (stable) for the sizes selectors have.
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements: reqs.into_boxed_slice() })
    }

    /// True if the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key (as Kubernetes sorts them).
    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    /// True if an object with these labels is selected.
    pub fn matches(&self, obj: &Object) -> bool {
        self.requirements.iter().all(|r| r.matches(obj.label(&r.key)))
    }

    /// The value a selected object must have for `key`, if the selector pins it
    /// (`key=v`, `key==v` or `key in (v)`), as `RequiresExactMatch`: decided by the first
    /// requirement on `key`.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| &*r.key == key)?;
        match r.op {
            LabelOp::Equals | LabelOp::In if r.values.len() == 1 => Some(&*r.values[0]),
            _ => None,
        }
    }
}

/// The lexer's tokens (`labels.Token`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Error,
    Eos,
    ClosePar,
    Comma,
    DoesNotExist,
    DoubleEq,
    Eq,
    Gt,
    Ident,
    In,
    Lt,
    NotEq,
    NotIn,
    OpenPar,
}

/// `string2token`.
fn token_of(s: &[u8]) -> Option<Tok> {
    Some(match s {
        b")" => Tok::ClosePar,
        b"," => Tok::Comma,
        b"!" => Tok::DoesNotExist,
        b"==" => Tok::DoubleEq,
        b"=" => Tok::Eq,
        b">" => Tok::Gt,
        b"in" => Tok::In,
        b"<" => Tok::Lt,
        b"!=" => Tok::NotEq,
        b"notin" => Tok::NotIn,
        b"(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_label_whitespace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// The lexer (`Lexer.Lex` until the end): bytes, a NUL ends the input as the end does, runs of
/// special symbols are matched greedily against the operators.
fn lex(s: &str) -> Vec<(Tok, String)> {
    let b = s.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while is_label_whitespace(at(pos)) {
            pos += 1;
        }
        let ch = at(pos);
        if ch == 0 {
            out.push((Tok::Eos, String::new()));
            return out;
        }
        let start = pos;
        if is_special(ch) {
            let mut last: Option<(Tok, usize)> = None;
            while is_special(at(pos)) {
                pos += 1;
                match token_of(&b[start..pos]) {
                    Some(t) => last = Some((t, pos)),
                    None if last.is_some() => {
                        pos -= 1;
                        break;
                    }
                    None => {}
                }
            }
            match last {
                Some((t, end)) => {
                    pos = end;
                    out.push((t, String::from(&s[start..end])));
                }
                None => out.push((
                    Tok::Error,
                    format!("error expected: keyword found '{}'", &s[start..pos]),
                )),
            }
            continue;
        }
        while at(pos) != 0 && !is_special(at(pos)) && !is_label_whitespace(at(pos)) {
            pos += 1;
        }
        let lit = &s[start..pos];
        out.push((token_of(lit.as_bytes()).unwrap_or(Tok::Ident), String::from(lit)));
    }
}

/// Where the parser is: `in`/`notin` are operators after a key, identifiers where values go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

struct LabelParser {
    items: Vec<(Tok, String)>,
    pos: usize,
}

impl LabelParser {
    fn lookahead(&self, ctx: Ctx) -> (Tok, String) {
        let (t, l) = self.items.get(self.pos).cloned().unwrap_or((Tok::Eos, String::new()));
        (Self::in_context(t, ctx), l)
    }

    fn consume(&mut self, ctx: Ctx) -> (Tok, String) {
        let item = self.lookahead(ctx);
        self.pos += 1;
        item
    }

    fn in_context(t: Tok, ctx: Ctx) -> Tok {
        match t {
            Tok::In | Tok::NotIn if ctx == Ctx::Values => Tok::Ident,
            t => t,
        }
    }

    /// `Parser.parse`.
    fn parse(&mut self) -> Result<Vec<LabelRequirement>, String> {
        let mut reqs = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Ctx::Values);
            match tok {
                Tok::Ident | Tok::DoesNotExist => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    let (t, l) = self.consume(Ctx::Values);
                    match t {
                        Tok::Eos => return Ok(reqs),
                        Tok::Comma => {
                            let (t2, l2) = self.lookahead(Ctx::Values);
                            if t2 != Tok::Ident && t2 != Tok::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Tok::Eos => return Ok(reqs),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ))
                }
            }
        }
    }

    /// `parseRequirement`.
    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        let (key, op) = self.key_and_inferred_operator()?;
        if let Some(op @ (LabelOp::Exists | LabelOp::DoesNotExist)) = op {
            return new_requirement(key, op, Vec::new());
        }
        let op = self.operator()?;
        let values = match op {
            LabelOp::In | LabelOp::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        new_requirement(key, op, values.into_iter().collect())
    }

    /// `parseKeyAndInferOperator`.
    fn key_and_inferred_operator(&mut self) -> Result<(String, Option<LabelOp>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Ctx::Values);
        if tok == Tok::DoesNotExist {
            op = Some(LabelOp::DoesNotExist);
            (tok, lit) = self.consume(Ctx::Values);
        }
        if tok != Tok::Ident {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        // `validateLabelKey(literal, p.path)` with no path.
        let errs = qualified_name_errors(&lit);
        if !errs.is_empty() {
            return Err(field_invalid("<nil>", &lit, &errs.join("; ")));
        }
        if matches!(self.lookahead(Ctx::Values).0, Tok::Eos | Tok::Comma)
            && op != Some(LabelOp::DoesNotExist)
        {
            op = Some(LabelOp::Exists);
        }
        Ok((lit, op))
    }

    /// `parseOperator`.
    fn operator(&mut self) -> Result<LabelOp, String> {
        let (tok, lit) = self.consume(Ctx::KeyAndOperator);
        Ok(match tok {
            Tok::In => LabelOp::In,
            Tok::Eq | Tok::DoubleEq => LabelOp::Equals,
            Tok::Gt => LabelOp::GreaterThan,
            Tok::Lt => LabelOp::LessThan,
            Tok::NotIn => LabelOp::NotIn,
            Tok::NotEq => LabelOp::NotEquals,
            _ => return Err(format!("found '{lit}', expected: in, notin, =, ==, !=, gt, lt")),
        })
    }

    /// `parseValues`: `(a,b)` as a set; `()` is the set `{""}`.
    fn values(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, lit) = self.consume(Ctx::Values);
        if tok != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Ctx::Values);
        match tok {
            Tok::Ident | Tok::Comma => {
                let set = self.identifiers()?;
                if self.consume(Ctx::Values).0 != Tok::ClosePar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Tok::ClosePar => {
                self.consume(Ctx::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// `parseIdentifiersList`: a possibly empty list of possibly empty identifiers.
    fn identifiers(&mut self) -> Result<BTreeSet<String>, String> {
        let mut set = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Ctx::Values);
            match tok {
                Tok::Ident => {
                    set.insert(lit);
                    let (t2, l2) = self.lookahead(Ctx::Values);
                    match t2 {
                        Tok::Comma => continue,
                        Tok::ClosePar => return Ok(set),
                        _ => return Err(format!("found '{l2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    match self.lookahead(Ctx::Values).0 {
                        Tok::ClosePar => {
                            set.insert(String::new());
                            return Ok(set);
                        }
                        Tok::Comma => {
                            self.consume(Ctx::Values);
                            set.insert(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    /// `parseExactValue`.
    fn exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        if matches!(self.lookahead(Ctx::Values).0, Tok::Eos | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Ctx::Values);
        if tok == Tok::Ident {
            return Ok(BTreeSet::from([lit]));
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

/// `NewRequirement`'s checks of the values (the key was checked by the parser), aggregated.
fn new_requirement(
    key: String,
    op: LabelOp,
    values: Vec<String>,
) -> Result<LabelRequirement, String> {
    let mut errs: Vec<String> = Vec::new();
    if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
        for (i, v) in values.iter().enumerate() {
            if v.parse::<i64>().is_err() {
                errs.push(field_invalid(
                    &format!("values[{i}]"),
                    v,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                ));
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let msgs = label_value_errors(v);
        if !msgs.is_empty() {
            errs.push(field_invalid(&format!("values[{i}][{key}]"), v, &msgs.join("; ")));
        }
    }
    if !errs.is_empty() {
        return Err(aggregate(errs));
    }
    let values: Vec<Box<str>> = values.into_iter().map(String::into_boxed_str).collect();
    Ok(LabelRequirement { key: key.into(), op, values: values.into_boxed_slice() })
}

/// `field.Invalid(path, value, detail).Error()`.
fn field_invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {}: {detail}", go_quote(value))
}

/// `ErrorList.ToAggregate().Error()`: one message as it is, several (each once) in brackets.
fn aggregate(errs: Vec<String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    if seen.len() == 1 {
        seen.pop().unwrap_or_default()
    } else {
        format!("[{}]", seen.join(", "))
    }
}

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// apimachinery's `RegexError`.
fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{re}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{re}')"));
    out
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.'
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| is_name_char(c))
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`.
fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && !b[0].is_ascii_uppercase()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && !b[b.len() - 1].is_ascii_uppercase()
            && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    })
}

/// `validation.IsQualifiedName`.
fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(String::from("prefix part must be non-empty"));
            } else {
                if prefix.len() > 253 {
                    errs.push(String::from("prefix part must be no more than 253 characters"));
                }
                if !matches_dns1123_subdomain(prefix) {
                    errs.push(format!(
                        "prefix part {}",
                        regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"])
                    ));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(String::from("name part must be non-empty"));
    } else if name.len() > 63 {
        errs.push(String::from("name part must be no more than 63 characters"));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// `validation.IsValidLabelValue`.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(String::from("must be no more than 63 characters"));
    }
    if !value.is_empty() && !matches_qualified_name(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
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
        }
    }

    #[test]
    fn label_parse_messages_are_apimachinerys() {
        // The messages of `labels.Parse` (k8s.io/apimachinery pkg/labels/selector.go), as the
        // Kubernetes oracle shows them for the same selectors.
        for (bad, msg) in [
            ("app=web,", "found '', expected: identifier after ','"),
            (
                "-app=web",
                "unable to parse requirement: <nil>: Invalid value: \"-app\": name part must \
                 consist of alphanumeric characters, '-', '_' or '.', and must start and end with \
                 an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex \
                 used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ),
            (
                "n>x",
                "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' \
                 operators, the value must be an integer",
            ),
            ("app=we b", "found 'b', expected: ',' or 'end of string'"),
            ("app in web", "unable to parse requirement: found 'web' expected: '('"),
            ("=web", "found '=', expected: !, identifier, or 'end of string'"),
            ("app===web", "unable to parse requirement: found '=', expected: identifier"),
        ] {
            assert_eq!(LabelSelector::parse(bad).expect_err(bad).message, msg, "{bad}");
        }
    }

    #[test]
    fn empty_value_sets_are_the_empty_string() {
        // `parseValues`: "()" is the set {""}, as are "(,)" and "(a,)" plus "".
        let empty = obj(&[("app", "")], &[]);
        let web = obj(&[("app", "web")], &[]);
        let none = obj(&[], &[]);
        let s = LabelSelector::parse("app in ()").unwrap();
        assert!(s.matches(&empty) && !s.matches(&web) && !s.matches(&none));
        assert_eq!(s.requires_exact_match("app"), Some(""));
        let s = LabelSelector::parse("app notin ()").unwrap();
        assert!(!s.matches(&empty) && s.matches(&web) && s.matches(&none));
        let s = LabelSelector::parse("app in (web,)").unwrap();
        assert!(s.matches(&empty) && s.matches(&web));
        // Values are a set: duplicates collapse, so one value pins the key.
        let s = LabelSelector::parse("app in (web,web)").unwrap();
        assert_eq!(s.requires_exact_match("app"), Some("web"));
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
