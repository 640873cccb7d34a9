package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"watchcache.local/tools/robustness/checker"
	"watchcache.local/tools/robustness/harness"
)

func cmdHA(args []string) int {
	fs := flag.NewFlagSet("ha", flag.ExitOnError)
	var c common
	c.flags(fs)
	seed := fs.Int64("seed", 1, "seed of the load")
	dur := fs.Duration("duration", 60*time.Second, "length of the load (the replica is killed at 1/6, the leader at about 1/2)")
	watches := fs.Int("watches", 20, "watches of the client under test")
	rate := fs.Float64("rate", 100, "writes/s (to etcd directly)")
	flagset := fs.Int("flagset", 0, "watchcache flag set (as run)")
	out := fs.String("out", "", "directory for logs, violations.txt and the recording")
	_ = fs.Parse(args)
	res, err := harness.RunHA(harness.HAConfig{Seed: *seed, Duration: *dur, Watches: *watches, WriteRate: *rate, FlagSet: *flagset,
		EtcdBin: c.etcdBin, WatchcacheBin: c.wcBin, Out: *out, Log: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "robustness ha:", err)
		return 2
	}
	rep, err := checker.Check(res.Run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "robustness ha: checking:", err)
		return 2
	}
	rep.PrintTable(os.Stdout, fmt.Sprintf("HA: 3 etcd members, 2 watchcache replicas, %d clientv3 watches over both · %s", *watches, *dur))
	for _, f := range res.Failovers {
		fmt.Printf("   %s at +%.1fs (%s; the watches then on %s): longest time without an event around it, per prefix watch: median %.0f ms, max %.0f ms (etcd's own watch: %.0f ms)\n",
			f.What, f.At.Seconds(), f.Replica, f.After, harness.Median(f.GapsMS), harness.Max(f.GapsMS), f.EtcdGaps)
	}
	if rep.Total() > 0 {
		rep.PrintDetails(os.Stdout, 5)
	}
	if *out != "" {
		if f, err := os.Create(*out + "/violations.txt"); err == nil {
			rep.PrintDetails(f, 0)
			f.Close()
		}
	}
	if rep.Total() > 0 {
		return 1
	}
	return 0
}

func cmdSlowReaders(args []string) int {
	fs := flag.NewFlagSet("slow-readers", flag.ExitOnError)
	var c common
	c.flags(fs)
	streams := fs.Int("streams", 100, "watch streams")
	per := fs.Int("per-stream", 10, "watches per stream (all on the prefix)")
	rate := fs.Float64("rate", 1000, "events/s written (txns of 10 puts)")
	warm := fs.Duration("warmup", 10*time.Second, "reading normally before the stall")
	stall := fs.Duration("stall", 60*time.Second, "how long every watcher stops reading")
	recover := fs.Duration("recover", 10*time.Second, "writes go on this long after reading resumes")
	catchup := fs.Duration("catch-up", 10*time.Minute, "the longest the watchers may take to catch up")
	flagset := fs.Int("flagset", 0, "watchcache flag set (as run)")
	extra := fs.String("watchcache-flags", "", "more watchcache flags (space separated)")
	out := fs.String("out", "", "directory for logs")
	_ = fs.Parse(args)
	var ex []string
	if *extra != "" {
		ex = strings.Fields(*extra)
	}
	res, err := harness.RunSlowReaders(harness.SlowConfig{Streams: *streams, PerStream: *per, Rate: *rate, Warmup: *warm, Stall: *stall,
		Recover: *recover, CatchUp: *catchup, FlagSet: *flagset, Extra: ex, EtcdBin: c.etcdBin, WatchcacheBin: c.wcBin, Out: *out, Log: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "robustness slow-readers:", err)
		return 2
	}
	fmt.Printf("── slow readers: %d watchers (%d streams × %d) on /registry/, %.0f events/s, all stop reading for %s\n", res.Watchers, *streams, *per, *rate, *stall)
	fmt.Printf("   %s\n", strings.Join(res.Args, " "))
	fmt.Printf("   etcd: %d txns, %d events, final revision %d · delivered %d events (%.1f per watcher per etcd event)\n",
		res.Writes, res.Events, res.FinalRevision, res.EventsDelivered, float64(res.EventsDelivered)/float64(max(1, int64(res.Watchers)*res.Events)))
	fmt.Printf("   watchcache RSS: baseline %.1f MiB, peak %.1f MiB, growth %.1f MiB (%d samples)\n",
		float64(res.BaselineKB)/1024, float64(res.PeakKB)/1024, float64(res.PeakKB-res.BaselineKB)/1024, len(res.RSSKB))
	if res.CatchUpSeconds > 0 {
		fmt.Printf("   every watcher had etcd's revision at the resume %.1f s after reading again\n", res.CatchUpSeconds)
	}
	if res.CaughtUp {
		fmt.Printf("   every watcher had every event up to the final revision %.1f s after reading again\n", res.CompleteSeconds)
	} else {
		fmt.Printf("   NOT caught up %.1f s after reading again\n", res.CompleteSeconds)
	}
	var props []string
	for p := range res.Counts {
		props = append(props, p)
	}
	sort.Strings(props)
	total := 0
	for _, p := range props {
		fmt.Printf("   %-13s %d\n", p, res.Counts[p])
		total += res.Counts[p]
	}
	fmt.Printf("   violations %d (watchers with a problem: %d)\n", total, res.WatchersWithProblem)
	for _, e := range res.Examples {
		fmt.Println("   " + e)
	}
	if *out != "" {
		if f, err := os.Create(*out + "/rss.txt"); err == nil {
			for i, kb := range res.RSSKB {
				fmt.Fprintf(f, "%d %d\n", i+1, kb)
			}
			f.Close()
		}
	}
	if total > 0 || !res.CaughtUp {
		return 1
	}
	return 0
}
