// Command robustness is watchcache's robustness suite (issue 10): a seeded load with faults
// against a real etcd and the real watchcache binary, every watch response recorded as sent,
// checked against etcd's own history; the same load against etcd as a baseline; a self-test
// that plants corruptions; an HA run and a slow-readers run.
//
//	robustness run       one run (--target watchcache|etcd, --seed, --duration, --flagset)
//	robustness suite     SEEDS runs through watchcache, each with its baseline against etcd
//	robustness selftest  plant corruptions in a recording (or a synthetic one); all must be caught
//	robustness check     check a saved recording again
//	robustness show      print one stream's log from a saved recording
//	robustness ha        two watchcache replicas in front of a 3-member etcd; kill one, then the leader
//	robustness slow-readers  1 000 watchers stop reading for 60 s under 1 000 events/s
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"watchcache.local/tools/robustness/checker"
	"watchcache.local/tools/robustness/harness"
	"watchcache.local/tools/robustness/record"
	"watchcache.local/tools/robustness/selftest"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "robustness: interrupted; stopping the processes")
		harness.Interrupt()
		harness.KillAll()
		os.Exit(130)
	}()
	var code int
	switch os.Args[1] {
	case "run":
		code = cmdRun(os.Args[2:])
	case "suite":
		code = cmdSuite(os.Args[2:])
	case "selftest":
		code = cmdSelftest(os.Args[2:])
	case "check":
		code = cmdCheck(os.Args[2:])
	case "show":
		code = cmdShow(os.Args[2:])
	case "ha":
		code = cmdHA(os.Args[2:])
	case "slow-readers":
		code = cmdSlowReaders(os.Args[2:])
	default:
		usage()
	}
	harness.KillAll()
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: robustness run|suite|selftest|check|ha|slow-readers [flags] (-h for each)")
	os.Exit(2)
}

// root finds the repository (the directory holding .tools or Cargo.toml) from the working directory.
func root() string {
	d, _ := os.Getwd()
	for x := d; x != "/"; x = filepath.Dir(x) {
		if _, err := os.Stat(filepath.Join(x, "Cargo.toml")); err == nil {
			return x
		}
	}
	return d
}

type common struct {
	etcdBin, wcBin string
}

func (c *common) flags(fs *flag.FlagSet) {
	r := root()
	fs.StringVar(&c.etcdBin, "etcd-bin", filepath.Join(r, ".tools/bin/etcd"), "etcd binary (make setup-etcd)")
	fs.StringVar(&c.wcBin, "watchcache-bin", filepath.Join(r, "target/release/watchcache"), "watchcache binary")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}

// oneRun runs and checks one configuration, printing its table; it returns the report.
func oneRun(cfg harness.Config, details int) (*checker.Report, *record.Run, error) {
	run, err := harness.Run(cfg)
	if err != nil {
		return nil, nil, err
	}
	rep, err := checker.Check(run)
	if err != nil {
		return nil, run, fmt.Errorf("checking: %w", err)
	}
	title := fmt.Sprintf("seed %d · target %s · flag set %d · %s", cfg.Seed, cfg.Target, cfg.FlagSet, cfg.Duration)
	if cfg.Target == "etcd" {
		title = fmt.Sprintf("seed %d · baseline: target etcd · %s", cfg.Seed, cfg.Duration)
	}
	if cfg.Auth {
		title += " · etcd auth on"
	}
	rep.PrintTable(os.Stdout, title)
	for _, n := range run.Notes {
		fmt.Printf("   note: %s\n", n)
	}
	if rep.Total() > 0 {
		rep.PrintDetails(os.Stdout, details)
	}
	if cfg.Out != "" {
		f, err := os.Create(filepath.Join(cfg.Out, "violations.txt"))
		if err == nil {
			rep.PrintTable(f, title)
			rep.PrintDetails(f, 0)
			f.Close()
		}
	}
	return rep, run, nil
}

func cmdRun(args []string) int {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var c common
	c.flags(fs)
	seed := fs.Int64("seed", 1, "seed of the load")
	dur := fs.Duration("duration", 90*time.Second, "length of the load")
	flagset := fs.Int("flagset", 0, "watchcache flag set: 0 defaults, 1 small fixed ring and credit, 2 v1.30 profile")
	target := fs.String("target", "watchcache", "watchcache or etcd (the baseline)")
	out := fs.String("out", "", "directory for logs, violations.txt and (with --save) the recording")
	save := fs.Bool("save", false, "save the recording (run.gob.gz) in --out")
	details := fs.Int("details", 5, "violations printed in full per property (0: all)")
	quiet := fs.Bool("quiet", false, "no progress log on stderr")
	auth := fs.Bool("auth", false, "etcd with auth on: root on etcd directly, a user with readwrite on every key through the target")
	_ = fs.Parse(args)
	cfg := harness.Config{Seed: *seed, Duration: *dur, FlagSet: *flagset, Target: *target, EtcdBin: c.etcdBin, WatchcacheBin: c.wcBin, Out: *out, Save: *save, Auth: *auth}
	if !*quiet {
		cfg.Log = logf
	}
	rep, _, err := oneRun(cfg, *details)
	if err != nil {
		fmt.Fprintln(os.Stderr, "robustness run:", err)
		return 2
	}
	if rep.Total() > 0 {
		return 1
	}
	return 0
}

func cmdSuite(args []string) int {
	fs := flag.NewFlagSet("suite", flag.ExitOnError)
	var c common
	c.flags(fs)
	seeds := fs.Int("seeds", 10, "number of seeds")
	first := fs.Int64("first-seed", 1, "first seed")
	dur := fs.Duration("duration", 90*time.Second, "length of each run")
	out := fs.String("out", "", "directory for each run's logs and violations (default: a temporary one)")
	baseline := fs.Bool("baseline", true, "run seeds against etcd too")
	baselineSeeds := fs.Int("baseline-seeds", 0, "only the first N seeds get a baseline (0: all)")
	selftestToo := fs.Bool("selftest", false, "then plant corruptions in the first baseline's recording (and a synthetic one); a miss fails the suite")
	save := fs.Bool("save", false, "save every recording")
	details := fs.Int("details", 3, "violations printed in full per property and run")
	auth := fs.Bool("auth", false, "every run with etcd's auth on (see run -h)")
	_ = fs.Parse(args)
	if *out == "" {
		d, err := os.MkdirTemp("", "robustness-suite-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		*out = d
	}
	type row struct {
		name string
		rep  *checker.Report
		err  error
	}
	var rows []row
	for s := *first; s < *first+int64(*seeds); s++ {
		targets := []string{"watchcache"}
		if *baseline && (*baselineSeeds == 0 || s < *first+int64(*baselineSeeds)) {
			targets = append(targets, "etcd")
		}
		for _, t := range targets {
			fsn := int(s % 3)
			name := fmt.Sprintf("seed %d %s", s, t)
			if t == "watchcache" {
				name += fmt.Sprintf(" (flag set %d)", fsn)
			}
			dir := filepath.Join(*out, fmt.Sprintf("seed%d-%s", s, t))
			keep := *save || (*selftestToo && t == "etcd" && s == *first)
			cfg := harness.Config{Seed: s, Duration: *dur, FlagSet: fsn, Target: t, EtcdBin: c.etcdBin, WatchcacheBin: c.wcBin, Out: dir, Save: keep, Log: logf, Auth: *auth}
			rep, _, err := oneRun(cfg, *details)
			if err != nil {
				fmt.Printf("── %s: HARNESS ERROR: %v\n", name, err)
			}
			rows = append(rows, row{name, rep, err})
		}
	}
	fmt.Println()
	var sum []summaryRow
	for _, r := range rows {
		sum = append(sum, summaryRow{r.name, r.rep, r.err})
	}
	bad := printSummary(sum, *out)
	missed := 0
	if *selftestToo {
		fmt.Println()
		missed += selftestReport("synthetic recording", selftest.Synthetic())
		path := filepath.Join(*out, fmt.Sprintf("seed%d-etcd", *first), "run.gob.gz")
		if run, err := record.Load(path); err != nil {
			fmt.Printf("selftest: no baseline recording (%v)\n", err)
			missed++
		} else {
			missed += selftestReport(path, run)
		}
	}
	if bad > 0 || missed > 0 {
		fmt.Printf("robustness: %d of %d runs with violations or errors; self-test: %d missed\n", bad, len(rows), missed)
		return 1
	}
	fmt.Printf("robustness: %d runs, 0 violations\n", len(rows))
	return 0
}

// selftestReport plants the corruptions in run and prints what was caught; it returns the misses.
func selftestReport(src string, run *record.Run) int {
	results, err := selftest.Run(run)
	if err != nil {
		fmt.Printf("selftest on %s: %v\n", src, err)
		return 1
	}
	fmt.Printf("── self-test on %s\n", src)
	failed := 0
	for _, r := range results {
		status := "caught"
		if !r.Caught {
			status = "MISSED"
			failed++
		}
		fmt.Printf("   %-28s -> %-13s %s: %s\n", r.Name, r.Property, status, r.Detail)
	}
	if failed > 0 {
		fmt.Printf("selftest: %d of %d corruptions missed\n", failed, len(results))
	} else {
		fmt.Printf("selftest: all %d corruptions caught\n", len(results))
	}
	return failed
}

func cmdCheck(args []string) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	details := fs.Int("details", 5, "violations printed in full per property (0: all)")
	quiet := fs.Bool("summary", false, "several recordings: only the summary table")
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: robustness check [--details N] [--summary] RUN.gob.gz...")
		return 2
	}
	var rows []summaryRow
	for _, path := range fs.Args() {
		run, err := record.Load(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		rep, err := checker.Check(run)
		name := fmt.Sprintf("seed %d %s", run.Seed, run.Target)
		if run.Target == "watchcache" {
			name += fmt.Sprintf(" (flag set %d)", run.FlagSet)
		}
		rows = append(rows, summaryRow{name, rep, err})
		if err != nil || *quiet {
			continue
		}
		rep.PrintTable(os.Stdout, fmt.Sprintf("%s: seed %d · target %s · flag set %d", path, run.Seed, run.Target, run.FlagSet))
		rep.PrintDetails(os.Stdout, *details)
	}
	bad := 0
	if len(rows) > 1 || *quiet {
		bad = printSummary(rows, "the recordings' directories")
	} else if rows[0].err != nil {
		fmt.Fprintln(os.Stderr, rows[0].err)
		return 2
	} else if rows[0].rep.Total() > 0 {
		bad = 1
	}
	if bad > 0 {
		return 1
	}
	return 0
}

func cmdSelftest(args []string) int {
	fs := flag.NewFlagSet("selftest", flag.ExitOnError)
	rec := fs.String("recording", "", "a saved recording (robustness run --save); default: a synthetic one")
	_ = fs.Parse(args)
	var run *record.Run
	if *rec != "" {
		r, err := record.Load(*rec)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		run = r
	} else {
		run = selftest.Synthetic()
	}
	src := "synthetic recording"
	if *rec != "" {
		src = *rec
	}
	if selftestReport(src, run) > 0 {
		return 1
	}
	return 0
}

type summaryRow struct {
	name string
	rep  *checker.Report
	err  error
}

// printSummary prints one line per run with its violations per property; it returns the
// number of runs with violations or errors.
func printSummary(rows []summaryRow, where string) int {
	fmt.Println("══ summary (violations per property; details in each run's violations.txt under " + where + ")")
	short := map[string]string{checker.Ordered: "ord", checker.Unique: "uniq", checker.Atomic: "atom", checker.Reliable: "rel", checker.Resumable: "res",
		checker.Bookmarkable: "bmk", checker.PrevKV: "prev", checker.Filter: "filt", checker.Events: "evt", checker.Compaction: "cmp", checker.Cancel: "cncl",
		checker.Created: "crt", checker.WatchID: "wid", checker.Range: "rng", checker.Linearizable: "lin", checker.Permission: "perm"}
	hdr := fmt.Sprintf("%-34s %7s %9s %-44s", "run", "writes", "events", "faults")
	for _, p := range checker.Properties {
		hdr += fmt.Sprintf(" %4s", short[p])
	}
	fmt.Println(hdr + "  total")
	bad := 0
	for _, r := range rows {
		if r.err != nil {
			fmt.Printf("%-34s harness error: %v\n", r.name, r.err)
			bad++
			continue
		}
		f := r.rep.Figures
		line := fmt.Sprintf("%-34s %7d %9d %-44s", r.name, f.Writes, f.EventsDelivered, strings.ReplaceAll(r.rep.FaultsLine(), "compactions", "compact"))
		for _, p := range checker.Properties {
			line += fmt.Sprintf(" %4d", r.rep.Count(p))
		}
		fmt.Printf("%s  %d\n", line, r.rep.Total())
		if r.rep.Total() > 0 {
			bad++
		}
	}
	return bad
}
