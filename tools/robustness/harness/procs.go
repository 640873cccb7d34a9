// Package harness runs the robustness load: it starts a real etcd (one member or a cluster) and
// the real watchcache binary, plays the seeded load and the faults, records every watch
// response as sent (record package) beside a ground-truth watch on etcd itself, and hands the
// recording to the checker. It also holds the HA and the slow-readers runs.
//
// etcd counterparts: tests/robustness/main_test.go and framework/e2e (processes, faults:
// kill, SIGSTOP, compaction), tests/robustness/traffic (the KV load, leases, txns),
// tests/robustness/client/watch.go (watches resumed from the last revision + 1).
package harness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FreePort finds a free loopback port below the kernel's ephemeral range: a port inside it can
// be taken, while its server is down, by a client's own connection to it (a TCP self-connect
// from a client retrying 127.0.0.1:PORT), and the restarted server then fails with "address
// already in use" (seen once in a baseline run).
func FreePort() (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				lo = n
			}
		}
	}
	if lo > 12000 {
		portsMu.Lock()
		defer portsMu.Unlock()
		for attempt := 0; attempt < 1000; attempt++ {
			port := 10000 + rand.IntN(lo-10000)
			if portsGiven[port] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue
			}
			l.Close()
			portsGiven[port] = true
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Proc is a child process in its own process group, restartable with the same command line.
type Proc struct {
	Name    string
	Bin     string
	Args    []string
	LogPath string
	Ready   func() error // nil when healthy

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	log    *os.File
	exited error
}

var (
	procsMu sync.Mutex
	procs   []*Proc
)

// KillAll kills every process group started here (for the end of a run and for signals).
func KillAll() {
	procsMu.Lock()
	defer procsMu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
}

// Start starts the process (again) and waits until Ready says it is up; a start that dies at
// once (a port still held) is tried again for up to the timeout.
func (p *Proc) Start(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := p.start(time.Until(deadline))
		if err == nil || !errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

var errExited = errors.New("exited while starting")

func (p *Proc) start(timeout time.Duration) error {
	p.mu.Lock()
	if p.cmd != nil && p.running() {
		p.mu.Unlock()
		return fmt.Errorf("%s already running", p.Name)
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	fmt.Fprintf(f, "==== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), p.Bin, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.mu.Unlock()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.cmd, p.log, p.done = cmd, f, make(chan struct{})
	done := p.done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exited = err
		p.mu.Unlock()
		f.Close()
		close(done)
	}()
	p.mu.Unlock()
	procsMu.Lock()
	found := false
	for _, q := range procs {
		found = found || q == p
	}
	if !found {
		procs = append(procs, p)
	}
	procsMu.Unlock()
	if p.Ready == nil {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		err := p.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			p.mu.Lock()
			exit := p.exited
			p.mu.Unlock()
			return fmt.Errorf("%s %w (%v); log: %s", p.Name, errExited, exit, p.LogPath)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v (log: %s)", p.Name, timeout, err, p.LogPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *Proc) running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the running process's id (0 if none).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || !p.running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || done == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// Signal sends sig to the process (SIGSTOP, SIGCONT).
func (p *Proc) Signal(sig syscall.Signal) error {
	pid := p.Pid()
	if pid == 0 {
		return errors.New(p.Name + " not running")
	}
	return syscall.Kill(pid, sig)
}

// Exited reports an unexpected exit.
func (p *Proc) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.running()
}

func httpOK(url string) error {
	c := http.Client{Timeout: time.Second}
	r, err := c.Get(url)
	if err != nil {
		return err
	}
	r.Body.Close()
	if r.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, r.Status)
	}
	return nil
}

// Member is one etcd member's addresses.
type Member struct {
	Name             string
	Client, Peer     int
	DataDir, LogPath string
}

func (m Member) ClientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.Client) }
func (m Member) Endpoint() string  { return fmt.Sprintf("127.0.0.1:%d", m.Client) }
func (m Member) PeerURL() string   { return fmt.Sprintf("http://127.0.0.1:%d", m.Peer) }

// NewEtcd prepares (does not start) the members of a cluster of n on free loopback ports.
func NewEtcd(bin, dir string, n int, progressInterval time.Duration) ([]*Proc, []Member, error) {
	var members []Member
	var initial []string
	for i := 0; i < n; i++ {
		c, err := FreePort()
		if err != nil {
			return nil, nil, err
		}
		p, err := FreePort()
		if err != nil {
			return nil, nil, err
		}
		m := Member{Name: fmt.Sprintf("m%d", i), Client: c, Peer: p,
			DataDir: filepath.Join(dir, fmt.Sprintf("etcd-m%d", i)), LogPath: filepath.Join(dir, fmt.Sprintf("etcd-m%d.log", i))}
		members = append(members, m)
		initial = append(initial, m.Name+"="+m.PeerURL())
	}
	var ps []*Proc
	for _, m := range members {
		args := []string{"--name", m.Name, "--data-dir", m.DataDir,
			"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
			"--listen-peer-urls", m.PeerURL(), "--initial-advertise-peer-urls", m.PeerURL(),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "robustness",
			"--logger", "zap", "--log-level", "warn",
			"--watch-progress-notify-interval", progressInterval.String(),
		}
		url := m.ClientURL() + "/health"
		ps = append(ps, &Proc{Name: "etcd " + m.Name, Bin: bin, Args: args, LogPath: m.LogPath, Ready: func() error { return httpOK(url) }})
	}
	return ps, members, nil
}

// Target is a watchcache process's addresses.
type Target struct {
	GRPC, HTTP int
}

func (t Target) Endpoint() string { return fmt.Sprintf("127.0.0.1:%d", t.GRPC) }

// FlagSet returns the watchcache flags of issue 10's flag set n.
func FlagSet(n int) []string {
	switch n {
	case 1:
		return []string{"--capacity", "512", "--fixed-capacity", "--grpc-credit", "64", "--grpc-queue", "128"}
	case 2:
		return []string{"--profile", "v1.30", "--capacity", "1024", "--upper-bound-capacity", "4096", "--grpc-credit", "256", "--grpc-queue", "256"}
	default:
		return nil
	}
}

// NewWatchcache prepares a `watchcache serve` in front of the given etcd endpoints.
func NewWatchcache(bin, dir, name string, endpoints []string, extra []string) (*Proc, Target, error) {
	g, err := FreePort()
	if err != nil {
		return nil, Target{}, err
	}
	h, err := FreePort()
	if err != nil {
		return nil, Target{}, err
	}
	t := Target{GRPC: g, HTTP: h}
	args := []string{"serve", "--etcd-endpoints", strings.Join(endpoints, ","),
		"--listen-grpc", t.Endpoint(), "--listen-http", fmt.Sprintf("127.0.0.1:%d", h),
		"--prefix", "/registry/", "--progress-notify-interval", "2s"}
	args = append(args, extra...)
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", h)
	p := &Proc{Name: name, Bin: bin, Args: args, LogPath: filepath.Join(dir, name+".log"), Ready: func() error { return httpOK(url) }}
	return p, t, nil
}
