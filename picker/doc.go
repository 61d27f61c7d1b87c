// Package picker decides which worker serves a request: it implements
// extproc.Decider.
//
// For each request it decodes the OpenAI body (chat or completions) once
// into tokenizer.Request, renders and tokenizes the prompt from it exactly
// as the model server will (tokenizer; images placed by multimodal, their
// uuids written into the body at the places the request recorded),
// hashes the full blocks (kvindex.HashBlocks), asks the KV index or the
// approximate index how many leading blocks each candidate holds, and hands
// the candidates to the scoring Scheduler, which picks (or queues, or sheds).
// The Decision carries the chosen worker, fallbacks ordered by cost, and a
// Ticket through which the ext_proc stream reports prefill done, decode
// progress, the endpoint Envoy really used, and the end of the request.
//
// Explain runs the same path without side effects for the explain endpoint.
// The Envoy protocol itself lives in extproc; this package never sees a
// gRPC message.
package picker
