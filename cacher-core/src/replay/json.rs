//! Reading JSON objects field by field: required and optional fields with typed errors that
//! name the path, and a final check that every field was read (so a typo is an error, not a
//! silently ignored setting). Shared by the scenario parser and the workload parser of
//! [`crate::simulate`].

use alloc::borrow::ToOwned;
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde_json::{Map, Value};

use super::ScenarioError;

/// Reads the fields of a JSON object, remembering which were read so that [`Fields::finish`] can
/// report the unknown ones. `null` counts as absent.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
    used: BTreeSet<&'static str>,
}

impl<'a> Fields<'a> {
    /// Starts reading `v`, an object at `path` (`""` for the top level).
    pub fn new(v: &'a Value, path: &str) -> Result<Fields<'a>, ScenarioError> {
        match v {
            Value::Object(map) => Ok(Fields { map, path: path.to_owned(), used: BTreeSet::new() }),
            other => {
                Err(ScenarioError::new(path, format!("expected an object, got {}", kind_of(other))))
            }
        }
    }

    /// The path of `field` in this object (`steps[3].rv`).
    pub fn at(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{}", self.path, field)
        }
    }

    /// The field's value, `None` when absent or null.
    pub fn raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.used.insert(field);
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    /// The field's value; an error when absent or null.
    pub fn require(&mut self, field: &'static str) -> Result<&'a Value, ScenarioError> {
        self.raw(field)
            .ok_or_else(|| ScenarioError::new(self.at(field), "required field is missing"))
    }

    /// A non-negative integer (or a decimal string: large resource versions) from `v`.
    pub fn u64_of(&self, field: &str, v: &Value) -> Result<u64, ScenarioError> {
        match v {
            Value::Number(n) => n.as_u64().ok_or_else(|| {
                ScenarioError::new(
                    self.at(field),
                    format!("expected a non-negative integer, got {n}"),
                )
            }),
            // Large resource versions may be written as strings (JavaScript cannot hold them).
            Value::String(s) => crate::rv::parse_u64(s).ok_or_else(|| {
                ScenarioError::new(
                    self.at(field),
                    format!("expected a non-negative integer, got {s:?}"),
                )
            }),
            other => Err(ScenarioError::new(
                self.at(field),
                format!("expected a non-negative integer, got {}", kind_of(other)),
            )),
        }
    }

    /// A required non-negative integer.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, ScenarioError> {
        let v = self.require(field)?;
        self.u64_of(field, v)
    }

    /// An optional non-negative integer.
    pub fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(v) => self.u64_of(field, v).map(Some),
        }
    }

    /// A required string.
    pub fn string(&mut self, field: &'static str) -> Result<String, ScenarioError> {
        let v = self.require(field)?;
        self.string_of(field, v)
    }

    /// A string from `v`.
    pub fn string_of(&self, field: &str, v: &Value) -> Result<String, ScenarioError> {
        match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(ScenarioError::new(
                self.at(field),
                format!("expected a string, got {}", kind_of(other)),
            )),
        }
    }

    /// An optional string.
    pub fn opt_string(&mut self, field: &'static str) -> Result<Option<String>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(v) => self.string_of(field, v).map(Some),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&mut self, field: &'static str) -> Result<Option<bool>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected true or false, got {}", kind_of(other)),
            )),
        }
    }

    /// An optional number.
    pub fn opt_f64(&mut self, field: &'static str) -> Result<Option<f64>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected a number, got {}", kind_of(other)),
            )),
        }
    }

    /// An optional object of strings (labels, fields), in key order; empty when absent.
    pub fn string_map(
        &mut self,
        field: &'static str,
    ) -> Result<Vec<(String, String)>, ScenarioError> {
        match self.raw(field) {
            None => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(ScenarioError::new(
                        format!("{}.{}", self.at(field), k),
                        format!("expected a string, got {}", kind_of(other)),
                    )),
                })
                .collect(),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected an object of strings, got {}", kind_of(other)),
            )),
        }
    }

    /// Fails on any field that was not read.
    pub fn finish(self) -> Result<(), ScenarioError> {
        for k in self.map.keys() {
            if !self.used.contains(k.as_str()) {
                let known: Vec<&str> = self.used.iter().copied().collect();
                return Err(ScenarioError::new(
                    self.at(k),
                    format!("unknown field; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// How an error message names a JSON value's kind (`a string`, `an array`, ...).
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
