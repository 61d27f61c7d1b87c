package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// gonja evaluates a + b by stringifying whenever one side is a string, and
// a ** b always as a float. Python raises TypeError for "text" + {} and gives
// an int for 2 ** 3. The evaluator cannot be configured, so after parsing,
// every + and ** node is rewritten into "a|op(b) or a|op(b)": a filter with
// Python's rules (the second one only runs when the result is falsy, and
// gives the same value). A filter rather than a function call keeps the cost
// near gonja's own operator: filters are called directly, calls by reflection.
//
// A chain a + b + c + d (left-associative, so ((a + b) + c) + d) becomes one
// call a|op(b, c, d) that folds left to right. Chat templates build each
// turn as '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n';
// folding pairwise copied the (often tens of KB) content once per +, which
// was the largest allocation of a whole routing decision. The fold gives
// what the pairwise form gives, and all-string chains take one allocation.
// The only difference is in templates that fail anyway: every operand is
// evaluated before the first TypeError is reported.

const (
	pyAddFunc = "__kvroute_py_add"
	pyPowFunc = "__kvroute_py_pow"
)

// pyOperators are added to the template environment's filters.
var pyOperators = map[string]exec.FilterFunction{pyAddFunc: pyAddFilter, pyPowFunc: pyOperatorFilter(pyPow)}

// pyAddFilter is in|op(b, c, ...): Python's in + b + c + ..., left to right.
func pyAddFilter(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if len(params.Args) == 0 {
		return exec.AsValue(errors.New("binary operator got 1 operand"))
	}
	out, err := pyAddAll(in, params.Args)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(out)
}

// pyAddAll folds pyAdd over first and rest, building an all-string chain
// with a single allocation instead of one copy per +.
func pyAddAll(first *exec.Value, rest []*exec.Value) (any, error) {
	if s, ok := concatStrings(first, rest); ok {
		return s, nil
	}
	acc := first
	var out any
	for _, v := range rest {
		var err error
		if out, err = pyAdd(acc, v); err != nil {
			return nil, err
		}
		acc = exec.AsValue(out)
	}
	return out, nil
}

// concatStrings joins first and rest when every one is a string, which is
// what pairwise pyAdd would give for them.
func concatStrings(first *exec.Value, rest []*exec.Value) (string, bool) {
	if !first.IsString() {
		return "", false
	}
	n := len(first.String())
	for _, v := range rest {
		if !v.IsString() {
			return "", false
		}
		n += len(v.String())
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(first.String())
	for _, v := range rest {
		b.WriteString(v.String())
	}
	return b.String(), true
}

func pyOperatorFilter(op func(a, b *exec.Value) (any, error)) exec.FilterFunction {
	return func(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
		if len(params.Args) != 1 {
			return exec.AsValue(fmt.Errorf("binary operator got %d operands", len(params.Args)+1))
		}
		out, err := op(in, params.Args[0])
		if err != nil {
			return exec.AsValue(err)
		}
		return exec.AsValue(out)
	}
}

// rewritePyOperators rewrites the + and ** nodes under root, and prints of
// a chain of + into chainPrint nodes (chat_print.go).
func rewritePyOperators(root *nodes.Template) {
	seen := map[uintptr]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			if v.Type() == reflect.TypeFor[*nodes.BinaryExpression]() {
				// The node may sit behind an unexported field of a control
				// structure, where reflect refuses Interface(); the pointer
				// itself is a plain *BinaryExpression.
				be := (*nodes.BinaryExpression)(v.UnsafePointer())
				if isAddition(be) {
					chain := additionChain(be)
					for _, operand := range chain {
						walk(reflect.ValueOf(operand))
					}
					rewriteAddChain(be, chain)
					return
				}
				walk(reflect.ValueOf(be.Left))
				walk(reflect.ValueOf(be.Right))
				rewriteBinary(be)
				return
			}
			// Node lists live in wrappers (block bodies) and the root.
			var list []nodes.Node
			switch v.Type() {
			case reflect.TypeFor[*nodes.Wrapper]():
				list = (*nodes.Wrapper)(v.UnsafePointer()).Nodes
			case reflect.TypeFor[*nodes.Template]():
				list = (*nodes.Template)(v.UnsafePointer()).Nodes
			}
			prints := chainPrints(list)
			walk(v.Elem())
			replaceChainPrints(list, prints)
		case reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			if v.Type() == reflect.TypeFor[tokens.Token]() {
				return
			}
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Map:
			iter := v.MapRange()
			for iter.Next() {
				walk(iter.Value())
			}
		}
	}
	walk(reflect.ValueOf(root))
}

func isAddition(be *nodes.BinaryExpression) bool {
	return be.Operator != nil && be.Operator.Token != nil && be.Operator.Token.Type == tokens.Addition
}

// additionChain lists the operands of a left-associative chain of +, left
// to right: ((a + b) + c) gives a, b, c. A parenthesized + on the right,
// a + (b + c), stays one operand, as its own sum comes first in Python.
func additionChain(be *nodes.BinaryExpression) []nodes.Expression {
	var rights []nodes.Expression
	var left nodes.Expression = be
	for {
		b, ok := left.(*nodes.BinaryExpression)
		if !ok || !isAddition(b) {
			break
		}
		rights = append(rights, b.Right)
		left = b.Left
	}
	chain := append(make([]nodes.Expression, 0, len(rights)+1), left)
	for i := len(rights) - 1; i >= 0; i-- {
		chain = append(chain, rights[i])
	}
	return chain
}

// rewriteAddChain turns be, the top of a chain of +, into
// "a|add(b, c) or a|add(b, c)".
func rewriteAddChain(be *nodes.BinaryExpression, chain []nodes.Expression) {
	rewriteAsFilter(be, pyAddFunc, chain[0], chain[1:])
}

func rewriteBinary(be *nodes.BinaryExpression) {
	if be.Operator == nil || be.Operator.Token == nil || be.Operator.Token.Type != tokens.Power {
		return
	}
	rewriteAsFilter(be, pyPowFunc, be.Left, []nodes.Expression{be.Right})
}

// rewriteAsFilter turns be into "in|fn(args) or in|fn(args)": the node must
// stay a BinaryExpression because its parent may hold it in an unexported
// field, where it cannot be replaced.
func rewriteAsFilter(be *nodes.BinaryExpression, fn string, in nodes.Expression, args []nodes.Expression) {
	at := be.Operator.Token
	call := func() *nodes.FilteredExpression {
		return &nodes.FilteredExpression{Expression: in, Filters: []*nodes.FilterCall{
			{Token: at, Name: fn, Args: args, Kwargs: map[string]nodes.Expression{}}}}
	}
	left, right := call(), call()
	be.Left, be.Right = left, right
	be.Operator = &nodes.BinOperator{Token: &tokens.Token{Type: tokens.Or, Val: "or", Pos: at.Pos, Line: at.Line, Col: at.Col}}
}

// pyTypeName names a value's Python type for TypeError messages.
func pyTypeName(v *exec.Value) string {
	switch {
	case v.IsNil():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return "object"
}

// pyNumber reports whether v is an int or float (bool included, as Python's
// bool is an int).
func pyNumber(v *exec.Value) bool { return v.IsNumber() || v.IsBool() }

func pyInt(v *exec.Value) int {
	if v.IsBool() {
		if v.Bool() {
			return 1
		}
		return 0
	}
	return v.Integer()
}

func pyFloat(v *exec.Value) float64 {
	if v.IsFloat() {
		return v.Float()
	}
	return float64(pyInt(v))
}

// pyAdd is Python's a + b for the types templates see.
func pyAdd(a, b *exec.Value) (any, error) {
	switch {
	case a.IsString() && b.IsString():
		return a.String() + b.String(), nil
	case pyNumber(a) && pyNumber(b):
		if a.IsFloat() || b.IsFloat() {
			return pyFloat(a) + pyFloat(b), nil
		}
		return pyInt(a) + pyInt(b), nil
	case a.IsList() && b.IsList():
		out := make(pyList, 0, a.Len()+b.Len())
		for _, v := range []*exec.Value{a, b} {
			for i := range v.Len() {
				out = append(out, v.Index(i).Interface())
			}
		}
		return out, nil
	case a.IsString():
		return nil, fmt.Errorf("TypeError: can only concatenate str (not %q) to str", pyTypeName(b))
	case a.IsList():
		return nil, fmt.Errorf("TypeError: can only concatenate list (not %q) to list", pyTypeName(b))
	}
	return nil, fmt.Errorf("TypeError: unsupported operand type(s) for +: '%s' and '%s'", pyTypeName(a), pyTypeName(b))
}

// pyPow is Python's a ** b: an int for ints with a non-negative exponent.
func pyPow(a, b *exec.Value) (any, error) {
	if !pyNumber(a) || !pyNumber(b) {
		return nil, fmt.Errorf("TypeError: unsupported operand type(s) for ** or pow(): '%s' and '%s'", pyTypeName(a), pyTypeName(b))
	}
	if !a.IsFloat() && !b.IsFloat() && pyInt(b) >= 0 {
		base, exp, out := pyInt(a), pyInt(b), 1
		for ; exp > 0; exp >>= 1 { // by squaring; wraps where Python would grow
			if exp&1 == 1 {
				out *= base
			}
			base *= base
		}
		return out, nil
	}
	return math.Pow(pyFloat(a), pyFloat(b)), nil
}
