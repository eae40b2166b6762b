package conformance

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

// h2specMarker starts the h2spec section of docs/conformance-<backend>.md.
const h2specMarker = "<!-- h2spec -->"

// TestH2spec runs h2spec (HTTP/2 conformance, RFC 7540/9113 and HPACK)
// against containerd's socket directly and through inplaced with each
// --relay setting, and compares the results (compareH2spec): every case
// that passes or is skipped directly must pass or be skipped through
// inplaced (one that passes only through it is a failure of containerd's
// that inplaced does not share). --relay=grpc is plain grpc-go, so it is
// also measured against grpc-go of this build with the fallback's limits
// (GRPCGo, in process): what that fails, the fallback may fail too. h2spec
// speaks TCP: a relay of this test's copies bytes between a loopback port
// and the unix socket. Each case may take up to 3 s (`-o 3`).
func TestH2spec(t *testing.T) {
	if os.Getenv("INPLACED_CONFORMANCE") != "1" {
		t.Skip("set INPLACED_CONFORMANCE=1 (hack/conformance.sh) to run h2spec")
	}
	harness.RequireRoot(t)
	bin := harness.H2specPath()
	harness.RequireTool(t, "h2spec", bin)
	proxyBin, modes, docsDir := fromEnv(t)
	reg := harness.StartRegistry(t)
	for _, b := range harness.BackendsFromEnv() {
		t.Run(string(b), func(t *testing.T) {
			c := harness.StartContainerd(t, b, reg)
			defer func() {
				if err := c.Close(); err != nil {
					t.Errorf("containerd cleanup: %v", err)
				}
			}()
			results := map[Mode]*Result{}
			for _, m := range modes {
				endpoint, stop := c.Endpoint, func() {}
				if m != Direct {
					endpoint, stop = startProxy(t, proxyBin, c.Endpoint, proxyArgs(m)...)
				}
				res, err := RunH2spec(t, bin, strings.TrimPrefix(endpoint, "unix://"), fmt.Sprintf("%s-%s", b, m))
				stop()
				if err != nil {
					t.Fatalf("h2spec %s %s: %v", b, m, err)
				}
				res.Backend, res.Mode = string(b), m
				results[m] = res
				t.Logf("h2spec %s %s: %d passed, %d failed, %d skipped in %s",
					b, m, len(res.Passed), len(res.Failed), len(res.Skipped), res.Duration.Round(time.Second))
			}
			if results[ProxyGRPC] != nil {
				results[GRPCGo] = runH2specGRPCGo(t, bin)
			}
			compareH2spec(t, string(b), results)
			out := filepath.Join(docsDir, fmt.Sprintf("conformance-%s.md", b))
			old, _ := os.ReadFile(out)
			md := string(old)
			if i := strings.Index(md, h2specMarker); i >= 0 {
				md = md[:i]
			}
			md = strings.TrimRight(md, "\n") + "\n\n" + H2specMarkdown(results)
			if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", out)
		})
	}
}

// h2specSection is the h2spec section of a conformance document, if any.
func h2specSection(doc string) string {
	if i := strings.Index(doc, h2specMarker); i >= 0 {
		return "\n" + doc[i:]
	}
	return ""
}

// RunH2spec runs h2spec against the unix socket sock through a loopback
// TCP relay and reads its JUnit report. Failed cases are no error; a
// missing report is.
func RunH2spec(t *testing.T, bin, sock, name string) (*Result, error) {
	t.Helper()
	port := tcpToUnix(t, sock)
	dir := t.TempDir()
	report := filepath.Join(dir, "report.xml")
	start := time.Now()
	cmd := exec.Command(bin, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-o", "3", "-j", report)
	out, runErr := cmd.CombinedOutput()
	logPath := filepath.Join(dir, "h2spec.log")
	_ = os.WriteFile(logPath, out, 0o644)
	keepArtifact(t, logPath, name+"-h2spec.log")
	data, err := os.ReadFile(report)
	if err != nil {
		return nil, fmt.Errorf("no report (h2spec: %v): %w\n%s", runErr, err, tail(string(out), 40))
	}
	res, err := ParseJUnit(data)
	if err != nil {
		return nil, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

// ParseJUnit reads h2spec's JUnit report: a case is named by its section
// and description.
func ParseJUnit(data []byte) (*Result, error) {
	var doc struct {
		Suites []struct {
			Cases []struct {
				Package   string  `xml:"package,attr"`
				ClassName string  `xml:"classname,attr"`
				Failure   *string `xml:"failure"`
				Error     *string `xml:"error"`
				Skipped   *string `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("h2spec report: %w", err)
	}
	res := &Result{Failed: map[string]string{}}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			name := c.Package + ": " + c.ClassName
			switch {
			case c.Failure != nil:
				res.Failed[name] = firstLine(*c.Failure)
			case c.Error != nil:
				res.Failed[name] = firstLine(*c.Error)
			case c.Skipped != nil:
				res.Skipped = append(res.Skipped, name)
			default:
				res.Passed = append(res.Passed, name)
			}
		}
	}
	sort.Strings(res.Passed)
	if len(res.Passed)+len(res.Failed)+len(res.Skipped) == 0 {
		return nil, fmt.Errorf("h2spec report has no test cases")
	}
	return res, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// H2specMarkdown is the h2spec section of docs/conformance-<backend>.md.
func H2specMarkdown(results map[Mode]*Result) string {
	var b bytes.Buffer
	b.WriteString(h2specMarker + "\n## h2spec\n\n")
	fmt.Fprintf(&b, "h2spec %s (`-o 3`) against the same containerd's socket, through a loopback TCP-to-unix relay,\n", strings.SplitN(h2specVersion(), " ", 2)[0])
	fmt.Fprintf(&b, "generated by `hack/conformance.sh` on %s. Every case that passes or is skipped directly must pass or be\n", time.Now().UTC().Format("2006-01-02"))
	b.WriteString("skipped through inplaced; inplaced answers some cases that containerd's grpc-go server fails. `relay: grpc` is\n")
	b.WriteString("plain grpc-go: it may also fail what grpc-go of this build fails with the fallback's limits (the grpc-go row).\n\n")
	b.WriteString("| path | passed | failed | skipped | time |\n|---|---:|---:|---:|---:|\n")
	for _, m := range []Mode{Direct, Proxy, ProxyGRPC, GRPCGo} {
		if r := results[m]; r != nil {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", m, len(r.Passed), len(r.Failed), len(r.Skipped), r.Duration.Round(time.Second))
		}
	}
	b.WriteString("\n")
	for _, pm := range proxyModes {
		d, p := results[Direct], results[pm]
		if d == nil || p == nil {
			continue
		}
		broken, grpcGo := h2specBroken(d, p, results[GRPCGo], pm)
		if len(broken) == 0 {
			fmt.Fprintf(&b, "**Every case that passes or is skipped directly passes or is skipped through %s", pm)
			if len(grpcGo) > 0 {
				b.WriteString(", but for what grpc-go of this build fails too (below)")
			}
			b.WriteString(".**\n\n")
		} else {
			fmt.Fprintf(&b, "**Some cases pass or are skipped directly but not through %s.**\n\n", pm)
		}
		onlyDirect, onlyProxy := diff(d.Passed, p.Passed)
		writeList(&b, "Passed or skipped directly, not through "+string(pm), broken)
		writeList(&b, "Passed or skipped directly, failed through "+string(pm)+" and against grpc-go of this build", grpcGo)
		writeList(&b, "Passed only directly (against "+string(pm)+")", onlyDirect)
		writeList(&b, "Passed only through "+string(pm), onlyProxy)
	}
	return b.String()
}

// compareH2spec fails the test for each case that passes or is skipped
// directly and does neither through a proxy mode: inplaced must not break
// what the backend gets right, and a case h2spec skips directly (for a
// setting the backend does not advertise) must not fail through inplaced
// either. Through --relay=grpc a case that grpc-go of this build fails as
// well (results[GRPCGo]) is logged, not failed: the fallback is plain
// grpc-go by design.
func compareH2spec(t *testing.T, backend string, results map[Mode]*Result) {
	t.Helper()
	d := results[Direct]
	if d == nil {
		return
	}
	for _, pm := range proxyModes {
		p := results[pm]
		if p == nil {
			continue
		}
		broken, grpcGo := h2specBroken(d, p, results[GRPCGo], pm)
		for _, name := range grpcGo {
			t.Logf("h2spec %s: %s fails through %s as against grpc-go of this build: %s", backend, name, pm, p.Failed[name])
		}
		for _, name := range broken {
			t.Errorf("h2spec %s: %s passes or is skipped directly, not through %s: %s", backend, name, pm, p.Failed[name])
		}
	}
}

// h2specBroken are the cases that pass or are skipped in d and do neither
// in p; through ProxyGRPC, those that grpc-go of this build (g) fails too
// are apart, in grpcGo.
func h2specBroken(d, p, g *Result, pm Mode) (broken, grpcGo []string) {
	ok := func(r *Result) map[string]bool {
		m := map[string]bool{}
		for _, s := range append(slices.Clone(r.Passed), r.Skipped...) {
			m[s] = true
		}
		return m
	}
	through := ok(p)
	var byGRPCGo map[string]bool
	if g != nil && pm == ProxyGRPC {
		byGRPCGo = ok(g)
	}
	for s := range ok(d) {
		switch {
		case through[s]:
		case byGRPCGo != nil && !byGRPCGo[s]:
			grpcGo = append(grpcGo, s)
		default:
			broken = append(broken, s)
		}
	}
	sort.Strings(broken)
	sort.Strings(grpcGo)
	return broken, grpcGo
}

// h2specVersion is the pin of hack/install-deps.sh, from the tool's stamp.
func h2specVersion() string {
	data, err := os.ReadFile(filepath.Join(filepath.Dir(harness.H2specPath()), ".h2spec.version"))
	if err != nil {
		return "(version unknown)"
	}
	return strings.TrimSpace(string(data))
}

// tcpToUnix relays a loopback TCP port to the unix socket sock for the
// test's life; either side's close closes both.
func tcpToUnix(t *testing.T, sock string) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.Dial("unix", sock)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
				<-done // one side closed: close both, as the peer would see it
				c.Close()
				u.Close()
				<-done
			}()
		}
	}()
	return lis.Addr().(*net.TCPAddr).Port
}
