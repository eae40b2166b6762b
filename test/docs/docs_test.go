// Package docs checks that README.md, CONTRIBUTING.md and docs/ stand alone:
// no path that leaves the repository, no ticket numbers a reader cannot
// follow, no relative link to a file that is not there, no code block left
// open, a package table in docs/architecture.md that names every package
// under pkg/, and a README whose first screen is the front door (what and
// why, the commands, the quickstart). It needs nothing but the source tree,
// so make test-unit runs it.
package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// root is the repository, seen from this package's directory.
const root = "../.."

func TestDocsStandAlone(t *testing.T) {
	files := []string{"README.md", "CONTRIBUTING.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, _ := filepath.Rel(root, m)
		files = append(files, rel)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems(root, f, string(b)) {
			t.Errorf("%s", p)
		}
		if p := unclosedFence(string(b)); p != "" {
			t.Errorf("%s: %s", f, p)
		}
	}
}

// fenceLine is a line that opens or closes a code block: any indentation
// (a block nested in a list item is indented), three or more backticks or
// tildes, then an optional info string.
var fenceLine = regexp.MustCompile("^\\s*(`{3,}|~{3,})(.*)$")

// unclosedFence says where a code block opens that nothing closes, or ""
// when every fence is closed. A fence left open turns the rest of the
// document into code (on GitHub, everything after it renders as one block).
// As CommonMark reads it: a block closes at a line of the same character,
// at least as many of them, and nothing else but spaces.
func unclosedFence(text string) string {
	open, at := "", 0
	for i, line := range strings.Split(text, "\n") {
		m := fenceLine.FindStringSubmatch(line)
		switch {
		case m == nil:
		case open == "":
			if m[1][0] == '`' && strings.Contains(m[2], "`") {
				continue // an inline code span, not a fence
			}
			open, at = m[1], i+1
		case m[1][0] == open[0] && len(m[1]) >= len(open) && strings.TrimSpace(m[2]) == "":
			open = ""
		}
	}
	if open != "" {
		return fmt.Sprintf("the code block opened at line %d (%s) is never closed: everything after it renders as code "+
			"(fences pair up in order, so the one left open may be an earlier one: look for prose between a pair)", at, open)
	}
	return ""
}

func TestArchitectureListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := packages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under pkg/: %v", len(pkgs), pkgs)
	}
	for _, p := range missingPackages(string(b), pkgs) {
		t.Errorf("docs/architecture.md: the package table has no row for %s: add one (one paragraph: its one job)", p)
	}
}

// README's first screen is the front door: what and why, the fast loop and
// the two commands, and the quickstart, before anything else.
func TestReadmeFirstScreen(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 40 {
		lines = lines[:40]
	}
	for _, s := range missingFromFirstScreen(strings.Join(lines, "\n")) {
		t.Errorf("README.md's first 40 lines do not hold %s: keep the front door first, move the rest below", s)
	}
}

// firstScreen are what README's first 40 lines must hold, each with a
// phrase that shows it.
var firstScreen = []struct{ what, phrase string }{
	{"why (kubelet kills first and pulls second)", "kills the container first"},
	{"what inplaced does instead (pulls first)", "pulls first"},
	{"the pod keeps its IP", "keeps its IP"},
	{"a bad tag never takes the pod down", "bad tag never takes the pod down"},
	{"the fast loop", "make test-unit"},
	{"make demo", "make demo"},
	{"make test", "make test "},
	{"the quickstart", "Quickstart"},
	{"the quickstart's service start", "systemctl enable --now inplaced"},
}

func missingFromFirstScreen(text string) []string {
	var out []string
	for _, f := range firstScreen {
		if !strings.Contains(text, f.phrase) {
			out = append(out, fmt.Sprintf("%s (%q)", f.what, f.phrase))
		}
	}
	return out
}

// The checks themselves, on text made to break them: a check that cannot
// fail proves nothing.
func TestChecksCatch(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"README.md", "docs/a.md"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		text string
		bad  bool
	}{
		{"see `../shared/facts/kubelet-cri.md`", true},
		{"see [the facts](../../shared/x.md)", true},
		{"as issue 12 asks", true},
		{"## Kubernetes mode (issues 9 and 10)", true},
		{"fixed in #12.", true},
		{"the issue-12 targets", true},
		{"a [link](missing.md) to nowhere", true},
		{"back to the [README](../README.md) and [a](a.md#section)", false},
		{"`make test` runs `docs/a.md` checks; see https://github.com/kubernetes/kubernetes/issues/139964", false},
		{"in code: `x := a[1] // issue 3` and\n```\ncd ../docs # issue 4\n```\n", false},
		{"HTTP/2 frames, 3 issues found, #define, C#5 and a #hashtag", false},
	} {
		got := problems(dir, "docs/a.md", c.text)
		if (len(got) > 0) != c.bad {
			t.Errorf("%q: problems %q, want bad=%v", c.text, got, c.bad)
		}
	}
	for _, c := range []struct {
		text string
		bad  bool
	}{
		{"a\n```\ncode\n```\nb\n", false},
		{"a\n```sh\ncode\n```\n\n* item\n\n  ```\n  nested\n  ```\n", false},
		{"````md\n```\ninner\n```\n````\n", false},
		{"~~~\n```\n~~~\n", false},
		{"```not a fence```, a code span\n", false},
		// docs/architecture.md as it was: the diagram's fence left open, so
		// the next fence closed it and the rest rendered inverted.
		{"# x\n\n```\nkubelet ──▶ relay\n\n## Packages\n\n```\nframes\n```\n", true},
		{"a\n```go\ncode\n", true},
		{"a\n````\ncode\n```\n", true},
		{"a\n```\ncode\n``` trailing\n", true},
	} {
		if got := unclosedFence(c.text); (got != "") != c.bad {
			t.Errorf("%q: unclosedFence %q, want bad=%v", c.text, got, c.bad)
		}
	}
	if got := unclosedFence("# x\n\n```\ndiagram\n\n## Packages\n"); !strings.Contains(got, "line 3") {
		t.Errorf("unclosedFence names the wrong line: %q", got)
	}
	if got := missingFromFirstScreen("# x\nmake test-unit and make demo"); len(got) != len(firstScreen)-2 {
		t.Errorf("first screen check found %d missing, want %d: %q", len(got), len(firstScreen)-2, got)
	}
	table := "| package | job |\n|---|---|\n| `pkg/a`, `pkg/b` | x |\n"
	if got := missingPackages(table, []string{"pkg/a", "pkg/b", "pkg/c"}); len(got) != 1 || got[0] != "pkg/c" {
		t.Errorf("missing packages: %v, want [pkg/c]", got)
	}
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	url        = regexp.MustCompile(`[a-z]+://[^\s)>\]` + "`" + `]+`)
	upPath     = regexp.MustCompile(`(?:\.\./)+[A-Za-z0-9_.\-/]*`)
	link       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	ticketWord = regexp.MustCompile(`(?i)\b(?:issues?|tickets?|PRs?|pull requests?)[ -]#?\d+`)
	ticketHash = regexp.MustCompile(`(?:^|[\s(\[,;])#\d+\b`)
)

// problems lists what makes text (the file name, relative to root) not
// stand alone.
func problems(root, name, text string) []string {
	var out []string
	dir := filepath.Dir(name)
	noURL := url.ReplaceAllString(text, "")
	for _, m := range upPath.FindAllString(noURL, -1) {
		if !inside(root, dir, m) {
			out = append(out, fmt.Sprintf("%s: %q points outside the repository (docs must stand alone: say what it says instead)", name, m))
		}
	}
	prose := codeSpan.ReplaceAllString(fence.ReplaceAllString(text, ""), "")
	for _, m := range link.FindAllStringSubmatch(prose, -1) {
		target := strings.SplitN(m[1], "#", 2)[0]
		if target == "" || strings.Contains(target, ":") {
			continue // an anchor, a URL, mailto:
		}
		if _, err := os.Stat(filepath.Join(root, dir, target)); err != nil {
			out = append(out, fmt.Sprintf("%s: link to %q: no such file in the repository", name, m[1]))
		}
	}
	prose = url.ReplaceAllString(prose, "")
	for _, re := range []*regexp.Regexp{ticketWord, ticketHash} {
		for _, m := range re.FindAllString(prose, -1) {
			out = append(out, fmt.Sprintf("%s: %q names a ticket a reader of the repository cannot follow: say what it asked for", name, strings.TrimSpace(m)))
		}
	}
	return out
}

// inside reports whether a path that climbs with ../ names something in the
// repository, read from the document's directory or from the root.
func inside(root, dir, p string) bool {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return false
	}
	for _, base := range []string{filepath.Join(absRoot, dir), absRoot} {
		full := filepath.Join(base, p)
		if full != absRoot && !strings.HasPrefix(full, absRoot+string(filepath.Separator)) {
			continue
		}
		if _, err := os.Stat(full); err == nil {
			return true
		}
	}
	return false
}

// packages lists the Go packages under root/pkg as "pkg/...": directories
// with a non-test .go file, as go list ./pkg/... finds them.
func packages(root string) ([]string, error) {
	seen := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(root, "pkg"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			seen[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	var out []string
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, err
}

var tablePkg = regexp.MustCompile("`(pkg/[A-Za-z0-9_/]+)`")

// missingPackages returns the packages no table row of doc names in its
// first cell.
func missingPackages(doc string, pkgs []string) []string {
	named := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(strings.TrimSpace(line), "|") || len(cells) < 3 {
			continue
		}
		for _, m := range tablePkg.FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	var out []string
	for _, p := range pkgs {
		if !named[p] {
			out = append(out, p)
		}
	}
	return out
}
