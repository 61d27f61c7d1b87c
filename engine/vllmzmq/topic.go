package vllmzmq

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Topic is a publisher's identity as llm-d names it in the first frame of
// every message it publishes to a shared subscriber:
//
//	kv@<pod-ip>@<model>          (llm-d-inference-sim, llm-d's vLLM charts)
//	kv@<pod-ip>:<port>@<model>   (one topic per engine where pods run several)
//
// vLLM itself sends whatever its kv-events-config "topic" says, "" by
// default; a publisher that shares a subscriber with others has to set it
// to one of the forms above to be told apart.
type Topic struct {
	// Host is the publisher's IP address or host name.
	Host string
	// Port is the engine's HTTP port; 0 when the topic names none.
	Port int
	// Model is the served model, possibly empty. It may itself contain "@".
	Model string
}

// TopicPrefix starts every topic ParseTopic accepts.
const TopicPrefix = "kv@"

// maxTopicLen bounds what ParseTopic reads: topics name a host and a model.
const maxTopicLen = 1024

// ParseTopic reads a "kv@<host>[:<port>]@<model>" topic. The model part is
// everything after the second "@" and may be empty.
func ParseTopic(topic string) (Topic, error) {
	if len(topic) > maxTopicLen {
		return Topic{}, fmt.Errorf("vllmzmq: topic of %d bytes is longer than %d", len(topic), maxTopicLen)
	}
	rest, ok := strings.CutPrefix(topic, TopicPrefix)
	if !ok {
		return Topic{}, fmt.Errorf("vllmzmq: topic %q does not start with %q", topic, TopicPrefix)
	}
	hostPort, model, ok := strings.Cut(rest, "@")
	if !ok {
		return Topic{}, fmt.Errorf("vllmzmq: topic %q has no \"@<model>\" part", topic)
	}
	for _, r := range topic {
		if r < 0x20 || r == 0x7f {
			return Topic{}, fmt.Errorf("vllmzmq: topic %q has a control character", topic)
		}
	}
	t := Topic{Host: hostPort, Model: model}
	if h, p, err := net.SplitHostPort(hostPort); err == nil {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return Topic{}, fmt.Errorf("vllmzmq: topic %q: port %q is not in 1-65535", topic, p)
		}
		t.Host, t.Port = h, port
	} else if strings.HasPrefix(hostPort, "[") && strings.HasSuffix(hostPort, "]") {
		t.Host = hostPort[1 : len(hostPort)-1] // a bracketed IPv6 address with no port
	}
	if t.Host == "" || strings.ContainsAny(t.Host, " /[]") {
		return Topic{}, fmt.Errorf("vllmzmq: topic %q names no usable host", topic)
	}
	return t, nil
}

// String writes the topic back in the form ParseTopic reads.
func (t Topic) String() string {
	host := t.Host
	if t.Port != 0 {
		host = net.JoinHostPort(t.Host, strconv.Itoa(t.Port))
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return TopicPrefix + host + "@" + t.Model
}
