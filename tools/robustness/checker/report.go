package checker

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Total is the number of violations.
func (r *Report) Total() int { return len(r.Violations) }

// FaultsLine spells the faults done: "etcd-kill 2, etcd-stop 2, target-kill 2, compactions 14".
func (r *Report) FaultsLine() string {
	var kinds []string
	for k := range r.Figures.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Figures.Faults[k]))
	}
	parts = append(parts, fmt.Sprintf("compactions %d", r.Figures.Compactions))
	return strings.Join(parts, ", ")
}

// PrintTable writes the figures and one line per property.
func (r *Report) PrintTable(w io.Writer, title string) {
	f := &r.Figures
	fmt.Fprintf(w, "── %s\n", title)
	fmt.Fprintf(w, "   writes %d (%d failed) · revisions %d · etcd events %d · streams %d (%d broken) · watch records %d (%d open at the end, %d not drained)\n",
		f.Writes, f.WritesFailed, f.Revisions, f.HistoryEvents, f.Streams, f.StreamBreaks, f.WatchRecords, f.WatchesOpenAtEnd, f.NotDrained)
	fmt.Fprintf(w, "   responses %d · events delivered %d · progress notifications %d · compaction cancels %d · ranges %d (%d failed)\n",
		f.Responses, f.EventsDelivered, f.ProgressNotifications, f.CompactionCancels, f.Ranges, f.RangesFailed)
	if f.DeniedCreates > 0 {
		fmt.Fprintf(w, "   creates of ranges the stream's user may not read: %d (%d refused as etcd refuses them)\n", f.DeniedCreates, f.DeniedRefused)
	}
	fmt.Fprintf(w, "   faults: %s\n", r.FaultsLine())
	fmt.Fprintf(w, "   %-13s %s\n", "property", "violations")
	for _, p := range Properties {
		n := r.Count(p)
		mark := ""
		if n > 0 {
			mark = "  <<"
		}
		fmt.Fprintf(w, "   %-13s %d%s\n", p, n, mark)
	}
	fmt.Fprintf(w, "   %-13s %d\n", "total", r.Total())
}

// PrintDetails writes up to perProperty violations of each property in full (0: all).
func (r *Report) PrintDetails(w io.Writer, perProperty int) {
	shown := map[string]int{}
	for i := range r.Violations {
		v := &r.Violations[i]
		shown[v.Property]++
		if perProperty > 0 && shown[v.Property] > perProperty {
			continue
		}
		fmt.Fprint(w, v.String())
	}
	for _, p := range Properties {
		if n := shown[p]; perProperty > 0 && n > perProperty {
			fmt.Fprintf(w, "[%s] … %d more (all in violations.txt)\n", p, n-perProperty)
		}
	}
}
