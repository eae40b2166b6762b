// Package codecheck keeps the code that decides and runs a swap, the
// daemon's lifecycle and the relay small enough to read: no function over
// 60 lines or a cyclomatic complexity over 15 (counted as gocyclo counts
// it). A go/ast
// walk rather than gocyclo itself: the rule is a dozen lines, and make
// test-unit then needs nothing beyond Go.
package codecheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

const (
	maxLines      = 60
	maxComplexity = 15
)

// checked are the files held to the limits (patterns of filepath.Match;
// test files are not held): the swap planner and executor, the daemon's
// build / serve / shut down, and the relay, which every call of kubelet's
// goes through.
var checked = []string{
	"pkg/swap/plan.go",
	"pkg/swap/exec.go",
	"pkg/daemon/daemon.go",
	"pkg/relay/*.go",
}

func TestComplexity(t *testing.T) {
	var files []string
	for _, pattern := range checked {
		matches, err := filepath.Glob(filepath.Join("../..", pattern))
		if err != nil || len(matches) == 0 {
			t.Fatalf("%s: no file (%v)", pattern, err)
		}
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				files = append(files, m)
			}
		}
	}
	for _, f := range files {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tooComplex(fset, file) {
			t.Errorf("%s: %s", f, p)
		}
	}
}

// The check on a function made to break it.
func TestComplexityCatches(t *testing.T) {
	src := "package x\nfunc big(a, b int) int {\n"
	for i := 0; i < 20; i++ {
		src += fmt.Sprintf("\tif a > %d && b > 0 {\n\t\ta++\n\t}\n", i)
	}
	src += "\treturn a\n}\nfunc small() {}\n"
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := tooComplex(fset, file)
	if len(got) != 2 {
		t.Fatalf("want big flagged for lines and complexity (41), got %q", got)
	}
	if c := complexity(file.Decls[0].(*ast.FuncDecl)); c != 41 {
		t.Errorf("complexity %d, want 41", c)
	}
}

func tooComplex(fset *token.FileSet, file *ast.File) []string {
	var out []string
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		name := fn.Name.Name
		if fn.Recv != nil && len(fn.Recv.List) > 0 {
			name = fmt.Sprintf("(%s).%s", types(fn.Recv.List[0].Type), name)
		}
		lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
		if lines > maxLines {
			out = append(out, fmt.Sprintf("%s is %d lines (at most %d): split it", name, lines, maxLines))
		}
		if c := complexity(fn); c > maxComplexity {
			out = append(out, fmt.Sprintf("%s has cyclomatic complexity %d (at most %d): split it", name, c, maxComplexity))
		}
	}
	return out
}

func types(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		return "*" + types(s.X)
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return "?"
}

// complexity is gocyclo's count: 1, plus one for each if, for, range, case
// and comm clause other than default, and && or ||.
func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
