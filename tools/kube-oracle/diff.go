package main

// kube-oracle diff: every scenario through `watchcache replay` and through the oracle of its
// profile, compared record by record; a table of same / differs / no counterpart; failure on a
// difference that the allow-list does not name.
//
// What is compared. Both traces are grouped by instant (`at`) and, within an instant, by client
// (`id`; records without one, such as RELIST and REQUEST_PROGRESS, form their own group): the
// order of one client's records is compared, the interleaving of different clients within one
// millisecond is not (in Kubernetes it is goroutine scheduling, invisible to clients). Fields a
// Kubernetes client cannot observe are dropped on both sides: the `reason` watchcache gives for
// a LIST/GET/WATCH/RANGE/RELIST decision (the ERROR/REJECTED `reason` is the Status reason and
// is compared), the `message` of a CLOSED (a Kubernetes stream just ends), and the cache RV of a
// GET (Kubernetes' Get returns the object only).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

type side struct {
	spec string // "watchcache", "oracle" (the scenario's profile) or "oracle:PROFILE"
}

type outcome struct {
	trace         []map[string]any
	variants      [][]map[string]any // every distinct trace of the runs (the oracle's: see -runs)
	noCounterpart string
	skipped       map[string]string
	err           string
	profile       string
}

type allowEntry struct {
	scenario, profile, reason, ref string
	ids                            map[string]bool // nil: every client of the scenario
	used                           bool
}

type row struct {
	scenario, profile, result, detail string
	diffIDs                           []string // clients whose records differ ("-": records without id)
	allowed                           bool
	failed                            bool
	dur                               time.Duration
}

func diffCmd(args []string) int {
	fl := flag.NewFlagSet("diff", flag.ExitOnError)
	root := repoRoot()
	watchcache := fl.String("watchcache", filepath.Join(root, "target/release/watchcache"), "the watchcache binary (`watchcache replay FILE`)")
	binDir := fl.String("bin", filepath.Join(root, ".tools/bin"), "where kube-oracle-<profile> binaries are")
	allowPath := fl.String("allow", filepath.Join(root, "tools/kube-oracle/allow.txt"), "allow-list file")
	left := fl.String("left", "watchcache", "left side: watchcache, oracle or oracle:PROFILE")
	right := fl.String("right", "oracle", "right side: oracle or oracle:PROFILE (or watchcache)")
	jobs := fl.Int("j", 2, "scenarios run in parallel")
	fl.IntVar(&oracleRuns, "runs", 8, "runs of the oracle per scenario: where two of Kubernetes' goroutines act at the same instant the outcome can vary, and each outcome seen is accepted")
	fl.IntVar(&oracleRacyRuns, "racy-runs", 24, "further runs of a scenario whose first runs varied (to see all its outcomes)")
	verbose := fl.Bool("v", false, "print the differing records of every scenario that differs")
	noAllow := fl.Bool("no-allow", false, "ignore the allow-list (every difference fails)")
	showReasons := fl.Bool("reasons", false, "print the allow-list's reason beside each allowed difference")
	_ = fl.Parse(args)
	files := fl.Args()
	if len(files) == 0 {
		files, _ = filepath.Glob(filepath.Join(root, "scenarios/*.json"))
	}
	var scenarios []string
	for _, f := range files {
		if !strings.HasSuffix(f, ".trace.json") {
			scenarios = append(scenarios, f)
		}
	}
	sort.Strings(scenarios)
	var allow []*allowEntry
	if !*noAllow && *left == "watchcache" {
		var err error
		if allow, err = readAllow(*allowPath); err != nil {
			fmt.Fprintln(os.Stderr, "kube-oracle diff:", err)
			return 2
		}
	}
	rows := make([]row, len(scenarios))
	details := make([]string, len(scenarios))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, *jobs))
	for i, f := range scenarios {
		wg.Add(1)
		go func(i int, f string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			rows[i], details[i] = compareOne(f, side{*left}, side{*right}, *watchcache, *binDir)
			rows[i].dur = time.Since(start)
		}(i, f)
	}
	wg.Wait()

	counts := map[string]int{}
	unlisted := 0
	width := 10
	for _, r := range rows {
		width = max(width, len(r.scenario))
	}
	fmt.Printf("%-*s  %-7s  %s\n", width, "scenario", "profile", "result")
	for i := range rows {
		r := &rows[i]
		if r.result == "differs" {
			var reasons []string
			uncovered := []string{}
			for _, id := range r.diffIDs {
				covered := false
				for _, a := range allow {
					if a.scenario == r.scenario && a.profile == r.profile && (a.ids == nil || a.ids[id]) {
						covered, a.used = true, true
						reasons = append(reasons, a.reason+" ["+a.ref+"]")
					}
				}
				if !covered {
					uncovered = append(uncovered, id)
				}
			}
			r.allowed = len(uncovered) == 0
			if !r.allowed {
				unlisted++
				r.detail = "not in the allow-list: " + strings.Join(uncovered, ", ") + " -- " + r.detail
			} else if *showReasons {
				r.detail = "allowed: " + strings.Join(dedup(reasons), "; ") + " -- " + r.detail
			}
		}
		if r.result == "error" {
			unlisted++
		}
		counts[r.result]++
		label := r.result
		if r.result == "differs" && r.allowed {
			label = "differs (allowed)"
		} else if r.result == "differs" {
			label = "DIFFERS"
		}
		fmt.Printf("%-*s  %-7s  %s", width, r.scenario, r.profile, label)
		if r.detail != "" {
			fmt.Printf(": %s", r.detail)
		}
		fmt.Println()
		if *verbose && details[i] != "" {
			fmt.Println(indent(details[i], "    "))
		}
	}
	ran := map[string]bool{}
	for _, r := range rows {
		ran[r.scenario+"@"+r.profile] = true
	}
	for _, a := range allow {
		if !a.used && ran[a.scenario+"@"+a.profile] {
			fmt.Printf("note: allow-list entry %s@%s matches no difference (remove it if the scenario is now the same)\n", a.scenario, a.profile)
		}
	}
	fmt.Printf("\n%d scenarios: %d same, %d differ (%d not in the allow-list), %d without a Kubernetes counterpart, %d errors\n",
		len(rows), counts["same"], counts["differs"], unlisted-counts["error"], counts["no counterpart"], counts["error"])
	if unlisted > 0 {
		return 1
	}
	return 0
}

func compareOne(file string, l, r side, watchcache, binDir string) (row, string) {
	name := strings.TrimSuffix(filepath.Base(file), ".json")
	out := row{scenario: name}
	sc, err := loadScenario(file)
	if err != nil {
		out.result, out.detail = "error", err.Error()
		return out, ""
	}
	profile := strOr(sc.Config, "profile", "v1.30")
	if !strings.HasPrefix(profile, "v") {
		profile = "v" + profile
	}
	out.profile = profile
	a := runSide(l, file, profile, watchcache, binDir)
	b := runSide(r, file, profile, watchcache, binDir)
	for _, o := range []outcome{a, b} {
		if o.err != "" {
			out.result, out.detail = "error", o.err
			return out, ""
		}
	}
	for _, o := range []outcome{a, b} {
		if o.noCounterpart != "" {
			out.result, out.detail = "no counterpart", o.noCounterpart
			return out, ""
		}
	}
	skipped := map[string]string{}
	for _, o := range []outcome{a, b} {
		for id, why := range o.skipped {
			skipped[id] = why
		}
	}
	// A skipped request is fine only if the other side refused it without effect.
	var notes []string
	for _, id := range sortedKeys(skipped) {
		for _, o := range []outcome{a, b} {
			if o.skipped[id] != "" {
				continue
			}
			for _, rec := range o.trace {
				if rec["id"] == id && rec["type"] != "REJECTED" {
					out.result = "no counterpart"
					out.detail = fmt.Sprintf("request %s (%s) is accepted by %s", id, skipped[id], o.profile)
					return out, ""
				}
			}
		}
		notes = append(notes, fmt.Sprintf("%s skipped (%s)", id, skipped[id]))
	}
	va, vb := variantGroups(a, skipped), variantGroups(b, skipped)
	racy := racyGroups(va, vb)
	bad := map[string]bool{}
	for k, sa := range va {
		if !intersects(sa, vb[k]) {
			bad[k.id] = true
		}
	}
	for k, sb := range vb {
		if !intersects(va[k], sb) {
			bad[k.id] = true
		}
	}
	if len(racy) > 0 {
		notes = append(notes, "Kubernetes varies with goroutine scheduling at "+strings.Join(racy, ", ")+" (every outcome seen is accepted)")
	}
	if len(bad) == 0 {
		out.result = "same"
		out.detail = strings.Join(notes, "; ")
		return out, ""
	}
	// Describe the difference between the closest variants.
	ta, tb := closest(a, b, skipped)
	summary, detail, _ := compareTraces(ta, tb, l.spec, r.spec)
	for id := range bad {
		if id == "" {
			id = "-"
		}
		out.diffIDs = append(out.diffIDs, id)
	}
	sort.Strings(out.diffIDs)
	out.result = "differs"
	notes = append([]string{summary}, notes...)
	out.detail = strings.Join(notes, "; ")
	return out, detail
}

// oracleRuns is how many times the oracle runs each scenario, oracleRacyRuns how many more
// times if those runs did not all agree.
var oracleRuns, oracleRacyRuns = 8, 24

func variantsOf(o outcome) [][]map[string]any {
	if len(o.variants) > 0 {
		return o.variants
	}
	return [][]map[string]any{o.trace}
}

// variantGroups maps each (instant, client) to the set of record sequences its variants show
// there ("" for none).
func variantGroups(o outcome, skipped map[string]string) map[groupKey]map[string]bool {
	vs := variantsOf(o)
	keys := map[groupKey]bool{}
	per := make([]map[groupKey][]string, len(vs))
	for i, v := range vs {
		per[i], _ = groupsOf(normalize(v, skipped))
		for k := range per[i] {
			keys[k] = true
		}
	}
	out := map[groupKey]map[string]bool{}
	for k := range keys {
		out[k] = map[string]bool{}
		for i := range vs {
			out[k][strings.Join(per[i][k], "\n")] = true
		}
	}
	return out
}

func intersects(a, b map[string]bool) bool {
	if a == nil {
		a = map[string]bool{"": true}
	}
	if b == nil {
		b = map[string]bool{"": true}
	}
	for x := range a {
		if b[x] {
			return true
		}
	}
	return false
}

func racyGroups(sides ...map[groupKey]map[string]bool) []string {
	seen := map[string]bool{}
	for _, g := range sides {
		for k, set := range g {
			if len(set) > 1 {
				id := k.id
				if id == "" {
					id = "-"
				}
				seen[fmt.Sprintf("%v ms (%s)", k.at, id)] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// closest returns the pair of variants with the fewest differing groups.
func closest(a, b outcome, skipped map[string]string) ([]map[string]any, []map[string]any) {
	best, ba, bb := -1, []map[string]any(nil), []map[string]any(nil)
	for _, x := range variantsOf(a) {
		for _, y := range variantsOf(b) {
			nx, ny := normalize(x, skipped), normalize(y, skipped)
			gx, _ := groupsOf(nx)
			gy, _ := groupsOf(ny)
			n := 0
			for k, v := range gx {
				if strings.Join(v, "\n") != strings.Join(gy[k], "\n") {
					n++
				}
			}
			for k := range gy {
				if _, ok := gx[k]; !ok {
					n++
				}
			}
			if best < 0 || n < best {
				best, ba, bb = n, nx, ny
			}
		}
	}
	return ba, bb
}

func runSide(s side, file, profile, watchcache, binDir string) outcome {
	o := outcome{profile: profile}
	if s.spec == "watchcache" {
		o.profile = "watchcache"
		cmd := exec.Command(watchcache, "replay", file)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		if err != nil {
			o.err = fmt.Sprintf("watchcache replay: %v: %s", err, strings.TrimSpace(stderr.String()))
			return o
		}
		if err := json.Unmarshal(stdout, &o.trace); err != nil {
			o.err = "watchcache replay: " + err.Error()
		}
		return o
	}
	args := []string{"run"}
	if p, ok := strings.CutPrefix(s.spec, "oracle:"); ok {
		profile = p
		args = append(args, "-profile", p)
	}
	o.profile = "kubernetes " + profile
	bin := filepath.Join(binDir, "kube-oracle-"+profile)
	if _, err := os.Stat(bin); err != nil {
		o.noCounterpart = fmt.Sprintf("no oracle for profile %s (%s missing: make setup-kube-oracle)", profile, bin)
		return o
	}
	metaFile, err := os.CreateTemp("", "kube-oracle-meta-*.json")
	if err != nil {
		o.err = err.Error()
		return o
	}
	metaFile.Close()
	defer os.Remove(metaFile.Name())
	args = append(args, "-meta", metaFile.Name(), file)
	seen := map[string]bool{}
	runs := max(1, oracleRuns)
	for run := 0; run < runs; run++ {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		var m runMeta
		if b, rerr := os.ReadFile(metaFile.Name()); rerr == nil {
			_ = json.Unmarshal(b, &m)
		}
		o.skipped = m.Skipped
		if m.NoCounterpart != "" {
			o.noCounterpart = m.NoCounterpart
			return o
		}
		if err != nil {
			o.err = fmt.Sprintf("%s: %v: %s", filepath.Base(bin), err, lastLines(stderr.String(), 5))
			return o
		}
		var t []map[string]any
		if err := json.Unmarshal(stdout, &t); err != nil {
			o.err = filepath.Base(bin) + ": " + err.Error()
			return o
		}
		if run == 0 {
			o.trace = t
		}
		if !seen[string(stdout)] {
			seen[string(stdout)] = true
			o.variants = append(o.variants, t)
		}
		if run == runs-1 && runs == max(1, oracleRuns) && len(o.variants) > 1 {
			runs += oracleRacyRuns // it races: look for all its outcomes
		}
	}
	return o
}

// normalize drops what a Kubernetes client cannot observe and the skipped requests' records.
func normalize(trace []map[string]any, skipped map[string]string) []map[string]any {
	var out []map[string]any
	for _, r := range trace {
		if id, ok := r["id"].(string); ok && skipped[id] != "" {
			continue
		}
		c := map[string]any{}
		for k, v := range r {
			c[k] = v
		}
		switch c["type"] {
		case "LIST", "GET", "WATCH", "RANGE", "RELIST":
			delete(c, "reason")
		case "CLOSED":
			delete(c, "message")
		}
		if c["type"] == "GET" {
			delete(c, "rv")
		}
		out = append(out, c)
	}
	return out
}

type groupKey struct {
	at float64
	id string
}

func groupsOf(trace []map[string]any) (map[groupKey][]string, map[string][]map[string]any) {
	g := map[groupKey][]string{}
	perID := map[string][]map[string]any{}
	for _, r := range trace {
		at, _ := r["at"].(float64)
		id, _ := r["id"].(string)
		g[groupKey{at, id}] = append(g[groupKey{at, id}], compact(r))
		perID[id] = append(perID[id], r)
	}
	return g, perID
}

func compact(r map[string]any) string {
	b, _ := json.Marshal(r) // map keys sorted: a canonical form
	return string(b)
}

// compareTraces returns "" if the traces are the same, else a one-line summary per client, the
// differing records and the differing clients.
func compareTraces(a, b []map[string]any, la, lb string) (string, string, []string) {
	ga, pa := groupsOf(a)
	gb, pb := groupsOf(b)
	same := len(ga) == len(gb)
	if same {
		for k, v := range ga {
			if strings.Join(v, "\n") != strings.Join(gb[k], "\n") {
				same = false
				break
			}
		}
	}
	if same {
		return "", "", nil
	}
	ids := map[string]bool{}
	for id := range pa {
		ids[id] = true
	}
	for id := range pb {
		ids[id] = true
	}
	var summary, differing []string
	var detail strings.Builder
	for _, id := range sortedSet(ids) {
		ra, rb := pa[id], pb[id]
		if seqEqual(ra, rb, nil) {
			continue
		}
		name := id
		if name == "" {
			name = "-"
		}
		differing = append(differing, name)
		switch {
		case seqEqual(ra, rb, []string{"at"}):
			i := firstDiff(ra, rb, nil)
			summary = append(summary, fmt.Sprintf("%s: same records at other times (first %s at %v, %s at %v)",
				name, la, ra[i]["at"], lb, rb[i]["at"]))
		case seqEqual(ra, rb, []string{"message"}):
			i := firstDiff(ra, rb, nil)
			summary = append(summary, fmt.Sprintf("%s: message %q vs %q", name, ra[i]["message"], rb[i]["message"]))
		default:
			i := firstDiff(ra, rb, nil)
			summary = append(summary, fmt.Sprintf("%s: %s vs %s", name, short(ra, i), short(rb, i)))
		}
		fmt.Fprintf(&detail, "%s:\n", name)
		for _, r := range ra {
			fmt.Fprintf(&detail, "  %-12s %s\n", la, compact(r))
		}
		for _, r := range rb {
			fmt.Fprintf(&detail, "  %-12s %s\n", lb, compact(r))
		}
	}
	if len(summary) == 0 {
		summary = append(summary, "same records per client, in another order within an instant")
		differing = append(differing, "-")
	}
	return strings.Join(summary, "; "), detail.String(), differing
}

func short(rs []map[string]any, i int) string {
	if i >= len(rs) {
		return fmt.Sprintf("(%d records, nothing more)", len(rs))
	}
	r := rs[i]
	parts := []string{fmt.Sprintf("at %v %v", r["at"], r["type"])}
	for _, k := range []string{"source", "key", "rv", "cause", "code", "reason", "message", "continue", "remaining"} {
		if v, ok := r[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	if items, ok := r["items"].([]any); ok {
		parts = append(parts, fmt.Sprintf("%d items", len(items)))
	}
	if ann, ok := r["annotations"]; ok {
		parts = append(parts, fmt.Sprintf("annotations=%v", ann))
	}
	return strings.Join(parts, " ")
}

func without(r map[string]any, drop []string) string {
	c := map[string]any{}
	for k, v := range r {
		c[k] = v
	}
	for _, k := range drop {
		delete(c, k)
	}
	return compact(c)
}

func seqEqual(a, b []map[string]any, drop []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if without(a[i], drop) != without(b[i], drop) {
			return false
		}
	}
	return true
}

func firstDiff(a, b []map[string]any, drop []string) int {
	for i := range a {
		if i >= len(b) || without(a[i], drop) != without(b[i], drop) {
			return i
		}
	}
	return len(a)
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readAllow reads the allow-list: one entry a line, `scenario@profile[:id,id...] | reason |
// reference` (reference: a Kubernetes file:line or an upstream issue); the ids name the clients
// whose records may differ ("-" for records without an id such as REQUEST_PROGRESS), none
// means any; `#` starts a comment.
func readAllow(path string) ([]*allowEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	var out []*allowEntry
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, "|")
		if len(parts) != 3 {
			return nil, fmt.Errorf("%s:%d: want `scenario@profile[:ids] | reason | reference`", path, n)
		}
		e := &allowEntry{reason: strings.TrimSpace(parts[1]), ref: strings.TrimSpace(parts[2])}
		var rest, ids string
		e.scenario, rest, _ = strings.Cut(strings.TrimSpace(parts[0]), "@")
		e.profile, ids, _ = strings.Cut(rest, ":")
		if ids != "" {
			e.ids = map[string]bool{}
			for _, id := range strings.Split(ids, ",") {
				e.ids[strings.TrimSpace(id)] = true
			}
		}
		if e.scenario == "" || e.profile == "" || e.reason == "" || e.ref == "" {
			return nil, fmt.Errorf("%s:%d: scenario@profile, reason and reference are all required", path, n)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

func repoRoot() string {
	if out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	wd, _ := os.Getwd()
	return wd
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
