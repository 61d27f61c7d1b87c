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
// ten times a second. It is safe for concurrent use.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int
	start time.Time
	last  time.Time
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
	fmt.Fprintln(p.w)
}

func (p *Progress) line(done, errs int, elapsed time.Duration) string {
	const width = 30
	frac := 0.0
	if p.total > 0 {
		frac = min(1, float64(done)/float64(p.total))
	}
	n := int(frac * width)
	return fmt.Sprintf("%-14s [%s%s] %d/%d requests, %d errors, %.0fs",
		p.label, strings.Repeat("#", n), strings.Repeat(".", width-n), done, p.total, errs, elapsed.Seconds())
}
