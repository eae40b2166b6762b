// Package codecheck keeps the code small enough to read, counting
// cyclomatic complexity as gocyclo counts it. The code that decides and
// runs a swap, and the daemon's lifecycle, have no function over 60 lines
// or a complexity over 15 (TestComplexity); the whole tree has no function
// over 20, none over 15 in pkg/swap, pkg/kube and pkg/relay, and no file
// over 900 lines (TestTreeComplexity, tree_test.go). A go/ast walk rather
// than gocyclo itself: the rule is a dozen lines, and make test-unit then
// needs nothing beyond Go.
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

// root is the repository, seen from this package's directory.
const root = "../.."

const (
	maxLines      = 60
	maxComplexity = 15
)

// checked are the files held to the limits (patterns of filepath.Match;
// test files are not held): the swap planner and executor, the recovery
// planner and executor, the daemon's build / serve / shut down, and the
// relay, which every call of kubelet's goes through.
var checked = []string{
	"pkg/swap/plan.go",
	"pkg/swap/exec.go",
	"pkg/swap/recover.go",
	"pkg/swap/recoverplan.go",
	"pkg/daemon/daemon.go",
	"pkg/relay/*.go",
}

func TestComplexity(t *testing.T) {
	var files []string
	for _, pattern := range checked {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
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
		name := funcName(fn)
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

// funcName is a function's name as gocyclo prints it: f, (T).m or (*T).m.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv != nil && len(fn.Recv.List) > 0 {
		return fmt.Sprintf("(%s).%s", types(fn.Recv.List[0].Type), fn.Name.Name)
	}
	return fn.Name.Name
}

func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return "*" + types(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr: // a generic type's receiver, T[E]
		return types(e.X)
	case *ast.IndexListExpr:
		return types(e.X)
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
