package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// bins are the binaries the harness runs.
type bins struct {
	etcd, watchcache, apiserver, kubectl string
}

// etcdProc is one etcd member on free loopback ports with its own data directory.
type etcdProc struct {
	*proc
	dir, client, peer string
	args              []string
}

func startEtcd(b bins, dir string, extra ...string) (*etcdProc, error) {
	cport, pport := freePort(), freePort()
	e := &etcdProc{dir: dir, client: fmt.Sprintf("127.0.0.1:%d", cport), peer: fmt.Sprintf("http://127.0.0.1:%d", pport)}
	e.args = append([]string{"--name", "default", "--data-dir", filepath.Join(dir, "etcd-data"),
		"--listen-client-urls", "http://" + e.client, "--advertise-client-urls", "http://" + e.client,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer,
		"--initial-cluster", "default=" + e.peer, "--log-level", "warn", "--logger", "zap"}, extra...)
	return e, e.start(b)
}

func (e *etcdProc) start(b bins) error {
	p, err := startProc("etcd", filepath.Join(e.dir, "etcd.log"), b.etcd, e.args...)
	if err != nil {
		return err
	}
	e.proc = p
	_, err = waitHTTP(nil, "http://"+e.client+"/health", 30*time.Second, p)
	return err
}

func (e *etcdProc) metrics() metrics { return scrape("http://" + e.client + "/metrics") }

// wcProc is `watchcache serve` in front of an etcd.
type wcProc struct {
	*proc
	dir, grpc, http string
	args            []string
}

func startWatchcache(b bins, dir, etcd string, extra ...string) (*wcProc, error) {
	w := &wcProc{dir: dir, grpc: fmt.Sprintf("127.0.0.1:%d", freePort()), http: fmt.Sprintf("127.0.0.1:%d", freePort())}
	w.args = append([]string{"serve", "--etcd-endpoints", etcd, "--listen-grpc", w.grpc, "--listen-http", w.http,
		"--prefix", "/registry/", "--web-dir", filepath.Join(dir, "no-web")}, extra...)
	return w, w.start(b)
}

func (w *wcProc) start(b bins) error {
	p, err := startProc("watchcache", filepath.Join(w.dir, "watchcache.log"), b.watchcache, w.args...)
	if err != nil {
		return err
	}
	w.proc = p
	_, err = waitHTTP(nil, "http://"+w.http+"/readyz", 60*time.Second, p)
	return err
}

func (w *wcProc) metrics() metrics { return scrape("http://" + w.http + "/metrics") }

// apiserver is one kube-apiserver on a free secure port.
type apiserver struct {
	*proc
	name, dir, etcd string
	port            int
	pki             *pki
	args            []string
	client          *kubernetes.Clientset
	cfg             *rest.Config
	http            *http.Client
	kubeconfig      string
	readyAfter      time.Duration
}

func newAPIServer(name, dir, etcd string, p *pki, extra ...string) *apiserver {
	a := &apiserver{name: name, dir: dir, etcd: etcd, port: freePort(), pki: p}
	a.args = append([]string{
		"--etcd-servers=http://" + etcd, "--etcd-prefix=/registry",
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", a.port),
		"--tls-cert-file=" + p.servingCert, "--tls-private-key-file=" + p.servKey,
		"--token-auth-file=" + p.tokenFile, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPub, "--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=10.0.0.0/24", "--profiling=false",
		"--cert-dir=" + filepath.Join(dir, "certs-"+name),
	}, extra...)
	a.cfg = &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", a.port), BearerToken: p.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(p.caPEM)}, QPS: 1000, Burst: 2000}
	a.client = kubernetes.NewForConfigOrDie(a.cfg)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(p.caPEM))
	a.http = &http.Client{Timeout: 30 * time.Second, Transport: &bearer{token: p.token,
		rt: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
	a.kubeconfig = filepath.Join(dir, "kubeconfig-"+name)
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: c
  context: {cluster: c, user: admin}
current-context: c
`, a.cfg.Host, p.caCert, p.token)
	if err := os.WriteFile(a.kubeconfig, []byte(kc), 0o600); err != nil {
		panic(err)
	}
	return a
}

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// start runs kube-apiserver and waits for /readyz; readyAfter is the time from exec to ready.
func (a *apiserver) start(b bins) error {
	p, err := startProc("kube-apiserver "+a.name, filepath.Join(a.dir, "kube-apiserver-"+a.name+".log"), b.apiserver, a.args...)
	if err != nil {
		return err
	}
	a.proc = p
	d, err := waitHTTP(a.http, a.cfg.Host+"/readyz", 120*time.Second, p)
	if err != nil {
		return err
	}
	a.readyAfter = time.Since(p.started)
	_ = d
	return nil
}

func (a *apiserver) get(path string) ([]byte, int, error) {
	resp, err := a.http.Get(a.cfg.Host + path)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return body, resp.StatusCode, err
}

// kubectl runs kubectl against this apiserver with a timeout.
func (a *apiserver) kubectl(b bins, timeout time.Duration, stdin string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.kubectl, append([]string{"--kubeconfig", a.kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), errb.String(), err
}

func (a *apiserver) metrics() metrics {
	body, _, err := a.get("/metrics")
	if err != nil {
		return metrics{}
	}
	return parseMetrics(string(body))
}

// metrics is a Prometheus text exposition, one sample per line: "name{labels}" -> value.
type metrics map[string]float64

func scrape(url string) metrics {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return metrics{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return parseMetrics(string(b))
}

func parseMetrics(s string) metrics {
	m := metrics{}
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		val := line[i+1:]
		// OpenMetrics may put a timestamp after the value.
		if j := strings.IndexByte(name, '}'); j >= 0 && j+1 < len(name) && strings.TrimSpace(name[j+1:]) != "" {
			parts := strings.Fields(line[j+1:])
			name, val = line[:j+1], parts[0]
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		m[name] = v
	}
	return m
}

// sum adds every sample of the metric whose labels contain all of the given label pairs
// (`method="Range"`).
func (m metrics) sum(name string, labels ...string) float64 {
	t := 0.0
	for k, v := range m {
		base := k
		if i := strings.IndexByte(k, '{'); i >= 0 {
			base = k[:i]
		}
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(k, l) {
				ok = false
				break
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// etcd's own counters.
func etcdRanges(m metrics) float64 {
	return m.sum("grpc_server_handled_total", `grpc_method="Range"`)
}
func etcdMVCCRanges(m metrics) float64   { return m.sum("etcd_mvcc_range_total") }
func etcdWatchStreams(m metrics) float64 { return m.sum("etcd_debugging_mvcc_watch_stream_total") }
func etcdWatchers(m metrics) float64     { return m.sum("etcd_debugging_mvcc_watcher_total") }
func etcdTxns(m metrics) float64 {
	return m.sum("grpc_server_handled_total", `grpc_method="Txn"`)
}
