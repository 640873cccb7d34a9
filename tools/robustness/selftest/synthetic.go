package selftest

import (
	"fmt"
	"math/rand/v2"
	"time"

	"watchcache.local/tools/robustness/record"
)

// Synthetic builds a small recording the way etcd would have answered it: 40 revisions of
// txns over a few keys (some revisions with several events), a compaction, raw streams with
// several watches (one cancelled by the client and followed by another on the same stream, one
// cancelled for compaction and resumed from the compaction revision), a clientv3 watch, progress
// notifications, and Ranges. The checker must find nothing in it.
func Synthetic() *record.Run {
	r := rand.New(rand.NewPCG(10, 10))
	keys := []string{"/registry/a", "/registry/b", "/registry/c", "/registry/d", "/other/x"}
	state := map[string]*record.KV{}
	var hist []record.Event
	const last = 41
	at := func(rev int64) time.Duration { return time.Duration(rev) * 10 * time.Millisecond }
	for rev := int64(2); rev <= last; rev++ {
		n := 1 + r.IntN(3)
		perm := r.Perm(len(keys))
		added := 0
		for _, ki := range perm {
			if added == n {
				break
			}
			k := keys[ki]
			prev := state[k]
			if prev != nil && r.IntN(4) == 0 {
				p := *prev
				hist = append(hist, record.Event{Type: record.Delete, KV: record.KV{Key: k, ModRevision: rev}, PrevKV: &p})
				state[k] = nil
				added++
				continue
			}
			kv := record.KV{Key: k, Value: fmt.Sprintf("v%d", rev), ModRevision: rev, CreateRevision: rev, Version: 1}
			ev := record.Event{Type: record.Put, KV: kv}
			if prev != nil {
				kv.CreateRevision, kv.Version = prev.CreateRevision, prev.Version+1
				p := *prev
				ev.KV, ev.PrevKV = kv, &p
			}
			c := kv
			state[k] = &c
			hist = append(hist, ev)
			added++
		}
	}
	run := &record.Run{Seed: 0, Target: "synthetic", History: hist, FinalRevision: last,
		Compactions: []record.Compaction{{Revision: 20, At: at(22)}}}

	// deliver builds the responses etcd would send a watch for [from, to]: one per revision, or
	// batches of `batch` revisions (a catch-up).
	deliver := func(req record.CreateRequest, id int64, from, to int64, batch int) []record.Response {
		var out []record.Response
		var cur *record.Response
		revs := 0
		for _, e := range hist {
			if e.Rev() < from || e.Rev() > to || !req.Matches(&e) {
				continue
			}
			if !req.PrevKV {
				e.PrevKV = nil
			}
			if cur == nil || (cur.Events[len(cur.Events)-1].Rev() != e.Rev() && revs >= batch) {
				out = append(out, record.Response{WatchID: id})
				cur = &out[len(out)-1]
				revs = 0
			}
			if len(cur.Events) == 0 || cur.Events[len(cur.Events)-1].Rev() != e.Rev() {
				revs++
			}
			cur.Events = append(cur.Events, e)
			cur.Revision = e.Rev()
			cur.At = at(e.Rev()) + time.Millisecond
		}
		return out
	}
	type sb struct {
		s   record.Stream
		seq int
	}
	seq := func(b *sb) int { b.seq++; return b.seq }
	addWatch := func(stream int, req record.CreateRequest, kind, start string, resumeOf int) int {
		id := len(run.Watches)
		run.Watches = append(run.Watches, record.Watch{ID: id, Stream: stream, Request: req, Kind: kind, StartKind: start, ResumeOf: resumeOf})
		return id
	}
	create := func(b *sb, w int, t time.Duration, known int64) {
		b.s.Sends = append(b.s.Sends, record.Send{Seq: seq(b), At: t, Kind: record.SendCreate, Watch: w, KnownRevision: known})
	}
	recv := func(b *sb, rs ...record.Response) {
		for _, x := range rs {
			x.Seq = seq(b)
			b.s.Recvs = append(b.s.Recvs, x)
		}
	}

	// Stream 0 (raw): a prefix watch from 2 with prev_kv; a key watch "from now" cancelled by the
	// client; then a range watch on the same stream (a new id).
	s0 := &sb{s: record.Stream{ID: 0, Client: record.Raw, Slot: 0, Target: "synthetic"}}
	prefix := record.CreateRequest{Key: "/registry/", RangeEnd: "/registry0", StartRevision: 2, PrevKV: true, ProgressNotify: true}
	w0 := addWatch(0, prefix, "prefix", "1", -1)
	create(s0, w0, 0, 1)
	recv(s0, record.Response{WatchID: 0, Revision: 1, Created: true})
	keyReq := record.CreateRequest{Key: "/registry/a"}
	w1 := addWatch(0, keyReq, "key", "0", -1)
	d0 := deliver(prefix, 0, 2, last, 1)
	// Interleave: the prefix watch's responses up to 10, the key watch's create at 10.
	i := 0
	for ; i < len(d0) && d0[i].Revision <= 10; i++ {
		recv(s0, d0[i])
	}
	create(s0, w1, at(10)+2*time.Millisecond, 10)
	recv(s0, record.Response{WatchID: 1, Revision: 10, Created: true, At: at(10) + 3*time.Millisecond})
	d1 := deliver(keyReq, 1, 11, 25, 1)
	j := 0
	for ; i < len(d0) && d0[i].Revision <= 25; i++ {
		for j < len(d1) && d1[j].Revision <= d0[i].Revision {
			recv(s0, d1[j])
			j++
		}
		recv(s0, d0[i])
	}
	for ; j < len(d1); j++ {
		recv(s0, d1[j])
	}
	s0.s.Sends = append(s0.s.Sends, record.Send{Seq: seq(s0), At: at(25) + 5*time.Millisecond, Kind: record.SendCancel, WatchID: 1, Reason: "client"})
	recv(s0, record.Response{WatchID: 1, Revision: 25, Canceled: true, At: at(25) + 6*time.Millisecond})
	rangeReq := record.CreateRequest{Key: "/registry/b", RangeEnd: "/registry/d", StartRevision: 26, NoDelete: true}
	w2 := addWatch(0, rangeReq, "range", "recent", -1)
	create(s0, w2, at(25)+7*time.Millisecond, 25)
	recv(s0, record.Response{WatchID: 2, Revision: 25, Created: true, At: at(25) + 8*time.Millisecond})
	d2 := deliver(rangeReq, 2, 26, last, 1)
	j = 0
	for ; i < len(d0); i++ {
		for j < len(d2) && d2[j].Revision <= d0[i].Revision {
			recv(s0, d2[j])
			j++
		}
		recv(s0, d0[i])
	}
	for ; j < len(d2); j++ {
		recv(s0, d2[j])
	}
	s0.s.Sends = append(s0.s.Sends, record.Send{Seq: seq(s0), At: at(last) + 10*time.Millisecond, Kind: record.SendProgress})
	recv(s0, record.Response{WatchID: -1, Revision: last, At: at(last) + 11*time.Millisecond})
	recv(s0, record.Response{WatchID: 0, Revision: last, At: at(last) + 2*time.Second})
	s0.s.End, s0.s.EndSeq, s0.s.EndAt = "closed", seq(s0), at(last)+3*time.Second
	run.Watches[w0].OpenAtEnd, run.Watches[w0].Drained = true, true
	run.Watches[w2].OpenAtEnd, run.Watches[w2].Drained = true, true

	// Stream 1 (raw): a watch from 5 after the compaction at 20 is cancelled for it, the client
	// cancels the id as clientv3 does, and watches again from 20 (a catch-up in batches).
	s1 := &sb{s: record.Stream{ID: 1, Client: record.Raw, Slot: 1, Target: "synthetic"}}
	old := record.CreateRequest{Key: "/registry/", RangeEnd: "/registry0", StartRevision: 5, PrevKV: true}
	w3 := addWatch(1, old, "prefix", "compacted", -1)
	create(s1, w3, at(30), 30)
	recv(s1, record.Response{WatchID: 0, Revision: 30, Created: true, At: at(30) + time.Millisecond},
		record.Response{WatchID: 0, Canceled: true, CompactRevision: 20, At: at(30) + 2*time.Millisecond, CancelReason: "etcdserver: mvcc: required revision has been compacted"})
	s1.s.Sends = append(s1.s.Sends, record.Send{Seq: seq(s1), At: at(30) + 3*time.Millisecond, Kind: record.SendCancel, WatchID: 0, Reason: "after server cancel"})
	again := old
	again.StartRevision = 20
	w4 := addWatch(1, again, "prefix", "after-compaction", w3)
	create(s1, w4, at(30)+4*time.Millisecond, 30)
	recv(s1, record.Response{WatchID: 1, Revision: 30, Created: true, At: at(30) + 5*time.Millisecond})
	d4 := deliver(again, 1, 20, last, 3)
	for k := range d4 {
		if d4[k].At < at(30)+6*time.Millisecond {
			d4[k].At = at(30) + 6*time.Millisecond
		}
		for e := range d4[k].Events {
			// etcd cannot read prev_kv below the compaction: missing is what it sends.
			if d4[k].Events[e].Rev()-1 < 20 {
				d4[k].Events[e].PrevKV = nil
			}
		}
	}
	recv(s1, d4...)
	s1.s.End, s1.s.EndSeq, s1.s.EndAt = "closed", seq(s1), at(last)+3*time.Second
	run.Watches[w4].OpenAtEnd, run.Watches[w4].Drained = true, false

	// Stream 2 (clientv3): puts only under the prefix from 30, a progress notification at the end.
	s2 := &sb{s: record.Stream{ID: 2, Client: record.ClientV3, Slot: 2, Target: "synthetic"}}
	v3 := record.CreateRequest{Key: "/registry/", RangeEnd: "/registry0", StartRevision: 30, NoDelete: true, ProgressNotify: true}
	w5 := addWatch(2, v3, "prefix", "recent", -1)
	create(s2, w5, at(30), 30)
	recv(s2, record.Response{Revision: 30, Created: true, At: at(30) + time.Millisecond})
	recv(s2, deliver(v3, 0, 30, last, 1)...)
	recv(s2, record.Response{Revision: last, At: at(last) + 2*time.Second})
	s2.s.End, s2.s.EndSeq, s2.s.EndAt = "closed", seq(s2), at(last)+3*time.Second
	run.Watches[w5].OpenAtEnd, run.Watches[w5].Drained = true, true

	run.Streams = []record.Stream{s0.s, s1.s, s2.s}

	// Ranges: answers at their revision from the same history.
	stateAt := func(key, end string, rev int64) []record.KV {
		cur := map[string]record.KV{}
		for _, e := range hist {
			if e.Rev() > rev {
				break
			}
			if e.Type == record.Delete {
				delete(cur, e.KV.Key)
			} else {
				cur[e.KV.Key] = e.KV
			}
		}
		var out []record.KV
		for _, k := range keys {
			if kv, ok := cur[k]; ok && record.InRange(key, end, k) {
				out = append(out, kv)
			}
		}
		return out
	}
	all := stateAt("/registry/", "/registry0", last)
	run.Ranges = append(run.Ranges, record.Range{ID: 0, Start: at(last) + time.Second, End: at(last) + time.Second, Key: "/registry/", RangeEnd: "/registry0",
		KnownRevision: last, Header: last, KVs: all, Count: int64(len(all))})
	mid := stateAt("/registry/", "/registry0", 35)
	run.Ranges = append(run.Ranges, record.Range{ID: 1, Start: at(35), End: at(35), Key: "/registry/", RangeEnd: "/registry0",
		KnownRevision: 33, Header: 35, KVs: mid, Count: int64(len(mid))})
	past := stateAt("/registry/", "\x00", 15)
	lim := past
	more := false
	if len(lim) > 1 {
		lim, more = lim[:1], true
	}
	run.Ranges = append(run.Ranges, record.Range{ID: 2, Start: at(36), End: at(36), Key: "/registry/", RangeEnd: "\x00", Revision: 15, Limit: 1,
		Serializable: true, KnownRevision: 36, Header: 36, KVs: lim, Count: int64(len(past)), More: more})
	return run
}
