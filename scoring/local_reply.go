package scoring

import "time"

// LocalReplyCooldown is how long a worker is passed over after the proxy
// answered a request for it itself: no healthy upstream, a circuit
// breaker's overflow, a connect timeout. Such a reply says nothing certain
// about the worker (it is not counted by passive health and never ejects
// it), but the request never reached it, so the worker's load looks lighter
// than it is and the next pick would choose it again: 130 of 160 requests
// went to a cluster the proxy had no healthy host for. For the cooldown
// the worker ranks after every worker that is not cooling, before silent
// and ejected ones; with nothing else left it is still chosen.
const LocalReplyCooldown = 2 * time.Second

// ObserveLocalReply records that the proxy answered a request routed to
// worker itself. Unknown workers are ignored.
func (p *Pool) ObserveLocalReply(worker string) {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.workers[worker]; ok {
		w.health.coolUntil = now.Add(LocalReplyCooldown)
		p.summarizeLocked(w)
	}
}
