// Command kvroute is the KV-cache-aware router for LLM inference fleets.
//
// This is a minimal placeholder dispatcher so that the tokenize subcommand
// can be built and used before the router's own main.go lands; the router's
// owner replaces this file.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 || os.Args[1] != "tokenize" {
		fmt.Fprintln(os.Stderr, "usage: kvroute tokenize --tokenizer DIR [--chat-template FILE]")
		os.Exit(2)
	}
	if err := runTokenize(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute:", err)
		os.Exit(1)
	}
}
