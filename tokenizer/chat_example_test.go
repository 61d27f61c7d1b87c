package tokenizer_test

import (
	"fmt"
	"log"

	"github.com/kvroute/kvroute/tokenizer"
)

// A router resolves the request's model, parses the body once and gets the
// ids vLLM will prefill.
func ExampleRegistry() {
	reg := tokenizer.NewRegistry(tokenizer.ChatOptions{})
	if err := reg.Add("Qwen/Qwen3-8B", tokenizer.ModelSource{Dir: "testdata/qwen3"}, "my-lora"); err != nil {
		log.Fatal(err)
	}
	chat, err := reg.Get("my-lora")
	if err != nil {
		log.Fatal(err) // errors.Is(err, tokenizer.ErrUnknownModel): route by load instead
	}
	req, err := tokenizer.ParseChatRequest([]byte(`{"model": "my-lora",
		"messages": [{"role": "user", "content": "Hi"}],
		"chat_template_kwargs": {"enable_thinking": false}}`))
	if err != nil {
		log.Fatal(err)
	}
	text, _ := chat.ApplyChatTemplate(req)
	ids, _ := chat.EncodeChat(req)
	fmt.Printf("%q\n%v\n", text, ids)
	// Output:
	// "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	// [151644 872 198 13048 151645 198 151644 77091 198 151667 271 151668 271]
}
