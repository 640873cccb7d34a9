package checker

import (
	"strings"
	"testing"
	"time"

	"watchcache.local/tools/robustness/record"
)

// history: /r/a created at 2, /r/b at 3, a txn at 4 (/r/a updated, /r/c created), /r/b deleted at 5.
func history() []record.Event {
	a2 := record.KV{Key: "/r/a", Value: "1", CreateRevision: 2, ModRevision: 2, Version: 1}
	b3 := record.KV{Key: "/r/b", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1, Lease: 7}
	a4 := record.KV{Key: "/r/a", Value: "2", CreateRevision: 2, ModRevision: 4, Version: 2}
	c4 := record.KV{Key: "/r/c", Value: "1", CreateRevision: 4, ModRevision: 4, Version: 1}
	return []record.Event{
		{Type: record.Put, KV: a2},
		{Type: record.Put, KV: b3},
		{Type: record.Put, KV: a4, PrevKV: &a2},
		{Type: record.Put, KV: c4},
		{Type: record.Delete, KV: record.KV{Key: "/r/b", ModRevision: 5}, PrevKV: &b3},
	}
}

// oneWatch is a run with one raw stream holding one watch and the given responses after its created.
func oneWatch(req record.CreateRequest, known int64, resps ...record.Response) *record.Run {
	run := &record.Run{History: history(), FinalRevision: 5}
	run.Watches = []record.Watch{{ID: 0, Stream: 0, Request: req, ResumeOf: -1}}
	s := record.Stream{ID: 0, Client: record.Raw, End: "closed"}
	s.Sends = []record.Send{{Seq: 1, Kind: record.SendCreate, Watch: 0, KnownRevision: known}}
	seq := 2
	for _, r := range resps {
		r.Seq = seq
		r.At = time.Duration(seq) * time.Millisecond
		seq++
		s.Recvs = append(s.Recvs, r)
	}
	s.EndSeq = seq
	run.Streams = []record.Stream{s}
	return run
}

func evs(idx ...int) []record.Event {
	h := history()
	var out []record.Event
	for _, i := range idx {
		e := h[i]
		e.PrevKV = nil
		out = append(out, e)
	}
	return out
}

func check(t *testing.T, run *record.Run) *Report {
	t.Helper()
	rep, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func want(t *testing.T, rep *Report, prop string, n int) {
	t.Helper()
	if got := rep.Count(prop); got != n {
		var all []string
		for _, v := range rep.Violations {
			all = append(all, v.String())
		}
		t.Fatalf("%s: %d violations, want %d\n%s", prop, got, n, strings.Join(all, ""))
	}
}

var prefix = record.CreateRequest{Key: "/r/", RangeEnd: "/r0", StartRevision: 2}

func TestWholeWatchIsClean(t *testing.T) {
	run := oneWatch(prefix, 1,
		record.Response{WatchID: 0, Revision: 1, Created: true},
		record.Response{WatchID: 0, Revision: 3, Events: evs(0, 1)},
		record.Response{WatchID: 0, Revision: 5, Events: evs(2, 3, 4)},
		record.Response{WatchID: 0, Revision: 5})
	rep := check(t, run)
	if rep.Total() != 0 {
		t.Fatalf("violations in a clean watch: %v", rep.Violations)
	}
}

func TestSplitRevisionIsAtomicViolation(t *testing.T) {
	run := oneWatch(prefix, 1,
		record.Response{WatchID: 0, Revision: 1, Created: true},
		record.Response{WatchID: 0, Revision: 4, Events: evs(0, 1, 2)},
		record.Response{WatchID: 0, Revision: 5, Events: evs(3, 4)})
	want(t, check(t, run), Atomic, 1)
}

func TestResponseEndingMidRevision(t *testing.T) {
	run := oneWatch(prefix, 1,
		record.Response{WatchID: 0, Revision: 1, Created: true},
		record.Response{WatchID: 0, Revision: 4, Events: evs(0, 1, 2)})
	run.Streams[0].End = "broken: EOF"
	rep := check(t, run)
	want(t, rep, Atomic, 1)
	want(t, rep, Reliable, 1) // /r/c@4 never came, though the watch saw revision 4
}

// A "from now" watch must not deliver what was acknowledged before its create was sent.
func TestFromNowLowerBound(t *testing.T) {
	req := prefix
	req.StartRevision = 0
	run := oneWatch(req, 3,
		record.Response{WatchID: 0, Revision: 3, Created: true},
		record.Response{WatchID: 0, Revision: 3, Events: evs(1)},
		record.Response{WatchID: 0, Revision: 5, Events: evs(2, 3, 4)})
	want(t, check(t, run), Resumable, 1)
	// ... but may deliver the created header's own revision when it was written after the create.
	run = oneWatch(req, 2,
		record.Response{WatchID: 0, Revision: 3, Created: true},
		record.Response{WatchID: 0, Revision: 3, Events: evs(1)},
		record.Response{WatchID: 0, Revision: 5, Events: evs(2, 3, 4)})
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("%v", rep.Violations)
	}
}

func TestCompactionCancel(t *testing.T) {
	run := oneWatch(prefix, 1,
		record.Response{WatchID: 0, Revision: 5, Created: true},
		record.Response{WatchID: 0, Canceled: true, CompactRevision: 3})
	run.Compactions = []record.Compaction{{Revision: 3}}
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("a justified compaction cancel flagged: %v", rep.Violations)
	}
	// Cancelled at 3 though it needed only revisions >= 3: etcd keeps it.
	run = oneWatch(record.CreateRequest{Key: "/r/", RangeEnd: "/r0", StartRevision: 3}, 1,
		record.Response{WatchID: 0, Revision: 5, Created: true},
		record.Response{WatchID: 0, Canceled: true, CompactRevision: 3})
	run.Compactions = []record.Compaction{{Revision: 3}}
	want(t, check(t, run), Compaction, 1)
}

// A compaction whose call failed without an answer (a timeout while etcd was busy) may have
// been applied all the same: found in a baseline run with auth on, where etcd compacted at a
// revision the harness had recorded as failed, and its cancels and refusals were flagged.
// A refusal is an answer: etcd did not compact.
func TestACompactionThatFailedWithoutAnAnswerMayHaveBeenApplied(t *testing.T) {
	cancel := func(err string) *record.Run {
		run := oneWatch(prefix, 1,
			record.Response{WatchID: 0, Revision: 5, Created: true},
			record.Response{WatchID: 0, Canceled: true, CompactRevision: 3})
		run.Compactions = []record.Compaction{{Revision: 3, At: -1, Err: err}}
		return run
	}
	want(t, check(t, cancel("context deadline exceeded")), Compaction, 0)
	want(t, check(t, cancel("rpc error: code = Unavailable desc = error reading from server: EOF")), Compaction, 0)
	want(t, check(t, cancel("etcdserver: mvcc: required revision has been compacted")), Compaction, 1)
	want(t, check(t, cancel("etcdserver: invalid auth token")), Compaction, 1)
}

func TestMissingPrevKVToleratedOnlyBelowCompaction(t *testing.T) {
	req := prefix
	req.PrevKV = true
	req.StartRevision = 4
	e := evs(2, 3)
	// A catch-up a second after the created (not the flush of responses built before the
	// flag): no etcd race explains a missing prev_kv.
	run := oneWatch(req, 5, record.Response{WatchID: 0, Revision: 5, Created: true}, record.Response{WatchID: 0, Revision: 4, Events: e})
	run.Streams[0].Recvs[1].At = time.Second
	want(t, check(t, run), PrevKV, 1)
	run.Compactions = []record.Compaction{{Revision: 4}}
	want(t, check(t, run), PrevKV, 0)
}

// etcd registers a new watcher before it sets the watch's prev_kv flag: events that reach its
// sendLoop in between go out without prev_kv, in the responses that follow the created at once.
// Only there is a missing prev_kv etcd's.
func TestMissingPrevKVToleratedRightAfterTheCreatedOnly(t *testing.T) {
	req := prefix
	req.PrevKV = true
	req.StartRevision = 5
	e := evs(4) // revision 5: /r/b deleted
	mk := func(between bool) *record.Run {
		run := &record.Run{History: history(), FinalRevision: 5}
		run.Watches = []record.Watch{{ID: 0, Request: req, ResumeOf: -1}, {ID: 1, Request: record.CreateRequest{Key: "/x"}, ResumeOf: -1}}
		s := record.Stream{ID: 0, Client: record.Raw, End: "closed", EndSeq: 20}
		s.Sends = []record.Send{{Seq: 1, Kind: record.SendCreate, Watch: 0, KnownRevision: 4}, {Seq: 3, Kind: record.SendCreate, Watch: 1}}
		s.Recvs = []record.Response{{Seq: 2, WatchID: 0, Revision: 5, Created: true}}
		if between {
			s.Recvs = append(s.Recvs, record.Response{Seq: 4, WatchID: 1, Revision: 4, Created: true})
		}
		s.Recvs = append(s.Recvs, record.Response{Seq: 5, WatchID: 0, Revision: 5, Events: e})
		if !between {
			s.Recvs = append(s.Recvs, record.Response{Seq: 6, WatchID: 1, Revision: 5, Created: true})
		}
		run.Streams = []record.Stream{s}
		return run
	}
	want(t, check(t, mk(false)), PrevKV, 0)
	want(t, check(t, mk(true)), PrevKV, 1)
}

// The same race for a watch from a past revision: the store can build its catch-up before the
// flag is set (seen on etcd 3.7.3 under load, baseline seed 63), events at or below the revision
// known when the create was sent included. Tolerated in the run right after the created, not
// after a response that carried a prev_kv.
func TestMissingPrevKVInACatchUpRightAfterTheCreated(t *testing.T) {
	req := prefix
	req.PrevKV = true
	req.StartRevision = 2
	created := record.Response{WatchID: 0, Revision: 5, Created: true}
	// Revisions 2–5, none with prev_kv: /r/a's update at 4 and /r/b's delete at 5 miss theirs.
	catchUp := record.Response{WatchID: 0, Revision: 5, Events: evs(0, 1, 2, 3, 4)}
	want(t, check(t, oneWatch(req, 5, created, catchUp)), PrevKV, 0)
	// The first response carried /r/a's previous value: the flag was set, /r/b's missing one
	// in the next is not etcd's race.
	first := record.Response{WatchID: 0, Revision: 4, Events: evs(0, 1, 2, 3)}
	first.Events[2].PrevKV = history()[2].PrevKV
	rest := record.Response{WatchID: 0, Revision: 5, Events: evs(4)}
	want(t, check(t, oneWatch(req, 5, created, first, rest)), PrevKV, 1)
}

// Alone on its stream: a missing prev_kv is etcd's race only in the run of responses right after
// the created, before any prev_kv came, and within moments of the created.
func TestMissingPrevKVAloneOnItsStream(t *testing.T) {
	req := prefix
	req.PrevKV = true
	req.StartRevision = 4
	withPrev := evs(2, 3) // revision 4: /r/a's second write (previous value a2), /r/c created
	withPrev[0].PrevKV = history()[2].PrevKV
	noPrev := evs(2, 3)
	del := evs(4) // revision 5: /r/b deleted, without its previous value
	run := func(first []record.Event, secondAt time.Duration) *record.Run {
		r := &record.Run{History: history(), FinalRevision: 5}
		r.Watches = []record.Watch{{ID: 0, Request: req, ResumeOf: -1}}
		s := record.Stream{ID: 0, Client: record.Raw, End: "closed", EndSeq: 20}
		s.Sends = []record.Send{{Seq: 1, Kind: record.SendCreate, Watch: 0, KnownRevision: 3}}
		s.Recvs = []record.Response{
			{Seq: 2, At: time.Millisecond, WatchID: 0, Revision: 3, Created: true},
			{Seq: 3, At: time.Millisecond, WatchID: 0, Revision: 4, Events: first},
			{Seq: 4, At: secondAt, WatchID: 0, Revision: 5, Events: del},
		}
		r.Streams = []record.Stream{s}
		return r
	}
	// Both right after the created, neither with prev_kv: etcd's race.
	want(t, check(t, run(noPrev, 2*time.Millisecond)), PrevKV, 0)
	// The first carried prev_kv: the flag was set, the second's missing one is not etcd's.
	want(t, check(t, run(withPrev, 2*time.Millisecond)), PrevKV, 1)
	// A second later: not the pending responses' flush.
	want(t, check(t, run(noPrev, time.Second)), PrevKV, 1)
}

func TestStreamProgressSpeaksForEveryWatch(t *testing.T) {
	// Two watches; a -1 answer at 5 while the key watch on /r/b has not had its delete.
	run := &record.Run{History: history(), FinalRevision: 5}
	run.Watches = []record.Watch{{ID: 0, Request: prefix, ResumeOf: -1}, {ID: 1, Request: record.CreateRequest{Key: "/r/b", StartRevision: 2}, ResumeOf: -1}}
	s := record.Stream{ID: 0, Client: record.Raw, End: "closed", EndSeq: 20}
	s.Sends = []record.Send{{Seq: 1, Kind: record.SendCreate, Watch: 0}, {Seq: 3, Kind: record.SendCreate, Watch: 1}, {Seq: 8, Kind: record.SendProgress}}
	s.Recvs = []record.Response{
		{Seq: 2, WatchID: 0, Revision: 1, Created: true},
		{Seq: 4, WatchID: 1, Revision: 1, Created: true},
		{Seq: 5, WatchID: 0, Revision: 5, Events: evs(0, 1, 2, 3, 4)},
		{Seq: 6, WatchID: 1, Revision: 3, Events: evs(1)},
		{Seq: 9, WatchID: -1, Revision: 5},
		{Seq: 10, WatchID: 1, Revision: 5, Events: evs(4)},
	}
	run.Streams = []record.Stream{s}
	rep := check(t, run)
	want(t, rep, Bookmarkable, 1)
	if rep.Violations[0].Watch != 1 {
		t.Fatalf("flagged the wrong watch: %v", rep.Violations[0])
	}
}

func TestWatchIDReuseAndLateCancelAck(t *testing.T) {
	run := &record.Run{History: history(), FinalRevision: 5, Compactions: []record.Compaction{{Revision: 3, At: -1}}}
	run.Watches = []record.Watch{{ID: 0, Request: prefix, ResumeOf: -1}, {ID: 1, Request: record.CreateRequest{Key: "/r/", RangeEnd: "/r0", StartRevision: 3}, ResumeOf: 0}}
	s := record.Stream{ID: 0, Client: record.Raw, End: "closed", EndSeq: 20}
	s.Sends = []record.Send{{Seq: 1, Kind: record.SendCreate, Watch: 0}, {Seq: 4, Kind: record.SendCancel, WatchID: 0}, {Seq: 5, Kind: record.SendCreate, Watch: 1}}
	s.Recvs = []record.Response{
		{Seq: 2, WatchID: 0, Revision: 5, Created: true},
		{Seq: 3, WatchID: 0, Canceled: true, CompactRevision: 3},
		{Seq: 6, WatchID: 0, Revision: 5, Canceled: true}, // etcd acks the client's cancel of the compacted watch
		{Seq: 7, WatchID: 1, Revision: 5, Created: true},
		{Seq: 8, WatchID: 1, Revision: 5, Events: evs(1, 2, 3, 4)},
	}
	run.Streams = []record.Stream{s}
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("%v", rep.Violations)
	}
	// The same with the new watch given id 0 again: reused.
	s.Recvs[3].WatchID, s.Recvs[4].WatchID = 0, 0
	s.Recvs[2], s.Recvs[3] = s.Recvs[3], s.Recvs[2]
	s.Recvs[2].Seq, s.Recvs[3].Seq = 6, 7
	run.Streams = []record.Stream{s}
	rep := check(t, run)
	want(t, rep, WatchID, 2) // the id handed out again, then events for it after its cancel
	want(t, rep, Cancel, 1)  // the client's cancel of the old id killed the new watch
}

func TestRangeRules(t *testing.T) {
	base := func() record.Range {
		return record.Range{Key: "/r/", RangeEnd: "/r0", Header: 4, Count: 3}
	}
	h := history()
	run := &record.Run{History: h, FinalRevision: 5}
	// limit 2 of 3 keys: more; keys_only: no value, no lease.
	r := base()
	r.Limit, r.More, r.KeysOnly = 2, true, true
	a, b := h[2].KV, h[1].KV
	a.Value, b.Value, b.Lease = "", "", 0
	r.KVs = []record.KV{a, b}
	run.Ranges = []record.Range{r}
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("%v", rep.Violations)
	}
	// count_only: no kvs, no more.
	r = base()
	r.CountOnly, r.Limit = true, 1
	run.Ranges = []record.Range{r}
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("%v", rep.Violations)
	}
	// A past revision: the state at 3, whatever the header.
	r = base()
	r.Revision, r.Header, r.Count, r.KVs = 3, 5, 2, []record.KV{h[0].KV, h[1].KV}
	run.Ranges = []record.Range{r}
	if rep := check(t, run); rep.Total() != 0 {
		t.Fatalf("%v", rep.Violations)
	}
	// Stale linearizable: header 3 while 4 was acknowledged.
	r = base()
	r.Header, r.Count, r.KVs, r.KnownRevision = 3, 2, []record.KV{h[0].KV, h[1].KV}, 4
	run.Ranges = []record.Range{r}
	rep := check(t, run)
	want(t, rep, Linearizable, 1)
	want(t, rep, Range, 0)
}

const permissionDenied = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"

// limitedRun is oneWatch on a stream of the user limited, who may not read [/r/b, /r/c).
func limitedRun(req record.CreateRequest, resps ...record.Response) *record.Run {
	run := oneWatch(req, 1, resps...)
	run.Streams[0].User = "limited"
	run.Denied = []record.Denied{{User: "limited", Key: "/r/b", End: "/r/c"}}
	return run
}

func TestAWatchTheUserMayNotReadIsRefusedWithNothingElse(t *testing.T) {
	refused := record.Response{WatchID: -1, Revision: 5, Created: true, Canceled: true, CancelReason: permissionDenied}
	rep := check(t, limitedRun(prefix, refused))
	if rep.Total() != 0 {
		t.Fatalf("a refusal as etcd's: %d violations\n%v", rep.Total(), rep.Violations)
	}
	// Served anyway: the secret's events leak.
	want(t, check(t, limitedRun(prefix,
		record.Response{WatchID: 0, Revision: 1, Created: true},
		record.Response{WatchID: 0, Revision: 3, Events: evs(0, 1)})), Permission, 1)
	// Created and kept, nothing delivered yet.
	want(t, check(t, limitedRun(prefix, record.Response{WatchID: 0, Revision: 1, Created: true})), Permission, 1)
	// Refused for another reason.
	other := refused
	other.CancelReason = "injected"
	want(t, check(t, limitedRun(prefix, other)), Permission, 1)
	// The same user on a range it may read is not refused; a refusal there is a cancel etcd
	// would not send.
	allowed := record.CreateRequest{Key: "/r/a", StartRevision: 2}
	rep = check(t, limitedRun(allowed, refused))
	want(t, rep, Cancel, 1)
	want(t, rep, Permission, 0)
	// Another user's stream is not limited's.
	run := limitedRun(prefix, refused)
	run.Streams[0].User = "load"
	want(t, check(t, run), Cancel, 1)
}

func TestDeniedMeetsARangeWhenAnyOfItsKeysIsDenied(t *testing.T) {
	d := record.Denied{User: "u", Key: "/r/b", End: "/r/c"}
	from := record.Denied{User: "u", Key: "/r/b", End: "\x00"}
	for _, tc := range []struct {
		d        record.Denied
		key, end string
		want     bool
	}{
		{d, "/r/b", "", true},
		{d, "/r/b/x", "", true},
		{d, "/r/a", "", false},
		{d, "/r/c", "", false},
		{d, "/r/", "/r0", true},
		{d, "/r/a", "/r/b", false},
		{d, "/r/a", "/r/b\x00", true},
		{d, "/r/c", "/r/d", false},
		{d, "/r/a", "\x00", true},
		{d, "/r/c", "\x00", false},
		{from, "/r/a", "/r/b", false},
		{from, "/r/a", "/r/b0", true},
		{from, "/s", "", true},
		{from, "/r/a", "\x00", true},
	} {
		req := record.CreateRequest{Key: tc.key, RangeEnd: tc.end}
		if got := tc.d.Meets(&req); got != tc.want {
			t.Errorf("%q denied, [%q, %q): meets %v, want %v", tc.d.Key+".."+tc.d.End, tc.key, tc.end, got, tc.want)
		}
	}
}
