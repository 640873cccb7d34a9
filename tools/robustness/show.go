package main

import (
	"flag"
	"fmt"
	"os"
	"sort"

	"watchcache.local/tools/robustness/record"
)

// cmdShow prints one stream's log (sends and responses in order), to read a violation's context.
func cmdShow(args []string) int {
	fs := flag.NewFlagSet("show", flag.ExitOnError)
	watch := fs.Int("watch", -1, "the watch record whose stream to print")
	stream := fs.Int("stream", -1, "the stream to print")
	events := fs.Int("events", 6, "events spelled out per response")
	from := fs.Int("from", 0, "first seq")
	to := fs.Int("to", 1<<30, "last seq")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: robustness show [--watch N | --stream N] RUN.gob.gz")
		return 2
	}
	run, err := record.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *watch >= 0 {
		*stream = run.Watches[*watch].Stream
	}
	if *stream < 0 || *stream >= len(run.Streams) {
		fmt.Fprintln(os.Stderr, "no such stream")
		return 2
	}
	s := &run.Streams[*stream]
	fmt.Printf("stream %d: %s slot %d slow=%v target %s opened +%.3fs end %q at #%d +%.3fs\n", s.ID, s.Client, s.Slot, s.Slow, s.Target, s.Opened.Seconds(), s.End, s.EndSeq, s.EndAt.Seconds())
	type line struct {
		seq int
		txt string
	}
	var lines []line
	for _, snd := range s.Sends {
		var t string
		switch snd.Kind {
		case record.SendCreate:
			w := run.Watches[snd.Watch]
			t = fmt.Sprintf("-> #%d +%.3fs CREATE record %d (%s, %s, resumes %d) known=%d %s", snd.Seq, snd.At.Seconds(), w.ID, w.Kind, w.StartKind, w.ResumeOf, snd.KnownRevision, w.Request.String())
		case record.SendCancel:
			t = fmt.Sprintf("-> #%d +%.3fs CANCEL id=%d (%s)", snd.Seq, snd.At.Seconds(), snd.WatchID, snd.Reason)
		case record.SendProgress:
			t = fmt.Sprintf("-> #%d +%.3fs PROGRESS", snd.Seq, snd.At.Seconds())
		}
		lines = append(lines, line{snd.Seq, t})
	}
	for i := range s.Recvs {
		r := &s.Recvs[i]
		lines = append(lines, line{r.Seq, "<- " + r.Describe(*events, nil)})
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].seq < lines[j].seq })
	for _, l := range lines {
		if l.seq >= *from && l.seq <= *to {
			fmt.Println(l.txt)
		}
	}
	return 0
}
