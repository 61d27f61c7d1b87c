package envoy_test

import (
	"fmt"
	"log"

	"github.com/kvroute/kvroute/envoy"
)

// Render the cluster-header bootstrap for a fleet; Generate checks the
// result with Validate before returning it.
func ExampleGenerate() {
	yaml, err := envoy.Generate(envoy.StyleClusterHeader, []envoy.Worker{
		{Cluster: "w0", Address: "10.0.0.5:8000"},
		{Cluster: "w1", Address: "10.0.0.6:8000"},
	}, envoy.Options{ExtProcAddress: "10.0.0.2:9002"})
	if err != nil {
		log.Fatal(err)
	}
	b, err := envoy.Validate(yaml)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(b.GetStaticResources().GetClusters()), "clusters")
	// Output: 4 clusters
}
