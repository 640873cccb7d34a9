//! Prometheus text scrapes: etcd's own counters (what reached it) and watchcache's.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::procs::http_get;

/// A sample: series name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// One scrape of a Prometheus text endpoint.
#[derive(Default, Clone)]
pub(crate) struct Prom(Vec<Sample>);

impl Prom {
    pub(crate) fn parse(text: &str) -> Prom {
        let mut out = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, labels, rest) = match line.find('{') {
                Some(i) => {
                    let Some(j) = line.rfind('}') else { continue };
                    (&line[..i], parse_labels(&line[i + 1..j]), &line[j + 1..])
                }
                None => match line.split_once(' ') {
                    Some((n, r)) => (n, Vec::new(), r),
                    None => continue,
                },
            };
            if let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
                out.push((name.to_owned(), labels, v));
            }
        }
        Prom(out)
    }

    /// The sum of a series over every label set that has the given labels.
    pub(crate) fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name && want.iter().all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// Values of one series by one label.
    pub(crate) fn by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for (n, l, v) in &self.0 {
            if n == name {
                let k =
                    l.iter().find(|(a, _)| a == label).map(|(_, b)| b.clone()).unwrap_or_default();
                *m.entry(k).or_insert(0.0) += v;
            }
        }
        m
    }
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(after) = after.strip_prefix('"') else { break };
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => val.push(c),
            }
        }
        out.push((key, val));
        rest = &after[end.min(after.len())..];
    }
    out
}

pub(crate) async fn scrape(addr: &str) -> Result<Prom, String> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return Err(format!("GET {addr}/metrics: HTTP {status}"));
    }
    Ok(Prom::parse(&body))
}

/// What etcd itself counted: the figures the scenarios compare.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EtcdCounts {
    pub(crate) watch_streams_started: f64,
    pub(crate) watch_msgs_received: f64,
    pub(crate) watch_streams_ended: f64,
    pub(crate) range_handled: f64,
    pub(crate) watchers: f64,
    pub(crate) watch_streams: f64,
    pub(crate) slow_watchers: f64,
}

impl EtcdCounts {
    pub(crate) fn of(p: &Prom) -> EtcdCounts {
        let watch = [("grpc_method", "Watch"), ("grpc_service", "etcdserverpb.Watch")];
        let range = [("grpc_method", "Range"), ("grpc_service", "etcdserverpb.KV")];
        EtcdCounts {
            watch_streams_started: p.sum("grpc_server_started_total", &watch),
            watch_msgs_received: p.sum("grpc_server_msg_received_total", &watch),
            watch_streams_ended: p.sum("grpc_server_handled_total", &watch),
            range_handled: p.sum("grpc_server_handled_total", &range),
            watchers: p.sum("etcd_debugging_mvcc_watcher_total", &[]),
            watch_streams: p.sum("etcd_debugging_mvcc_watch_stream_total", &[]),
            slow_watchers: p.sum("etcd_debugging_mvcc_slow_watcher_total", &[]),
        }
    }

    pub(crate) fn delta(&self, before: &EtcdCounts) -> Value {
        json!({
            "watch_streams_started": self.watch_streams_started - before.watch_streams_started,
            "watch_messages_received": self.watch_msgs_received - before.watch_msgs_received,
            "watch_streams_ended": self.watch_streams_ended - before.watch_streams_ended,
            "range_requests": self.range_handled - before.range_handled,
        })
    }
}

/// The counts that changed between two readings of a labelled counter.
pub(crate) fn map_delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d != 0.0 {
            m.insert(k.clone(), json!(d));
        }
    }
    Value::Object(m)
}

/// A labelled counter summed over several watchcache processes (replicas).
pub(crate) async fn by_label_sum(
    https: &[String],
    name: &str,
    label: &str,
) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for h in https {
        if let Ok(p) = scrape(h).await {
            for (k, v) in p.by(name, label) {
                *m.entry(k).or_insert(0.0) += v;
            }
        }
    }
    m
}
