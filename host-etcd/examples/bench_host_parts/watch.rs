//! The load generator's watchers and writer.
//!
//! Watchers are multiplexed on `Watch` streams as kube-apiserver and clientv3 do: several
//! watches per stream, several streams per connection. The client is lean on purpose (raw
//! gRPC frames through tonic, the watch response walked in place without decoding it into
//! structs), so that the load generator costs less CPU per delivery than the servers it
//! measures; every event is still checked (one key per revision: every watcher must see every
//! revision exactly once, across reconnects and restarts).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use etcd_client::{Client, ConnectOptions};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::hist::{Hist, Shards};

// ---------------------------------------------------------------------------------------------
// The wire: WatchRequest encoded by hand, WatchResponse walked in place.

/// Bytes in, bytes out: the gRPC framing is tonic's, the messages are ours.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawCodec;

pub(crate) struct RawEncoder;
pub(crate) struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_bytes_field(buf: &mut Vec<u8>, field: u64, b: &[u8]) {
    put_varint(buf, (field << 3) | 2);
    put_varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// `WatchRequest { create_request: WatchCreateRequest { key, range_end, start_revision } }`.
pub(crate) fn create_request(key: &[u8], range_end: &[u8], start_revision: u64) -> Bytes {
    let mut inner = Vec::with_capacity(key.len() + range_end.len() + 16);
    put_bytes_field(&mut inner, 1, key);
    if !range_end.is_empty() {
        put_bytes_field(&mut inner, 2, range_end);
    }
    if start_revision > 0 {
        put_varint(&mut inner, 3 << 3);
        put_varint(&mut inner, start_revision);
    }
    let mut out = Vec::with_capacity(inner.len() + 4);
    put_bytes_field(&mut out, 1, &inner);
    Bytes::from(out)
}

/// A protobuf reader over one message.
struct Pb<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Pb<'a> {
    fn new(b: &'a [u8]) -> Pb<'a> {
        Pb { b, i: 0 }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let byte = *self.b.get(self.i)?;
            self.i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    /// The next field's number and wire type; None at the end (or on garbage).
    fn field(&mut self) -> Option<(u64, u8)> {
        if self.i >= self.b.len() {
            return None;
        }
        let k = self.varint()?;
        Some((k >> 3, (k & 7) as u8))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.varint()? as usize;
        let s = self.b.get(self.i..self.i.checked_add(n)?)?;
        self.i += n;
        Some(s)
    }

    fn skip(&mut self, wire: u8) -> Option<()> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => {
                self.i = self.i.checked_add(8).filter(|i| *i <= self.b.len())?;
                Some(())
            }
            2 => self.bytes().map(|_| ()),
            5 => {
                self.i = self.i.checked_add(4).filter(|i| *i <= self.b.len())?;
                Some(())
            }
            _ => None,
        }
    }
}

/// The scalar fields of a WatchResponse.
#[derive(Default, Debug)]
pub(crate) struct RespHead {
    pub(crate) watch_id: i64,
    pub(crate) created: bool,
    pub(crate) canceled: bool,
    pub(crate) compact_revision: i64,
    pub(crate) cancel_reason: String,
    pub(crate) events: usize,
}

/// WatchResponse: header 1, watch_id 2, created 3, canceled 4, compact_revision 5,
/// cancel_reason 6, fragment 7, events 11.
pub(crate) fn parse_head(b: &[u8]) -> Option<RespHead> {
    let mut h = RespHead::default();
    let mut p = Pb::new(b);
    while let Some((f, w)) = p.field() {
        match (f, w) {
            (2, 0) => h.watch_id = p.varint()? as i64,
            (3, 0) => h.created = p.varint()? != 0,
            (4, 0) => h.canceled = p.varint()? != 0,
            (5, 0) => h.compact_revision = p.varint()? as i64,
            (6, 2) => h.cancel_reason = String::from_utf8_lossy(p.bytes()?).into_owned(),
            (11, 2) => {
                p.bytes()?;
                h.events += 1;
            }
            (_, w) => p.skip(w)?,
        }
    }
    Some(h)
}

/// Calls `f(mod_revision, value)` for every event's key-value (Event: kv 2; KeyValue:
/// mod_revision 3, value 5).
pub(crate) fn for_each_event(b: &[u8], mut f: impl FnMut(u64, &[u8])) -> Option<()> {
    let mut p = Pb::new(b);
    while let Some((field, w)) = p.field() {
        if (field, w) != (11, 2) {
            p.skip(w)?;
            continue;
        }
        let mut ev = Pb::new(p.bytes()?);
        while let Some((ef, ew)) = ev.field() {
            if (ef, ew) != (2, 2) {
                ev.skip(ew)?;
                continue;
            }
            let mut kv = Pb::new(ev.bytes()?);
            let (mut rev, mut value): (u64, &[u8]) = (0, &[]);
            while let Some((kf, kw)) = kv.field() {
                match (kf, kw) {
                    (3, 0) => rev = kv.varint()?,
                    (5, 2) => value = kv.bytes()?,
                    (_, w) => kv.skip(w)?,
                }
            }
            f(rev, value);
        }
    }
    Some(())
}

/// The send time (ns since the run's base) at the start of a value.
fn leading_u64(v: &[u8]) -> Option<u64> {
    let mut n = 0u64;
    let mut any = false;
    for b in v {
        if !b.is_ascii_digit() {
            break;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(n)
}

const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";

// ---------------------------------------------------------------------------------------------
// Shared state.

/// Shared by the program: the time base of the values and where errors are tallied.
pub(crate) struct Shared {
    pub(crate) base: Instant,
    pub(crate) record_latency: AtomicBool,
    pub(crate) errors: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            base: Instant::now(),
            record_latency: AtomicBool::new(false),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    pub(crate) fn note_error(&self, what: &str, e: &str) {
        let mut msg = format!("{what}: {e}");
        msg.truncate(200);
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(msg).or_insert(0) += 1;
        }
    }

    pub(crate) fn take_errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().map(|mut m| std::mem::take(&mut *m)).unwrap_or_default()
    }
}

/// One watcher's state, kept across its streams.
pub(crate) struct WState {
    /// Every revision up to this one has been seen (or counted missing).
    pub(crate) last_rev: AtomicU64,
    events: AtomicU64,
    missing: AtomicU64,
    duplicates: AtomicU64,
    /// `created` responses received.
    pub(crate) creates: AtomicU64,
    /// Its watch ended (its stream broke, or it was canceled).
    breaks: AtomicU64,
    compacted: AtomicU64,
}

impl WState {
    fn new(rev: u64) -> WState {
        WState {
            last_rev: AtomicU64::new(rev),
            events: AtomicU64::new(0),
            missing: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            breaks: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WTotals {
    pub(crate) events: u64,
    pub(crate) missing: u64,
    pub(crate) duplicates: u64,
    pub(crate) creates: u64,
    pub(crate) watch_breaks: u64,
    pub(crate) compacted: u64,
    pub(crate) stream_breaks: u64,
    pub(crate) failed_opens: u64,
}

impl WTotals {
    pub(crate) fn minus(&self, b: &WTotals) -> WTotals {
        WTotals {
            events: self.events - b.events,
            missing: self.missing - b.missing,
            duplicates: self.duplicates - b.duplicates,
            creates: self.creates - b.creates,
            watch_breaks: self.watch_breaks - b.watch_breaks,
            compacted: self.compacted - b.compacted,
            stream_breaks: self.stream_breaks - b.stream_breaks,
            failed_opens: self.failed_opens - b.failed_opens,
        }
    }
}

/// What every stream task of a fleet shares.
struct FleetShared {
    sh: Arc<Shared>,
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// clientv3's order: a stream sends its next create once the previous one is created.
    serial: bool,
    latency: Shards,
    /// From opening a stream to its first `created`.
    first_create: Shards,
    /// From sending a further create to its `created` (serial), or from opening the stream
    /// (pipelined).
    next_create: Shards,
    stream_breaks: AtomicU64,
    failed_opens: AtomicU64,
}

/// How a fleet is laid out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) watchers: usize,
    pub(crate) per_stream: usize,
    pub(crate) conns: usize,
    pub(crate) serial: bool,
}

impl Layout {
    pub(crate) fn streams(&self) -> usize {
        self.watchers.div_ceil(self.per_stream.max(1))
    }

    pub(crate) fn connections(&self) -> usize {
        self.conns.clamp(1, self.streams().max(1))
    }
}

/// The watchers of one target: their state (kept across reconnections) and their streams.
pub(crate) struct Fleet {
    pub(crate) states: Vec<Arc<WState>>,
    pub(crate) layout: Layout,
    tasks: Vec<JoinHandle<()>>,
    fs: Arc<FleetShared>,
}

impl Fleet {
    pub(crate) fn new(
        layout: Layout,
        rev: u64,
        sh: &Arc<Shared>,
        key: &[u8],
        range_end: &[u8],
    ) -> Fleet {
        let shards = (layout.streams() / 16).clamp(1, 256);
        Fleet {
            states: (0..layout.watchers).map(|_| Arc::new(WState::new(rev))).collect(),
            layout,
            tasks: Vec::new(),
            fs: Arc::new(FleetShared {
                sh: sh.clone(),
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                serial: layout.serial,
                latency: Shards::new(shards),
                first_create: Shards::new(shards),
                next_create: Shards::new(shards),
                stream_breaks: AtomicU64::new(0),
                failed_opens: AtomicU64::new(0),
            }),
        }
    }

    /// Opens the connections (spread over `endpoints`) and starts every stream on them; the
    /// time the connections took.
    pub(crate) async fn start(
        &mut self,
        endpoints: &[String],
        from_now: bool,
    ) -> Result<Duration, String> {
        let t0 = Instant::now();
        let n = self.layout.connections();
        let mut pending = Vec::with_capacity(n);
        for c in 0..n {
            let ep = &endpoints[c % endpoints.len()];
            let e = Endpoint::from_shared(format!("http://{ep}"))
                .map_err(|e| format!("{ep}: {e}"))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true);
            pending.push(async move {
                e.connect().await.map_err(|e| format!("connecting to {ep}: {e}"))
            });
        }
        // Connect in batches (a listen backlog is finite).
        let mut chans: Vec<Channel> = Vec::with_capacity(n);
        while !pending.is_empty() {
            let rest = pending.split_off(pending.len().min(256));
            let batch = std::mem::replace(&mut pending, rest);
            for r in futures::future::join_all(batch).await {
                chans.push(r?);
            }
        }
        let connect_time = t0.elapsed();
        let per = self.layout.per_stream.max(1);
        for (s, group) in self.states.chunks(per).enumerate() {
            let ch = chans[s % chans.len()].clone();
            let ws: Vec<Arc<WState>> = group.to_vec();
            self.tasks.push(tokio::spawn(run_stream(ch, ws, self.fs.clone(), s, from_now)));
        }
        Ok(connect_time)
    }

    /// Drops every stream and connection.
    pub(crate) async fn stop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }

    pub(crate) fn totals(&self) -> WTotals {
        let mut t = WTotals::default();
        for w in &self.states {
            t.events += w.events.load(Ordering::Relaxed);
            t.missing += w.missing.load(Ordering::Relaxed);
            t.duplicates += w.duplicates.load(Ordering::Relaxed);
            t.creates += w.creates.load(Ordering::Relaxed);
            t.watch_breaks += w.breaks.load(Ordering::Relaxed);
            t.compacted += w.compacted.load(Ordering::Relaxed);
        }
        t.stream_breaks = self.fs.stream_breaks.load(Ordering::Relaxed);
        t.failed_opens = self.fs.failed_opens.load(Ordering::Relaxed);
        t
    }

    pub(crate) fn set_last_rev(&self, rev: u64) {
        for s in &self.states {
            s.last_rev.store(rev, Ordering::Relaxed);
        }
    }

    pub(crate) fn min_rev(&self) -> u64 {
        self.states.iter().map(|s| s.last_rev.load(Ordering::Relaxed)).min().unwrap_or(0)
    }

    pub(crate) fn count_at_least(&self, rev: u64) -> usize {
        self.states.iter().filter(|s| s.last_rev.load(Ordering::Relaxed) >= rev).count()
    }

    pub(crate) fn count_created(&self, at_least: &[u64]) -> usize {
        self.states
            .iter()
            .zip(at_least)
            .filter(|(s, n)| s.creates.load(Ordering::Relaxed) >= **n)
            .count()
    }

    pub(crate) fn creates(&self) -> Vec<u64> {
        self.states.iter().map(|s| s.creates.load(Ordering::Relaxed)).collect()
    }

    pub(crate) fn take_latency(&self) -> Hist {
        self.fs.latency.take()
    }

    /// (first create on a stream, each further create).
    pub(crate) fn take_create_hists(&self) -> (Hist, Hist) {
        (self.fs.first_create.take(), self.fs.next_create.take())
    }

    /// Waits until every watcher saw revision `rev`; the time it took, or an error.
    pub(crate) async fn wait_rev(
        &self,
        rev: u64,
        limit: Duration,
        what: &str,
    ) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            if self.min_rev() >= rev {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "{what}: after {limit:?} only {} of {} watchers have revision {rev} (the slowest is at {})",
                    self.count_at_least(rev),
                    self.states.len(),
                    self.min_rev()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// What the watchers that fell short of `rev` did not receive.
    pub(crate) fn settle_missing(&self, rev: u64) -> u64 {
        let mut n = 0;
        for s in &self.states {
            let last = s.last_rev.load(Ordering::Relaxed);
            if last < rev {
                n += rev - last;
            }
        }
        n
    }
}

/// One Watch stream with its watchers, until aborted: create every watch (from now at first,
/// then each from its last revision + 1), check every event, and on any break open the stream
/// again and create them all again.
async fn run_stream(
    ch: Channel,
    ws: Vec<Arc<WState>>,
    fs: Arc<FleetShared>,
    index: usize,
    from_now: bool,
) {
    let mut first = from_now;
    let mut backoff = Duration::from_millis(20);
    let path = http::uri::PathAndQuery::from_static(WATCH_PATH);
    let mut ids: FxHashMap<i64, usize> = FxHashMap::default();
    loop {
        let reqs: Vec<Bytes> = ws
            .iter()
            .map(|w| {
                let start = if first { 0 } else { w.last_rev.load(Ordering::Relaxed) + 1 };
                create_request(&fs.key, &fs.range_end, start)
            })
            .collect();
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(reqs.len() + 1);
        let initial = if fs.serial { 1 } else { reqs.len() };
        for r in &reqs[..initial] {
            let _ = tx.try_send(r.clone());
        }
        let mut sent = initial;
        let t_open = Instant::now();
        let mut grpc = tonic::client::Grpc::new(ch.clone()).max_decoding_message_size(256 << 20);
        let call = async {
            grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
            grpc.streaming(
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
                path.clone(),
                RawCodec,
            )
            .await
        };
        let mut stream = match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(e)) => {
                fs.failed_opens.fetch_add(1, Ordering::Relaxed);
                fs.sh.note_error("watch stream open", e.message());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
            Err(_) => {
                fs.failed_opens.fetch_add(1, Ordering::Relaxed);
                fs.sh.note_error("watch stream open", "timed out after 10 s");
                continue;
            }
        };
        first = false;
        ids.clear();
        let mut created = 0usize;
        let mut last_send = t_open;
        let why = loop {
            let buf = match stream.message().await {
                Ok(Some(b)) => b,
                Ok(None) => break "stream ended by the server".to_owned(),
                Err(e) => break format!("{:?}: {}", e.code(), e.message()),
            };
            let Some(h) = parse_head(&buf) else {
                fs.sh.note_error("watch stream", "undecodable WatchResponse");
                continue;
            };
            if h.created && created < ws.len() {
                let now = Instant::now();
                ids.insert(h.watch_id, created);
                ws[created].creates.fetch_add(1, Ordering::Relaxed);
                if created == 0 {
                    fs.first_create.record(index, (now - t_open).as_micros() as u64);
                } else {
                    fs.next_create.record(index, (now - last_send).as_micros() as u64);
                }
                created += 1;
                if fs.serial && sent < reqs.len() {
                    let _ = tx.try_send(reqs[sent].clone());
                    sent += 1;
                    last_send = now;
                }
                backoff = Duration::from_millis(20);
            }
            let Some(&wi) = ids.get(&h.watch_id) else { continue };
            let st = &ws[wi];
            if h.canceled {
                if h.compact_revision > 0 {
                    st.compacted.fetch_add(1, Ordering::Relaxed);
                    let c = h.compact_revision as u64;
                    let last = st.last_rev.load(Ordering::Relaxed);
                    if c > last + 1 {
                        st.missing.fetch_add(c - last - 1, Ordering::Relaxed);
                        st.last_rev.store(c - 1, Ordering::Relaxed);
                    }
                }
                break format!("canceled: {}", h.cancel_reason);
            }
            if h.events == 0 {
                continue;
            }
            let now = fs.sh.now_ns();
            let record = fs.sh.record_latency.load(Ordering::Relaxed);
            let mut last = st.last_rev.load(Ordering::Relaxed);
            let (mut n, mut missing, mut dups) = (0u64, 0u64, 0u64);
            let mut hist = if record { fs.latency.shard(index).lock().ok() } else { None };
            for_each_event(&buf, |rev, value| {
                if rev <= last {
                    dups += 1;
                    return;
                }
                if rev > last + 1 {
                    missing += rev - last - 1;
                }
                last = rev;
                n += 1;
                if let (Some(h), Some(sent)) = (hist.as_mut(), leading_u64(value)) {
                    h.record(now.saturating_sub(sent) / 1000);
                }
            });
            drop(hist);
            st.last_rev.store(last, Ordering::Relaxed);
            st.events.fetch_add(n, Ordering::Relaxed);
            if missing > 0 {
                st.missing.fetch_add(missing, Ordering::Relaxed);
            }
            if dups > 0 {
                st.duplicates.fetch_add(dups, Ordering::Relaxed);
            }
        };
        drop(tx);
        fs.stream_breaks.fetch_add(1, Ordering::Relaxed);
        for w in &ws[..created] {
            w.breaks.fetch_add(1, Ordering::Relaxed);
        }
        fs.sh.note_error("watch stream", &why);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

// ---------------------------------------------------------------------------------------------
// etcd-client for everything but the watchers.

pub(crate) async fn connect(endpoint: &str) -> Result<Client, String> {
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
    Client::connect([endpoint], Some(opts))
        .await
        .map_err(|e| format!("connecting to {endpoint}: {e}"))
}

pub(crate) async fn etcd_revision(c: &Client) -> Result<u64, String> {
    let mut c = c.clone();
    let r = tokio::time::timeout(Duration::from_secs(10), c.status())
        .await
        .map_err(|_| "etcd status timed out".to_owned())?
        .map_err(|e| format!("etcd status: {e}"))?;
    Ok(r.header().map(|h| h.revision()).unwrap_or(0).max(0) as u64)
}

// ---------------------------------------------------------------------------------------------
// The writer: puts straight to etcd at a fixed rate, the send time first in the value.

#[derive(Debug, Default, Clone)]
pub(crate) struct WriteReport {
    pub(crate) puts: u64,
    pub(crate) errors: u64,
    pub(crate) first_rev: u64,
    pub(crate) last_rev: u64,
    pub(crate) seconds: f64,
}

pub(crate) struct Writer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<WriteReport>,
}

/// What the writer writes.
#[derive(Clone)]
pub(crate) struct WriteSpec {
    pub(crate) prefix: String,
    pub(crate) key_mod: usize,
    pub(crate) value_size: usize,
}

impl Writer {
    pub(crate) fn start(
        clients: Vec<Client>,
        sh: Arc<Shared>,
        rate: u64,
        duration: Option<Duration>,
        spec: WriteSpec,
        seq: Arc<AtomicU64>,
    ) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            let inflight = Arc::new(Semaphore::new(256));
            let first = Arc::new(AtomicU64::new(u64::MAX));
            let last = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(AtomicU64::new(0));
            let t0 = Instant::now();
            let mut sent = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let el = t0.elapsed();
                if stop2.load(Ordering::Relaxed) || duration.is_some_and(|d| el >= d) {
                    break;
                }
                let due = (el.as_secs_f64() * rate as f64) as u64;
                while sent < due {
                    let Ok(permit) = inflight.clone().acquire_owned().await else { break };
                    let i = seq.fetch_add(1, Ordering::Relaxed);
                    let mut kv = clients[(i % clients.len() as u64) as usize].kv_client();
                    let key = format!("{}k{}", spec.prefix, i % spec.key_mod as u64);
                    let (sh, first, last, errors) =
                        (sh.clone(), first.clone(), last.clone(), errors.clone());
                    let size = spec.value_size;
                    tokio::spawn(async move {
                        let mut value = sh.now_ns().to_string();
                        if value.len() < size {
                            value.push(' ');
                            while value.len() < size {
                                value.push('x');
                            }
                        }
                        match kv.put(key, value, None).await {
                            Ok(r) => {
                                let rev =
                                    r.header().map(|h| h.revision()).unwrap_or(0).max(0) as u64;
                                first.fetch_min(rev, Ordering::Relaxed);
                                last.fetch_max(rev, Ordering::Relaxed);
                            }
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                sh.note_error("put", &e.to_string());
                            }
                        }
                        drop(permit);
                    });
                    sent += 1;
                }
            }
            let seconds = t0.elapsed().as_secs_f64();
            let _ = inflight.acquire_many(256).await;
            let f = first.load(Ordering::Relaxed);
            WriteReport {
                puts: sent - errors.load(Ordering::Relaxed),
                errors: errors.load(Ordering::Relaxed),
                first_rev: if f == u64::MAX { 0 } else { f },
                last_rev: last.load(Ordering::Relaxed),
                seconds,
            }
        });
        Writer { stop, task }
    }

    pub(crate) async fn finish(self) -> Result<WriteReport, String> {
        self.stop.store(true, Ordering::Relaxed);
        match tokio::time::timeout(Duration::from_secs(120), self.task).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(format!("writer task failed: {e}")),
            Err(_) => Err("writer did not finish within 120 s".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_request_and_walk() {
        let r = create_request(b"/bench/", b"/bench0", 42);
        let mut p = Pb::new(&r);
        let (f, w) = p.field().unwrap();
        assert_eq!((f, w), (1, 2));
        let inner = p.bytes().unwrap();
        let mut q = Pb::new(inner);
        assert_eq!(q.field(), Some((1, 2)));
        assert_eq!(q.bytes(), Some(&b"/bench/"[..]));
        assert_eq!(q.field(), Some((2, 2)));
        assert_eq!(q.bytes(), Some(&b"/bench0"[..]));
        assert_eq!(q.field(), Some((3, 0)));
        assert_eq!(q.varint(), Some(42));
        assert_eq!(leading_u64(b"123 xx"), Some(123));
    }
}
