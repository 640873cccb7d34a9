// kube-harness runs a real kube-apiserver (built from the Kubernetes Go module by
// tools/kube/build.sh) on etcd directly and on `watchcache serve` in front of the same kind of
// etcd, side by side:
//
//	kube-harness check   issue 14: readiness, creates, etcd's Range and watch counts, round
//	                     trips, the kubectl checks, restarts, cache = etcd (make kube-check)
//	kube-harness slo     issue 15: client-go reflectors that disconnect, a writer, counters of
//	                     410s, relists, lists and events, against simulate() (make validate-slo-k8s)
//
// Everything runs on loopback ports in temporary directories; every child process is killed on
// exit, also on failure or Ctrl-C.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "kube-harness: %v: stopping every child process\n", s)
		killAll()
		os.Exit(130)
	}()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube-harness check|slo [flags]")
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "check":
		code = mainCheck(os.Args[2:])
	case "slo":
		code = mainSLO(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: kube-harness check|slo [flags]")
		code = 2
	}
	killAll()
	os.Exit(code)
}

func binFlags(fs *flag.FlagSet) *bins {
	root := os.Getenv("WATCHCACHE_ROOT")
	if root == "" {
		root, _ = os.Getwd()
	}
	b := &bins{}
	fs.StringVar(&b.etcd, "etcd", filepath.Join(root, ".tools/bin/etcd"), "etcd binary")
	fs.StringVar(&b.watchcache, "watchcache", filepath.Join(root, "target/release/watchcache"), "watchcache binary")
	fs.StringVar(&b.apiserver, "kube-apiserver", filepath.Join(root, ".tools/bin/kube-apiserver"), "kube-apiserver binary")
	fs.StringVar(&b.kubectl, "kubectl", filepath.Join(root, ".tools/bin/kubectl"), "kubectl binary")
	return b
}

func logf(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func mainCheck(args []string) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	b := binFlags(fs)
	keep := fs.Bool("keep", false, "keep the temporary directories (logs)")
	modes := fs.String("modes", "etcd,watchcache,etcd-nocache,watchcache-nocache", "modes to run")
	// kube-apiserver's compactor watches compact_rev_key, outside /registry/: cached too, as the
	// README tells operators, so that etcd sees one watch per cache whatever the apiservers.
	wcFlags := fs.String("watchcache-flags", "--prefix compact_rev_key", "extra flags for watchcache serve (space-separated; the default caches kube-apiserver's compact_rev_key)")
	_ = fs.Parse(args)
	all := map[string]modeCfg{
		"etcd":               {name: "etcd directly", watchcache: false, apiCache: true},
		"watchcache":         {name: "through watchcache", watchcache: true, apiCache: true},
		"etcd-nocache":       {name: "etcd directly, --watch-cache=false", watchcache: false, apiCache: false},
		"watchcache-nocache": {name: "through watchcache, --watch-cache=false", watchcache: true, apiCache: false},
	}
	start := time.Now()
	var results []*modeResult
	for _, m := range strings.Split(*modes, ",") {
		cfg, ok := all[m]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown mode %q\n", m)
			return 2
		}
		logf("== kube-apiserver %s", cfg.name)
		results = append(results, runMode(*b, cfg, *keep, strings.Fields(*wcFlags), logf))
	}
	printCheckReport(results)
	fmt.Printf("\nkube-check: %s in all\n", time.Since(start).Round(time.Second))
	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
		}
		for _, c := range r.checks {
			if !c.ok {
				failed++
			}
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

func printCheckReport(rs []*modeResult) {
	fmt.Println()
	head := "| measured |"
	sep := "|---|"
	for _, r := range rs {
		head += " " + r.cfg.name + " |"
		sep += "---|"
	}
	fmt.Println(head)
	fmt.Println(sep)
	row := func(name string, f func(r *modeResult) string) {
		line := "| " + name + " |"
		for _, r := range rs {
			line += " " + f(r) + " |"
		}
		fmt.Println(line)
	}
	row("kube-apiserver ready after start / restart", func(r *modeResult) string {
		return fmt.Sprintf("%.1f s / %.1f s", r.readyStart.Seconds(), r.readyRestart.Seconds())
	})
	row("320 configmap creates", func(r *modeResult) string { return fmt.Sprintf("%.1f s", r.creates.Seconds()) })
	row("etcd Range requests on start / restart (gRPC Range)", func(r *modeResult) string {
		return fmt.Sprintf("%.0f / %.0f", r.rangesStart, r.rangesRestart)
	})
	row("etcd mvcc ranges on start / restart (etcd_mvcc_range_total)", func(r *modeResult) string {
		return fmt.Sprintf("%.0f / %.0f", r.mvccStart, r.mvccRestart)
	})
	row("etcd watch streams, one / two kube-apiservers", func(r *modeResult) string {
		return fmt.Sprintf("%.0f / %.0f", r.streams1, r.streams2)
	})
	row("etcd watchers, one / two kube-apiservers", func(r *modeResult) string {
		return fmt.Sprintf("%.0f / %.0f", r.watchers1, r.watcher2)
	})
	row("clientv3 round trip p90, put / txn / get", func(r *modeResult) string {
		if r.rtt == nil {
			return "—"
		}
		return fmt.Sprintf("%.2f / %.2f / %.2f ms", r.rtt["put"], r.rtt["txn"], r.rtt["get"])
	})
	row("checks passed", func(r *modeResult) string {
		n := 0
		for _, c := range r.checks {
			if c.ok {
				n++
			}
		}
		s := fmt.Sprintf("%d of %d", n, len(r.checks))
		if r.err != nil {
			s += " (stopped: " + oneLine(r.err.Error(), 80) + ")"
		}
		return s
	})
	row("mode's run time", func(r *modeResult) string { return r.dur.Round(time.Second).String() })

	fmt.Println("\nChecks:")
	names := []string{}
	seen := map[string]bool{}
	for _, r := range rs {
		for _, c := range r.checks {
			if !seen[c.name] {
				seen[c.name] = true
				names = append(names, c.name)
			}
		}
	}
	for _, n := range names {
		line := fmt.Sprintf("  %-62s", n)
		for _, r := range rs {
			st := "—"
			for _, c := range r.checks {
				if c.name == n {
					st = "ok"
					if !c.ok {
						st = "FAIL"
					}
				}
			}
			line += fmt.Sprintf(" %-5s", st)
		}
		fmt.Println(line)
	}
	for _, r := range rs {
		for _, c := range r.checks {
			if !c.ok {
				fmt.Printf("  FAIL [%s] %s: %s\n", r.cfg.name, c.name, oneLine(c.detail, 400))
			}
		}
	}
	fmt.Println("\nwatchcache_upstream_watches against etcd's watcher count (etcd_debugging_mvcc_watcher_total):")
	for _, r := range rs {
		for _, g := range r.gauges {
			mark := ""
			if g.upstream != g.etcdWs {
				mark = "  <- differs"
			}
			fmt.Printf("  [%s] %-42s %3.0f vs %3.0f%s\n", r.cfg.name, g.when, g.upstream, g.etcdWs, mark)
		}
	}
	// kube-apiserver's warnings and errors that appear through watchcache but not on etcd.
	var base map[string]int
	for _, r := range rs {
		if !r.cfg.watchcache && r.cfg.apiCache {
			base = r.warnings
		}
	}
	for _, r := range rs {
		if !r.cfg.watchcache || base == nil {
			continue
		}
		var only []string
		for k, n := range r.warnings {
			if _, ok := base[k]; !ok {
				only = append(only, fmt.Sprintf("%4d× %s", n, k))
			}
		}
		sort.Strings(only)
		fmt.Printf("\nkube-apiserver a's W/E log lines [%s] that etcd directly did not log (%d kinds):\n", r.cfg.name, len(only))
		for _, l := range only {
			fmt.Println("  " + l)
		}
	}
}
