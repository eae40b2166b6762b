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
	md := Markdown("containerd-2.4", map[Mode]*Result{Direct: {Passed: []string{"a"}}, Proxy: {Passed: []string{"b"}}, ProxyGRPC: {Passed: []string{"a"}}})
	for _, want := range []string{"| direct | 1 |", "| proxy | 1 |", "| proxy-grpc | 1 |", "The sets of passed specs differ (direct, proxy)", "- a\n", "- b\n",
		"Same set of passed specs directly and through proxy-grpc"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

const sampleJUnit = `<testsuites>
 <testsuite name="3.5. HTTP/2 Connection Preface" package="http2/3.5" id="3.5" tests="2" skipped="0" failures="1" errors="0">
  <testcase package="http2/3.5" classname="Sends client connection preface" time="0.001"></testcase>
  <testcase package="http2/3.5" classname="Sends invalid connection preface" time="0.001"><failure>Expected: GOAWAY
Actual: timeout</failure></testcase>
 </testsuite>
 <testsuite name="5.1.2. Stream Concurrency" package="http2/5.1.2" id="5.1.2" tests="1" skipped="1" failures="0" errors="0">
  <testcase package="http2/5.1.2" classname="Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded" time="0.000"><skipped>skipped</skipped></testcase>
 </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	r, err := ParseJUnit([]byte(sampleJUnit))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http2/3.5: Sends client connection preface"}; !slices.Equal(r.Passed, want) {
		t.Errorf("passed = %q, want %q", r.Passed, want)
	}
	if msg := r.Failed["http2/3.5: Sends invalid connection preface"]; msg != "Expected: GOAWAY" {
		t.Errorf("failed = %v", r.Failed)
	}
	if len(r.Skipped) != 1 || !strings.HasPrefix(r.Skipped[0], "http2/5.1.2: ") {
		t.Errorf("skipped = %v", r.Skipped)
	}
	md := H2specMarkdown(map[Mode]*Result{Direct: r, Proxy: {Passed: []string{"x"}}})
	for _, want := range []string{h2specMarker, "| direct | 1 | 1 | 1 |", "Some cases pass or are skipped directly but not through proxy", "- http2/3.5: Sends client connection preface\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if got := h2specSection("# critest\n\n" + md); !strings.HasPrefix(got, "\n"+h2specMarker) {
		t.Errorf("h2specSection = %q", got)
	}
}
