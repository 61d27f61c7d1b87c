package operator

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, seen from this package.
var root = filepath.Join("..", "..")

// docFiles returns the README, the changelog and every page under docs/,
// relative to the repository's root.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "CHANGELOG.md"}
	for _, p := range pages {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// prose returns a Markdown file's lines outside fenced code blocks.
func prose(text string) []string {
	var lines []string
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines = append(lines, l)
		}
	}
	return lines
}

// anchor is the id GitHub gives a heading: lower case, letters, digits,
// '-' and '_' kept, spaces turned into '-', everything else dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors returns the heading ids of a Markdown text, with GitHub's -1, -2
// suffixes for repeated headings.
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(text) {
		h := strings.TrimLeft(l, "#")
		if len(h) == len(l) || !strings.HasPrefix(h, " ") {
			continue
		}
		id := anchor(strings.TrimSpace(h))
		if n := seen[id]; n > 0 {
			ids[id+"-"+strconv.Itoa(n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// Every relative link in the README and docs/ names a file that exists
// and, when it has a #fragment into a Markdown file, a heading of that file.
func TestDocsRelativeLinksResolve(t *testing.T) {
	texts := map[string]string{}
	read := func(rel string) (string, bool) {
		if s, ok := texts[rel]; ok {
			return s, true
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", false
		}
		texts[rel] = string(b)
		return string(b), true
	}
	for _, file := range docFiles(t) {
		text, ok := read(file)
		if !ok {
			t.Fatalf("%s: cannot read", file)
		}
		links := 0
		for _, line := range prose(text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, frag, _ := strings.Cut(target, "#")
				rel := file
				if path != "" {
					rel = filepath.Clean(filepath.Join(filepath.Dir(file), path))
					if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
						t.Errorf("%s: link %q: %s does not exist", file, target, rel)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(rel, ".md") {
					continue
				}
				dest, _ := read(rel)
				if !anchors(dest)[frag] {
					t.Errorf("%s: link %q: %s has no heading #%s", file, target, rel, frag)
				}
			}
		}
		if file == "README.md" && links == 0 {
			t.Errorf("README.md: found no relative links; the link pattern is broken")
		}
	}
}

// The docs' go test and go run commands name packages that exist, so a
// moved package shows up here rather than in a reader's terminal.
func TestDocsCommandsNameExistingPackages(t *testing.T) {
	cmd := regexp.MustCompile("go (?:test|run|build|install)[^`\n]*")
	pkg := regexp.MustCompile(`(?:^|\s)(\./[A-Za-z0-9_./-]*)`)
	checked := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmd.FindAllString(string(b), -1) {
			for _, m := range pkg.FindAllStringSubmatch(c, -1) {
				p := strings.TrimSuffix(strings.TrimSuffix(m[1], "..."), "/")
				if p == "." || p == "" {
					continue
				}
				checked++
				if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
					t.Errorf("%s: %q names %s, which is not a folder of the repository", file, c, m[1])
				}
			}
		}
	}
	if checked == 0 {
		t.Error("found no package paths in the docs' go commands; the pattern is broken")
	}
}

// docs/operating.md's flag tables list exactly the flags kvroute serve
// --help-all prints, so a new, renamed or removed flag fails here until the
// page is regenerated.
func TestOperatingDocsListEveryServeFlag(t *testing.T) {
	r := runBin(t, "kvroute", "serve", "--help-all")
	help := r.stdout + r.stderr
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		want = append(want, m[1])
	}
	if len(want) < 50 {
		t.Fatalf("kvroute serve --help-all lists %d flags; the pattern is broken:\n%s", len(want), help)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Flags of `kvroute serve`\n")
	if !ok {
		t.Fatal("docs/operating.md has no \"## Flags of `kvroute serve`\" section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var got []string
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)").FindAllStringSubmatch(sec, -1) {
		got = append(got, m[1])
	}
	slices.Sort(want)
	slices.Sort(got)
	for _, f := range want {
		if _, found := slices.BinarySearch(got, f); !found {
			t.Errorf("docs/operating.md does not list --%s, which kvroute serve --help-all prints", f)
		}
	}
	for _, f := range got {
		if _, found := slices.BinarySearch(want, f); !found {
			t.Errorf("docs/operating.md lists --%s, which kvroute serve --help-all does not print", f)
		}
	}
}
