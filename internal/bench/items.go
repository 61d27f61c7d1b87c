package bench

// CompletionItem is one streaming /v1/completions request with a token-id
// prompt and exactly maxTokens of output, for workloads built elsewhere
// (the virtual-time simulator's agent sessions).
func CompletionItem(model string, prompt []int32, maxTokens int) Item {
	return Item{Path: PathCompletions, Body: completionBody(model, prompt, maxTokens),
		Prompt: prompt, PromptLen: len(prompt), OutputLen: maxTokens}
}
