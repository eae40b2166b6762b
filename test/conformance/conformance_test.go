// Package conformance runs critest v1.37 against a private containerd directly
// and then through the inplaced proxy, and compares the sets of passed specs:
// the proxy conforms when exactly the same specs pass through it as directly
// against the same containerd (failures of the backend itself, or of the test
// images standing in for upstream ones, are the same on both paths).
//
// It is opt-in (INPLACED_CONFORMANCE=1) and takes a few minutes per backend;
// hack/conformance.sh runs it. Environment:
//
//	INPLACED_CONFORMANCE=1             run at all
//	INPLACED_CONFORMANCE_MODES         "direct", "proxy" or "direct,proxy" (default:
//	                                   both when the proxy binary exists, else direct)
//	INPLACED_PROXY_BIN                 proxy binary (default <repo>/_output/bin/inplaced)
//	INPLACED_CONFORMANCE_DOCS          where conformance-<backend>.md go (default <repo>/docs)
//	INPLACED_CONFORMANCE_FOCUS/_SKIP   passed to critest as -ginkgo.focus / -ginkgo.skip
//	INPLACED_CONFORMANCE_SEED          ginkgo seed, the same for both paths (default 1)
//	INPLACED_BACKENDS                  see harness.BackendsFromEnv
//	INPLACED_ARTIFACTS                 if set, critest output and reports are kept there
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/test/harness"
)

// Mode is how critest reaches containerd.
type Mode string

const (
	Direct    Mode = "direct"
	Proxy     Mode = "proxy"      // inplaced --relay=router (the default)
	ProxyGRPC Mode = "proxy-grpc" // inplaced --relay=grpc
	// GRPCGo is no way to containerd but h2spec's measure of the
	// fallback: grpc-go of this build as --relay=grpc configures its
	// server, in process, answering every call itself.
	GRPCGo Mode = "grpc-go"
)

// proxyModes are the ways through inplaced, each compared with Direct.
var proxyModes = []Mode{Proxy, ProxyGRPC}

// proxyArgs are inplaced's arguments for a mode.
func proxyArgs(m Mode) []string {
	if m == ProxyGRPC {
		return []string{"--relay=grpc"}
	}
	return []string{"--relay=router"}
}

func TestConformance(t *testing.T) {
	if os.Getenv("INPLACED_CONFORMANCE") != "1" {
		t.Skip("set INPLACED_CONFORMANCE=1 (hack/conformance.sh) to run critest")
	}
	harness.RequireRoot(t)
	harness.RequireTool(t, "critest", harness.CritestPath())
	proxyBin, modes, docsDir := fromEnv(t)

	reg := harness.StartRegistry(t)
	images := reg.PushTestImages(t)
	reg.PushCritestImages(t)
	imagesFile := filepath.Join(t.TempDir(), "test-images.yaml")
	if err := os.WriteFile(imagesFile, []byte(images.TestImagesYAML()), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, b := range harness.BackendsFromEnv() {
		t.Run(string(b), func(t *testing.T) {
			results := map[Mode]*Result{}
			for _, m := range modes {
				// A fresh containerd per run: nothing pulled or left by the
				// first run changes the second.
				c := harness.StartContainerd(t, b, reg, harness.WithMirrors(harness.CritestRegistryHosts...))
				endpoint := c.Endpoint
				var stopProxy func()
				if m != Direct {
					endpoint, stopProxy = startProxy(t, proxyBin, c.Endpoint, proxyArgs(m)...)
				}
				res, err := RunCritest(t, endpoint, imagesFile, fmt.Sprintf("%s-%s", b, m))
				if stopProxy != nil {
					stopProxy()
				}
				if cerr := c.Close(); cerr != nil {
					t.Errorf("containerd cleanup: %v", cerr)
				}
				if err != nil {
					t.Fatalf("critest %s %s: %v", b, m, err)
				}
				res.Backend, res.Mode = string(b), m
				results[m] = res
				t.Logf("critest %s %s: %d passed, %d failed, %d skipped in %s",
					b, m, len(res.Passed), len(res.Failed), len(res.Skipped), res.Duration.Round(time.Second))
			}

			compare(t, "critest", string(b), results, true)
			md := Markdown(string(b), results)
			if old, err := os.ReadFile(filepath.Join(docsDir, fmt.Sprintf("conformance-%s.md", b))); err == nil {
				md += h2specSection(string(old)) // TestH2spec's, kept until it runs again
			}
			if err := os.MkdirAll(docsDir, 0o755); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(docsDir, fmt.Sprintf("conformance-%s.md", b))
			if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", out)
		})
	}
}

// fromEnv is what both suites take from the environment: inplaced's
// binary, the modes to run and where the documents go.
func fromEnv(t *testing.T) (proxyBin string, modes []Mode, docsDir string) {
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	proxyBin = os.Getenv("INPLACED_PROXY_BIN")
	if proxyBin == "" {
		proxyBin = filepath.Join(root, "_output", "bin", "inplaced")
	}
	modes = modesFromEnv(proxyBin)
	if slices.Contains(modes, Proxy) || slices.Contains(modes, ProxyGRPC) {
		harness.RequireTool(t, "inplaced", proxyBin)
	}
	docsDir = os.Getenv("INPLACED_CONFORMANCE_DOCS")
	if docsDir == "" {
		docsDir = filepath.Join(root, "docs")
	}
	return proxyBin, modes, docsDir
}

// compare logs what passes only one way for each proxy mode and fails the
// test when something passes only directly (or, with both, only through
// inplaced: critest's specs must be the same set).
func compare(t *testing.T, tool, backend string, results map[Mode]*Result, both bool) {
	for _, pm := range proxyModes {
		d, p := results[Direct], results[pm]
		if d == nil || p == nil {
			continue
		}
		onlyDirect, onlyProxy := diff(d.Passed, p.Passed)
		t.Logf("%s %s: direct %d passed, %s %d passed", tool, backend, len(d.Passed), pm, len(p.Passed))
		for _, s := range onlyDirect {
			t.Logf("  passes only directly: %s", s)
		}
		for _, s := range onlyProxy {
			t.Logf("  passes only through %s: %s", pm, s)
		}
		if len(onlyDirect) > 0 || both && len(onlyProxy) > 0 {
			t.Errorf("%s %s: the sets of passed cases differ (%d only direct, %d only through %s)",
				tool, backend, len(onlyDirect), len(onlyProxy), pm)
		}
	}
}

func modesFromEnv(proxyBin string) []Mode {
	if v := os.Getenv("INPLACED_CONFORMANCE_MODES"); v != "" {
		var out []Mode
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, Mode(s))
			}
		}
		return out
	}
	if st, err := os.Stat(proxyBin); err == nil && st.Mode().IsRegular() {
		return []Mode{Direct, Proxy, ProxyGRPC}
	}
	return []Mode{Direct}
}

// startProxy runs inplaced in front of backend and returns its endpoint and a
// stop function (SIGTERM, then SIGKILL after 10 s; files removed).
func startProxy(t *testing.T, bin, backend string, args ...string) (string, func()) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "ipc")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "cri.sock")
	logPath := filepath.Join(dir, "inplaced.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{
		"--listen", sock,
		"--runtime-endpoint", backend,
		"--state-dir", filepath.Join(dir, "state"),
		"--control-socket", filepath.Join(dir, "control.sock")}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			keepArtifact(t, logPath, "inplaced.log")
		}
		_ = os.RemoveAll(dir)
	}
	t.Cleanup(stop)
	endpoint := "unix://" + sock
	if err := harness.WaitCRIReady(endpoint, 30*time.Second); err != nil {
		data, _ := os.ReadFile(logPath)
		stop()
		t.Fatalf("inplaced: %v\n%s", err, tail(string(data), 30))
	}
	return endpoint, stop
}

// Result is the outcome of one critest run, by spec name.
type Result struct {
	Backend  string
	Mode     Mode
	Passed   []string
	Failed   map[string]string // spec -> first line of the failure
	Skipped  []string
	Duration time.Duration
}

// RunCritest runs critest against endpoint and reads its ginkgo JSON report.
// A non-zero exit of critest (failed specs) is no error; a missing report is.
func RunCritest(t *testing.T, endpoint, imagesFile, name string) (*Result, error) {
	t.Helper()
	dir := t.TempDir()
	report := filepath.Join(dir, "report.json")
	logPath := filepath.Join(dir, "critest.log")
	args := []string{
		"--runtime-endpoint", endpoint,
		"--image-endpoint", endpoint,
		"--test-images-file", imagesFile,
		"-ginkgo.no-color",
		"-ginkgo.json-report", report,
		// The same spec order on both paths: some specs depend on what ran before.
		"-ginkgo.seed", seed(),
	}
	if f := os.Getenv("INPLACED_CONFORMANCE_FOCUS"); f != "" {
		args = append(args, "-ginkgo.focus", f)
	}
	if s := os.Getenv("INPLACED_CONFORMANCE_SKIP"); s != "" {
		args = append(args, "-ginkgo.skip", s)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.CritestPath(), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	shmBefore := shmSegments()
	start := time.Now()
	runErr := cmd.Run()
	dur := time.Since(start)
	removeNewShm(t, shmBefore)
	keepArtifact(t, logPath, name+"-critest.log")
	keepArtifact(t, report, name+"-report.json")

	data, err := os.ReadFile(report)
	if err != nil {
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("no report (critest: %v): %w\n%s", runErr, err, tail(string(out), 40))
	}
	res, err := ParseReport(data)
	if err != nil {
		return nil, err
	}
	res.Duration = dur
	return res, nil
}

// seed is ginkgo's randomization seed: $INPLACED_CONFORMANCE_SEED, or 1.
func seed() string {
	if s := os.Getenv("INPLACED_CONFORMANCE_SEED"); s != "" {
		return s
	}
	return "1"
}

// ginkgoReport is the part of ginkgo v2's JSON report (a list of suite reports) used here.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		Failure                 struct {
			Message string
		}
	}
}

// ParseReport reads a ginkgo JSON report: one entry per It, named by its
// container texts and its own text joined with spaces.
func ParseReport(data []byte) (*Result, error) {
	var suites []ginkgoReport
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("ginkgo report: %w", err)
	}
	res := &Result{Failed: map[string]string{}}
	for _, s := range suites {
		for _, sr := range s.SpecReports {
			if sr.LeafNodeType != "It" {
				continue
			}
			name := strings.Join(append(slices.Clone(sr.ContainerHierarchyTexts), sr.LeafNodeText), " ")
			switch sr.State {
			case "passed":
				res.Passed = append(res.Passed, name)
			case "skipped", "pending":
				res.Skipped = append(res.Skipped, name)
			default: // failed, panicked, interrupted, aborted, timedout
				res.Failed[name] = sr.State + ": " + strings.Join(strings.Fields(sr.Failure.Message), " ")
			}
		}
	}
	sort.Strings(res.Passed)
	sort.Strings(res.Skipped)
	return res, nil
}

// diff returns the names only in a and only in b.
func diff(a, b []string) (onlyA, onlyB []string) {
	inA, inB := map[string]bool{}, map[string]bool{}
	for _, s := range a {
		inA[s] = true
	}
	for _, s := range b {
		inB[s] = true
		if !inA[s] {
			onlyB = append(onlyB, s)
		}
	}
	for _, s := range a {
		if !inB[s] {
			onlyA = append(onlyA, s)
		}
	}
	return onlyA, onlyB
}

// Markdown is the summary written to docs/conformance-<backend>.md.
func Markdown(backend string, results map[Mode]*Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# critest %s against %s\n\n", harness.CriToolsVersion, backend)
	fmt.Fprintf(&b, "Generated by `hack/conformance.sh` on %s. critest runs against a private\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "containerd (test/harness) with the harness's substitute test images; the proxy conforms when\n")
	fmt.Fprintf(&b, "the same specs pass through it as directly against the same containerd, with either\n")
	fmt.Fprintf(&b, "`--relay` setting (proxy: the HTTP/2 router; proxy-grpc: grpc-go's server and client).\n\n")
	fmt.Fprintf(&b, "| path | passed | failed | skipped | time |\n|---|---:|---:|---:|---:|\n")
	for _, m := range []Mode{Direct, Proxy, ProxyGRPC} {
		if r := results[m]; r != nil {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", m, len(r.Passed), len(r.Failed), len(r.Skipped), r.Duration.Round(time.Second))
		}
	}
	b.WriteString("\n")
	compared := false
	for _, pm := range proxyModes {
		d, p := results[Direct], results[pm]
		if d == nil || p == nil {
			continue
		}
		compared = true
		onlyDirect, onlyProxy := diff(d.Passed, p.Passed)
		if len(onlyDirect)+len(onlyProxy) == 0 {
			fmt.Fprintf(&b, "**Same set of passed specs directly and through %s.**\n\n", pm)
			continue
		}
		fmt.Fprintf(&b, "**The sets of passed specs differ (direct, %s).**\n\n", pm)
		writeList(&b, "Passed only directly", onlyDirect)
		writeList(&b, "Passed only through "+string(pm), onlyProxy)
	}
	if !compared {
		b.WriteString("Only one path was run (the proxy binary was not built).\n\n")
	}
	for _, m := range []Mode{Direct, Proxy, ProxyGRPC} {
		r := results[m]
		if r == nil || len(r.Failed) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## Failed specs (%s)\n\n", m)
		names := make([]string, 0, len(r.Failed))
		for n := range r.Failed {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			msg := r.Failed[n]
			if len(msg) > 200 {
				msg = msg[:200] + "..."
			}
			fmt.Fprintf(&b, "- %s  \n  `%s`\n", n, strings.ReplaceAll(msg, "`", "'"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func writeList(w io.Writer, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(w, "### %s\n\n", title)
	for _, s := range items {
		fmt.Fprintf(w, "- %s\n", s)
	}
	fmt.Fprintln(w)
}

func keepArtifact(t *testing.T, src, name string) {
	dst := os.Getenv("INPLACED_ARTIFACTS")
	if dst == "" {
		return
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return
	}
	if err := os.WriteFile(filepath.Join(dst, name), data, 0o644); err != nil {
		t.Logf("artifacts: %v", err)
	}
}

// shmSegments maps the ids of the host's System V shared memory segments to
// their number of attached processes.
func shmSegments() map[int]int {
	data, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return nil
	}
	out := map[int]int{}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		id, err1 := strconv.Atoi(f[1])
		nattch, err2 := strconv.Atoi(f[6])
		if err1 == nil && err2 == nil {
			out[id] = nattch
		}
	}
	return out
}

// removeNewShm removes the unattached shared memory segments that appeared
// during a critest run: its HostIpc specs create one on the host with
// `ipcmk -M 1048576` and never remove it.
func removeNewShm(t *testing.T, before map[int]int) {
	if before == nil {
		return
	}
	for id, nattch := range shmSegments() {
		if _, old := before[id]; old || nattch != 0 {
			continue
		}
		if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
			t.Logf("remove shm segment %d left by critest: %v", id, err)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
