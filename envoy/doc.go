// Package envoy holds what kvroute needs to sit behind Envoy: the bootstrap
// YAMLs shipped beside this file (cluster-header.yaml, original-dst.yaml,
// xds.yaml), Generate to render them for a given fleet, Validate to check a
// bootstrap against Envoy's own protos and the rules kvroute relies on,
// ParseBootstrap, and XDSServer, the ADS server for the xds style.
//
// Package envoy/proxy runs a real Envoy on a bootstrap for the tests, the
// demo and kvbench; the router never imports it.
package envoy
