// Command gieepp is a build wrapper only: it pins the Gateway API Inference
// Extension's endpoint picker (cmd/epp) at the version the peer comparison
// runs. scripts/gie-epp.sh builds that package from this module.
package main

import _ "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"

func main() {}
