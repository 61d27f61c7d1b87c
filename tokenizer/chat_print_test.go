package tokenizer

import (
	"testing"

	"github.com/nikolalohinski/gonja/v2/nodes"
)

// countChainPrints counts the chainPrint nodes in a node list and the
// wrappers of the control structures it holds.
func countChainPrints(list []nodes.Node) int {
	n := 0
	for _, node := range list {
		block, ok := node.(*nodes.ControlStructureBlock)
		if !ok {
			continue
		}
		if _, ok := block.ControlStructure.(*chainPrint); ok {
			n++
		}
	}
	return n
}

// The prints of a + chain at the top level are turned into chainPrint
// nodes, which write the operands without building the sum; other prints
// stay gonja's.
func TestPrintsOfPlusChainsWriteOperandsDirectly(t *testing.T) {
	tests := []struct {
		name, src string
		want      int
	}{
		{"chain of strings", "{{ '<' + role + '>' + content }}", 1},
		{"single plus", "{{ a + b }}", 1},
		{"two chains and text", "x{{ a + b }}y{{ c + d + e }}", 2},
		{"no plus", "{{ a }}{{ a ~ b }}", 0},
		{"conditional print", "{{ a + b if c else d }}", 0},
		{"plus under a filter", "{{ (a + b) | trim }}", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tpl, err := ParseTemplate(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			if got := countChainPrints(tpl.tpl.Root().Nodes); got != tt.want {
				t.Fatalf("%d chain prints, want %d", got, tt.want)
			}
		})
	}
}
