package tokenizer_test

import (
	"fmt"
	"log"

	"github.com/kvroute/kvroute/tokenizer"
)

func ExampleLoad() {
	tok, err := tokenizer.Load("testdata/mistral-sp")
	if err != nil {
		log.Fatal(err)
	}
	ids := tok.Encode("Hello, world!</s>", true)
	fmt.Println(ids)
	fmt.Println(tok.Decode(ids))
	eot, _ := tok.TokenID("</s>")
	fmt.Println(eot, tok.IsSpecial(eot))
	// Output:
	// [1 22557 28725 1526 28808 2]
	// <s> Hello, world!</s>
	// 2 true
}
