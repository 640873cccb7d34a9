package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process: its own process group, killed when the harness exits (Pdeathsig and
// the registry below), its output in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	log     string
	started time.Time
	done    chan struct{}
	err     error
}

var (
	procsMu sync.Mutex
	procs   = map[*proc]bool{}
)

func startProc(name, logPath string, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n==== %s start %s: %s %s\n", name, time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	procsMu.Lock()
	procs[p] = true
	procsMu.Unlock()
	go func() {
		p.err = cmd.Wait()
		f.Close()
		procsMu.Lock()
		delete(procs, p)
		procsMu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after the grace period.
func (p *proc) stop(grace time.Duration) {
	if p == nil || !p.alive() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) kill() {
	if p == nil || !p.alive() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// killAll ends every child still running (on exit, normal or not).
func killAll() {
	procsMu.Lock()
	var all []*proc
	for p := range procs {
		all = append(all, p)
	}
	procsMu.Unlock()
	for _, p := range all {
		p.stop(5 * time.Second)
	}
}

// tail returns the last n lines of a process's log (for error messages).
func (p *proc) tail(n int) string {
	f, err := os.Open(p.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free loopback port.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until ok(status) or the timeout; it fails early when p exits.
func waitHTTP(client *http.Client, url string, timeout time.Duration, p *proc) (time.Duration, error) {
	start := time.Now()
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	for time.Since(start) < timeout {
		if p != nil && !p.alive() {
			return 0, fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.tail(30))
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return time.Since(start), nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	name := url
	if p != nil {
		name = p.name + " " + url + "\n" + p.tail(30)
	}
	return 0, fmt.Errorf("timed out after %v waiting for %s", timeout, name)
}

func mustMkdirTemp(prefix string) string {
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		panic(err)
	}
	return d
}

func joinPath(parts ...string) string { return filepath.Join(parts...) }
