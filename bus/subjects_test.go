package bus

import "testing"

func TestSubjects(t *testing.T) {
	if got := EventsSubject("prod", "w0"); got != "kvroute.prod.events.w0" {
		t.Errorf("EventsSubject = %q", got)
	}
	if got := EventsWildcard("prod"); got != "kvroute.prod.events.>" {
		t.Errorf("EventsWildcard = %q", got)
	}
}
