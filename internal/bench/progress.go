package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line progress bar, redrawn in place with \r at most
// ten times a second; or, for logs and pipes (NewProgressLines), writes one
// whole line every few seconds. It is safe for concurrent use.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int
	start time.Time
	last  time.Time
	every time.Duration // > 0: one line per period, no \r
	unit  string        // what is counted; "" means requests (with errors)
}

// Counting names what the bar counts when it is not requests (a sweep
// counts runs); the errors count is then left out. It returns p.
func (p *Progress) Counting(unit string) *Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unit = unit
	return p
}

// NewProgressLines returns a progress report for a non-terminal: a line at
// most every period and one at the end.
func NewProgressLines(w io.Writer, label string, total int, every time.Duration) *Progress {
	now := time.Now()
	return &Progress{w: w, label: label, total: total, start: now, last: now, every: every}
}

// NewProgress returns a bar for total requests written to w.
func NewProgress(w io.Writer, label string, total int) *Progress {
	return &Progress{w: w, label: label, total: total, start: time.Now()}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update redraws the bar for done requests, errs of them failed.
func (p *Progress) Update(done, errs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.every > 0 {
		if done < p.total && now.Sub(p.last) < p.every || p.last.IsZero() {
			return
		}
		p.last = now
		if done >= p.total {
			p.last = time.Time{} // the final line once
		}
		fmt.Fprintln(p.w, p.line(done, errs, now.Sub(p.start)))
		return
	}
	if done < p.total && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	fmt.Fprint(p.w, "\r"+p.line(done, errs, now.Sub(p.start)))
}

// Done ends the bar's line.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.every == 0 {
		fmt.Fprintln(p.w)
	}
}

func (p *Progress) line(done, errs int, elapsed time.Duration) string {
	const width = 30
	frac := 0.0
	if p.total > 0 {
		frac = min(1, float64(done)/float64(p.total))
	}
	n := int(frac * width)
	bar := strings.Repeat("#", n) + strings.Repeat(".", width-n)
	if p.unit != "" {
		return fmt.Sprintf("%-14s [%s] %d/%d %s, %.0fs", p.label, bar, done, p.total, p.unit, elapsed.Seconds())
	}
	return fmt.Sprintf("%-14s [%s] %d/%d requests, %d errors, %.0fs",
		p.label, bar, done, p.total, errs, elapsed.Seconds())
}
