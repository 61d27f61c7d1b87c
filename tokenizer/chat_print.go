package tokenizer

import (
	"fmt"
	"io"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Chat templates print each turn as {{ '<|im_start|>' + role + '\n' +
// content + '<|im_end|>\n' }}: a sum that exists only to be written out.
// Building it first copies the (often tens of KB) content once more than
// needed on every request, so a print of a chain of + is replaced by a node
// that evaluates the operands left to right and, when all are strings,
// writes them one after another. Any other outcome is folded exactly as the
// + filter folds it, so the printed text is the same either way.

// chainPrint prints {{ a + b + ... }}.
type chainPrint struct {
	out      *nodes.Output      // the original print, for autoescaped output
	operands []nodes.Expression // a, b, ... left to right
}

// Position implements nodes.Node.
func (c *chainPrint) Position() *tokens.Token { return c.out.Position() }

func (c *chainPrint) String() string { return c.out.String() }

// Execute implements exec.ControlStructure.
func (c *chainPrint) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	if r.Config.AutoEscape {
		// Escaping depends on the sum's own safety flag: let gonja print it.
		_, err := r.Visit(c.out)
		return err
	}
	var stack [8]*exec.Value
	vals := stack[:0]
	strs := true
	for _, e := range c.operands {
		v := r.Eval(e)
		if v.IsError() {
			return fmt.Errorf("line %d: %s", c.out.Start.Line, v.Error())
		}
		strs = strs && v.IsString()
		vals = append(vals, v)
	}
	if strs {
		for _, v := range vals {
			if _, err := io.WriteString(r.Output, v.String()); err != nil {
				return err
			}
		}
		return nil
	}
	sum, err := pyAddAll(vals[0], vals[1:])
	if err != nil {
		return fmt.Errorf("line %d: %w", c.out.Start.Line, err)
	}
	_, err = io.WriteString(r.Output, exec.AsValue(sum).String())
	return err
}

// chainPrints finds the prints of a chain of + among list, before the chain
// is rewritten into a filter call; replaceChainPrints swaps them in after.
func chainPrints(list []nodes.Node) map[int]*chainPrint {
	var found map[int]*chainPrint
	for i, n := range list {
		out, ok := n.(*nodes.Output)
		if !ok || out.Condition != nil || out.Alternative != nil {
			continue
		}
		be, ok := out.Expression.(*nodes.BinaryExpression)
		if !ok || !isAddition(be) {
			continue
		}
		if found == nil {
			found = map[int]*chainPrint{}
		}
		found[i] = &chainPrint{out: out, operands: additionChain(be)}
	}
	return found
}

func replaceChainPrints(list []nodes.Node, found map[int]*chainPrint) {
	for i, c := range found {
		list[i] = &nodes.ControlStructureBlock{Location: c.out.Start, Name: "print", ControlStructure: c}
	}
}
