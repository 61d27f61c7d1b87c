// Package extproc is kvroute's Envoy external processor: the
// envoy.service.ext_proc.v3.ExternalProcessor gRPC service that Envoy calls
// for every HTTP request.
//
// Each ext_proc stream is one Stream, a pure state machine (messages in,
// responses out) that reads the request in the body mode Envoy announces
// (BUFFERED, FULL_DUPLEX_STREAMED, or none), asks a Decider for a worker,
// and answers with the target header, the Gateway API destination header
// and envoy.lb metadata, or an OpenAI-style immediate error. On the response
// path it tells the decision's Ticket when the response started, when its
// first body byte came (prefill done), how far decoding got, and when the
// request's load can be freed. Server puts Streams behind
// gRPC with health checking, keepalive enforcement and TLS.
//
// The decision itself (parse, tokenize, match, pick) is not here: package
// picker implements Decider. extproc imports no other kvroute package.
package extproc
