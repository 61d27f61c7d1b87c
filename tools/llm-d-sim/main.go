// Command llmdsim is a build wrapper only: it pins llm-d's vLLM simulator
// (llm-d-inference-sim) at the version kvroute's third-party engine tests
// run. scripts/llm-d-sim.sh builds its cmd/llm-d-inference-sim from this
// module; the imports keep that command's dependencies in go.sum.
package main

import (
	_ "github.com/llm-d/llm-d-inference-sim/cmd/signals"
	_ "github.com/llm-d/llm-d-inference-sim/pkg/common"
	_ "github.com/llm-d/llm-d-inference-sim/pkg/communication"
	_ "github.com/llm-d/llm-d-inference-sim/pkg/llm-d-inference-sim"
)

func main() {}
