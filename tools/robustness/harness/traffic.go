package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"watchcache.local/tools/robustness/record"
)

func newClient(endpoints []string, slow bool, c *Creds) (*clientv3.Client, error) {
	opts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg))}
	if slow {
		opts = append(opts, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	}
	cfg := clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		DialOptions:          opts,
		Logger:               zap.NewNop(),
		MaxCallRecvMsgSize:   maxMsg,
	}
	if c != nil {
		cfg.Username, cfg.Password = c.User, c.Password
	}
	return clientv3.New(cfg)
}

// writer plays the KV load: puts, deletes, multi-key txns with If/Else, ranged deletes and
// lease-attached puts that expire or are revoked early.
type writer struct {
	rec        *recorder
	etcd, tgt  *clientv3.Client
	targetName string
	seq        int
	wg         sync.WaitGroup
	leasesMu   sync.Mutex
	leases     map[clientv3.LeaseID]bool
	bigValues  bool
}

func value(r *rand.Rand, seq int, big bool) string {
	v := fmt.Sprintf("v%d-%x", seq, r.Uint32())
	if big && r.IntN(100) < 5 {
		v += strings.Repeat("x", 1024+r.IntN(8192))
	}
	return v
}

// one plays one write with its own seeded randomness.
func (w *writer) one(ctx context.Context, r *rand.Rand, seq int) {
	cli, via := w.etcd, "etcd"
	if r.IntN(100) < 30 {
		cli, via = w.tgt, w.targetName
	}
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := w.rec.now()
	var rev int64
	var err error
	op := ""
	switch n := r.IntN(100); {
	case n < 45:
		op = "put"
		var resp *clientv3.PutResponse
		resp, err = cli.Put(octx, randKey(r), value(r, seq, w.bigValues))
		if err == nil {
			rev = resp.Header.Revision
		}
	case n < 58:
		op = "delete"
		var resp *clientv3.DeleteResponse
		resp, err = cli.Delete(octx, randKey(r))
		if err == nil {
			rev = resp.Header.Revision
		}
	case n < 80:
		op = "txn"
		keys := distinctKeys(r, 2+r.IntN(3), nil)
		var cmp clientv3.Cmp
		switch r.IntN(3) {
		case 0:
			cmp = clientv3.Compare(clientv3.Version(keys[0]), ">", 0)
		case 1:
			cmp = clientv3.Compare(clientv3.ModRevision(keys[0]), "<", w.rec.known.Load()-int64(r.IntN(200)))
		default:
			cmp = clientv3.Compare(clientv3.Value(keys[0]), "=", fmt.Sprintf("v%d", r.IntN(10)))
		}
		var then []clientv3.Op
		for _, k := range keys {
			if r.IntN(4) == 0 {
				then = append(then, clientv3.OpDelete(k))
			} else {
				then = append(then, clientv3.OpPut(k, value(r, seq, w.bigValues)))
			}
		}
		excl := map[string]bool{}
		for _, k := range keys {
			excl[k] = true
		}
		var els []clientv3.Op
		for _, k := range distinctKeys(r, 1+r.IntN(3), excl) {
			els = append(els, clientv3.OpPut(k, value(r, seq, w.bigValues)))
		}
		var resp *clientv3.TxnResponse
		resp, err = cli.Txn(octx).If(cmp).Then(then...).Else(els...).Commit()
		if err == nil {
			rev = resp.Header.Revision
		}
	case n < 87:
		op = "delete-range"
		k := pick(r, innerKeys)
		end := prefixEnd(k)
		if r.IntN(2) == 0 {
			end = pick(r, innerKeys)
			if end < k {
				k, end = end, k
			}
			if end == k {
				end = prefixEnd(k)
			}
		}
		var resp *clientv3.DeleteResponse
		resp, err = cli.Delete(octx, k, clientv3.WithRange(end))
		if err == nil {
			rev = resp.Header.Revision
		}
	default:
		op = "lease-put"
		var lr *clientv3.LeaseGrantResponse
		lr, err = cli.Grant(octx, int64(2+r.IntN(3)))
		if err == nil {
			w.leasesMu.Lock()
			w.leases[lr.ID] = true
			w.leasesMu.Unlock()
			var ops []clientv3.Op
			for _, k := range distinctKeys(r, 1+r.IntN(3), nil) {
				ops = append(ops, clientv3.OpPut(k, value(r, seq, w.bigValues), clientv3.WithLease(lr.ID)))
			}
			var resp *clientv3.TxnResponse
			resp, err = cli.Txn(octx).Then(ops...).Commit()
			if err == nil {
				rev = resp.Header.Revision
				if r.IntN(2) == 0 {
					w.revokeLater(ctx, cli, via, lr.ID, time.Duration(300+r.IntN(1200))*time.Millisecond)
				}
			}
		}
	}
	wr := record.Write{Start: start, End: w.rec.now(), Via: via, Op: op, Revision: rev}
	if err != nil {
		wr.Err = err.Error()
	} else {
		w.rec.ack(rev)
	}
	w.rec.addWrite(wr)
}

func (w *writer) revokeLater(ctx context.Context, cli *clientv3.Client, via string, id clientv3.LeaseID, after time.Duration) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		octx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := w.rec.now()
		resp, err := cli.Revoke(octx, id)
		wr := record.Write{Start: start, End: w.rec.now(), Via: via, Op: "lease-revoke"}
		if err != nil {
			wr.Err = err.Error()
		} else {
			wr.Revision = resp.Header.Revision
			w.rec.ack(wr.Revision)
		}
		w.rec.addWrite(wr)
	}()
}

// revokeAll revokes every lease etcd still holds (the end of the load: nothing may expire later).
func (w *writer) revokeAll(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := w.etcd.Leases(octx)
		cancel()
		if err != nil {
			if attempt > 10 {
				return fmt.Errorf("listing leases: %w", err)
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if len(resp.Leases) == 0 {
			return nil
		}
		for _, l := range resp.Leases {
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			start := w.rec.now()
			r, err := w.etcd.Revoke(octx, l.ID)
			cancel()
			wr := record.Write{Start: start, End: w.rec.now(), Via: "etcd", Op: "lease-revoke"}
			if err != nil {
				wr.Err = err.Error()
			} else {
				wr.Revision = r.Header.Revision
				w.rec.ack(wr.Revision)
			}
			w.rec.addWrite(wr)
		}
	}
}

// every runs f at rate per second from a seeded generator, with up to workers in flight
// (a tick that finds them all busy is skipped: the rate falls while etcd is down).
func every(ctx context.Context, rate float64, workers int, seed uint64, f func(ctx context.Context, r *rand.Rand, seq int)) *sync.WaitGroup {
	var wg sync.WaitGroup
	jobs := make(chan int)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range jobs {
				f(ctx, rand.New(rand.NewPCG(seed, uint64(seq))), seq)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(jobs)
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		for seq := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				select {
				case jobs <- seq:
					seq++
				default:
				}
			}
		}
	}()
	return &wg
}

// reader plays the Range load through the target.
type reader struct {
	rec *recorder
	cli *clientv3.Client
}

func (rd *reader) one(ctx context.Context, r *rand.Rand, _ int) {
	sel := randSel(r)
	x := record.Range{Key: sel.key, RangeEnd: sel.end, Serializable: r.IntN(2) == 0}
	var opts []clientv3.OpOption
	switch sel.end {
	case "":
	case "\x00":
		opts = append(opts, clientv3.WithFromKey())
	default:
		opts = append(opts, clientv3.WithRange(sel.end))
	}
	if x.Serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	if r.IntN(100) < 20 {
		x.Revision = max(1, rd.rec.known.Load()-1-int64(r.IntN(400)))
		opts = append(opts, clientv3.WithRev(x.Revision))
	}
	if r.IntN(100) < 30 {
		x.Limit = 1 + int64(r.IntN(50))
		opts = append(opts, clientv3.WithLimit(x.Limit))
	}
	switch n := r.IntN(100); {
	case n < 15:
		x.KeysOnly = true
		opts = append(opts, clientv3.WithKeysOnly())
	case n < 25:
		x.CountOnly = true
		opts = append(opts, clientv3.WithCountOnly())
	}
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	x.KnownRevision = rd.rec.known.Load()
	x.Start = rd.rec.now()
	resp, err := rd.cli.Get(octx, sel.key, opts...)
	x.End = rd.rec.now()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		x.Err = err.Error()
	} else {
		x.Header, x.Count, x.More = resp.Header.Revision, resp.Count, resp.More
		for _, kv := range resp.Kvs {
			x.KVs = append(x.KVs, rd.rec.in.kv(kv))
		}
	}
	rd.rec.addRange(x)
}
