package extproc

import "testing"

// The code details Envoy 1.40 sends (seen through real Envoy in
// e2e/local_reply_test.go) decide whose fault a 5xx is.
func TestClassify5xxByCodeDetails(t *testing.T) {
	for _, tc := range []struct {
		details string
		want    Outcome
	}{
		{"", OutcomeUpstreamError}, // no attributes: no telling, as before
		{"via_upstream", OutcomeUpstreamError},
		{"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}", OutcomeUpstreamError},
		{"upstream_reset_before_response_started{remote_reset}", OutcomeUpstreamError},
		{"upstream_reset_before_response_started{connection_termination}", OutcomeUpstreamError},
		{"upstream_reset_before_response_started{connection_timeout}", OutcomeLocalReply},
		{"upstream_reset_before_response_started{overflow}", OutcomeLocalReply},
		{"no_healthy_upstream", OutcomeLocalReply},
		{"upstream_response_timeout", OutcomeLocalReply},
		{"cluster_not_found", OutcomeLocalReply},
		{"maintenance_mode", OutcomeLocalReply},
	} {
		if got := classify5xx(tc.details); got != tc.want {
			t.Errorf("classify5xx(%q) = %s, want %s", tc.details, got, tc.want)
		}
	}
}
