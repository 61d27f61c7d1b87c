// Command peers/kvindex sets kvroute's KV index beside Dynamo's published
// one (the Rust crate dynamo-kv-router, driven by peers/dynamo-index) on the
// same bytes: it writes workload files of KV events and prompts, measures
// kvindex.Index on them, and runs both sides in interleaved rounds into a
// table. See docs/index-peers.md.
//
//	go run ./peers/kvindex gen -workers 64 -o idx-w64.bin
//	go run ./peers/kvindex measure -in idx-w64.bin -threads 1
//	go run ./peers/kvindex compare -rust PATH -dir DIR -rounds 5
//
// (make bench-index-peers builds it as bin/peers-kvindex).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = runGen(os.Args[2:])
	case "measure":
		err = runMeasure(os.Args[2:])
	case "compare":
		err = runCompare(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers-kvindex:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: peers-kvindex gen|measure|compare [flags] (-h for each)")
	os.Exit(2)
}

// presets are the two fleets of docs/index-peers.md: about 2.5 M and 3 M
// live (block, worker) entries after 1.5 times that many stored blocks.
var presets = map[int]GenConfig{
	64:   {Workers: 64, BlockSize: 16, Capacity: 40_000, Stored: 3_840_000, PerCase: 200, Seed: 64},
	1000: {Workers: 1000, BlockSize: 16, Capacity: 3_000, Stored: 4_500_000, PerCase: 200, Seed: 1000},
}

func runGen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	workers := fs.Int("workers", 64, "fleet preset: 64 or 1000")
	out := fs.String("o", "", "output file")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits
	cfg, ok := presets[*workers]
	if !ok || *out == "" {
		return fmt.Errorf("gen: -workers 64|1000 and -o are required")
	}
	return genFile(cfg, *out)
}

func genFile(cfg GenConfig, path string) error {
	w := Generate(cfg)
	stored := 0
	for _, e := range w.Events {
		if e.Kind == kindStored {
			stored++
		}
	}
	fmt.Fprintf(os.Stderr, "%s: %d workers, %d events (%d stored, %d removed), %d entries at the end, %d queries\n",
		path, w.Workers, len(w.Events), stored, len(w.Events)-stored, w.FinalEntries, len(w.Queries))
	return w.Write(path)
}

func runMeasure(args []string) error {
	fs := flag.NewFlagSet("measure", flag.ExitOnError)
	in := fs.String("in", "", "workload file")
	threads := fs.Int("threads", 1, "goroutines queueing events for the one that applies them, and looking up")
	minLookup := fs.Duration("min-lookup", 500*time.Millisecond, "least wall time per query case")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of applying and looking up to this file")
	heap := fs.String("heap", "fresh", "fresh: build the index in a process that never held one; warm: build and drop it once before the clock")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits
	profileTo = *cpuProfile
	w, err := Read(*in)
	if err != nil {
		return err
	}
	if *heap != "fresh" && *heap != "warm" {
		return fmt.Errorf("measure: -heap %q: want fresh or warm", *heap)
	}
	res, err := measureKVIndex(w, *threads, *minLookup, *heap == "warm")
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
