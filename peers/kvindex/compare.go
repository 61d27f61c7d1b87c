package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runCompare writes the workload files if missing, then runs rounds of
// (kvroute, PositionalIndexer, radix tree) in alternation, each index in
// a process of its own per (workload, threads, heap), and prints the
// medians as Markdown.
func runCompare(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	rust := fs.String("rust", "", "the peers/dynamo-index binary")
	dir := fs.String("dir", os.TempDir(), "where workload files and raw results go")
	rounds := fs.Int("rounds", 5, "rounds per side")
	fleets := fs.String("workers", "64,1000", "fleet presets")
	threadList := fs.String("threads", "1,2", "thread counts")
	minLookup := fs.Duration("min-lookup", 500*time.Millisecond, "least wall time per query case")
	heaps := fs.String("heap", "fresh,warm", "fresh: each index built in a process that never held one; warm: built and dropped once first")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits
	for _, h := range strings.Split(*heaps, ",") {
		if h != "fresh" && h != "warm" {
			return fmt.Errorf("compare: -heap %q: want fresh or warm, or both comma-separated", h)
		}
	}
	if *rust == "" {
		return fmt.Errorf("compare: -rust is required")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	raw, err := os.Create(filepath.Join(*dir, "index-peers.jsonl"))
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	var all []Result
	for _, f := range strings.Split(*fleets, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || presets[n].Workers == 0 {
			return fmt.Errorf("compare: no preset for %q workers", f)
		}
		path := filepath.Join(*dir, fmt.Sprintf("index-peers-w%d.bin", n))
		if !currentFile(path) {
			if err := genFile(presets[n], path); err != nil {
				return err
			}
		}
		for r := 1; r <= *rounds; r++ {
			for _, t := range strings.Split(*threadList, ",") {
				for _, h := range strings.Split(*heaps, ",") {
					// One process per index: indexes built in one process
					// share its allocator, and one built after another reuses
					// the memory the first freed.
					ms := strconv.Itoa(int(minLookup.Milliseconds()))
					sides := [][]string{
						{self, "measure", "-in", path, "-threads", t, "-min-lookup", minLookup.String(), "-heap", h},
						{*rust, "--in", path, "--threads", t, "--min-lookup-ms", ms, "--index", "positional", "--heap", h},
						{*rust, "--in", path, "--threads", t, "--min-lookup-ms", ms, "--index", "radix", "--heap", h},
					}
					for _, argv := range sides {
						fmt.Fprintf(os.Stderr, "round %d/%d: %s\n", r, *rounds, strings.Join(argv, " "))
						out, err := runSide(argv)
						if err != nil {
							return err
						}
						if _, err := raw.Write(out); err != nil {
							return err
						}
						dec := json.NewDecoder(bytes.NewReader(out))
						for {
							var res Result
							if err := dec.Decode(&res); err == io.EOF {
								break
							} else if err != nil {
								return fmt.Errorf("%s: %w", argv[0], err)
							}
							all = append(all, res)
						}
					}
				}
			}
		}
	}
	return writeTable(os.Stdout, all)
}

func runSide(argv []string) ([]byte, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return out, nil
}

type seriesKey struct {
	side, index, heap string
	workers, threads  int
}

// writeTable prints one row per (fleet, threads, index): medians over
// rounds of events per CPU-second, µs of CPU per lookup per case and bytes
// per entry, then the ratios of kvroute to each Dynamo index. It checks
// that every index found the same matches.
func writeTable(w io.Writer, all []Result) error {
	groups := map[seriesKey][]Result{}
	var keys []seriesKey
	for _, r := range all {
		k := seriesKey{r.Side, r.Index, r.Heap, r.Workers, r.Threads}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	slices.SortStableFunc(keys, func(a, b seriesKey) int {
		if a.heap != b.heap {
			return strings.Compare(a.heap, b.heap) // fresh before warm
		}
		if a.workers != b.workers {
			return a.workers - b.workers
		}
		return a.threads - b.threads
	})
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "| heap | workers | threads | index | apply: events/CPU-s | blocks/CPU-s | events/CPU-s incl. hashing | lookup µs CPU: full | early | system | bytes/entry | rounds |\n")
	fmt.Fprintf(bw, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	type row struct {
		events, blocks, hashed float64
		lookup                 [3]float64
		bytes                  float64
	}
	rows := map[seriesKey]row{}
	for _, k := range keys {
		rs := groups[k]
		var rw row
		rw.events = median(rs, func(r Result) float64 { return float64(r.Events) / r.ApplyCPU })
		rw.blocks = median(rs, func(r Result) float64 { return float64(r.Blocks) / r.ApplyCPU })
		rw.hashed = median(rs, func(r Result) float64 { return float64(r.Events) / (r.ApplyCPU + r.HashCPU) })
		rw.bytes = median(rs, func(r Result) float64 { return r.BytesPerEnt })
		for c := range caseNames {
			rw.lookup[c] = median(rs, func(r Result) float64 {
				l := r.Lookups[c]
				return l.CPU / float64(l.Lookups) * 1e6
			})
		}
		rows[k] = rw
		fmt.Fprintf(bw, "| %s | %d | %d | %s %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.0f | %d |\n",
			k.heap, k.workers, k.threads, k.side, k.index, rw.events, rw.blocks, rw.hashed, rw.lookup[0], rw.lookup[1], rw.lookup[2], rw.bytes, len(rs))
	}
	fmt.Fprintf(bw, "\nkvroute against each Dynamo index (>1: kvroute ahead; apply and memory as kvroute/dynamo and dynamo/kvroute, lookups as dynamo/kvroute):\n\n")
	fmt.Fprintf(bw, "| heap | workers | threads | kvroute | against | apply | apply incl. hashing | lookup full | early | system | memory |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		if k.side != "dynamo" {
			continue
		}
		ours, ok := rows[seriesKey{"kvroute", "kvindex.Index", k.heap, k.workers, k.threads}]
		if !ok {
			continue
		}
		d := rows[k]
		fmt.Fprintf(bw, "| %s | %d | %d | kvindex.Index | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", k.heap, k.workers, k.threads, k.index,
			ours.events/d.events, ours.hashed/d.hashed, d.lookup[0]/ours.lookup[0], d.lookup[1]/ours.lookup[1], d.lookup[2]/ours.lookup[2], d.bytes/ours.bytes)
	}
	// Same bytes in, same matches out.
	for _, k := range keys {
		ref := groups[seriesKey{"kvroute", "kvindex.Index", k.heap, k.workers, k.threads}]
		for _, r := range groups[k] {
			for c := range r.Lookups {
				if len(ref) > 0 && r.Lookups[c].Checksum != ref[0].Lookups[c].Checksum {
					fmt.Fprintf(bw, "\nWARNING: %s %s (%d workers) case %s: matched blocks %d, kvindex %d\n",
						k.side, k.index, k.workers, r.Lookups[c].Case, r.Lookups[c].Checksum, ref[0].Lookups[c].Checksum)
				}
			}
		}
	}
	return bw.Flush()
}

func median(rs []Result, f func(Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// currentFile reports whether path is a workload file of this version:
// one written by an older gen is written again.
func currentFile(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	head := make([]byte, len(magic))
	_, err = io.ReadFull(f, head)
	return err == nil && string(head) == magic
}
