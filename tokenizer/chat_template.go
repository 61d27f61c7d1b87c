package tokenizer

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Template is a compiled chat template. It renders with a Jinja environment
// set up as transformers sets up its own (trim_blocks, lstrip_blocks, loop
// controls, raise_exception, strftime_now, a Python-exact tojson) so that the
// text matches what the model server renders. A Template is safe for
// concurrent use.
type Template struct {
	source string
	tpl    *exec.Template
	// loopsOverContent is true for templates that iterate over a message's
	// content, for which vLLM's "auto" content format passes content as a
	// list of parts.
	loopsOverContent bool
}

// TemplateError is returned when a template calls raise_exception: the
// template itself rejected the conversation (for example roles that do not
// alternate). Message is the template's own text.
type TemplateError struct {
	Message string
}

func (e *TemplateError) Error() string { return "chat template: " + e.Message }

// ErrTemplateSyntax is wrapped by ParseTemplate errors for templates that the
// Jinja engine cannot parse.
var ErrTemplateSyntax = errors.New("chat template cannot be parsed")

const templateName = "/chat_template.jinja"

// ParseTemplate compiles a Jinja chat template.
func ParseTemplate(source string) (t *Template, err error) {
	defer func() {
		// The parser is third-party code fed with operator-supplied text; a
		// panic in it must become an error, not take the router down.
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("%w: parser panicked: %v", ErrTemplateSyntax, r)
		}
	}()
	loader, err := loaders.NewMemoryLoader(map[string]string{templateName: source})
	if err != nil {
		return nil, fmt.Errorf("chat template loader: %w", err)
	}
	tpl, err := exec.NewTemplate(templateName, templateConfig(), loader, chatEnvironment())
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrTemplateSyntax, trimGonjaError(err.Error(), source))
	}
	rewritePyOperators(tpl.Root())
	return &Template{source: source, tpl: tpl, loopsOverContent: loopsOverContent(source)}, nil
}

var (
	reSetFromMessages = regexp.MustCompile(`\{%-?\s*set\s+(\w+)\s*=\s*messages\b`)
	reForIn           = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+(\w+)`)
	reForInContent    = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(\w+)(?:\[\s*['"]content['"]\s*\]|\.content\b)`)
	reForInBare       = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+content\b`)
)

// loopsOverContent mirrors vLLM's content-format detection on the template
// text: a for loop over X['content'] or X.content where X is a loop variable
// over messages (or over a variable set from messages), or over a bare
// "content" variable.
func loopsOverContent(source string) bool {
	if reForInBare.MatchString(source) {
		return true
	}
	msgVars := map[string]bool{"messages": true}
	for _, m := range reSetFromMessages.FindAllStringSubmatch(source, -1) {
		msgVars[m[1]] = true
	}
	loopVars := map[string]bool{}
	for _, m := range reForIn.FindAllStringSubmatch(source, -1) {
		if msgVars[m[2]] {
			loopVars[m[1]] = true
		}
	}
	for _, m := range reForInContent.FindAllStringSubmatch(source, -1) {
		if loopVars[m[1]] {
			return true
		}
	}
	return false
}

// LoopsOverContent reports whether the template iterates over message
// content, so that vLLM would hand it content as a list of parts.
func (t *Template) LoopsOverContent() bool { return t.loopsOverContent }

// Source returns the template text.
func (t *Template) Source() string { return t.source }

// Render executes the template with vars as its top-level variables. Values
// may be the JSON values described on Object; they are converted to the
// engine's types here, keeping key order.
func (t *Template) Render(vars map[string]any) (string, error) {
	var b strings.Builder
	if err := t.renderTo(&b, vars); err != nil {
		return "", err
	}
	return b.String(), nil
}

// renderTo is Render writing into w, which the router's hot path passes as a
// reused buffer so that the prompt text is not allocated per request. On
// error w holds partial output.
func (t *Template) renderTo(w interface {
	io.Writer
	Grow(int)
}, vars map[string]any) (err error) {
	st := &renderState{}
	data := make(map[string]any, len(vars)+2)
	size := len(t.source)
	for k, v := range vars {
		data[k] = toTemplateValue(v)
		size += approxTextSize(v)
	}
	data["raise_exception"] = st.raiseException
	data["strftime_now"] = strftimeNow
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("chat template: render panicked: %v", r)
		}
	}()
	// Templates print every message once, so the request's own text size
	// is a good first guess for the output buffer; growing by doubling
	// would copy a long prompt several times.
	w.Grow(size + size/8)
	if err := t.tpl.Execute(w, exec.NewContext(data)); err != nil {
		if st.raised != nil {
			return st.raised
		}
		return fmt.Errorf("chat template: render: %s", lastGonjaCause(err.Error()))
	}
	return nil
}

// approxTextSize sums the string lengths inside a request value.
func approxTextSize(v any) int {
	switch t := v.(type) {
	case string:
		return len(t)
	case Object:
		n := 0
		for _, f := range t {
			n += len(f.Key) + approxTextSize(f.Value)
		}
		return n
	case []any:
		n := 0
		for _, e := range t {
			n += approxTextSize(e)
		}
		return n
	}
	return 8
}

// renderState carries what one render learns about its own failure.
type renderState struct {
	raised *TemplateError
}

func (s *renderState) raiseException(args *exec.VarArgs) (any, error) {
	msg := ""
	if len(args.Args) > 0 {
		msg = args.Args[0].String()
	}
	s.raised = &TemplateError{Message: msg}
	return nil, s.raised
}

func strftimeNow(args *exec.VarArgs) (any, error) {
	if len(args.Args) != 1 || !args.Args[0].IsString() {
		return nil, errors.New("strftime_now takes one format string")
	}
	return pyStrftime(time.Now(), args.Args[0].String()), nil
}

func templateConfig() *config.Config {
	c := config.New()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	c.KeepTrailingNewline = false
	c.AutoEscape = false
	return c
}

var (
	envOnce sync.Once
	env     *exec.Environment
)

// chatEnvironment is gonja's default environment with the filters, tests and
// dict methods that differ from Python's Jinja2 replaced.
func chatEnvironment() *exec.Environment {
	envOnce.Do(func() {
		filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
		mustReplace(filters.Replace("tojson", filterToJSON))
		mustReplace(filters.Replace("items", filterItems))
		mustReplace(filters.Replace("trim", filterTrim))
		for name, f := range pyOperators {
			mustReplace(filters.Register(name, f))
		}
		tests := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
		mustReplace(tests.Replace("false", testFalse))
		mustReplace(tests.Replace("true", testTrue))
		mustReplace(tests.Replace("sequence", testSequence))
		methods := builtins.Methods
		methods.Dict = orderedDictMethods
		methods.Str = newStrMethods(builtins.Methods.Str)
		env = &exec.Environment{
			Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
			Filters:           filters,
			Tests:             tests,
			ControlStructures: builtins.ControlStructures,
			Methods:           methods,
		}
	})
	return env
}

func mustReplace(err error) {
	if err != nil {
		panic("tokenizer: gonja environment: " + err.Error())
	}
}

// trimGonjaError shortens gonja's parse errors, which embed the whole template source.
func trimGonjaError(msg, source string) string {
	if source != "" {
		msg = strings.ReplaceAll(msg, source, "<template>")
	}
	return msg
}

// lastGonjaCause drops gonja's chain of "unable to evaluate ..." wrappers,
// which repeat whole expressions, and keeps the innermost cause.
func lastGonjaCause(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 && len(msg) > 400 {
		return msg[i+2:]
	}
	return msg
}
