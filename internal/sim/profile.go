package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// Profile is a timing measured on one GPU for one model shape. Unlike
// Polynomial it charges cached context: attention over the tokens a
// prefilling request already holds, and the KV every decoding request
// reads. A step that prefills costs
//
//	pass_ms + Σ over the requests prefilling in the step
//	          [per_token_ms·N + attention_ms·N·(C + N/2) + context_ms·C]
//
// where N is the request's new tokens in the step and C the tokens it
// already had in KV before them (its cached prefix and earlier chunks). A
// step with decoding requests adds kv_read_ms × the KV tokens they read; a
// decode-only step costs step_ms plus that, and a step that does both pays
// max(pass_ms, step_ms) once. The file format is documented in
// docs/timing.md; ParseProfile reads it.
type Profile struct {
	// ProfileName is the profile's name, as reports state it.
	ProfileName string
	// Description says what was measured: GPU, model shape, precision,
	// attention kernel.
	Description string
	Prefill     PrefillCoefficients
	Decode      DecodeCoefficients
}

// PrefillCoefficients price a step that prefills, in milliseconds.
type PrefillCoefficients struct {
	// PassMillis is paid once per step: weights, launches.
	PassMillis float64
	// PerTokenMillis is paid per new token (the GEMMs).
	PerTokenMillis float64
	// AttentionMillis is paid per unit of N·(C + N/2), token²: attention of
	// the new tokens over the cached ones and, causally, over each other.
	AttentionMillis float64
	// ContextMillis is paid per cached token of a prefilling request.
	ContextMillis float64
}

// DecodeCoefficients price a decode step, in milliseconds.
type DecodeCoefficients struct {
	// StepMillis is paid once per step with decoding requests.
	StepMillis float64
	// KVReadMillis is paid per KV token a decoding request reads.
	KVReadMillis float64
}

// Name returns the profile's name.
func (p *Profile) Name() string { return p.ProfileName }

// StepMillis returns the step's duration in milliseconds, 0 when it
// scheduled nothing. The KV capacity plays no part.
func (p *Profile) StepMillis(res *StepResult, _ int) float64 {
	if res.Scheduled == 0 {
		return 0
	}
	var ms float64
	switch {
	case res.PrefillTokens > 0 && res.DecodeTokens > 0:
		ms = max(p.Prefill.PassMillis, p.Decode.StepMillis)
	case res.PrefillTokens > 0:
		ms = p.Prefill.PassMillis
	default:
		ms = p.Decode.StepMillis
	}
	if res.PrefillTokens > 0 {
		ms += p.Prefill.PerTokenMillis*float64(res.PrefillTokens) +
			p.Prefill.AttentionMillis*res.PrefillAttention +
			p.Prefill.ContextMillis*float64(res.PrefillContext)
	}
	return ms + p.Decode.KVReadMillis*float64(res.DecodeKVTokens)
}

// profileFile is the JSON form of a Profile. Coefficients are pointers so
// that a missing one is an error, not a silent zero.
type profileFile struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Prefill     struct {
		PassMs      *float64 `json:"pass_ms"`
		PerTokenMs  *float64 `json:"per_token_ms"`
		AttentionMs *float64 `json:"attention_ms"`
		ContextMs   *float64 `json:"context_ms"`
	} `json:"prefill"`
	Decode struct {
		StepMs   *float64 `json:"step_ms"`
		KVReadMs *float64 `json:"kv_read_ms"`
	} `json:"decode"`
	// Fit and Notes are for readers; the simulator does not use them.
	Fit   json.RawMessage `json:"fit,omitempty"`
	Notes []string        `json:"notes,omitempty"`
}

// maxProfileBytes bounds a profile file; real ones are about 2 KB.
const maxProfileBytes = 1 << 20

// ParseProfile reads a timing profile (JSON, docs/timing.md). Every
// coefficient must be present, finite and not negative, pass_ms and
// step_ms positive (a step takes time); unknown fields are errors, so a
// misspelt coefficient is not silently zero.
func ParseProfile(data []byte) (*Profile, error) {
	if len(data) > maxProfileBytes {
		return nil, fmt.Errorf("timing profile: %d bytes, more than %d", len(data), maxProfileBytes)
	}
	var f profileFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("timing profile: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("timing profile: data after the JSON object")
	}
	var errs []string
	if strings.TrimSpace(f.Name) == "" {
		errs = append(errs, `"name" is missing`)
	}
	p := &Profile{ProfileName: f.Name, Description: f.Description}
	for _, c := range []struct {
		name     string
		v        *float64
		dst      *float64
		positive bool
	}{
		{"prefill.pass_ms", f.Prefill.PassMs, &p.Prefill.PassMillis, true},
		{"prefill.per_token_ms", f.Prefill.PerTokenMs, &p.Prefill.PerTokenMillis, false},
		{"prefill.attention_ms", f.Prefill.AttentionMs, &p.Prefill.AttentionMillis, false},
		{"prefill.context_ms", f.Prefill.ContextMs, &p.Prefill.ContextMillis, false},
		{"decode.step_ms", f.Decode.StepMs, &p.Decode.StepMillis, true},
		{"decode.kv_read_ms", f.Decode.KVReadMs, &p.Decode.KVReadMillis, false},
	} {
		switch {
		case c.v == nil:
			errs = append(errs, fmt.Sprintf("%q is missing", c.name))
		case math.IsNaN(*c.v) || math.IsInf(*c.v, 0) || *c.v < 0:
			errs = append(errs, fmt.Sprintf("%q %g must not be negative", c.name, *c.v))
		case c.positive && *c.v == 0:
			errs = append(errs, fmt.Sprintf("%q must be positive", c.name))
		default:
			*c.dst = *c.v
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("timing profile: %s", strings.Join(errs, "; "))
	}
	return p, nil
}

// Built-in profiles, the same format as --timing FILE.
//
//go:embed profiles/*.json
var builtinFS embed.FS

// TimingH100Llama3_8B names the built-in profile measured on one H100 80GB
// for a Llama-3-8B-shaped model (bf16, FlashAttention).
const TimingH100Llama3_8B = "h100-llama3-8b"

// TimingNames lists the timings ParseTiming knows by name.
func TimingNames() []string {
	names := []string{TimingPolynomial}
	entries, _ := builtinFS.ReadDir("profiles")
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(names[1:])
	return names
}

// TimingUsage is the help text of every command's --timing flag.
const TimingUsage = "engine step times: " + TimingPolynomial + " (NVIDIA Dynamo mocker's fit, the default: cached context costs nothing; " +
	"use it to compare with Dynamo's replay), " + TimingH100Llama3_8B + " (measured on one H100 80GB, Llama-3-8B shape: prefill pays " +
	"attention over the cached context and decode the KV it reads), or the path of a timing profile `file` (JSON, docs/timing.md)"

// ParseTiming returns the timing named s: "polynomial" (or empty), a
// built-in profile's name (TimingNames), or else the path of a profile
// file. A file whose path is a built-in name is read as ./NAME.
func ParseTiming(s string) (Timing, error) {
	if s == "" || s == TimingPolynomial {
		return Polynomial{}, nil
	}
	if data, err := builtinFS.ReadFile("profiles/" + s + ".json"); err == nil && !strings.ContainsAny(s, `/\`) {
		p, err := ParseProfile(data)
		if err != nil {
			return nil, fmt.Errorf("built-in timing %s: %w", s, err)
		}
		return p, nil
	}
	data, err := os.ReadFile(s)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("timing %q: neither a known name (%s) nor a profile file", s, strings.Join(TimingNames(), ", "))
		}
		return nil, fmt.Errorf("timing: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	return p, nil
}

// MarshalJSON writes the profile in its file format, coefficients only.
func (p *Profile) MarshalJSON() ([]byte, error) {
	type prefill struct {
		PassMs      float64 `json:"pass_ms"`
		PerTokenMs  float64 `json:"per_token_ms"`
		AttentionMs float64 `json:"attention_ms"`
		ContextMs   float64 `json:"context_ms"`
	}
	type decode struct {
		StepMs   float64 `json:"step_ms"`
		KVReadMs float64 `json:"kv_read_ms"`
	}
	return json.Marshal(struct {
		Name        string  `json:"name"`
		Description string  `json:"description,omitempty"`
		Prefill     prefill `json:"prefill"`
		Decode      decode  `json:"decode"`
	}{p.ProfileName, p.Description,
		prefill{p.Prefill.PassMillis, p.Prefill.PerTokenMillis, p.Prefill.AttentionMillis, p.Prefill.ContextMillis},
		decode{p.Decode.StepMillis, p.Decode.KVReadMillis}})
}
