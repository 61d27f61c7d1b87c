// Package envoy holds what kvroute needs to sit behind Envoy: the bootstrap
// YAMLs shipped beside this file (cluster-header.yaml, original-dst.yaml,
// xds.yaml), Generate to render them for a given fleet, Validate to check a
// bootstrap against Envoy's own protos and the rules kvroute relies on, and
// Gateway, a development and test stand-in for Envoy.
//
// Gateway is not a proxy for production: production uses Envoy. It is an
// HTTP/1.1 and h2c front that reads the same bootstrap files and drives
// kvroute through the real ext_proc gRPC protocol the way Envoy does
// (protocol_config on the first message, raw_value headers, BUFFERED and
// FULL_DUPLEX_STREAMED bodies, Envoy's header-mutation rules,
// clear_route_cache, immediate responses, message_timeout and
// failure_mode_allow, cluster_header and ORIGINAL_DST routing, response-phase
// messages), so that tests and the all-in-one demo exercise the shipped
// configuration end to end on machines without Envoy. It implements only the
// subset of Envoy those files use; a bootstrap using anything else fails to
// load rather than behaving differently from Envoy.
package envoy
