package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func etcdClient(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(p*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// rtt measures n round trips of put, txn and linearizable get through endpoint; p90 in ms.
func rtt(endpoint string, n int) (map[string]float64, error) {
	c, err := etcdClient(endpoint)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx := context.Background()
	key := "/registry/zz-kube-harness-rtt"
	if _, err := c.Put(ctx, key, "warm"); err != nil {
		return nil, err
	}
	ops := map[string]func(i int) error{
		"put": func(i int) error { _, err := c.Put(ctx, key, fmt.Sprint(i)); return err },
		"txn": func(i int) error {
			_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), ">", 0)).
				Then(clientv3.OpPut(key, fmt.Sprint(i))).Commit()
			return err
		},
		"get": func(i int) error { _, err := c.Get(ctx, key); return err },
	}
	out := map[string]float64{}
	for _, name := range []string{"put", "txn", "get"} {
		var ds []float64
		for i := 0; i < n+10; i++ {
			t := time.Now()
			if err := ops[name](i); err != nil {
				return nil, err
			}
			if i >= 10 {
				ds = append(ds, float64(time.Since(t).Microseconds())/1000)
			}
		}
		out[name] = percentile(ds, 0.9)
	}
	_, _ = c.Delete(ctx, key)
	return out, nil
}

// watchEvent is one event of a Kubernetes watch stream (JSON), as much of it as the checks read.
type watchEvent struct {
	Type   string `json:"type"`
	Object struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name            string            `json:"name"`
			Namespace       string            `json:"namespace"`
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	} `json:"object"`
}

func decodeEvents(r io.Reader, each func(watchEvent)) error {
	d := json.NewDecoder(r)
	for {
		var ev watchEvent
		if err := d.Decode(&ev); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		each(ev)
	}
}

// kubectlWatch is `kubectl get ... --watch --output-watch-events -o json` in the background.
type kubectlWatch struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	events []watchEvent
	done   chan struct{}
	err    error
	stderr strings.Builder
}

func startKubectlWatch(b bins, a *apiserver, args ...string) (*kubectlWatch, error) {
	full := append([]string{"--kubeconfig", a.kubeconfig, "get"}, args...)
	full = append(full, "--watch", "--output-watch-events", "-o", "json")
	w := &kubectlWatch{cmd: exec.Command(b.kubectl, full...), done: make(chan struct{})}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.cmd.Stderr = &w.stderr
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		w.err = decodeEvents(out, func(ev watchEvent) {
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
		})
		_ = w.cmd.Wait()
		close(w.done)
	}()
	return w, nil
}

func (w *kubectlWatch) count(typ string, names ...string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.events {
		if e.Type != typ {
			continue
		}
		if len(names) == 0 {
			n++
			continue
		}
		for _, nm := range names {
			if strings.HasPrefix(e.Object.Metadata.Name, nm) {
				n++
				break
			}
		}
	}
	return n
}

func (w *kubectlWatch) running() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

func (w *kubectlWatch) stop() {
	if w.running() {
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}
