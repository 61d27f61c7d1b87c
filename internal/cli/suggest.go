package cli

import (
	"errors"
	"flag"
	"strings"
)

const undefinedFlag = "flag provided but not defined: --"

// didYouMean adds the closest visible flag to an unknown-flag error:
// "flag provided but not defined: --worker-file; did you mean --workers-file?"
func didYouMean(err error, fs *flag.FlagSet) error {
	msg := err.Error()
	i := strings.Index(msg, undefinedFlag)
	if i < 0 {
		return err
	}
	typed := strings.TrimLeft(msg[i+len(undefinedFlag):], "-")
	if s := closestFlag(typed, fs); s != "" {
		return errors.New(msg + "; did you mean --" + s + "?")
	}
	return err
}

// closestFlag is the visible flag nearest to typed in edit distance, if
// it is near enough to be a slip (at most a third of the name, at least
// 2 edits), or the one flag typed is a prefix of. Ties go to the first in
// the flag set's (alphabetical) order.
func closestFlag(typed string, fs *flag.FlagSet) string {
	best, bestD := "", len(typed)/3
	if bestD < 2 {
		bestD = 2
	}
	bestD++ // strictly within the limit
	var prefixed []string
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, Hidden) {
			return
		}
		if strings.HasPrefix(f.Name, typed) {
			prefixed = append(prefixed, f.Name)
		}
		if d := editDistance(strings.ToLower(typed), f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" && len(prefixed) == 1 && len(typed) >= 3 {
		return prefixed[0]
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
