package bench

import "strings"

// modeColor gives each router mode one colour in every chart kvbench
// draws (the A/B chart, the sweep), so kv is the same blue in both.
var modeColor = map[string]string{
	"kv":                "#1f77b4",
	"round_robin":       "#d62728",
	"least_loaded":      "#2ca02c",
	"random":            "#ff7f0e",
	"power_of_two":      "#9467bd",
	"weighted":          "#8c564b",
	"kv_without_events": "#17becf",
}

// spareColors colour modes (or peers) that modeColor does not name, in
// the order they appear.
var spareColors = []string{"#e377c2", "#7f7f7f", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a"}

// ModeColors assigns a colour to every name of order: a known mode its
// own colour ("round-robin" and "round_robin" alike), others the spare
// colours in turn (cycling when there are more names than colours).
func ModeColors(order []string) map[string]string {
	out := make(map[string]string, len(order))
	spare := 0
	for _, name := range order {
		if c, ok := modeColor[strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "_")]; ok {
			out[name] = c
			continue
		}
		out[name] = spareColors[spare%len(spareColors)]
		spare++
	}
	return out
}
