// kube-oracle drives the real Kubernetes watch cache (k8s.io/apiserver/pkg/storage/cacher, the
// version this binary was built against) through a watchcache scenario and prints its trace in
// the scenario trace format, so that `watchcache replay` can be checked against Kubernetes'
// own code. See README.md. The binary is this package's test binary (build.sh), since a
// scenario runs inside a testing/synctest bubble (oracle_test.go).
//
//	kube-oracle run [-v] [-profile P] [-meta FILE] SCENARIO.json
//	kube-oracle diff [flags] SCENARIO.json...   (diff.go)
//	kube-oracle profile
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
)

func main() {
	code, body := cli(os.Args[1:])
	if body != nil {
		fmt.Fprintln(os.Stderr, "kube-oracle: `run` needs the synctest bubble of the test binary that build.sh makes (go test -c)")
		os.Exit(1)
	}
	os.Exit(code)
}

// cli runs a subcommand. For `run` it returns the body to execute inside a synctest bubble
// (oracle_test.go) instead of an exit code.
func cli(args []string) (int, func() int) {
	if len(args) < 1 {
		usage()
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:])
	case "diff":
		return diffCmd(args[1:]), nil
	case "profile":
		fmt.Println(profileName, kubeVersion)
		return 0, nil
	}
	usage()
	return 2, nil
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: kube-oracle run [-v] [-profile %s] [-meta FILE] SCENARIO.json\n"+
		"       kube-oracle diff [-h for flags] SCENARIO.json...\n       kube-oracle profile\n", profileName)
	os.Exit(2)
}

// runMeta is what `run -meta` writes beside the trace: why there is no counterpart, which requests
// were skipped.
type runMeta struct {
	Profile       string            `json:"profile"`
	Kubernetes    string            `json:"kubernetes"`
	NoCounterpart string            `json:"no_counterpart,omitempty"`
	Skipped       map[string]string `json:"skipped,omitempty"`
	Error         string            `json:"error,omitempty"`
}

const exitNoCounterpart = 3

func runCmd(args []string) (int, func() int) {
	fl := flag.NewFlagSet("run", flag.ExitOnError)
	verbose := fl.Bool("v", false, "print the cacher's log (klog -v=1) to stderr")
	profile := fl.String("profile", "", "run the scenario as this profile (default: its config's)")
	metaPath := fl.String("meta", "", "write metadata (no counterpart, skipped requests) to this JSON file")
	fl.BoolVar(&skipListDefaults, "no-list-defaults", false, "skip the request layer's SetListOptionsDefaults (investigation only)")
	_ = fl.Parse(args)
	if fl.NArg() != 1 {
		usage()
	}
	m := runMeta{Profile: profileName, Kubernetes: kubeVersion}
	writeMeta := func() {
		if *metaPath != "" {
			b, _ := json.MarshalIndent(m, "", " ")
			_ = os.WriteFile(*metaPath, append(b, '\n'), 0o644)
		}
	}
	fail := func(err error) int {
		m.Error = err.Error()
		writeMeta()
		fmt.Fprintln(os.Stderr, "kube-oracle:", err)
		return 1
	}
	sc, err := loadScenario(fl.Arg(0))
	if err != nil {
		return fail(err), nil
	}
	if err := unknownFields(sc); err != nil {
		return fail(err), nil
	}
	cfg, err := parseConfig(sc.Config, *profile)
	if err != nil {
		return fail(err), nil
	}
	d := &driver{cfg: cfg, byID: map[string]*client{}, delegatedIDs: map[string]bool{},
		unresponsive: map[string]int{}, prefix: scenarioPrefix(sc)}
	if cfg.ResourcePrefix != "" {
		// The cacher's ResourcePrefix, and the registry's resource named after it (404s).
		d.prefix = cfg.ResourcePrefix
		podsResource = schema.GroupResource{Resource: path.Base(cfg.ResourcePrefix)}
	}
	d.log = &klogCapture{d: d, verbose: *verbose}
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false",
		"one_output": "true", "v": "1", "stderrthreshold": "FATAL"} {
		_ = kfs.Set(k, v)
	}
	klog.SetOutput(d.log)
	if cfg.Profile != profileName {
		m.NoCounterpart = fmt.Sprintf("profile %s: this binary is the %s oracle (use kube-oracle-%s)", cfg.Profile, profileName, cfg.Profile)
	} else {
		m.NoCounterpart, m.Skipped = noCounterpart(sc, cfg, gatesOf())
		if m.NoCounterpart == "" {
			m.NoCounterpart = gateProblem(cfg)
		}
	}
	if m.NoCounterpart != "" {
		writeMeta()
		fmt.Fprintln(os.Stderr, "kube-oracle: no counterpart:", m.NoCounterpart)
		return exitNoCounterpart, nil
	}
	for id, why := range m.Skipped {
		fmt.Fprintf(os.Stderr, "kube-oracle: skipped %s: %s\n", id, why)
	}

	d.skips = m.Skipped
	rng := &splitmix64{s: cfg.Seed}
	maxExtra := uint64(float64(cfg.TickMs) * cfg.TickJitter)
	d.clock = &jitterClock{tickDraw: func() time.Duration {
		extra := uint64(0)
		if maxExtra > 0 {
			extra = rng.upTo(maxExtra)
		}
		return time.Duration(cfg.TickMs+extra) * time.Millisecond
	}}
	// Everything from here on runs in the bubble: its clock is scenario time.
	return 0, func() int {
		d.start = time.Now()
		d.fs = newFakeStorage(d)
		prepareBubble()
		k, err := newKube(d)
		if err != nil {
			return fail(err)
		}
		d.kube = k
		if err := d.run(sc); err != nil {
			return fail(err)
		}
		os.Stdout.Write(traceJSON(d.sortedTrace()))
		writeMeta()
		return 0
	}
}
