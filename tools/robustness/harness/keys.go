package harness

import (
	"fmt"
	"math/rand/v2"

	"watchcache.local/tools/robustness/record"
)

// The keyspace: 200 keys under the cached prefix /registry/ and 10 outside it, four of them
// sorting right beside it (/registry, /registry-a, /registry0, /registrz).
var (
	innerKeys []string
	outerKeys = []string{"/registry", "/registry-a", "/registry0", "/registrz", "/regist", "/registry.x", "/other/a", "/other/b", "/a", "/zzz"}
)

func init() {
	groups := []struct {
		dir, p string
		n      int
	}{{"pods", "p", 80}, {"configmaps", "c", 50}, {"nodes", "n", 20}, {"secrets", "s", 50}}
	for _, g := range groups {
		for i := 0; i < g.n; i++ {
			innerKeys = append(innerKeys, fmt.Sprintf("/registry/%s/%s-%d", g.dir, g.p, i))
		}
	}
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func randKey(r *rand.Rand) string {
	if r.IntN(100) < 5 {
		return pick(r, outerKeys)
	}
	return pick(r, innerKeys)
}

// distinctKeys draws n different keys.
func distinctKeys(r *rand.Rand, n int, exclude map[string]bool) []string {
	var out []string
	seen := map[string]bool{}
	for len(out) < n {
		k := randKey(r)
		if seen[k] || exclude[k] {
			continue
		}
		seen[k] = true
		out = append(out, k)
	}
	return out
}

// prefixEnd is etcd's prefix range end (the last byte + 1).
func prefixEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return "\x00"
}

// keySel is a key selection shared by watches and ranges.
type keySel struct {
	kind, key, end string
}

func randSel(r *rand.Rand) keySel {
	n := r.IntN(100)
	switch {
	case n < 25:
		return keySel{"prefix", "/registry/", prefixEnd("/registry/")}
	case n < 45:
		p := pick(r, []string{"/registry/pods/", "/registry/configmaps/", "/registry/nodes/", "/registry/secrets/"})
		return keySel{"sub-prefix", p, prefixEnd(p)}
	case n < 60:
		return keySel{"key", pick(r, innerKeys), ""}
	case n < 70:
		a, b := pick(r, innerKeys), pick(r, innerKeys)
		if a > b {
			a, b = b, a
		}
		if a == b {
			b = a + "\x00"
		}
		return keySel{"range", a, b}
	case n < 80:
		// Across the prefix boundary, one side or the other.
		if r.IntN(2) == 0 {
			return keySel{"across", pick(r, []string{"/registry", "/registry-a", "/regist"}), pick(r, innerKeys)}
		}
		return keySel{"across", pick(r, innerKeys), pick(r, []string{"/registry0\x00", "/registrz", "/zzz"})}
	case n < 90:
		switch r.IntN(4) {
		case 0:
			return keySel{"outside", pick(r, outerKeys), ""}
		case 1:
			return keySel{"outside", "/other/", prefixEnd("/other/")}
		case 2:
			return keySel{"outside", "/registry", "/registry/"}
		default:
			return keySel{"outside", "/registry0", "/zzzz"}
		}
	default:
		return keySel{"from-key", pick(r, innerKeys), "\x00"}
	}
}

// watchReq draws a watch's options (the start revision is set by the caller).
func watchReq(r *rand.Rand, sel keySel) record.CreateRequest {
	req := record.CreateRequest{Key: sel.key, RangeEnd: sel.end, PrevKV: r.IntN(100) < 40, ProgressNotify: r.IntN(100) < 50}
	switch n := r.IntN(100); {
	case n < 8:
		req.NoPut = true
	case n < 16:
		req.NoDelete = true
	}
	return req
}

// startRev draws a start revision kind and value: "0", "recent", "old" (older than a small
// window, above the compaction), "compacted" (below the last compaction), "1", "future".
func startRev(r *rand.Rand, known, compacted int64, allowZero, initial bool) (string, int64) {
	for {
		n := r.IntN(100)
		switch {
		case n < 22:
			if allowZero {
				return "0", 0
			}
		case n < 42:
			return "recent", max(1, known-int64(r.IntN(50)))
		case n < 57:
			if initial {
				continue
			}
			lo := max(compacted, 2)
			rev := known - 600 - int64(r.IntN(2500))
			if rev < lo {
				rev = lo
			}
			return "old", rev
		case n < 67:
			if compacted < 2 {
				continue
			}
			return "compacted", max(1, compacted-1-int64(r.IntN(200)))
		case n < 77:
			return "1", 1
		default:
			return "future", known + 5 + int64(r.IntN(300))
		}
	}
}
