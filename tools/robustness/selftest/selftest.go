// Package selftest proves the checker can fail: it takes a recording (a real run's, or a
// synthetic one built here the way etcd would have answered), plants one corruption at a time
// in a copy of it (a dropped event, a duplicate, a reorder, a revision split across two
// responses, a wrong value, a false progress notification, a reused watch id, a wrong compact
// revision, a stale linearizable Range, and more) and checks that the checker flags each one by
// the right property, on the record it was planted in.
//
// etcd counterpart: none in tests/robustness (its validate tests are table-driven); this is the
// mutation-testing half of our checker's unit tests.
package selftest

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"watchcache.local/tools/robustness/checker"
	"watchcache.local/tools/robustness/model"
	"watchcache.local/tools/robustness/record"
)

// Result is one planted corruption and whether it was caught.
type Result struct {
	Name     string
	Property string
	Caught   bool
	Detail   string
}

// A corruption finds a place in the run and changes it; it returns what it did, and which
// stream, watch record or Range it touched (for the sub-run it is checked in).
type corruption struct {
	name, property string
	plant          func(p *planter) (string, error)
}

type planter struct {
	run    *record.Run
	h      *model.History
	stream int // the stream changed, or -1
	watch  int // the watch record concerned, or -1
	rng    int // the Range changed, or -1
}

var errNoPlace = errors.New("no place for it in this recording")

var corruptions = []corruption{
	{"dropped event", checker.Reliable, dropEvent},
	{"duplicated event", checker.Unique, duplicateEvent},
	{"reordered events", checker.Ordered, reorderEvents},
	{"revision split", checker.Atomic, splitRevision},
	{"wrong value", checker.Events, wrongValue},
	{"false progress notification", checker.Bookmarkable, falseProgress},
	{"false progress (watch_id -1)", checker.Bookmarkable, falseStreamProgress},
	{"reused watch id", checker.WatchID, reuseID},
	{"wrong compact revision", checker.Compaction, wrongCompactRevision},
	{"stale linearizable Range", checker.Linearizable, staleRange},
	{"wrong Range answer", checker.Range, wrongRange},
	{"wrong prev_kv", checker.PrevKV, wrongPrevKV},
	{"event outside the range", checker.Filter, foreignEvent},
	{"skipped first event", checker.Resumable, skipFirst},
	{"server cancel", checker.Cancel, serverCancel},
	{"events the user may not read", checker.Permission, permissionLeak},
	{"progress below the start", checker.Bookmarkable, progressBelowStart},
}

// Run plants every corruption in its own copy of run and checks it.
func Run(run *record.Run) ([]Result, error) {
	h, err := model.New(run.History)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, c := range corruptions {
		p := &planter{run: shallow(run), h: h, stream: -1, watch: -1, rng: -1}
		what, err := c.plant(p)
		if err != nil {
			out = append(out, Result{Name: c.name, Property: c.property, Caught: false, Detail: err.Error()})
			continue
		}
		before, err := checker.Check(p.sub(run))
		if err != nil {
			return nil, err
		}
		after, err := checker.Check(p.sub(p.run))
		if err != nil {
			return nil, err
		}
		caught := false
		detail := what + ": not flagged"
		for i := range after.Violations {
			v := &after.Violations[i]
			if v.Property != c.property || !p.concerns(v) {
				continue
			}
			if !contains(before.Violations, v) {
				caught = true
				detail = what + " → " + v.Summary
				break
			}
		}
		out = append(out, Result{Name: c.name, Property: c.property, Caught: caught, Detail: detail})
	}
	return out, nil
}

func contains(vs []checker.Violation, v *checker.Violation) bool {
	for i := range vs {
		if vs[i].Property == v.Property && vs[i].Summary == v.Summary {
			return true
		}
	}
	return false
}

func (p *planter) concerns(v *checker.Violation) bool {
	switch {
	case p.rng >= 0:
		return v.Range == p.rng
	case p.watch >= 0 && v.Watch >= 0:
		return v.Watch == p.watch
	default:
		return v.Stream == p.stream
	}
}

// sub is the part of a run the corruption is checked in: its one stream or Range.
func (p *planter) sub(r *record.Run) *record.Run {
	s := *r
	s.Streams, s.Ranges = nil, nil
	if p.stream >= 0 {
		for _, st := range r.Streams {
			if st.ID == p.stream {
				s.Streams = []record.Stream{st}
			}
		}
	}
	if p.rng >= 0 {
		for _, x := range r.Ranges {
			if x.ID == p.rng {
				s.Ranges = []record.Range{x}
			}
		}
	}
	return &s
}

func shallow(r *record.Run) *record.Run {
	c := *r
	c.Streams = append([]record.Stream(nil), r.Streams...)
	c.Ranges = append([]record.Range(nil), r.Ranges...)
	return &c
}

// own gives the planter a deep copy of stream i to change.
func (p *planter) own(i int) *record.Stream {
	s := &p.run.Streams[i]
	s.Sends = append([]record.Send(nil), s.Sends...)
	recvs := make([]record.Response, len(s.Recvs))
	for j, r := range s.Recvs {
		r.Events = append([]record.Event(nil), r.Events...)
		for k := range r.Events {
			if r.Events[k].PrevKV != nil {
				pk := *r.Events[k].PrevKV
				r.Events[k].PrevKV = &pk
			}
		}
		recvs[j] = r
	}
	s.Recvs = recvs
	p.stream = s.ID
	return s
}

// spread doubles every sequence number of a stream so that a response can be put between two.
func spread(s *record.Stream) {
	for i := range s.Sends {
		s.Sends[i].Seq *= 2
	}
	for i := range s.Recvs {
		s.Recvs[i].Seq *= 2
	}
	s.EndSeq *= 2
}

// ---------------------------------------------------------------------------------------------
// Finding places: watch records with their responses, clean before the corruption.

type place struct {
	stream int   // index into run.Streams
	watch  int   // record id
	resps  []int // indices into the stream's Recvs that belong to the watch (events only)
	id     int64
	hasID  bool
}

// places lists, per stream, each watch record's event responses (attributed as the checker does).
func (p *planter) places() []place {
	var out []place
	for si := range p.run.Streams {
		s := &p.run.Streams[si]
		byWatch := map[int]*place{}
		var order []int
		if s.Client == record.ClientV3 {
			w := -1
			for _, snd := range s.Sends {
				if snd.Kind == record.SendCreate {
					w = snd.Watch
				}
			}
			if w < 0 {
				continue
			}
			pl := &place{stream: si, watch: w}
			for ri := range s.Recvs {
				if len(s.Recvs[ri].Events) > 0 {
					pl.resps = append(pl.resps, ri)
				}
			}
			byWatch[w] = pl
			order = append(order, w)
		} else {
			t := record.NewTracker()
			type item struct {
				seq  int
				send *record.Send
				ri   int
			}
			var items []item
			for i := range s.Sends {
				items = append(items, item{seq: s.Sends[i].Seq, send: &s.Sends[i]})
			}
			for i := range s.Recvs {
				items = append(items, item{seq: s.Recvs[i].Seq, ri: i})
			}
			sort.Slice(items, func(a, b int) bool { return items[a].seq < items[b].seq })
			for _, it := range items {
				if it.send != nil {
					if it.send.Kind == record.SendCreate {
						t.Create(it.send.Watch)
					} else if it.send.Kind == record.SendCancel {
						t.Cancel(it.send.WatchID)
					}
					continue
				}
				r := &s.Recvs[it.ri]
				o := t.Recv(r)
				if o.Watch < 0 {
					continue
				}
				pl := byWatch[o.Watch]
				if pl == nil {
					pl = &place{stream: si, watch: o.Watch}
					byWatch[o.Watch] = pl
					order = append(order, o.Watch)
				}
				if o.Kind == record.OutCreated {
					pl.id, pl.hasID = r.WatchID, true
				}
				if len(r.Events) > 0 {
					pl.resps = append(pl.resps, it.ri)
				}
			}
		}
		for _, w := range order {
			out = append(out, *byWatch[w])
		}
	}
	return out
}

func (p *planter) events(pl place) int {
	n := 0
	for _, ri := range pl.resps {
		n += len(p.run.Streams[pl.stream].Recvs[ri].Events)
	}
	return n
}

// find returns the first place (preferring raw streams, then any) that ok accepts.
func (p *planter) find(ok func(pl place) bool) (place, bool) {
	pls := p.places()
	for _, raw := range []bool{true, false} {
		for _, pl := range pls {
			if (p.run.Streams[pl.stream].Client == record.Raw) == raw && ok(pl) {
				return pl, true
			}
		}
	}
	return place{}, false
}

// clean says whether the checker has nothing against this watch record already.
func (p *planter) clean(pl place) bool {
	s := *p.run
	s.Streams = []record.Stream{p.run.Streams[pl.stream]}
	s.Ranges = nil
	rep, err := checker.Check(&s)
	if err != nil {
		return false
	}
	for _, v := range rep.Violations {
		if v.Watch == pl.watch || v.Watch < 0 {
			return false
		}
	}
	return true
}

func (p *planter) use(pl place) *record.Stream {
	p.watch = pl.watch
	return p.own(pl.stream)
}

// ---------------------------------------------------------------------------------------------
// The corruptions.

func dropEvent(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return len(pl.resps) >= 3 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	r := &s.Recvs[pl.resps[1]]
	e := r.Events[0]
	seq := r.Seq
	r.Events = r.Events[1:]
	if len(r.Events) == 0 {
		removeResp(s, pl.resps[1]) // an empty response would read as a progress notification
	}
	return fmt.Sprintf("watch record %d: dropped %s from response #%d", pl.watch, e.Short(), seq), nil
}

func removeResp(s *record.Stream, ri int) {
	s.Recvs = append(s.Recvs[:ri:ri], s.Recvs[ri+1:]...)
}

func duplicateEvent(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return len(pl.resps) >= 3 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	src := s.Recvs[pl.resps[0]]
	e := src.Events[len(src.Events)-1]
	dst := &s.Recvs[pl.resps[1]]
	dst.Events = append([]record.Event{e}, dst.Events...)
	return fmt.Sprintf("watch record %d: %s again at the start of response #%d", pl.watch, e.Short(), dst.Seq), nil
}

func reorderEvents(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return len(pl.resps) >= 2 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	a, b := &s.Recvs[pl.resps[0]], &s.Recvs[pl.resps[1]]
	a.Events, b.Events = b.Events, a.Events
	a.Revision, b.Revision = b.Revision, a.Revision
	return fmt.Sprintf("watch record %d: the events of responses #%d and #%d swapped", pl.watch, a.Seq, b.Seq), nil
}

// multiRev finds, in a response of the watch, a revision with at least two events.
func multiRev(s *record.Stream, pl place) (ri, cut int, ok bool) {
	for _, i := range pl.resps {
		ev := s.Recvs[i].Events
		for k := 1; k < len(ev); k++ {
			if ev[k].Rev() == ev[k-1].Rev() {
				return i, k, true
			}
		}
	}
	return 0, 0, false
}

func splitRevision(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool {
		_, _, ok := multiRev(&p.run.Streams[pl.stream], pl)
		return ok && p.clean(pl)
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	ri, cut, _ := multiRev(s, pl)
	spread(s)
	orig := s.Recvs[ri]
	first, second := orig, orig
	first.Events = append([]record.Event(nil), orig.Events[:cut]...)
	first.Revision = orig.Events[cut-1].Rev()
	second.Events = append([]record.Event(nil), orig.Events[cut:]...)
	second.Seq = orig.Seq + 1
	recvs := append([]record.Response(nil), s.Recvs[:ri]...)
	recvs = append(recvs, first, second)
	s.Recvs = append(recvs, s.Recvs[ri+1:]...)
	return fmt.Sprintf("watch record %d: response #%d cut inside revision %d", pl.watch, orig.Seq/2, orig.Events[cut].Rev()), nil
}

func wrongValue(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool {
		if len(pl.resps) < 2 || !p.clean(pl) {
			return false
		}
		for _, e := range p.run.Streams[pl.stream].Recvs[pl.resps[1]].Events {
			if e.Type == record.Put {
				return true
			}
		}
		return false
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	r := &s.Recvs[pl.resps[1]]
	for k := range r.Events {
		if r.Events[k].Type == record.Put {
			r.Events[k].KV.Value += "-corrupt"
			return fmt.Sprintf("watch record %d: value of %s changed", pl.watch, r.Events[k].Short()), nil
		}
	}
	return "", errNoPlace
}

// insertBefore puts a progress response right before response ri (after spreading seqs).
func insertBefore(s *record.Stream, ri int, resp record.Response) {
	spread(s)
	resp.Seq = s.Recvs[ri].Seq - 1
	resp.At = s.Recvs[ri].At
	recvs := append([]record.Response(nil), s.Recvs[:ri]...)
	recvs = append(recvs, resp)
	s.Recvs = append(recvs, s.Recvs[ri:]...)
}

func falseProgress(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return len(pl.resps) >= 2 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	ri := pl.resps[1]
	R := s.Recvs[ri].Events[0].Rev()
	insertBefore(s, ri, record.Response{WatchID: pl.id, Revision: R})
	return fmt.Sprintf("watch record %d: a progress notification at %d before the response carrying %d", pl.watch, R, R), nil
}

func falseStreamProgress(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool {
		return p.run.Streams[pl.stream].Client == record.Raw && len(pl.resps) >= 2 && p.clean(pl)
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	ri := pl.resps[1]
	R := s.Recvs[ri].Events[len(s.Recvs[ri].Events)-1].Rev()
	insertBefore(s, ri, record.Response{WatchID: -1, Revision: R})
	return fmt.Sprintf("stream %d: a watch_id -1 progress answer at %d before watch record %d's response carrying it", s.ID, R, pl.watch), nil
}

func reuseID(p *planter) (string, error) {
	// Two records on one raw stream: the later one gets the earlier one's id.
	pls := p.places()
	for i := range pls {
		for j := i + 1; j < len(pls); j++ {
			a, b := pls[i], pls[j]
			if a.stream != b.stream || p.run.Streams[a.stream].Client != record.Raw || !a.hasID || !b.hasID || a.id == b.id {
				continue
			}
			s := p.use(b)
			for k := range s.Recvs {
				if s.Recvs[k].WatchID == b.id {
					s.Recvs[k].WatchID = a.id
				}
			}
			p.watch = -1 // the stream-level or the later record's violation
			return fmt.Sprintf("stream %d: watch record %d given id %d, watch record %d's", s.ID, b.watch, a.id, a.watch), nil
		}
	}
	return "", errNoPlace
}

func wrongCompactRevision(p *planter) (string, error) {
	known := map[int64]bool{}
	for _, c := range p.run.Compactions {
		known[c.Revision] = true
	}
	for si := range p.run.Streams {
		for ri, r := range p.run.Streams[si].Recvs {
			if r.CompactRevision == 0 {
				continue
			}
			s := p.own(si)
			bad := r.CompactRevision + 1
			for known[bad] {
				bad++
			}
			s.Recvs[ri].CompactRevision = bad
			return fmt.Sprintf("stream %d: compaction cancel #%d names %d instead of %d", s.ID, r.Seq, bad, r.CompactRevision), nil
		}
	}
	return "", errNoPlace
}

func staleRange(p *planter) (string, error) {
	for i := range p.run.Ranges {
		x := &p.run.Ranges[i]
		if x.Err != "" || x.Serializable || x.Revision != 0 || x.KnownRevision < 3 || x.Header < x.KnownRevision {
			continue
		}
		stale := x.KnownRevision - 1
		all := p.h.Range(x.Key, x.RangeEnd, stale)
		y := *x
		y.Header, y.Count, y.More, y.KVs = stale, int64(len(all)), false, nil
		kvs := all
		if y.Limit > 0 && int64(len(kvs)) > y.Limit {
			kvs, y.More = kvs[:y.Limit], true
		}
		if y.CountOnly {
			kvs, y.More = nil, false
		}
		for _, kv := range kvs {
			if y.KeysOnly {
				kv.Value, kv.Lease = "", 0
			}
			y.KVs = append(y.KVs, kv)
		}
		*x = y
		p.rng = x.ID
		return fmt.Sprintf("range#%d answered (consistently) at %d though %d had been acknowledged before it", x.ID, stale, x.KnownRevision), nil
	}
	return "", errNoPlace
}

func wrongRange(p *planter) (string, error) {
	for i := range p.run.Ranges {
		x := &p.run.Ranges[i]
		if x.Err != "" || len(x.KVs) == 0 || x.KeysOnly {
			continue
		}
		x.KVs = append([]record.KV(nil), x.KVs...)
		x.KVs[0].Value += "-corrupt"
		p.rng = x.ID
		return fmt.Sprintf("range#%d: value of %s changed", x.ID, x.KVs[0].Key), nil
	}
	return "", errNoPlace
}

func wrongPrevKV(p *planter) (string, error) {
	for _, pl := range p.places() {
		s := &p.run.Streams[pl.stream]
		for _, ri := range pl.resps {
			for k, e := range s.Recvs[ri].Events {
				if e.PrevKV != nil && p.clean(pl) {
					s = p.use(pl)
					s.Recvs[ri].Events[k].PrevKV.Value += "-corrupt"
					return fmt.Sprintf("watch record %d: prev_kv of %s changed", pl.watch, e.Short()), nil
				}
			}
		}
	}
	return "", errNoPlace
}

func foreignEvent(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool {
		if len(pl.resps) < 2 || !p.clean(pl) {
			return false
		}
		return p.run.Watches[pl.watch].Request.RangeEnd == ""
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	req := p.run.Watches[pl.watch].Request
	r := &s.Recvs[pl.resps[1]]
	// Any event of etcd's at that revision for another key, or a made-up one.
	rev := r.Events[0].Rev()
	for i := p.h.FirstAt(rev); i < len(p.h.Events) && p.h.Events[i].Rev() == rev; i++ {
		if !req.InRange(p.h.Events[i].KV.Key) {
			e := p.h.Events[i]
			e.PrevKV = nil
			r.Events = append(r.Events, e)
			return fmt.Sprintf("watch record %d (key %s): %s added", pl.watch, req.Key, e.Short()), nil
		}
	}
	e := r.Events[0]
	e.KV.Key += "-other"
	r.Events = append(r.Events, e)
	return fmt.Sprintf("watch record %d (key %s): %s added", pl.watch, req.Key, e.Short()), nil
}

func skipFirst(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool {
		w := p.run.Watches[pl.watch]
		return len(pl.resps) >= 2 && w.Request.StartRevision > 0 && p.clean(pl)
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	r := &s.Recvs[pl.resps[0]]
	e := r.Events[0]
	// Drop the whole first revision.
	k := 0
	for k < len(r.Events) && r.Events[k].Rev() == e.Rev() {
		k++
	}
	r.Events = r.Events[k:]
	if len(r.Events) == 0 {
		removeResp(s, pl.resps[0])
	}
	return fmt.Sprintf("watch record %d: its first revision %d (%d events) removed", pl.watch, e.Rev(), k), nil
}

func serverCancel(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return beforeClientCancel(p.run, pl) >= 1 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	last := pl.resps[beforeClientCancel(p.run, pl)]
	s := p.use(pl)
	spread(s)
	resp := record.Response{Seq: s.Recvs[last].Seq + 1, At: s.Recvs[last].At, WatchID: pl.id, Revision: s.Recvs[last].Revision, Canceled: true, CancelReason: "injected"}
	recvs := append([]record.Response(nil), s.Recvs[:last+1]...)
	recvs = append(recvs, resp)
	s.Recvs = append(recvs, s.Recvs[last+1:]...)
	return fmt.Sprintf("watch record %d: a cancel the client did not ask for after #%d", pl.watch, s.Recvs[last].Seq), nil
}

// permissionLeak makes a watch that got events one its stream's user may not read: the stream
// carries a user denied the watch's range, as if the target had served what etcd refuses.
func permissionLeak(p *planter) (string, error) {
	pl, ok := p.find(func(pl place) bool { return len(pl.resps) >= 1 && p.clean(pl) })
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	req := p.run.Watches[pl.watch].Request
	end := req.RangeEnd
	if end == "" {
		end = req.Key + "\x00"
	}
	s.User = "planted"
	p.run.Denied = append(append([]record.Denied(nil), p.run.Denied...), record.Denied{User: s.User, Key: req.Key, End: end})
	return fmt.Sprintf("watch record %d: its stream's user may not read [%q, %q)", pl.watch, req.Key, end), nil
}

// beforeClientCancel: the index into pl.resps of the watch's last event response before the
// client first cancelled it (a cancel from the server after that is an answer, not a
// violation), or -1. On a clientv3 stream any cancel counts, as the checker counts it.
func beforeClientCancel(run *record.Run, pl place) int {
	s := &run.Streams[pl.stream]
	cancelSeq := math.MaxInt
	for _, snd := range s.Sends {
		if snd.Kind == record.SendCancel && (s.Client == record.ClientV3 || snd.WatchID == pl.id) && snd.Seq < cancelSeq {
			cancelSeq = snd.Seq
		}
	}
	for i := len(pl.resps) - 1; i >= 0; i-- {
		if s.Recvs[pl.resps[i]].Seq < cancelSeq {
			return i
		}
	}
	return -1
}

func progressBelowStart(p *planter) (string, error) {
	// Not on a clientv3 stream: clientv3 hands a stream's watch_id -1 answers to each of its
	// watches, so the checker rightly lets one at or below the watch's created revision pass
	// (etcd may have computed it before the watch existed); a resumed watch's created revision
	// is at or above its start, so no place there would show the fault.
	pl, ok := p.find(func(pl place) bool {
		return len(pl.resps) >= 1 && p.run.Streams[pl.stream].Client != record.ClientV3 &&
			p.run.Watches[pl.watch].Request.StartRevision > 10 && p.clean(pl)
	})
	if !ok {
		return "", errNoPlace
	}
	s := p.use(pl)
	S := p.run.Watches[pl.watch].Request.StartRevision
	insertBefore(s, pl.resps[0], record.Response{WatchID: pl.id, Revision: S - 5})
	return fmt.Sprintf("watch record %d (start %d): a progress notification at %d before its first event", pl.watch, S, S-5), nil
}
