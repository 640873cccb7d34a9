package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
)

// modeCfg is one way of running kube-apiserver: on etcd or on watchcache, its own watch cache
// on or off.
type modeCfg struct {
	name       string
	watchcache bool
	apiCache   bool
}

type checkResult struct {
	name, detail string
	ok           bool
}

type gaugeSample struct {
	when             string
	upstream, etcdWs float64
}

type modeResult struct {
	cfg                                     modeCfg
	readyStart, readyRestart, creates       time.Duration
	rangesStart, rangesRestart              float64
	mvccStart, mvccRestart                  float64
	quorumRestart                           float64
	streams1, streams2, watchers1, watcher2 float64
	rtt                                     map[string]float64
	checks                                  []checkResult
	gauges                                  []gaugeSample
	warnings                                map[string]int
	err                                     error
	dur                                     time.Duration
}

type checkRun struct {
	b      bins
	cfg    modeCfg
	res    *modeResult
	dir    string
	pki    *pki
	e      *etcdProc
	wc     *wcProc
	a, b2  *apiserver
	ec     *clientv3.Client
	wcArgs []string
	logf   func(string, ...any)
}

func (r *checkRun) check(name string, f func() (string, error)) bool {
	t := time.Now()
	detail, err := f()
	ok := err == nil
	if err != nil {
		detail = err.Error()
	}
	r.res.checks = append(r.res.checks, checkResult{name: name, ok: ok, detail: detail})
	status := "ok  "
	if !ok {
		status = "FAIL"
	}
	r.logf("  %s %-52s %5.1fs  %s", status, name, time.Since(t).Seconds(), oneLine(detail, 150))
	return ok
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func (r *checkRun) gauge(when string) {
	if r.wc == nil {
		return
	}
	time.Sleep(2 * time.Second) // let cancels reach etcd
	g := gaugeSample{when: when, upstream: r.wc.metrics().sum("watchcache_upstream_watches"), etcdWs: etcdWatchers(r.e.metrics())}
	r.res.gauges = append(r.res.gauges, g)
	r.logf("  gauge %-30s watchcache_upstream_watches %v, etcd watchers %v", when, g.upstream, g.etcdWs)
}

func (r *checkRun) storage() string {
	if r.wc != nil {
		return r.wc.grpc
	}
	return r.e.client
}

// runMode runs every check of one mode on fresh processes in a fresh temporary directory.
func runMode(b bins, cfg modeCfg, keep bool, wcExtra []string, logf func(string, ...any)) (res *modeResult) {
	res = &modeResult{cfg: cfg, warnings: map[string]int{}}
	start := time.Now()
	dir := mustMkdirTemp("kube-check-")
	r := &checkRun{b: b, cfg: cfg, res: res, dir: dir, logf: logf, wcArgs: wcExtra}
	defer func() {
		if p := recover(); p != nil {
			res.err = fmt.Errorf("panic: %v", p)
		}
		for _, a := range []*apiserver{r.b2, r.a} {
			if a != nil && a.proc != nil {
				a.stop(15 * time.Second)
			}
		}
		if r.a != nil {
			res.warnings = logWarnings(filepath.Join(dir, "kube-apiserver-a.log"))
		}
		if r.ec != nil {
			r.ec.Close()
		}
		if r.wc != nil && r.wc.proc != nil {
			r.wc.stop(10 * time.Second)
		}
		if r.e != nil && r.e.proc != nil {
			r.e.stop(10 * time.Second)
		}
		res.dur = time.Since(start)
		if keep || res.err != nil {
			logf("  logs kept in %s", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	res.err = r.run()
	if res.err != nil {
		logf("  ERROR %v", res.err)
	}
	return res
}

func (r *checkRun) run() error {
	var err error
	r.pki = newPKI(r.dir)
	if r.e, err = startEtcd(r.b, r.dir); err != nil {
		return err
	}
	if r.ec, err = etcdClient(r.e.client); err != nil {
		return err
	}
	if r.cfg.watchcache {
		if r.wc, err = startWatchcache(r.b, r.dir, r.e.client, r.wcArgs...); err != nil {
			return err
		}
	}
	apiArgs := []string{"--etcd-compaction-interval=45s"}
	if !r.cfg.apiCache {
		apiArgs = append(apiArgs, "--watch-cache=false")
	}
	r.a = newAPIServer("a", r.dir, r.storage(), r.pki, apiArgs...)
	m0 := r.e.metrics()
	if err := r.a.start(r.b); err != nil {
		return err
	}
	m1 := r.e.metrics()
	r.res.readyStart = r.a.readyAfter
	r.res.rangesStart = etcdRanges(m1) - etcdRanges(m0)
	r.res.mvccStart = etcdMVCCRanges(m1) - etcdMVCCRanges(m0)
	r.logf("  kube-apiserver ready after %.2fs; etcd Range requests %v (mvcc ranges %v)", r.res.readyStart.Seconds(), r.res.rangesStart, r.res.mvccStart)
	time.Sleep(3 * time.Second)
	m := r.e.metrics()
	r.res.streams1, r.res.watchers1 = etcdWatchStreams(m), etcdWatchers(m)
	r.gauge("after kube-apiserver start")

	if !r.cfg.apiCache || true {
		if r.res.rtt, err = rtt(r.storage(), 200); err != nil {
			r.logf("  rtt: %v", err)
		}
	}
	ctx := context.Background()
	cs := r.a.client

	r.check("readiness (/readyz?verbose, every check [+])", func() (string, error) {
		body, code, err := r.a.get("/readyz?verbose")
		if err != nil {
			return "", err
		}
		plus := strings.Count(string(body), "[+]")
		if code != 200 || strings.Contains(string(body), "[-]") {
			return "", fmt.Errorf("status %d: %s", code, body)
		}
		return fmt.Sprintf("%d checks", plus), nil
	})
	r.check("namespaces (kubectl create/get)", func() (string, error) {
		for _, ns := range []string{"t1", "t2"} {
			if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "create", "namespace", ns); err != nil {
				return "", err
			}
		}
		out, _, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "namespaces", "-o", "name")
		if err != nil {
			return "", err
		}
		for _, ns := range []string{"default", "kube-system", "t1", "t2"} {
			if !strings.Contains(out, "namespace/"+ns+"\n") {
				return "", fmt.Errorf("namespace %s missing from %q", ns, out)
			}
		}
		return fmt.Sprintf("%d namespaces", strings.Count(out, "\n")), nil
	})
	l, err := cs.CoreV1().ConfigMaps("t1").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	rvOld := l.ResourceVersion
	r.check("320 configmap creates (client-go, one at a time)", func() (string, error) {
		t := time.Now()
		for i := 0; i < 320; i++ {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", i),
				Labels: map[string]string{"grp": strconv.Itoa(i % 4)}}, Data: map[string]string{"v": "0"}}
			if _, err := cs.CoreV1().ConfigMaps("t1").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return "", err
			}
		}
		r.res.creates = time.Since(t)
		out, _, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "configmaps", "-n", "t1", "-o", "name")
		if err != nil {
			return "", err
		}
		if n := strings.Count(out, "\n"); n != 320 {
			return "", fmt.Errorf("kubectl get shows %d configmaps, want 320", n)
		}
		return fmt.Sprintf("%.2fs; kubectl get: 320", r.res.creates.Seconds()), nil
	})
	r.check("deployment with a patch (kubectl create/patch)", func() (string, error) {
		if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "create", "deployment", "web", "-n", "t1", "--image=registry.k8s.io/pause:3.10"); err != nil {
			return "", err
		}
		if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "patch", "deployment", "web", "-n", "t1", "--type=merge", "-p", `{"spec":{"replicas":3}}`); err != nil {
			return "", err
		}
		if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "patch", "deployment", "web", "-n", "t1", "-p", `{"metadata":{"labels":{"patched":"yes"}}}`); err != nil {
			return "", err
		}
		out, _, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "deployment", "web", "-n", "t1", "-o", "jsonpath={.spec.replicas} {.metadata.labels.patched} {.metadata.generation}")
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(out, "3 yes") {
			return "", fmt.Errorf("after the patches: %q", out)
		}
		return "replicas, labels, generation: " + out, nil
	})
	r.check("an event (kubectl create; stored with a lease)", func() (string, error) {
		ev := `{"apiVersion":"v1","kind":"Event","metadata":{"name":"web.check","namespace":"t1"},
"involvedObject":{"kind":"Deployment","namespace":"t1","name":"web","apiVersion":"apps/v1"},
"reason":"Checked","message":"kube-check","type":"Normal","count":1,"source":{"component":"kube-check"}}`
		if _, _, err := r.a.kubectl(r.b, 30*time.Second, ev, "create", "-f", "-"); err != nil {
			return "", err
		}
		out, _, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "events", "-n", "t1", "-o", "name")
		if err != nil {
			return "", err
		}
		if !strings.Contains(out, "event/web.check") {
			return "", fmt.Errorf("event missing: %q", out)
		}
		g, err := r.ec.Get(ctx, "/registry/events/t1/web.check")
		if err != nil || len(g.Kvs) != 1 {
			return "", fmt.Errorf("etcd has no /registry/events/t1/web.check: %v", err)
		}
		if g.Kvs[0].Lease == 0 {
			return "", fmt.Errorf("event stored without a lease")
		}
		return fmt.Sprintf("lease %x", g.Kvs[0].Lease), nil
	})
	r.check("kubectl get -A -l grp=1", func() (string, error) {
		out, _, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "configmaps", "-A", "-l", "grp=1", "-o", "name")
		if err != nil {
			return "", err
		}
		if n := strings.Count(out, "\n"); n != 80 {
			return "", fmt.Errorf("%d configmaps, want 80", n)
		}
		return "80", nil
	})
	r.check("kubectl get --watch during updates and deletes", func() (string, error) {
		for i := 0; i < 10; i++ {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%d", i)}}
			if _, err := cs.CoreV1().ConfigMaps("t2").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return "", err
			}
		}
		w, err := startKubectlWatch(r.b, r.a, "configmaps", "-n", "t2")
		if err != nil {
			return "", err
		}
		defer w.stop()
		if !waitFor(20*time.Second, func() bool { return w.count("ADDED", "w-") == 10 }) {
			return "", fmt.Errorf("initial ADDED: %d of 10 (%s)", w.count("ADDED"), w.stderr.String())
		}
		for i := 0; i < 5; i++ {
			if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "annotate", "configmap", fmt.Sprintf("w-%d", i), "-n", "t2", "n=1", "--overwrite"); err != nil {
				return "", err
			}
		}
		if _, _, err := r.a.kubectl(r.b, 30*time.Second, "", "delete", "configmap", "w-7", "w-8", "w-9", "-n", "t2"); err != nil {
			return "", err
		}
		if !waitFor(20*time.Second, func() bool { return w.count("MODIFIED") >= 5 && w.count("DELETED") >= 3 }) {
			return "", fmt.Errorf("seen MODIFIED %d of 5, DELETED %d of 3", w.count("MODIFIED"), w.count("DELETED"))
		}
		return fmt.Sprintf("ADDED %d, MODIFIED %d, DELETED %d", w.count("ADDED"), w.count("MODIFIED"), w.count("DELETED")), nil
	})
	r.check("kubectl delete -l grp=3", func() (string, error) {
		out, _, err := r.a.kubectl(r.b, 60*time.Second, "", "delete", "configmaps", "-n", "t1", "-l", "grp=3")
		if err != nil {
			return "", err
		}
		if n := strings.Count(out, "deleted"); n != 80 {
			return "", fmt.Errorf("%d deleted, want 80", n)
		}
		out, _, err = r.a.kubectl(r.b, 30*time.Second, "", "get", "configmaps", "-n", "t1", "-o", "name")
		if err != nil {
			return "", err
		}
		if n := strings.Count(out, "\n"); n != 240 {
			return "", fmt.Errorf("%d left, want 240", n)
		}
		return "80 deleted, 240 left", nil
	})
	r.check("kubectl get --chunk-size=10", func() (string, error) {
		out, errOut, err := r.a.kubectl(r.b, 30*time.Second, "", "get", "configmaps", "-n", "t1", "--chunk-size=10", "-o", "name", "-v=6")
		if err != nil {
			return "", err
		}
		n := strings.Count(out, "\n")
		pages := strings.Count(errOut, "limit=10")
		conts := strings.Count(errOut, "continue=")
		if n != 240 || pages < 24 || conts < 23 {
			return "", fmt.Errorf("%d configmaps in %d requests (%d with continue), want 240 in 24", n, pages, conts)
		}
		return fmt.Sprintf("240 in %d pages", pages), nil
	})
	r.check("resourceVersion=0 lists", func() (string, error) {
		var sizes []int
		for _, q := range []string{"resourceVersion=0", "resourceVersion=0&limit=10"} {
			body, code, err := r.a.get("/api/v1/namespaces/t1/configmaps?" + q)
			if err != nil || code != 200 {
				return "", fmt.Errorf("%s: %d %v %s", q, code, err, body)
			}
			var l listBody
			if err := json.Unmarshal(body, &l); err != nil {
				return "", err
			}
			sizes = append(sizes, len(l.Items))
		}
		if sizes[0] != 240 {
			return "", fmt.Errorf("rv=0 list: %d items, want 240", sizes[0])
		}
		return fmt.Sprintf("%d items; with limit=10: %d", sizes[0], sizes[1]), nil
	})
	r.check("watch from an old resourceVersion (before the creates)", func() (string, error) {
		evs, err := r.rawWatch("/api/v1/namespaces/t1/configmaps?watch=1&resourceVersion=" + rvOld + "&timeoutSeconds=4")
		if err != nil {
			return "", err
		}
		add, del, last := 0, 0, uint64(0)
		for _, e := range evs {
			switch e.Type {
			case "ADDED":
				add++
			case "DELETED":
				del++
			case "ERROR":
				return "", fmt.Errorf("ERROR %d %s", e.Object.Code, e.Object.Reason)
			}
			rv, _ := strconv.ParseUint(e.Object.Metadata.ResourceVersion, 10, 64)
			if rv <= last {
				return "", fmt.Errorf("resourceVersion %d after %d", rv, last)
			}
			last = rv
		}
		if add != 320 || del != 80 {
			return "", fmt.Errorf("ADDED %d (want 320), DELETED %d (want 80)", add, del)
		}
		return fmt.Sprintf("from RV %s: ADDED 320, DELETED 80, in order", rvOld), nil
	})
	r.check("WatchList (sendInitialEvents) with the initial-events-end bookmark", func() (string, error) {
		evs, err := r.rawWatch("/api/v1/namespaces/t1/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=3")
		if err != nil {
			return "", err
		}
		add := 0
		for i, e := range evs {
			switch e.Type {
			case "ADDED":
				add++
			case "BOOKMARK":
				if e.Object.Metadata.Annotations["k8s.io/initial-events-end"] == "true" {
					if add != 240 {
						return "", fmt.Errorf("bookmark after %d ADDED, want 240", add)
					}
					return fmt.Sprintf("240 ADDED, then the bookmark at RV %s (event %d)", e.Object.Metadata.ResourceVersion, i+1), nil
				}
			case "ERROR":
				return "", fmt.Errorf("ERROR %d %s", e.Object.Code, e.Object.Reason)
			}
		}
		return "", fmt.Errorf("no initial-events-end bookmark in %d events (%d ADDED)", len(evs), add)
	})
	r.check("update conflict (stale resourceVersion: 409)", func() (string, error) {
		cm, err := cs.CoreV1().ConfigMaps("t1").Get(ctx, "cm-000", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		a, b := cm.DeepCopy(), cm.DeepCopy()
		a.Data["v"], b.Data["v"] = "a", "b"
		if _, err := cs.CoreV1().ConfigMaps("t1").Update(ctx, a, metav1.UpdateOptions{}); err != nil {
			return "", err
		}
		_, err = cs.CoreV1().ConfigMaps("t1").Update(ctx, b, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return "", fmt.Errorf("second update with the old RV: %v, want a conflict", err)
		}
		return "409 Conflict", nil
	})
	r.check("read-your-write (update, then get and list)", func() (string, error) {
		return readYourWrite(ctx, r.a, r.a, 30)
	})

	// A kube-apiserver restart on its own (the table's restart row).
	mA := r.e.metrics()
	r.a.stop(30 * time.Second)
	if err := r.a.start(r.b); err != nil {
		return err
	}
	mB := r.e.metrics()
	r.res.readyRestart = r.a.readyAfter
	r.res.rangesRestart = etcdRanges(mB) - etcdRanges(mA)
	r.res.mvccRestart = etcdMVCCRanges(mB) - etcdMVCCRanges(mA)
	if r.wc != nil {
		r.res.quorumRestart = -1
	}
	r.logf("  restart: ready after %.2fs; etcd Range requests %v (mvcc %v)", r.res.readyRestart.Seconds(), r.res.rangesRestart, r.res.mvccRestart)
	r.check("after a kube-apiserver restart: the same configmaps", func() (string, error) {
		l, err := cs.CoreV1().ConfigMaps("t1").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return "", err
		}
		if len(l.Items) != 240 {
			return "", fmt.Errorf("%d configmaps, want 240", len(l.Items))
		}
		return "240", nil
	})
	r.gauge("after a kube-apiserver restart")

	// Two kube-apiservers.
	r.b2 = newAPIServer("b", r.dir, r.storage(), r.pki, apiArgs...)
	if err := r.b2.start(r.b); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	m = r.e.metrics()
	r.res.streams2, r.res.watcher2 = etcdWatchStreams(m), etcdWatchers(m)
	r.logf("  etcd watch streams: one kube-apiserver %v, two %v (watchers %v, %v)", r.res.streams1, r.res.streams2, r.res.watchers1, r.res.watcher2)
	r.gauge("with two kube-apiservers")
	r.check("read-your-write across two kube-apiservers", func() (string, error) {
		return readYourWrite(ctx, r.a, r.b2, 30)
	})
	r.check("kube-apiserver restart while storage stays up: nothing lost", func() (string, error) {
		inf := startReflector(r.a, "t2")
		defer inf.stop()
		if !waitFor(20*time.Second, inf.synced) {
			return "", fmt.Errorf("reflector did not sync")
		}
		r.a.stop(30 * time.Second)
		bc := r.b2.client
		for i := 0; i < 10; i++ {
			if _, err := bc.CoreV1().ConfigMaps("t2").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("r-%d", i)}}, metav1.CreateOptions{}); err != nil {
				return "", err
			}
		}
		for i := 0; i < 5; i++ {
			if err := touch(ctx, r.b2, "t2", fmt.Sprintf("r-%d", i)); err != nil {
				return "", err
			}
		}
		for i := 7; i < 10; i++ {
			if err := bc.CoreV1().ConfigMaps("t2").Delete(ctx, fmt.Sprintf("r-%d", i), metav1.DeleteOptions{}); err != nil {
				return "", err
			}
		}
		if err := r.a.start(r.b); err != nil {
			return "", err
		}
		return r.converged(ctx, inf, "t2", 60*time.Second)
	})
	r.gauge("after a kube-apiserver restart with two")

	what := "etcd"
	if r.wc != nil {
		what = "watchcache"
	}
	r.check(what+" restart while kube-apiserver stays up: nothing lost", func() (string, error) {
		kw, err := startKubectlWatch(r.b, r.a, "configmaps", "-n", "t2")
		if err != nil {
			return "", err
		}
		defer kw.stop()
		inf := startReflector(r.b2, "t2")
		defer inf.stop()
		if !waitFor(20*time.Second, func() bool { return inf.synced() && kw.count("ADDED") >= 7 }) {
			return "", fmt.Errorf("watches did not start")
		}
		if r.wc != nil {
			r.wc.stop(10 * time.Second)
			time.Sleep(2 * time.Second)
			if err := r.wc.start(r.b); err != nil {
				return "", err
			}
		} else {
			r.e.stop(10 * time.Second)
			time.Sleep(2 * time.Second)
			if err := r.e.start(r.b); err != nil {
				return "", err
			}
		}
		// Writes through A, retried until its storage answers again.
		retry := func(f func() error) error {
			var err error
			for i := 0; i < 60; i++ {
				if err = f(); err == nil || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
					return nil
				}
				time.Sleep(500 * time.Millisecond)
			}
			return err
		}
		for i := 0; i < 5; i++ {
			name := fmt.Sprintf("s-%d", i)
			if err := retry(func() error {
				_, err := cs.CoreV1().ConfigMaps("t2").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
				return err
			}); err != nil {
				return "", err
			}
		}
		for i := 0; i < 3; i++ {
			if err := retry(func() error { return touch(ctx, r.a, "t2", fmt.Sprintf("s-%d", i)) }); err != nil {
				return "", err
			}
		}
		for i := 3; i < 5; i++ {
			if err := retry(func() error {
				return cs.CoreV1().ConfigMaps("t2").Delete(ctx, fmt.Sprintf("s-%d", i), metav1.DeleteOptions{})
			}); err != nil {
				return "", err
			}
		}
		detail, err := r.converged(ctx, inf, "t2", 60*time.Second)
		if err != nil {
			return "", err
		}
		if !waitFor(20*time.Second, func() bool {
			return kw.count("ADDED", "s-") >= 5 && kw.count("MODIFIED", "s-") >= 3 && kw.count("DELETED", "s-") >= 2
		}) {
			return "", fmt.Errorf("kubectl watch (running: %v) saw s-*: ADDED %d/5 MODIFIED %d/3 DELETED %d/2; %s",
				kw.running(), kw.count("ADDED", "s-"), kw.count("MODIFIED", "s-"), kw.count("DELETED", "s-"), oneLine(kw.stderr.String(), 200))
		}
		return detail + "; the kubectl watch started before it saw every write", nil
	})
	r.gauge("after a " + what + " restart")

	r.check("kube-apiserver's compaction reaches etcd", func() (string, error) {
		var last error
		ok := waitFor(150*time.Second, func() bool {
			_, err := r.ec.Get(ctx, "/registry/namespaces/default", clientv3.WithRev(2))
			last = err
			return err != nil && strings.Contains(err.Error(), "compacted")
		})
		if !ok {
			return "", fmt.Errorf("revision 2 still readable after 150 s: %v", last)
		}
		st, _ := r.ec.Get(ctx, "compact_rev_key")
		v := int64(0)
		if len(st.Kvs) == 1 {
			v = st.Kvs[0].Version
		}
		return fmt.Sprintf("revision 2 compacted (compact_rev_key version %d)", v), nil
	})
	for _, a := range []*apiserver{r.a, r.b2} {
		a := a
		r.check("kube-apiserver "+a.name+"'s lists (resourceVersion=0) equal etcd at that revision", func() (string, error) {
			return cacheEqualsEtcd(ctx, a, r.ec)
		})
	}
	r.b2.stop(30 * time.Second)
	r.gauge("after the second kube-apiserver stops")
	return nil
}

type listBody struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name, Namespace, ResourceVersion string
		} `json:"metadata"`
	} `json:"items"`
}

func (r *checkRun) rawWatch(path string) ([]watchEvent, error) {
	resp, err := r.a.http.Get(r.a.cfg.Host + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var b [2048]byte
		n, _ := resp.Body.Read(b[:])
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, b[:n])
	}
	var evs []watchEvent
	err = decodeEvents(resp.Body, func(e watchEvent) { evs = append(evs, e) })
	return evs, err
}

func touch(ctx context.Context, a *apiserver, ns, name string) error {
	cm, err := a.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["touched"] = time.Now().Format(time.RFC3339Nano)
	_, err = a.client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// readYourWrite updates a configmap through w, then reads it through r (get and list, both
// with resourceVersion "": the freshest), n times.
func readYourWrite(ctx context.Context, w, r *apiserver, n int) (string, error) {
	for i := 0; i < n; i++ {
		cm, err := w.client.CoreV1().ConfigMaps("t1").Get(ctx, "cm-001", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		want := fmt.Sprintf("%s-%d", w.name, i)
		cm.Data["v"] = want
		up, err := w.client.CoreV1().ConfigMaps("t1").Update(ctx, cm, metav1.UpdateOptions{})
		if err != nil {
			return "", err
		}
		g, err := r.client.CoreV1().ConfigMaps("t1").Get(ctx, "cm-001", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if g.Data["v"] != want || g.ResourceVersion != up.ResourceVersion {
			return "", fmt.Errorf("get after write %d: v=%q rv %s, want %q rv %s", i, g.Data["v"], g.ResourceVersion, want, up.ResourceVersion)
		}
		l, err := r.client.CoreV1().ConfigMaps("t1").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=cm-001"})
		if err != nil {
			return "", err
		}
		if len(l.Items) != 1 || l.Items[0].Data["v"] != want {
			return "", fmt.Errorf("list after write %d: %v", i, l.Items)
		}
	}
	return fmt.Sprintf("%d of %d (%s → %s)", n, n, w.name, r.name), nil
}

// reflector is a client-go Reflector with a store (what an informer runs).
type reflector struct {
	r      *cache.Reflector
	store  cache.Store
	stopCh chan struct{}
}

func startReflector(a *apiserver, ns string) *reflector {
	lw := cache.NewListWatchFromClient(a.client.CoreV1().RESTClient(), "configmaps", ns, fields.Everything())
	st := cache.NewStore(cache.MetaNamespaceKeyFunc)
	x := &reflector{store: st, stopCh: make(chan struct{})}
	x.r = cache.NewReflectorWithOptions(lw, &corev1.ConfigMap{}, st, cache.ReflectorOptions{Name: "kube-check"})
	go x.r.Run(x.stopCh)
	return x
}

func (x *reflector) synced() bool { return x.r.LastSyncResourceVersion() != "" }
func (x *reflector) stop()        { close(x.stopCh) }

// converged waits until the reflector's store equals etcd's configmaps in ns at the
// reflector's last resourceVersion, once that is at least etcd's current revision for them.
func (r *checkRun) converged(ctx context.Context, inf *reflector, ns string, timeout time.Duration) (string, error) {
	prefix := "/registry/configmaps/" + ns + "/"
	var last string
	ok := waitFor(timeout, func() bool {
		cur, err := r.ec.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			last = err.Error()
			return false
		}
		want := map[string]int64{}
		for _, kv := range cur.Kvs {
			want[ns+"/"+strings.TrimPrefix(string(kv.Key), prefix)] = kv.ModRevision
		}
		got := map[string]int64{}
		for _, o := range inf.store.List() {
			cm := o.(*corev1.ConfigMap)
			rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
			got[cm.Namespace+"/"+cm.Name] = rv
		}
		if d := diffMaps(want, got); d != "" {
			last = d
			return false
		}
		return true
	})
	if !ok {
		return "", fmt.Errorf("reflector differs from etcd: %s", last)
	}
	return fmt.Sprintf("reflector equals etcd (%d configmaps)", len(inf.store.List())), nil
}

func diffMaps(want, got map[string]int64) string {
	var d []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			d = append(d, "missing "+k)
		} else if g != v {
			d = append(d, fmt.Sprintf("%s rv %d, etcd %d", k, g, v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			d = append(d, "extra "+k)
		}
	}
	sort.Strings(d)
	if len(d) > 6 {
		d = append(d[:6], fmt.Sprintf("… %d in all", len(d)))
	}
	return strings.Join(d, ", ")
}

// cacheEqualsEtcd lists resources from kube-apiserver at resourceVersion=0 (its watch cache when
// on) and compares every object's key and resourceVersion with etcd's at the list's revision.
func cacheEqualsEtcd(ctx context.Context, a *apiserver, ec *clientv3.Client) (string, error) {
	type res struct{ api, prefix string }
	all := []res{
		{"/api/v1/configmaps", "/registry/configmaps/"},
		{"/api/v1/namespaces", "/registry/namespaces/"},
		{"/apis/apps/v1/deployments", "/registry/deployments/"},
		{"/api/v1/events", "/registry/events/"},
		{"/apis/coordination.k8s.io/v1/leases", "/registry/leases/"},
		{"/apis/rbac.authorization.k8s.io/v1/clusterroles", "/registry/clusterroles/"},
		{"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "/registry/clusterrolebindings/"},
		{"/apis/scheduling.k8s.io/v1/priorityclasses", "/registry/priorityclasses/"},
		{"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", "/registry/flowschemas/"},
		{"/api/v1/services", "/registry/services/specs/"},
	}
	total := 0
	var diffs []string
	for _, x := range all {
		var d string
		var n int
		for attempt := 0; attempt < 5; attempt++ {
			body, code, err := a.get(x.api + "?resourceVersion=0")
			if err != nil || code != 200 {
				return "", fmt.Errorf("%s: %d %v", x.api, code, err)
			}
			var l listBody
			if err := json.Unmarshal(body, &l); err != nil {
				return "", err
			}
			rv, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
			got := map[string]int64{}
			for _, it := range l.Items {
				k := it.Metadata.Name
				if it.Metadata.Namespace != "" {
					k = it.Metadata.Namespace + "/" + k
				}
				v, _ := strconv.ParseInt(it.Metadata.ResourceVersion, 10, 64)
				got[k] = v
			}
			resp, err := ec.Get(ctx, x.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(rv))
			if err != nil && strings.Contains(err.Error(), "compacted") {
				// The cache's RV for a resource without recent writes can be older than etcd's
				// compaction: compare with etcd's current state (equal if nothing changed since).
				resp, err = ec.Get(ctx, x.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			}
			if err != nil {
				d = fmt.Sprintf("etcd at %d: %v", rv, err)
				time.Sleep(time.Second)
				continue
			}
			want := map[string]int64{}
			for _, kv := range resp.Kvs {
				want[strings.TrimPrefix(string(kv.Key), x.prefix)] = kv.ModRevision
			}
			d, n = diffMaps(want, got), len(want)
			if d == "" {
				break
			}
			time.Sleep(time.Second)
		}
		if d != "" {
			diffs = append(diffs, x.api+": "+d)
		}
		total += n
	}
	if len(diffs) > 0 {
		return "", fmt.Errorf("%s", strings.Join(diffs, "; "))
	}
	return fmt.Sprintf("%d resources, %d objects, keys and resourceVersions equal", len(all), total), nil
}

var klogLine = regexp.MustCompile(`^([WE])\d{4} [0-9:.]+\s+\d+ ([^\]]+)\] (.*)$`)
var digits = regexp.MustCompile(`[0-9]+`)

// logWarnings collects kube-apiserver's W and E lines, digits masked, counted.
func logWarnings(path string) map[string]int {
	out := map[string]int{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		m := klogLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		msg := m[1] + " " + digits.ReplaceAllString(m[2]+"] "+m[3], "#")
		if len(msg) > 220 {
			msg = msg[:220]
		}
		out[msg]++
	}
	return out
}
