//! The trace: what clients see of a replay, one flat [`Record`] per [`OutputItem`] (the
//! `STARTED` items are host information and have none), and its JSON text (the golden-file
//! format).

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde::Serialize;

use crate::key::display_key;
use crate::output::{Output, RangeOutcome, ReadOutcome, RequestId, WatchEvent};
use crate::status::Status;

use super::driver::OutputItem;

/// One line of a trace. Fields that do not apply are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Record {
    /// Milliseconds.
    pub at: u64,
    /// The client request's id (from the scenario), where it concerns one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`, `CLOSED`, `REJECTED`, `LIST`, `GET`,
    /// `WATCH`, `REQUEST_PROGRESS`, `NEED_CURRENT_RV`, `RELIST`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `cache` or `storage`, for LIST, GET and WATCH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    /// The object's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The resourceVersion the client sees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rv: Option<u64>,
    /// The object's value (for DELETED, the last stored value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Bookmark annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Why a watch CLOSED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// HTTP-style code of an ERROR or REJECTED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// Status reason of an ERROR or REJECTED; why a read went where it went; why a relist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Status message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Retry-After of a REJECTED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u32>,
    /// Objects of a LIST or GET served from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<Item>>,
    /// The continue token of a LIST page.
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
    /// `remainingItemCount` of a LIST page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// Keys in the range of a RANGE (etcd's `count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// More keys than returned, for a RANGE (etcd's `more`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<bool>,
}

/// An object in a LIST or GET record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Item {
    /// Key.
    pub key: String,
    /// Its own resourceVersion.
    pub rv: u64,
    /// Value.
    pub value: Option<String>,
}

/// The trace as JSON text: an array with one record per line (the golden-file format).
pub fn trace_to_json(trace: &[Record]) -> String {
    let mut out = String::from("[\n");
    for (i, r) in trace.iter().enumerate() {
        // Serialising these plain records cannot fail.
        out.push_str(&serde_json::to_string(r).unwrap_or_default());
        out.push_str(if i + 1 < trace.len() { ",\n" } else { "\n" });
    }
    out.push_str("]\n");
    out
}

/// The trace records of one output, with request ids named from `names` (`#N` otherwise).
pub fn records_of(
    out: &Output,
    at: u64,
    names: &BTreeMap<RequestId, String>,
    trace: &mut Vec<Record>,
) {
    OutputItem::expand(at, out.clone(), &mut |item| trace.extend(record_of(&item, names)));
}

/// The trace record of one item (none for `STARTED`), with request ids named from `names`
/// (`#N` otherwise).
pub fn record_of(item: &OutputItem, names: &BTreeMap<RequestId, String>) -> Option<Record> {
    let name =
        |id: &RequestId| Some(names.get(id).cloned().unwrap_or_else(|| format!("#{}", id.0)));
    Some(match item {
        OutputItem::Event { at, watch, event } => event_record(*at, name(watch), event),
        // Host information; the trace shows what clients see.
        OutputItem::Started { .. } => return None,
        OutputItem::Error { at, watch, status } => Record {
            at: *at,
            id: name(watch),
            kind: "ERROR",
            code: Some(status.code()),
            reason: Some(status.reason.as_str().to_owned()),
            message: Some(status.message.clone()),
            ..Record::default()
        },
        OutputItem::Closed { at, watch, cause, message, .. } => Record {
            at: *at,
            id: name(watch),
            kind: "CLOSED",
            cause: Some(cause.as_str()),
            message: message.clone(),
            ..Record::default()
        },
        OutputItem::Delegated { at, watch, reason } => Record {
            at: *at,
            id: name(watch),
            kind: "WATCH",
            source: Some("storage"),
            reason: Some((*reason).to_owned()),
            ..Record::default()
        },
        OutputItem::Read { at, request, kind, outcome } => {
            read_record(*at, name(request), kind.as_str(), outcome)
        }
        OutputItem::Range { at, request, outcome } => match outcome {
            RangeOutcome::Storage { reason } => Record {
                at: *at,
                id: name(request),
                kind: "RANGE",
                source: Some("storage"),
                reason: Some((*reason).to_owned()),
                ..Record::default()
            },
            RangeOutcome::Cache(r) => Record {
                at: *at,
                id: name(request),
                kind: "RANGE",
                source: Some("cache"),
                rv: Some(r.header_rv),
                reason: Some(r.reason.to_owned()),
                items: Some(r.items.iter().map(|o| trace_item(o)).collect()),
                count: Some(r.count),
                more: Some(r.more),
                ..Record::default()
            },
        },
        OutputItem::Rejected { at, request, status } => rejected(*at, name(request), status),
        OutputItem::RequestProgress { at } => {
            Record { at: *at, kind: "REQUEST_PROGRESS", ..Record::default() }
        }
        OutputItem::NeedCurrentRevision { at, request } => {
            Record { at: *at, id: name(request), kind: "NEED_CURRENT_RV", ..Record::default() }
        }
        OutputItem::Relist { at, reason } => {
            Record { at: *at, kind: "RELIST", reason: Some(reason.clone()), ..Record::default() }
        }
    })
}

/// The `REJECTED` record of a request that failed.
pub(super) fn rejected(at: u64, id: Option<String>, status: &Status) -> Record {
    Record {
        at,
        id,
        kind: "REJECTED",
        code: Some(status.code()),
        reason: Some(status.reason.as_str().to_owned()),
        message: Some(status.message.clone()),
        retry_after_s: status.retry_after_s,
        ..Record::default()
    }
}

fn text(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(display_key)
}

fn trace_item(o: &crate::Object) -> Item {
    Item { key: display_key(o.key()), rv: o.rv(), value: text(o.value()) }
}
fn event_record(at: u64, id: Option<String>, e: &WatchEvent) -> Record {
    match e {
        WatchEvent::Bookmark { rv, initial_events_end } => Record {
            at,
            id,
            kind: "BOOKMARK",
            rv: Some(*rv),
            annotations: initial_events_end.then(|| {
                let mut m = BTreeMap::new();
                m.insert("k8s.io/initial-events-end".to_owned(), "true".to_owned());
                m
            }),
            ..Record::default()
        },
        _ => {
            let obj = e.object();
            Record {
                at,
                id,
                kind: e.type_str(),
                key: obj.map(|o| display_key(o.key())),
                rv: Some(e.rv()),
                value: obj.and_then(|o| text(o.value())),
                ..Record::default()
            }
        }
    }
}

fn read_record(at: u64, id: Option<String>, kind: &'static str, outcome: &ReadOutcome) -> Record {
    match outcome {
        ReadOutcome::Storage { reason } => Record {
            at,
            id,
            kind,
            source: Some("storage"),
            reason: Some((*reason).to_owned()),
            ..Record::default()
        },
        ReadOutcome::Cache(r) => Record {
            at,
            id,
            kind,
            source: Some("cache"),
            rv: Some(r.rv),
            reason: Some(r.reason.to_owned()),
            items: Some(r.items.iter().map(|o| trace_item(o)).collect()),
            continue_token: r.continue_token.clone(),
            remaining: r.remaining,
            ..Record::default()
        },
    }
}
