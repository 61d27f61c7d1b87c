// Package envoytest is Gateway, a development and test stand-in for Envoy
// that reads the bootstraps of package envoy. Only tests, e2e and kvbench
// import it.
//
// Gateway is not a proxy for production: production uses Envoy. It exists
// because Envoy cannot be installed everywhere kvroute is developed and
// tested. It is an HTTP/1.1 and h2c front that reads the same bootstrap files
// and drives kvroute through the real ext_proc gRPC protocol the way Envoy
// does:
//   - protocol_config on the first message of each stream, header values in
//     raw_value, attributes keyed under "envoy.filters.http.ext_proc";
//   - BUFFERED: the body goes out after the headers answer, then the router
//     starts; FULL_DUPLEX_STREAMED: body chunks stream without waiting, the
//     headers answer starts the router and the processor's streamed_response
//     chunks become the upstream body, then trailers;
//   - Envoy's header-mutation rules (x-envoy-*, host, :authority, :method and
//     :scheme are not changed unless mutation_rules allow it; pseudo headers
//     and host are never removed; an unset append_action overwrites);
//   - clear_route_cache re-picks the route (only in an answer that carries a
//     header mutation; route_cache_action CLEAR and RETAIN override it, and
//     disable_clear_route_cache means RETAIN); immediate_response goes to the
//     client; message_timeout and failure_mode_allow (504 or 500 when closed);
//     a spurious message or a processor that closes its side stops processing
//     and the request goes on without it;
//   - the HCM's early header mutations (header_mutation, remove only),
//     applied before routing and before ext_proc;
//   - routing by cluster_header (the name read when the route is picked) or
//     through an ORIGINAL_DST cluster by header (one ip:port, as Envoy parses
//     it); request_headers_to_remove applied after host selection; router
//     local replies (404, 503, 504) pass through the response path;
//   - route retry_policy as Envoy's router runs it: retry_on connect-failure
//     (a refused or timed-out connect) and reset (any other failure before
//     the response head), num_retries (default 1), a back-off below Envoy's
//     25 ms base interval, the route timeout spanning all attempts, the
//     request body kept and sent again (no retry once it outgrew the buffer
//     limit); the previous_hosts predicate (round robin re-picks up to
//     host_selection_retry_max_attempts times) and previous_priorities
//     (attempted priorities leave the load every update_frequency attempts;
//     all excluded means the original load);
//   - endpoint priorities, and the override_host load balancing policy: the
//     endpoint list from its header or metadata sources, read at the first
//     pick and consumed one host per attempt, hosts the cluster does not
//     hold skipped, then the round robin fallback; the host picked last is
//     written to selected_host_key;
//   - dynamic metadata: what the processor writes into a receiving namespace
//     is merged into the request's metadata; envoy.lb is forwarded (when
//     configured) with the request headers and the response headers;
//   - response headers, body (STREAMED or FULL_DUPLEX_STREAMED) and trailers
//     sent to the processor as the mode asks, each chunk flushed to the
//     client as it comes; at the end the stream is half-closed and given
//     deferred_close_timeout (5 s) before it is cancelled; a client that
//     leaves cancels it at once.
//
// It implements only the subset of Envoy those files use. A bootstrap that
// sets any other field, filter, cluster type, body mode or attribute fails to
// load instead of behaving differently from Envoy. Some fields are accepted
// and not enforced, because they do not change what kvroute sees: node,
// admin, stat_prefix, codec_type, request_timeout, stream_idle_timeout,
// grpc_service.timeout, health_checks (every endpoint counts as healthy),
// circuit_breakers, dns_lookup_family and lb_policy (static endpoints are
// picked round robin). The Gateway does not speak xDS: for xds.yaml the
// worker cluster kvroute_workers is given in GatewayOptions.Clusters (what
// kvroute's xDS server sends, envoy.WorkersCluster) or as addresses in
// GatewayOptions.Endpoints (built the way WorkersCluster builds it). Host names are not resolved,
// so override_host matches listed ip:port against endpoints as written. In
// FULL_DUPLEX_STREAMED the request-headers timer starts once the whole body
// has been handed to the processor, since the processor may wait for it.
// Besides envoy.lb, the only forwarded metadata is the Inference
// Extension's envoy.lb.subset_hint, supplied per request through
// GatewayOptions.SubsetHint in place of the gateway implementation that
// would set it.
package envoytest
