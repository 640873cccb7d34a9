package checker

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"watchcache.local/tools/robustness/record"
)

// progress is one progress notification that speaks for a watch: its own periodic one, or a
// watch_id -1 answer on its stream while it was open and not being cancelled.
type progress struct {
	resp   *record.Response
	stream bool // a watch_id -1 answer
}

// view is one watch record with the responses that belong to it.
type view struct {
	rec       *record.Watch
	st        *record.Stream
	create    *record.Send
	resps     []*record.Response // its own responses (created, events, periodic progress, cancel)
	progress  []progress
	cancelAt  int // seq of the client's cancel, or 0
	closedBy  string
	closedSeq int
}

func (c *checker) header(v *view) string {
	s := v.st
	kind := s.Client
	if s.Slow {
		kind += ", slow reader"
	}
	id := "?"
	for _, r := range v.resps {
		if r.Created {
			id = fmt.Sprint(r.WatchID)
			break
		}
	}
	if s.Client == record.ClientV3 {
		id = "(clientv3)"
	}
	h := fmt.Sprintf("stream %d (%s, slot %d) · watch record %d, watch id %s · %s watch, start %s", s.ID, kind, s.Slot, v.rec.ID, id, v.rec.Kind, v.rec.StartKind)
	if v.rec.ResumeOf >= 0 {
		h += fmt.Sprintf(" (resumes record %d)", v.rec.ResumeOf)
	}
	return h
}

func (c *checker) createLine(v *view) string {
	at := ""
	if v.create != nil {
		at = fmt.Sprintf("#%d +%.3fs ", v.create.Seq, v.create.At.Seconds())
	}
	return "create " + at + v.rec.Request.String()
}

func (c *checker) watchViolation(v *view, prop string, rev int64, at *record.Response, summary string, details ...string) {
	d := []string{c.header(v), c.createLine(v)}
	d = append(d, details...)
	vi := Violation{Property: prop, Stream: v.st.ID, Watch: v.rec.ID, Range: -1, Rev: rev, Summary: summary, Details: d}
	if at != nil {
		vi.At = at.At
	}
	c.add(vi)
}

func (c *checker) streamViolation(s *record.Stream, prop string, r *record.Response, summary string, details ...string) {
	kind := s.Client
	if s.Slow {
		kind += ", slow reader"
	}
	d := append([]string{fmt.Sprintf("stream %d (%s, slot %d)", s.ID, kind, s.Slot)}, details...)
	vi := Violation{Property: prop, Stream: s.ID, Watch: -1, Range: -1, Summary: summary, Details: d}
	if r != nil {
		vi.At = r.At
		vi.Rev = r.Revision
	}
	c.add(vi)
}

// stream attributes a stream's responses to its watch records and checks each of them.
func (c *checker) stream(s *record.Stream) {
	views := map[int]*view{}
	var order []int
	get := func(w int) *view {
		if v, ok := views[w]; ok {
			return v
		}
		v := &view{rec: &c.run.Watches[w], st: s}
		views[w] = v
		order = append(order, w)
		return v
	}
	// Merge the sends and receives by sequence number.
	type item struct {
		send *record.Send
		recv *record.Response
	}
	items := make([]item, 0, len(s.Sends)+len(s.Recvs))
	for i := range s.Sends {
		items = append(items, item{send: &s.Sends[i]})
	}
	for i := range s.Recvs {
		items = append(items, item{recv: &s.Recvs[i]})
	}
	seqOf := func(it item) int {
		if it.send != nil {
			return it.send.Seq
		}
		return it.recv.Seq
	}
	sort.SliceStable(items, func(i, j int) bool { return seqOf(items[i]) < seqOf(items[j]) })

	if s.Client == record.ClientV3 {
		// One watch per record: every response off the channel is its own, progress included.
		for _, it := range items {
			if it.send != nil {
				switch it.send.Kind {
				case record.SendCreate:
					v := get(it.send.Watch)
					v.create = it.send
				case record.SendCancel:
					for _, v := range views {
						if v.cancelAt == 0 {
							v.cancelAt = it.send.Seq
						}
					}
				}
				continue
			}
			r := it.recv
			for _, w := range order {
				v := views[w]
				v.resps = append(v.resps, r)
				if r.IsProgressNotify() {
					v.progress = append(v.progress, progress{resp: r})
				}
				if r.Canceled && v.closedBy == "" {
					v.closedSeq = r.Seq
					if r.CompactRevision != 0 {
						v.closedBy = "compaction"
					} else if v.cancelAt != 0 {
						v.closedBy = "client"
					} else {
						v.closedBy = "server"
					}
				}
			}
		}
	} else {
		t := record.NewTracker()
		lastCreated := map[int64]*view{}
		for _, it := range items {
			if it.send != nil {
				switch it.send.Kind {
				case record.SendCreate:
					v := get(it.send.Watch)
					v.create = it.send
					t.Create(it.send.Watch)
				case record.SendCancel:
					if w := t.Cancel(it.send.WatchID); w >= 0 && views[w].cancelAt == 0 {
						views[w].cancelAt = it.send.Seq
					}
				}
				continue
			}
			r := it.recv
			out := t.Recv(r)
			switch out.Kind {
			case record.OutUnsolicitedCreated:
				c.streamViolation(s, Created, r, fmt.Sprintf("stream %d: a created response (watch id %d) while no create was pending", s.ID, r.WatchID),
					"response "+r.Describe(6, nil))
			case record.OutUnknownID:
				prev := ""
				if pv, ok := lastCreated[r.WatchID]; ok {
					prev = fmt.Sprintf(" (last held by watch record %d, closed by %s at #%d)", pv.rec.ID, pv.closedBy, pv.closedSeq)
				}
				c.streamViolation(s, WatchID, r, fmt.Sprintf("stream %d: a response for watch id %d, which no open watch holds%s", s.ID, r.WatchID, prev),
					"response "+r.Describe(6, nil))
			case record.OutLateCancelAck:
				// etcd acknowledges the client's cancel of a watch it had cancelled itself.
			case record.OutStreamProgress:
				for _, w := range out.Applies {
					v := get(w)
					v.progress = append(v.progress, progress{resp: r, stream: true})
				}
			default:
				v := get(out.Watch)
				v.resps = append(v.resps, r)
				switch out.Kind {
				case record.OutCreated:
					if out.ReusedFrom >= 0 {
						old := get(out.ReusedFrom)
						state := "still open"
						if old.closedBy != "" {
							state = fmt.Sprintf("closed by %s at #%d", old.closedBy, old.closedSeq)
						}
						c.watchViolation(v, WatchID, r.Revision, r, fmt.Sprintf("stream %d: watch id %d handed out again (it was watch record %d's, %s); etcd never reuses an id on a stream",
							s.ID, r.WatchID, old.rec.ID, state),
							"earlier holder: "+c.createLine(old), "created "+r.Describe(4, nil))
					}
					lastCreated[r.WatchID] = v
				case record.OutCreateRejected:
					v.closedBy, v.closedSeq = "server", r.Seq
					if r.CompactRevision != 0 {
						v.closedBy = "compaction"
					}
				case record.OutCancelAck:
					v.closedBy, v.closedSeq = "client", r.Seq
				case record.OutServerCancel:
					v.closedBy, v.closedSeq = "server", r.Seq
					if r.CompactRevision != 0 {
						v.closedBy = "compaction"
					}
				case record.OutWatch:
					if r.IsProgressNotify() {
						v.progress = append(v.progress, progress{resp: r})
					}
				}
			}
		}
		_, pending := t.Open()
		for _, w := range pending {
			v := get(w)
			if s.End == "closed" && v.create != nil && s.EndAt-v.create.At > 10e9 {
				c.watchViolation(v, Created, 0, nil, fmt.Sprintf("stream %d: create sent at +%.3fs never acknowledged (stream open %.1fs longer)",
					s.ID, v.create.At.Seconds(), (s.EndAt-v.create.At).Seconds()))
			}
		}
	}
	for _, w := range order {
		c.watch(views[w])
	}
}

// got is one received event.
type got struct {
	ev   *record.Event
	resp *record.Response
	ri   int // index of resp in the view
	hi   int // index in the history, or -1
}

func (c *checker) watch(v *view) {
	req := &v.rec.Request
	if d := c.run.DeniedTo(v.st.User, req); d != nil {
		c.denied(v, d)
		return
	}
	final := c.run.FinalRevision
	var created *record.Response
	createdCount := 0
	var evs []got
	for ri, r := range v.resps {
		if r.Created {
			createdCount++
			if created == nil {
				created = r
			}
		}
		for i := range r.Events {
			e := &r.Events[i]
			hi, ok := c.h.Index(e.Rev(), e.KV.Key)
			if !ok {
				hi = -1
			}
			evs = append(evs, got{ev: e, resp: r, ri: ri, hi: hi})
		}
	}
	if v.st.Client == record.ClientV3 {
		onlyCancel := len(v.resps) == 1 && v.resps[0].Canceled
		if createdCount > 1 || (createdCount == 0 && len(v.resps) > 0 && !onlyCancel) {
			c.watchViolation(v, Created, 0, created, fmt.Sprintf("watch record %d: %d created responses (clientv3 with WithCreatedNotify passes exactly one)", v.rec.ID, createdCount))
		} else if len(v.resps) > 0 && !v.resps[0].Created && !onlyCancel {
			c.watchViolation(v, Created, 0, v.resps[0], fmt.Sprintf("watch record %d: a response before its created response", v.rec.ID), "first "+v.resps[0].Describe(4, nil))
		}
	}
	if created == nil && len(evs) == 0 && len(v.progress) == 0 {
		return
	}

	// The start: requested, or for "from now" watches the store's revision when it was created,
	// somewhere after what had been acknowledged before the create was sent and at most the
	// created response's header revision (etcd reads that header after registering the watch).
	lower, strict := req.StartRevision, req.StartRevision
	if req.StartRevision == 0 {
		lower = 1
		if v.create != nil {
			lower = v.create.KnownRevision + 1
		}
		strict = math.MaxInt64
		if created != nil {
			strict = created.Revision + 1
		}
	}
	from := strict
	for _, g := range evs {
		if g.hi >= 0 && req.Matches(g.ev) && g.ev.Rev() >= lower {
			if g.ev.Rev() < from {
				from = g.ev.Rev()
			}
			break
		}
	}

	// Per event: contents, filters, prev_kv, before the start.
	for _, g := range evs {
		e := g.ev
		if !req.Matches(e) {
			c.watchViolation(v, Filter, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s does not match the request", v.rec.ID, e.Short()),
				"in "+c.respLine(v, g.resp, e))
		}
		if g.hi < 0 {
			c.watchViolation(v, Events, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s is not in etcd's history (etcd at %d: %s)", v.rec.ID, e.Short(), e.Rev(), c.atRev(e.Rev())),
				"event "+e.Long(), "in "+c.respLine(v, g.resp, e))
			continue
		}
		want := &c.h.Events[g.hi]
		if e.Type != want.Type || !e.KV.Equal(&want.KV) {
			c.watchViolation(v, Events, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s differs from etcd's event", v.rec.ID, e.Short()),
				"got   "+e.Long(), "etcd  "+want.Long(), "in "+c.respLine(v, g.resp, e))
		}
		if e.Rev() < lower {
			c.watchViolation(v, Resumable, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s is before the watch's start (revision %d)", v.rec.ID, e.Short(), lower),
				"in "+c.respLine(v, g.resp, e))
		}
		c.prevKV(v, g)
	}

	// Ordered and unique, in arrival order; etcd's order inside a revision is the history's.
	seen := map[int]*record.Response{}
	seenOdd := map[string]bool{}
	maxHi := -1
	for _, g := range evs {
		if g.hi < 0 {
			k := fmt.Sprintf("%d/%s", g.ev.Rev(), g.ev.KV.Key)
			if seenOdd[k] {
				c.watchViolation(v, Unique, g.ev.Rev(), g.resp, fmt.Sprintf("watch record %d: %s delivered twice", v.rec.ID, g.ev.Short()), "in "+c.respLine(v, g.resp, g.ev))
			}
			seenOdd[k] = true
			if maxHi >= 0 && g.ev.Rev() < c.h.Events[maxHi].Rev() {
				c.watchViolation(v, Ordered, g.ev.Rev(), g.resp, fmt.Sprintf("watch record %d: %s after %s", v.rec.ID, g.ev.Short(), c.h.Events[maxHi].Short()),
					"in "+c.respLine(v, g.resp, g.ev))
			}
			continue
		}
		if first, dup := seen[g.hi]; dup {
			c.watchViolation(v, Unique, g.ev.Rev(), g.resp, fmt.Sprintf("watch record %d: %s delivered twice (first at #%d, again at #%d)", v.rec.ID, g.ev.Short(), first.Seq, g.resp.Seq),
				"first "+c.respLine(v, first, g.ev), "again "+c.respLine(v, g.resp, g.ev))
			continue
		}
		seen[g.hi] = g.resp
		if g.hi < maxHi {
			prev := &c.h.Events[maxHi]
			what := "out of revision order"
			if prev.Rev() == g.ev.Rev() {
				what = "out of etcd's order inside revision " + fmt.Sprint(g.ev.Rev())
			}
			c.watchViolation(v, Ordered, g.ev.Rev(), g.resp, fmt.Sprintf("watch record %d: %s after %s (%s)", v.rec.ID, g.ev.Short(), prev.Short(), what),
				"in "+c.respLine(v, g.resp, g.ev))
		} else {
			maxHi = g.hi
		}
	}
	for _, r := range v.resps {
		if n := len(r.Events); n > 0 && r.Revision < r.Events[n-1].Rev() {
			c.watchViolation(v, Ordered, r.Revision, r, fmt.Sprintf("watch record %d: response header revision %d below its last event %s", v.rec.ID, r.Revision, r.Events[n-1].Short()),
				"response "+r.Describe(6, nil))
		}
	}

	// The range the watch answers for: from its start through the last revision it saw (an
	// event or a progress notification), or through the final revision if it was open at the end.
	var to int64
	lastEvRev := int64(0)
	for _, g := range evs {
		if g.ev.Rev() > lastEvRev {
			lastEvRev = g.ev.Rev()
		}
	}
	to = lastEvRev
	for _, p := range v.progress {
		if p.resp.Revision > to {
			to = p.resp.Revision
		}
	}
	if v.rec.OpenAtEnd && final > to {
		to = final
	}
	if from == math.MaxInt64 {
		// A "from now" watch that was never acknowledged and got no event.
		return
	}
	expected := c.h.Matching(req, from, to)
	recvSeq := make([]int, len(expected)) // seq of each expected event's first receipt, or MaxInt
	pos := map[int]int{}
	for j, hi := range expected {
		pos[hi] = j
		recvSeq[j] = math.MaxInt
	}
	firstJ := -1
	for _, g := range evs {
		if g.hi < 0 {
			continue
		}
		j, ok := pos[g.hi]
		if !ok {
			continue
		}
		if recvSeq[j] == math.MaxInt {
			recvSeq[j] = g.resp.Seq
		}
		if firstJ < 0 {
			firstJ = j
		}
	}

	// Resumable: the first event is etcd's first matching event at or after the start.
	if firstJ > 0 {
		var skipped []int
		for j := 0; j < firstJ; j++ {
			if recvSeq[j] == math.MaxInt {
				skipped = append(skipped, expected[j])
			}
		}
		if len(skipped) > 0 {
			first := &c.h.Events[expected[firstJ]]
			c.watchViolation(v, Resumable, c.h.Events[expected[0]].Rev(), nil,
				fmt.Sprintf("watch record %d: first event %s, but etcd's first matching event at or after %d is %s (%d skipped)", v.rec.ID, first.Short(), from, c.h.Events[expected[0]].Short(), len(skipped)),
				"skipped: "+c.describeEvents(skipped, 10), "first "+c.firstResp(v, first))
		}
	}

	// Reliable: no gap from the start to the last revision seen.
	end := ""
	switch {
	case v.closedBy != "":
		end = fmt.Sprintf("closed by %s at #%d", v.closedBy, v.closedSeq)
	case v.rec.OpenAtEnd:
		end = fmt.Sprintf("open at the end of the run (final revision %d, drained: %v)", final, v.rec.Drained)
	default:
		end = "its stream ended: " + v.st.End
	}
	startJ := firstJ
	if startJ < 0 {
		startJ = 0
	}
	for j := startJ; j < len(expected); {
		if recvSeq[j] != math.MaxInt {
			j++
			continue
		}
		k := j
		for k < len(expected) && recvSeq[k] == math.MaxInt {
			k++
		}
		gap := expected[j:k]
		before, after := "none", "none"
		if j > 0 {
			before = c.firstResp(v, &c.h.Events[expected[j-1]])
		}
		if k < len(expected) {
			after = c.firstResp(v, &c.h.Events[expected[k]])
		}
		why := fmt.Sprintf("the watch saw revision %d", to)
		if v.rec.OpenAtEnd && to == final {
			why = fmt.Sprintf("the watch was open until the end (etcd's final revision %d)", final)
		}
		c.watchViolation(v, Reliable, c.h.Events[gap[0]].Rev(), nil,
			fmt.Sprintf("watch record %d: %d events lost in %d..%d (%s; %s)", v.rec.ID, len(gap), c.h.Events[gap[0]].Rev(), c.h.Events[gap[len(gap)-1]].Rev(), why, end),
			"lost: "+c.describeEvents(gap, 10), "before the gap: "+before, "after the gap: "+after)
		j = k
	}

	// Atomic: whole revisions per response.
	type revInfo struct {
		resps []*record.Response
		got   int
	}
	revs := map[int64]*revInfo{}
	var revOrder []int64
	counted := map[int]bool{}
	for _, g := range evs {
		if g.hi < 0 || !req.Matches(g.ev) || counted[g.hi] {
			continue
		}
		counted[g.hi] = true
		ri := revs[g.ev.Rev()]
		if ri == nil {
			ri = &revInfo{}
			revs[g.ev.Rev()] = ri
			revOrder = append(revOrder, g.ev.Rev())
		}
		if len(ri.resps) == 0 || ri.resps[len(ri.resps)-1] != g.resp {
			ri.resps = append(ri.resps, g.resp)
		}
		ri.got++
	}
	for _, rev := range revOrder {
		ri := revs[rev]
		if rev < from || rev > to {
			continue
		}
		want := c.h.Matching(req, rev, rev)
		if len(ri.resps) > 1 {
			var lines []string
			for _, r := range ri.resps {
				n := 0
				for i := range r.Events {
					if r.Events[i].Rev() == rev {
						n++
					}
				}
				lines = append(lines, fmt.Sprintf("%d of them in %s", n, c.respLine(v, r, nil)))
			}
			c.watchViolation(v, Atomic, rev, ri.resps[1],
				fmt.Sprintf("watch record %d: revision %d (%d matching events) split across %d responses", v.rec.ID, rev, len(want), len(ri.resps)), lines...)
		} else if ri.got < len(want) {
			var missing []int
			for _, hi := range want {
				if !counted[hi] {
					missing = append(missing, hi)
				}
			}
			c.watchViolation(v, Atomic, rev, ri.resps[0],
				fmt.Sprintf("watch record %d: response #%d carries %d of the %d matching events of revision %d", v.rec.ID, ri.resps[0].Seq, ri.got, len(want), rev),
				"response "+c.respLine(v, ri.resps[0], nil), "never delivered: "+c.describeEvents(missing, 10))
		}
	}

	if v.st.Client == record.ClientV3 && created != nil {
		// clientv3 passes watch_id -1 answers on as the watch's own progress: as for raw
		// streams, one at or below the created header may have been computed before the watch.
		kept := v.progress[:0:0]
		for _, p := range v.progress {
			if p.resp.Revision > created.Revision {
				kept = append(kept, p)
			}
		}
		v.progress = kept
	}
	c.bookmarks(v, evs, expected, recvSeq)
	c.cancels(v, evs, from)
}

// bookmarks: a progress notification at R comes after every matching event up to R (and
// etcd's rules: progress never goes back, nor below an event already delivered).
func (c *checker) bookmarks(v *view, evs []got, expected []int, recvSeq []int) {
	prefixMax := make([]int, len(expected))
	m := 0
	for j, s := range recvSeq {
		if s > m {
			m = s
		}
		prefixMax[j] = m
	}
	var prevR int64
	var prevP *record.Response
	var lastBefore *record.Event // the highest event received before the notification
	sameLoss := map[int]int{}    // first missing event -> index of its violation
	sameCount := map[int]int{}
	ei := 0
	for _, p := range v.progress {
		r := p.resp
		R := r.Revision
		kind := "periodic progress notification"
		if p.stream {
			kind = "progress answer (watch_id -1)"
		}
		if v.st.Client == record.ClientV3 {
			kind = "progress notification"
		}
		for ; ei < len(evs) && evs[ei].resp.Seq < r.Seq; ei++ {
			if lastBefore == nil || evs[ei].ev.Rev() > lastBefore.Rev() {
				lastBefore = evs[ei].ev
			}
		}
		if prevP != nil && R < prevR {
			c.watchViolation(v, Bookmarkable, R, r, fmt.Sprintf("watch record %d: %s at %d after one at %d (progress went back)", v.rec.ID, kind, R, prevR),
				"earlier "+prevP.Describe(0, nil), "later   "+r.Describe(0, nil))
		}
		if lastBefore != nil && R < lastBefore.Rev() {
			c.watchViolation(v, Bookmarkable, R, r, fmt.Sprintf("watch record %d: %s at %d after event %s", v.rec.ID, kind, R, lastBefore.Short()),
				"progress "+r.Describe(0, nil))
		}
		if S := v.rec.Request.StartRevision; S > 0 && R < S-1 {
			// etcd sends no progress below a watch's start (the fix of etcd #20221): clientv3
			// would resume such a watch from R+1 and replay revisions it never asked for.
			c.watchViolation(v, Bookmarkable, R, r, fmt.Sprintf("watch record %d: %s at %d, below the watch's start revision %d", v.rec.ID, kind, R, S),
				"progress "+r.Describe(0, nil))
		}
		if c.run.FinalRevision > 0 && R > c.run.FinalRevision {
			c.watchViolation(v, Bookmarkable, R, r, fmt.Sprintf("watch record %d: %s at %d, beyond etcd's final revision %d", v.rec.ID, kind, R, c.run.FinalRevision),
				"progress "+r.Describe(0, nil))
		}
		j := sort.Search(len(expected), func(j int) bool { return c.h.Events[expected[j]].Rev() > R })
		if j > 0 && prefixMax[j-1] > r.Seq {
			var missing []int
			var lateAt []string
			for k := 0; k < j; k++ {
				if recvSeq[k] > r.Seq {
					missing = append(missing, expected[k])
					if recvSeq[k] != math.MaxInt && len(lateAt) < 3 {
						lateAt = append(lateAt, fmt.Sprintf("%s arrived later at #%d", c.h.Events[expected[k]].Short(), recvSeq[k]))
					}
				}
			}
			never := 0
			for k := 0; k < j; k++ {
				if recvSeq[k] == math.MaxInt {
					never++
				}
			}
			d := []string{"progress " + r.Describe(0, nil)}
			if lastBefore != nil {
				d = append(d, "last event before it: "+lastBefore.Short())
			}
			d = append(d, "not yet delivered: "+c.describeEvents(missing, 10))
			d = append(d, lateAt...)
			if never > 0 {
				d = append(d, fmt.Sprintf("%d of them never delivered", never))
			}
			// One incident per first missing event: later notifications that still claim it
			// (the same loss, repeated) are counted on the first one.
			if at, seen := sameLoss[missing[0]]; seen {
				sameCount[missing[0]]++
				c.rep.Violations[at].Details[len(c.rep.Violations[at].Details)-1] = fmt.Sprintf("%d later progress notifications of this watch claimed it too", sameCount[missing[0]])
			} else {
				sameLoss[missing[0]] = len(c.rep.Violations)
				d = append(d, "no later progress notification of this watch claimed it")
				c.watchViolation(v, Bookmarkable, R, r,
					fmt.Sprintf("watch record %d: %s at %d while %d matching events <= %d had not been delivered (first %s)", v.rec.ID, kind, R, len(missing), R, c.h.Events[missing[0]].Short()), d...)
			}
		}
		if prevP == nil || R >= prevR {
			prevR, prevP = R, r
		}
	}
}

// cancels: a compaction cancel names a real compaction and comes only to a watch that needs a
// compacted revision; any other cancel the client did not ask for is one etcd would not send.
func (c *checker) cancels(v *view, evs []got, from int64) {
	for _, r := range v.resps {
		if r.CompactRevision != 0 {
			if !r.Canceled {
				c.watchViolation(v, Compaction, r.CompactRevision, r, fmt.Sprintf("watch record %d: compact_revision %d on a response that does not cancel the watch", v.rec.ID, r.CompactRevision),
					"response "+r.Describe(4, nil))
			}
			if !c.isCompaction(r.CompactRevision, r.At) {
				c.watchViolation(v, Compaction, r.CompactRevision, r, fmt.Sprintf("watch record %d: cancelled for compaction at %d, which was never a compaction revision (compactions before it: %s)",
					v.rec.ID, r.CompactRevision, c.compactionList(r.At)), "response "+r.Describe(4, nil))
			}
			next := from
			for _, g := range evs {
				if g.resp.Seq < r.Seq && g.ev.Rev()+1 > next {
					next = g.ev.Rev() + 1
				}
			}
			if next >= r.CompactRevision && from != math.MaxInt64 {
				c.watchViolation(v, Compaction, r.CompactRevision, r, fmt.Sprintf("watch record %d: cancelled for compaction at %d though it needed only revisions >= %d (etcd keeps such a watch)",
					v.rec.ID, r.CompactRevision, next), "response "+r.Describe(4, nil))
			}
			continue
		}
		if v.st.Client == record.ClientV3 && r.Canceled && v.closedSeq > 0 && r.Seq > v.closedSeq {
			continue // clientv3's own closing response after the watch's cancel
		}
		if r.Canceled && (v.cancelAt == 0 || v.cancelAt > r.Seq) {
			d := []string{"response " + r.Describe(4, nil)}
			why := ""
			if created := c.createdSeq(v); created > 0 {
				var last *record.Send
				for i := range v.st.Sends {
					snd := &v.st.Sends[i]
					if snd.Kind == record.SendCancel && snd.WatchID == r.WatchID && snd.Seq < r.Seq {
						last = snd
					}
				}
				if last != nil && last.Seq < created {
					why = fmt.Sprintf(": the client's cancel #%d for id %d (%s) was for an earlier watch, sent before this one's created response #%d gave it the same id", last.Seq, r.WatchID, last.Reason, created)
				}
			}
			c.watchViolation(v, Cancel, r.Revision, r, fmt.Sprintf("watch record %d: cancelled by the server (reason %q)%s; etcd keeps a well-formed watch until the client cancels it", v.rec.ID, r.CancelReason, why), d...)
		}
	}
}

// denied: a create whose range the stream's user may not read. etcd refuses it on arrival
// (recvLoop's isWatchPermitted): one response, created and cancelled, "permission denied", and
// nothing of the range before or after.
func (c *checker) denied(v *view, d *record.Denied) {
	why := fmt.Sprintf("user %q may not read [%q, %q)", v.st.User, d.Key, d.End)
	c.rep.Figures.DeniedCreates++
	refused := false
	for _, r := range v.resps {
		if len(r.Events) > 0 {
			c.watchViolation(v, Permission, r.Events[0].Rev(), r, fmt.Sprintf("watch record %d: %d events delivered on a watch etcd refuses (%s)", v.rec.ID, len(r.Events), why),
				"response "+r.Describe(4, nil))
			return
		}
		if r.Canceled && strings.Contains(r.CancelReason, "permission denied") {
			refused = true
		}
	}
	if refused {
		c.rep.Figures.DeniedRefused++
	}
	if len(v.resps) > 0 && !refused {
		c.watchViolation(v, Permission, v.resps[0].Revision, v.resps[0], fmt.Sprintf("watch record %d: not refused, where etcd refuses it (%s)", v.rec.ID, why),
			"first response "+v.resps[0].Describe(4, nil))
	}
}

func (c *checker) createdSeq(v *view) int {
	for _, r := range v.resps {
		if r.Created {
			return r.Seq
		}
	}
	return 0
}

func (c *checker) prevKV(v *view, g got) {
	e := g.ev
	if !v.rec.Request.PrevKV {
		if e.PrevKV != nil {
			c.watchViolation(v, PrevKV, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s carries a prev_kv the watch did not ask for", v.rec.ID, e.Short()),
				"event "+e.Long())
		}
		return
	}
	want := c.h.StateAt(e.KV.Key, e.Rev()-1)
	switch {
	case want == nil && e.PrevKV != nil:
		c.watchViolation(v, PrevKV, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s has prev_kv {%s}, but the key did not exist at %d", v.rec.ID, e.Short(), e.PrevKV, e.Rev()-1),
			"in "+c.respLine(v, g.resp, e))
	case want != nil && e.PrevKV == nil:
		// etcd forgets a watch's prev_kv flag when it reads the client's cancel, and still sends
		// the events already in flight before the cancel's ack (v3rpc/watch.go): tolerated after
		// the client's cancel, as below a compaction.
		afterCancel := v.cancelAt > 0 && v.cancelAt < g.resp.Seq
		if e.Rev()-1 >= c.compactedBefore(g.resp.At) && !afterCancel && !builtBeforeTheFlag(v, g.resp) {
			c.watchViolation(v, PrevKV, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s has no prev_kv; etcd's is {%s} and revision %d was not compacted (compacted: %d)",
				v.rec.ID, e.Short(), want, e.Rev()-1, c.compactedBefore(g.resp.At)), "in "+c.respLine(v, g.resp, e))
		}
	case want != nil && !want.Equal(e.PrevKV):
		c.watchViolation(v, PrevKV, e.Rev(), g.resp, fmt.Sprintf("watch record %d: %s has prev_kv {%s}, etcd's is {%s}", v.rec.ID, e.Short(), e.PrevKV, want),
			"in "+c.respLine(v, g.resp, e))
	}
}

// builtBeforeTheFlag: whether etcd may have built this response before it knew the watch asks
// for prev_kv. etcd's recvLoop (v3rpc/watch.go) registers a new watcher with the store first
// and sets prevKV[id] only after, under the stream's lock; sendLoop adds prev_kv when it reads
// a watcher's events (per response), and keeps the responses of an id it has not announced yet
// in pending[id], sending them all right after the created. So events that reach sendLoop
// between the two steps go out without prev_kv in an unbroken run of responses at the start:
// a watch from now created while writes pour in (as when a stopped etcd resumes), or a watch
// from a past revision whose catch-up the store builds at once (its syncWatchersLoop runs
// again without waiting while unsynced watchers remain). Tolerated only:
//   - on raw streams (a clientv3 record's channel carries one watch, so the run cannot be
//     told there);
//   - in the responses that follow the watch's created with no other response of the stream
//     between, received within pendingFlush of the created;
//   - when none of them, nor any earlier one of the run, carries a prev_kv (once the flag is
//     set it stays set).
//
// Seen on etcd 3.7.3: make test's smoke run, baseline seed 1 (a watch from now created during
// an etcd-stop, its first event, written at the resume, 3 µs after the created); and baseline
// seed 63 at 5101a06 (a watch from a recent revision under load, no fault near: 21 catch-up
// events in the first response after its created, 19 ms after the create, 8 of them without
// the prev_kv etcd had).
func builtBeforeTheFlag(v *view, resp *record.Response) bool {
	if v.st.Client != record.Raw || v.create == nil {
		return false
	}
	mine := make(map[int]bool, len(v.resps))
	for _, r := range v.resps {
		mine[r.Seq] = true
	}
	var created *record.Response
	for i := range v.st.Recvs {
		r := &v.st.Recvs[i]
		switch {
		case mine[r.Seq] && r.Created:
			created = r
		case created == nil:
		case !mine[r.Seq] || r.At-created.At > pendingFlush:
			return false
		default:
			for _, e := range r.Events {
				if e.PrevKV != nil {
					return false
				}
			}
			if r.Seq == resp.Seq {
				return true
			}
		}
	}
	return false
}

// pendingFlush: how soon after a created etcd's pending responses for that watch reach the
// client (sent back to back by the same loop; 3 µs in the case above).
const pendingFlush = 50 * time.Millisecond

func (c *checker) atRev(rev int64) string {
	i := c.h.FirstAt(rev)
	var parts []string
	for ; i < len(c.h.Events) && c.h.Events[i].Rev() == rev; i++ {
		parts = append(parts, c.h.Events[i].Short())
		if len(parts) == 6 {
			parts = append(parts, "…")
			break
		}
	}
	if len(parts) == 0 {
		return "no event"
	}
	return strings.Join(parts, ", ")
}

// respLine prints a response with the event of interest marked.
func (c *checker) respLine(_ *view, r *record.Response, e *record.Event) string {
	return r.Describe(6, func(_ int, x *record.Event) bool { return e != nil && x == e })
}

// firstResp prints the response in which the watch first got the event, if it did.
func (c *checker) firstResp(v *view, e *record.Event) string {
	for _, r := range v.resps {
		for i := range r.Events {
			x := &r.Events[i]
			if x.Rev() == e.Rev() && x.KV.Key == e.KV.Key {
				return c.respLine(v, r, x)
			}
		}
	}
	return e.Short() + " (never delivered)"
}
