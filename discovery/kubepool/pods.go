package kubepool

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	corev1 "k8s.io/api/core/v1"
)

// Pod annotations that override the router's defaults for one pod.
const (
	// AnnotationModel is the served model name (vLLM's --served-model-name).
	AnnotationModel = "kvroute.io/model"
	// AnnotationBlockSize is the KV block size in tokens.
	AnnotationBlockSize = "kvroute.io/block-size"
	// AnnotationKVBlocks is the KV capacity in blocks; without it the
	// capacity comes from the engine's /metrics (vllm:cache_config_info).
	AnnotationKVBlocks = "kvroute.io/kv-total-blocks"
)

// Defaults fill what a pod's annotations do not say.
type Defaults struct {
	// Model is the served model (required unless every pod is annotated).
	Model string
	// BlockSize is the KV block size (default 16, vLLM's).
	BlockSize int
	// KVTotalBlocks is the KV capacity in blocks; 0 leaves it to the load
	// reports scraped from the engine.
	KVTotalBlocks int
}

// WorkerID names the worker behind a pod's rank-th target port: the pod
// name alone when the pool has one port, "<pod>-dp<rank>" otherwise (the
// kvbridge convention for data-parallel ranks). A pod name may hold dots
// (a Deployment named after "llama-3.1-8b"), which worker ids may not, as
// they name NATS subjects; dots become underscores, which pod names never
// hold, so distinct pods keep distinct ids.
func WorkerID(pod string, rank, ports int) string {
	pod = strings.ReplaceAll(pod, ".", "_")
	if ports <= 1 {
		return pod
	}
	return pod + "-dp" + strconv.Itoa(rank)
}

// PodReady reports whether a pod serves: Ready, an IP, not terminating.
func PodReady(p *corev1.Pod) bool {
	if p == nil || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Workers returns the worker records of one pod under spec: none unless
// the pod matches and is Ready, else one per target port. A record that
// fails discovery.ValidateRecord (a pod name with a dot, a bad annotation)
// is an error and the pod serves nothing.
func Workers(p *corev1.Pod, spec Spec, d Defaults) ([]fleet.Worker, error) {
	if !spec.Matches(p.Labels) || !PodReady(p) {
		return nil, nil
	}
	model := d.Model
	if m := p.Annotations[AnnotationModel]; m != "" {
		model = m
	}
	bs := d.BlockSize
	if bs == 0 {
		bs = 16
	}
	kv := d.KVTotalBlocks
	var err error
	if v, ok := p.Annotations[AnnotationBlockSize]; ok {
		if bs, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("pod %s: annotation %s=%q: not a number", p.Name, AnnotationBlockSize, v)
		}
	}
	if v, ok := p.Annotations[AnnotationKVBlocks]; ok {
		if kv, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("pod %s: annotation %s=%q: not a number", p.Name, AnnotationKVBlocks, v)
		}
	}
	out := make([]fleet.Worker, 0, len(spec.Ports))
	for rank, port := range spec.Ports {
		w := fleet.Worker{
			ID:            WorkerID(p.Name, rank, len(spec.Ports)),
			Model:         model,
			Address:       net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)),
			BlockSize:     bs,
			KVTotalBlocks: kv,
			DPRank:        rank,
		}
		if err := discovery.ValidateRecord(w); err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		out = append(out, w)
	}
	return out, nil
}
