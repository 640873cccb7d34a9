// kube-oracle drives the real Kubernetes watch cache (k8s.io/apiserver/pkg/storage/cacher, the
// version this binary was built against) through a watchcache scenario and prints its trace in
// the scenario trace format, so that `watchcache replay` can be checked against Kubernetes'
// own code. See README.md.
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
	"time"

	"k8s.io/klog/v2"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "run":
		os.Exit(runCmd(os.Args[2:]))
	case "diff":
		os.Exit(diffCmd(os.Args[2:]))
	case "profile":
		fmt.Println(profileName, kubeVersion)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: kube-oracle run [-v] [-profile %s] [-meta FILE] SCENARIO.json\n"+
		"       kube-oracle diff [-h for flags] SCENARIO.json...\n       kube-oracle profile\n", profileName)
	os.Exit(2)
}

// meta is what `run -meta` writes beside the trace: why there is no counterpart, which requests
// were skipped.
type runMeta struct {
	Profile       string            `json:"profile"`
	Kubernetes    string            `json:"kubernetes"`
	NoCounterpart string            `json:"no_counterpart,omitempty"`
	Skipped       map[string]string `json:"skipped,omitempty"`
	Error         string            `json:"error,omitempty"`
}

const exitNoCounterpart = 3

func runCmd(args []string) int {
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
		return fail(err)
	}
	if err := unknownFields(sc); err != nil {
		return fail(err)
	}
	cfg, err := parseConfig(sc.Config, *profile)
	if err != nil {
		return fail(err)
	}
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
		return exitNoCounterpart
	}
	for id, why := range m.Skipped {
		fmt.Fprintf(os.Stderr, "kube-oracle: skipped %s: %s\n", id, why)
	}

	capture := &klogCapture{verbose: *verbose}
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false",
		"one_output": "true", "v": "1", "stderrthreshold": "FATAL"} {
		_ = kfs.Set(k, v)
	}
	klog.SetOutput(capture)

	d := &driver{cfg: cfg, clock: newFakeClock(), byID: map[string]*client{}, delegatedIDs: map[string]bool{},
		results: make(chan func(), 1<<16), log: capture, skips: m.Skipped}
	rng := &splitmix64{s: cfg.Seed}
	maxExtra := uint64(float64(cfg.TickMs) * cfg.TickJitter)
	d.clock.tickDraw = func() time.Duration {
		extra := uint64(0)
		if maxExtra > 0 {
			extra = rng.upTo(maxExtra)
		}
		return time.Duration(cfg.TickMs+extra) * time.Millisecond
	}
	d.prefix = scenarioPrefix(sc)
	d.fs = newFakeStorage(d)
	d.budget = &budgetBridge{clock: d.clock}
	k, err := newKube(d)
	if err != nil {
		return fail(err)
	}
	d.kube = k
	d.q = newQuiescer(k.listed)
	if err := d.run(sc); err != nil {
		return fail(err)
	}
	os.Stdout.Write(traceJSON(d.sortedTrace()))
	writeMeta()
	return 0
}
