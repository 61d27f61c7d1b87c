package extproc

import (
	"sync"
	"time"
)

// failLogEvery is how often, at most, a failed ext_proc stream is logged.
// A misbehaving client of the ext_proc port (or a data plane sending what
// the router cannot take) fails one stream per request; every failure is
// counted in kvroute_extproc_stream_errors_total, and the log gets one line
// per period saying how many it left out.
const failLogEvery = time.Second

// logLimiter lets one line through per period and counts the rest.
type logLimiter struct {
	every time.Duration

	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// allow reports whether a line may go out at now, and how many lines were
// held back since the last one that did.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	l.next = now.Add(l.every)
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
