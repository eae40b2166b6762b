package conformance

import (
	"slices"
	"strings"
	"testing"
)

const sampleReport = `[{"SuiteDescription":"CRI validation","SpecReports":[
 {"ContainerHierarchyTexts":null,"LeafNodeText":"","LeafNodeType":"BeforeSuite","State":"passed"},
 {"ContainerHierarchyTexts":["[sig-node] Image Manager"],"LeafNodeText":"public image with tag should be pulled and removed","LeafNodeType":"It","State":"passed"},
 {"ContainerHierarchyTexts":["[sig-node] Container","runtime should support basic operations on container"],"LeafNodeText":"runtime should support creating container [Conformance]","LeafNodeType":"It","State":"failed","Failure":{"Message":"Expected\n    <bool>: false\nto be true"}},
 {"ContainerHierarchyTexts":["[sig-node] Networking"],"LeafNodeText":"runtime should support port mapping","LeafNodeType":"It","State":"skipped"}
]}]`

func TestParseReport(t *testing.T) {
	r, err := ParseReport([]byte(sampleReport))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"[sig-node] Image Manager public image with tag should be pulled and removed"}; !slices.Equal(r.Passed, want) {
		t.Errorf("passed = %q, want %q", r.Passed, want)
	}
	if len(r.Skipped) != 1 || len(r.Failed) != 1 {
		t.Fatalf("skipped %v failed %v", r.Skipped, r.Failed)
	}
	for name, msg := range r.Failed {
		if !strings.HasPrefix(name, "[sig-node] Container runtime should support basic operations on container runtime should support creating") {
			t.Errorf("failed spec name %q", name)
		}
		if msg != "failed: Expected <bool>: false to be true" {
			t.Errorf("failure message %q", msg)
		}
	}
}

func TestDiff(t *testing.T) {
	onlyA, onlyB := diff([]string{"a", "b", "c"}, []string{"b", "c", "d"})
	if !slices.Equal(onlyA, []string{"a"}) || !slices.Equal(onlyB, []string{"d"}) {
		t.Errorf("diff = %v, %v", onlyA, onlyB)
	}
	md := Markdown("containerd-2.4", map[Mode]*Result{Direct: {Passed: []string{"a"}}, Proxy: {Passed: []string{"b"}}}, []string{"a"}, []string{"b"})
	for _, want := range []string{"| direct | 1 |", "| proxy | 1 |", "The sets of passed specs differ", "- a\n", "- b\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
