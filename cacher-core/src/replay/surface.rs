//! The configuration fields and the metrics as the bindings show them: one list of names,
//! each with its value, so that the scenario format, Python's `Cacher(**config)` and
//! `config()`, JS's `new Cacher(config)` and `config()`, and both `metrics()` name the same
//! fields in the same order. A binding maps [`FieldValue`] to its language and nothing else.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde_json::Value;

use crate::config::{Config, Profile};
use crate::metrics::{Metrics, READ_WAIT_BUCKETS_MS};

use super::json::Fields;
use super::ScenarioError;

/// A value of a configuration field or a metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldValue<'a> {
    /// Absent (`None` in Python, `null` in JS).
    Null,
    /// A flag.
    Bool(bool),
    /// A size or a duration in milliseconds (a JS number).
    Size(u64),
    /// A 64-bit count or seed (a JS BigInt).
    Count(u64),
    /// A fraction.
    Float(f64),
    /// Text.
    Str(&'a str),
    /// Counts by label.
    CountsBy(&'a BTreeMap<String, u64>),
    /// Counts in a fixed order (histogram buckets).
    Counts(&'a [u64]),
}

/// A configuration field: its scenario name, how to read it from a [`Config`], how to set it
/// from a JSON object.
pub struct ConfigField {
    /// The name in a scenario's `config` (and of the Python keyword, the JS option).
    pub name: &'static str,
    /// Its value in a configuration.
    pub get: fn(&Config) -> FieldValue<'_>,
    set: fn(&mut Config, &mut Fields<'_>) -> Result<(), ScenarioError>,
}

macro_rules! number {
    ($field:ident, $kind:ident) => {
        ConfigField {
            name: stringify!($field),
            get: |c| FieldValue::$kind(c.$field as u64),
            set: |c, f| {
                if let Some(x) = f.opt_u64(stringify!($field))? {
                    c.$field = x.try_into().map_err(|_| {
                        ScenarioError::new(f.at(stringify!($field)), "value too large")
                    })?;
                }
                Ok(())
            },
        }
    };
}

macro_rules! flag {
    ($field:ident) => {
        ConfigField {
            name: stringify!($field),
            get: |c| FieldValue::Bool(c.$field),
            set: |c, f| {
                if let Some(x) = f.opt_bool(stringify!($field))? {
                    c.$field = x;
                }
                Ok(())
            },
        }
    };
}

/// Every configuration field after `profile` (which comes first: it presets the others), in
/// the order the scenario format, `config()` and the docs list them.
#[allow(clippy::unnecessary_cast)]
pub const CONFIG_FIELDS: &[ConfigField] = &[
    number!(capacity, Size),
    number!(lower_bound_capacity, Size),
    number!(upper_bound_capacity, Size),
    flag!(dynamic_capacity),
    number!(event_fresh_ms, Size),
    number!(bookmark_frequency_ms, Size),
    number!(dispatch_tick_ms, Size),
    ConfigField {
        name: "dispatch_tick_jitter",
        get: |c| FieldValue::Float(c.dispatch_tick_jitter),
        set: |c, f| {
            if let Some(j) = f.opt_f64("dispatch_tick_jitter")? {
                c.dispatch_tick_jitter = j;
            }
            Ok(())
        },
    },
    number!(freshness_timeout_ms, Size),
    number!(progress_request_interval_ms, Size),
    number!(budget_refill_ms_per_s, Size),
    number!(budget_max_ms, Size),
    ConfigField {
        name: "watch_chan_size",
        get: |c| c.watch_chan_size.map_or(FieldValue::Null, |n| FieldValue::Size(n as u64)),
        set: |c, f| {
            if let Some(n) = f.opt_u64("watch_chan_size")? {
                c.watch_chan_size =
                    Some(n.try_into().map_err(|_| {
                        ScenarioError::new(f.at("watch_chan_size"), "value too large")
                    })?);
            }
            Ok(())
        },
    },
    ConfigField {
        name: "index_field",
        get: |c| c.index_field.as_deref().map_or(FieldValue::Null, FieldValue::Str),
        set: |c, f| {
            if let Some(s) = f.opt_string("index_field")? {
                c.index_field = Some(s.into_boxed_str());
            }
            Ok(())
        },
    },
    number!(interval_buffer_size, Size),
    number!(request_timeout_ms, Size),
    number!(seed, Count),
    flag!(watch_list),
    flag!(consistent_list_from_cache),
    flag!(resilient_initialization),
    flag!(list_from_cache_snapshot),
    flag!(watch_from_storage_without_rv),
    flag!(storage_supports_progress),
    flag!(consistent_list_skip_timeout_fallback),
    flag!(non_blocking_dispatch),
    number!(relist_delay_ms, Size),
    ConfigField {
        name: "max_cache_bytes",
        get: |c| c.max_cache_bytes.map_or(FieldValue::Null, FieldValue::Size),
        set: |c, f| {
            if let Some(n) = f.opt_u64("max_cache_bytes")? {
                c.max_cache_bytes = Some(n);
            }
            Ok(())
        },
    },
    ConfigField {
        name: "resource_prefix",
        get: |c| c.resource_prefix.as_deref().map_or(FieldValue::Null, FieldValue::Str),
        set: |c, f| {
            if let Some(s) = f.opt_string("resource_prefix")? {
                c.resource_prefix = Some(s.into_boxed_str());
            }
            Ok(())
        },
    },
];

/// The configuration as `(name, value)` pairs: `profile`, then [`CONFIG_FIELDS`].
pub fn config_fields(c: &Config) -> Vec<(&'static str, FieldValue<'_>)> {
    let mut out = Vec::with_capacity(CONFIG_FIELDS.len() + 1);
    out.push(("profile", FieldValue::Str(c.profile.as_str())));
    out.extend(CONFIG_FIELDS.iter().map(|f| (f.name, (f.get)(c))));
    out
}

/// Parses a config object (every field optional; the profile presets the others) and checks
/// it; errors name the field under `path`.
pub fn parse_config(v: &Value, path: &str) -> Result<Config, ScenarioError> {
    let mut f = Fields::new(v, path)?;
    let profile = match f.opt_string("profile")? {
        None => Profile::V1_30,
        Some(p) => {
            Profile::parse(&p).map_err(|e| ScenarioError::new(f.at("profile"), e.message))?
        }
    };
    let mut c = Config::for_profile(profile);
    for field in CONFIG_FIELDS {
        (field.set)(&mut c, &mut f)?;
    }
    f.finish()?;
    c.validate().map_err(|e| {
        let at = if path.is_empty() { e.field } else { format!("{path}.{}", e.field) };
        ScenarioError::new(at, e.message)
    })?;
    Ok(c)
}

/// Every metric after its Kubernetes name (see [`Metrics`]), in the order `metrics()` lists
/// them, with the histogram's bucket bounds (`read_wait_buckets_ms`) beside its counts.
pub fn metrics_fields(m: &Metrics) -> [(&'static str, FieldValue<'_>); 24] {
    use FieldValue::{Count, Counts, CountsBy};
    [
        ("events_received", Count(m.events_received)),
        ("events_dispatched", Count(m.events_dispatched)),
        ("init_events", Count(m.init_events)),
        ("terminated_watchers", Count(m.terminated_watchers)),
        ("capacity_increases", Count(m.capacity_increases)),
        ("capacity_decreases", Count(m.capacity_decreases)),
        ("initializations", Count(m.initializations)),
        ("cache_lists", CountsBy(&m.cache_lists)),
        ("cache_list_fetched", CountsBy(&m.cache_list_fetched)),
        ("cache_list_returned", Count(m.cache_list_returned)),
        ("read_wait_buckets_ms", Counts(&READ_WAIT_BUCKETS_MS)),
        ("read_wait_counts", Counts(&m.read_wait_buckets)),
        ("read_wait_sum_ms", Count(m.read_wait_sum_ms)),
        ("consistent_reads_ok", Count(m.consistent_reads_ok)),
        ("consistent_reads_fallback", Count(m.consistent_reads_fallback)),
        ("lists_delegated", Count(m.lists_delegated)),
        ("gets_delegated", Count(m.gets_delegated)),
        ("watches_delegated", Count(m.watches_delegated)),
        ("watches_started", Count(m.watches_started)),
        ("progress_requests", Count(m.progress_requests)),
        ("deliveries", Count(m.deliveries)),
        ("bookmarks_sent", Count(m.bookmarks_sent)),
        ("watch_expired", Count(m.watch_expired)),
        ("byte_evictions", Count(m.byte_evictions)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_field_round_trips_through_the_scenario_format() {
        let c = Config::for_profile(Profile::V1_34);
        let mut obj = serde_json::Map::new();
        for (name, v) in config_fields(&c) {
            let j = match v {
                FieldValue::Null => Value::Null,
                FieldValue::Bool(b) => Value::from(b),
                FieldValue::Size(n) | FieldValue::Count(n) => Value::from(n),
                FieldValue::Float(x) => Value::from(x),
                FieldValue::Str(s) => Value::from(s),
                other => panic!("{name}: {other:?} is not a config value"),
            };
            obj.insert(name.into(), j);
        }
        assert_eq!(obj.len(), 29);
        let back = parse_config(&Value::Object(obj), "config").unwrap();
        assert_eq!(config_fields(&back), config_fields(&c));
    }
}
