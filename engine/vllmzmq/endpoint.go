package vllmzmq

import (
	"fmt"
	"strconv"
	"strings"
)

// OffsetEndpointPort returns the endpoint a data-parallel rank uses, as vLLM
// and SGLang derive it: rank 0 keeps the endpoint, a TCP endpoint's port is
// raised by the rank, and an inproc endpoint gets the suffix "_dp<rank>".
func OffsetEndpointPort(endpoint string, rank int) (string, error) {
	if endpoint == "" || rank == 0 {
		return endpoint, nil
	}
	if rank < 0 {
		return "", fmt.Errorf("vllmzmq: data-parallel rank %d is negative", rank)
	}
	switch {
	case strings.Contains(endpoint, "inproc"):
		return fmt.Sprintf("%s_dp%d", endpoint, rank), nil
	case strings.Contains(endpoint, "tcp"):
		i := strings.LastIndexByte(endpoint, ':')
		if i < 0 {
			return endpoint, nil
		}
		port, err := strconv.Atoi(endpoint[i+1:])
		if err != nil {
			return "", fmt.Errorf("vllmzmq: endpoint %q has no numeric port: %w", endpoint, err)
		}
		return endpoint[:i+1] + strconv.Itoa(port+rank), nil
	default:
		return "", fmt.Errorf("vllmzmq: endpoint %q is neither tcp nor inproc", endpoint)
	}
}

// bindsByDefault applies vLLM's rule for its PUB endpoint: bind when the
// address is a wildcard, IPv6 any, ipc or inproc; connect otherwise.
func bindsByDefault(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// dialable turns a bound address such as "tcp://*:5557" or
// "tcp://0.0.0.0:5557" into one a local client can dial.
func dialable(endpoint string) string {
	for _, any := range []string{"tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"} {
		if strings.HasPrefix(endpoint, any) {
			return "tcp://127.0.0.1:" + endpoint[len(any):]
		}
	}
	return endpoint
}
