package guest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// helm runs the payload's helm against the API server with the admin
// kubeconfig, its own home in a temp dir.
func (f *fleet) helm(t *testing.T, args ...string) {
	t.Helper()
	if out, err := f.helmOut(args...); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (f *fleet) helmOut(args ...string) (string, error) {
	c, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, filepath.Join(f.dir, "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+os.Getenv("INPLACED_KUBECONFIG"), "HOME="+f.helmH,
		"HELM_CONFIG_HOME="+filepath.Join(f.helmH, "config"), "HELM_CACHE_HOME="+filepath.Join(f.helmH, "cache"),
		"HELM_DATA_HOME="+filepath.Join(f.helmH, "data"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cleanup takes away what a failed run left: the release (its uninstall
// hook puts kubelet back on containerd), else the DaemonSet.
func (f *fleet) cleanup() {
	t := f.t
	if t.Failed() {
		f.installerLogs(t)
	}
	if out, err := f.helmOut("status", fleetRelease, "-n", fleetNamespace); err != nil {
		return // no release: uninstalled (or never installed)
	} else if !strings.Contains(out, "STATUS") {
		return
	}
	t.Logf("cleanup: the release is still there: helm uninstall")
	if out, err := f.helmOut("uninstall", fleetRelease, "-n", fleetNamespace, "--timeout", "8m"); err != nil {
		t.Errorf("cleanup: helm uninstall: %v\n%s", err, out)
		_, _ = f.helmOut("uninstall", fleetRelease, "-n", fleetNamespace, "--no-hooks")
	}
}

// installerLogs prints the tail of every installer and uninstall-hook
// container log on the node, and inplaced's journal.
func (f *fleet) installerLogs(t *testing.T) {
	logs, _ := filepath.Glob("/var/log/pods/" + fleetNamespace + "_inplaced-*/*/*.log")
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		t.Logf("---- %s (tail)\n%s", l, tailLines(string(b), 30))
	}
	out, _ := exec.Command("journalctl", "-b", "-u", "inplaced", "-u", f.node.unit, "--no-pager", "-n", "40").CombinedOutput()
	t.Logf("---- journal of inplaced and %s (tail)\n%s", f.node.unit, out)
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// pushLayout pushes the image index of the OCI layout dir (make image's)
// to ref.
func pushLayout(dir, ref string) error {
	p, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	m, err := p.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 {
		return fmt.Errorf("%s: %d entries in index.json, want 1", dir, len(m.Manifests))
	}
	idx, err := p.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		return err
	}
	return remote.WriteIndex(tag, idx)
}

var endpointRe = regexp.MustCompile(`(?m)^containerRuntimeEndpoint:\s*(\S+)\s*$`)

// kubeletEndpoint is the runtime endpoint in kubelet's configuration file.
func kubeletEndpoint(t *testing.T) string {
	t.Helper()
	m := endpointRe.FindStringSubmatch(readFile(t, kubeletConfig))
	if m == nil {
		return ""
	}
	return strings.Trim(m[1], `"'`)
}

// k3sKubeletEndpoint is the CRI endpoint k3s's agent started its kubelet
// with, from the agent's log line "Running kubelet ..." of the unit's
// current run (its invocation ID): what k3s made of its config.yaml and
// config.yaml.d, not what the files say.
func k3sKubeletEndpoint(t *testing.T) string {
	t.Helper()
	id := unitProps(t, "k3s-agent", "InvocationID")["InvocationID"]
	if id == "" {
		t.Fatal("k3s-agent has no invocation: it does not run")
	}
	out, err := exec.Command("journalctl", "-b", "_SYSTEMD_INVOCATION_ID="+id, "-o", "cat", "--no-pager").Output()
	if err != nil {
		t.Fatalf("k3s-agent's journal of invocation %s: %v", id, err)
	}
	var last string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Running kubelet") {
			last = l
		}
	}
	if m := k3sEndpointRe.FindStringSubmatch(last); m != nil {
		return m[1]
	}
	// k3s of Kubernetes 1.35 gives kubelet the endpoint in a configuration
	// drop-in of the directory it names: the last file's value wins.
	m := k3sConfigDirRe.FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("k3s-agent's journal of invocation %s: no kubelet started with --container-runtime-endpoint or --config-dir (%q)", id, last)
	}
	files, _ := filepath.Glob(filepath.Join(m[1], "*.conf"))
	var endpoint string
	for _, f := range files {
		if e := endpointRe.FindStringSubmatch(readFile(t, f)); e != nil {
			endpoint = strings.Trim(e[1], `"'`)
		}
	}
	if endpoint == "" {
		t.Fatalf("k3s-agent's kubelet configuration %s (%v): no containerRuntimeEndpoint", m[1], files)
	}
	return endpoint
}

var (
	k3sEndpointRe  = regexp.MustCompile(`--container-runtime-endpoint=(\S+)`)
	k3sConfigDirRe = regexp.MustCompile(`--config-dir=(\S+)`)
)

// mainPID is a unit's main pid (0 when it runs none).
func mainPID(t *testing.T, unit string) int {
	t.Helper()
	pid, _ := strconv.Atoi(unitProps(t, unit, "MainPID")["MainPID"])
	return pid
}

// nodeReadyCondition is the Node's Ready condition now.
func nodeReadyCondition(t *testing.T, cs kubernetes.Interface) (*corev1.Node, corev1.NodeCondition) {
	t.Helper()
	n, c, err := nodeReady(cs)
	if err != nil {
		t.Fatal(err)
	}
	return n, *c
}

// nodeStayedReady fails t unless the Node is Ready with the same
// transition time as before: it never left Ready in between.
func (f *fleet) nodeStayedReady(t *testing.T, before corev1.NodeCondition, step string) {
	t.Helper()
	_, now := nodeReadyCondition(t, f.cs)
	if now.Status != corev1.ConditionTrue || !now.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("%s: the Node's Ready condition is %s since %s, was %s since %s", step, now.Status,
			now.LastTransitionTime.Format(time.TimeOnly), before.Status, before.LastTransitionTime.Format(time.TimeOnly))
		return
	}
	t.Logf("fleet: %s: the Node stayed Ready (Ready=True since %s, before and after)", step, now.LastTransitionTime.Format(time.TimeOnly))
}

// readyWatch polls the Node's Ready condition every second and keeps each
// reading that is not True.
type readyWatch struct {
	stopCh chan struct{}
	done   chan struct{}
	bad    []string
}

func watchNodeReady(cs kubernetes.Interface) *readyWatch {
	w := &readyWatch{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			if _, c, err := nodeReady(cs); err != nil {
				w.bad = append(w.bad, time.Now().Format("15:04:05")+": "+err.Error())
			} else if c.Status != corev1.ConditionTrue {
				w.bad = append(w.bad, fmt.Sprintf("%s: Ready=%s %s", time.Now().Format("15:04:05"), c.Status, c.Reason))
			}
			select {
			case <-w.stopCh:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return w
}

func (w *readyWatch) stop() []string {
	close(w.stopCh)
	<-w.done
	return w.bad
}

// kubeletCallsInMetrics waits until inplaced's metrics count calls only
// kubelet makes (the suite's own client calls Version and ListContainers,
// the installer Version).
func (f *fleet) kubeletCallsInMetrics(t *testing.T) {
	t.Helper()
	methods := []string{"ListPodSandbox", "PodSandboxStatus", "Status", "ImageFsInfo"}
	seen := map[string]float64{}
	eventually(t, time.Minute, "kubelet's calls in inplaced's metrics", func() error {
		m, err := criRequests("http://" + fleetMetrics + "/metrics")
		if err != nil {
			return err
		}
		for _, k := range methods {
			seen[k] = m[k]
		}
		if seen["ListPodSandbox"] == 0 || seen["Status"] == 0 {
			return fmt.Errorf("inplaced_cri_requests_total %v", seen)
		}
		return nil
	})
	t.Logf("fleet: install: kubelet's calls in inplaced's metrics (inplaced_cri_requests_total, code OK): %v", seen)
}

var criRequestsRe = regexp.MustCompile(`^inplaced_cri_requests_total\{code="OK",method="([^"]+)"\} (\S+)$`)

// criRequests reads inplaced_cri_requests_total{code="OK"} by method.
func criRequests(url string) (map[string]float64, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if g := criRequestsRe.FindStringSubmatch(sc.Text()); g != nil {
			m[g[1]], _ = strconv.ParseFloat(g[2], 64)
		}
	}
	return m, sc.Err()
}

// holdTables lists inplaced's netfilter tables in the host's network
// namespace and in every pod's.
func holdTables(t *testing.T) []string {
	t.Helper()
	nss, _ := filepath.Glob("/var/run/netns/*")
	var left []string
	for _, ns := range append([]string{""}, nss...) {
		args := []string{"list", "tables"}
		cmd := exec.Command("nft", args...)
		if ns != "" {
			cmd = exec.Command("nsenter", append([]string{"--net=" + ns, "nft"}, args...)...)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("nft list tables in %q: %v: %s", ns, err, out)
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "inplaced") {
				left = append(left, fmt.Sprintf("netns %q: %s", ns, l))
			}
		}
	}
	t.Logf("fleet: netfilter tables checked in the host's and %d pod network namespaces", len(nss))
	return left
}

// poller asks a URL every interval, one request at a time on a new
// connection, each with 10 s (a TCG guest under the installer's load can
// be slow to answer; a refused, reset or unanswered request is a failure).
type poller struct {
	mu      sync.Mutex
	samples []sample
	stopCh  chan struct{}
	done    chan struct{}
}

type sample struct {
	start time.Time
	took  time.Duration
	err   string
}

func startPoller(url string, every time.Duration) *poller {
	p := &poller{stopCh: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		defer close(p.done)
		for {
			s := sample{start: time.Now()}
			resp, err := client.Get(url)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %s", resp.Status)
				}
			}
			s.took = time.Since(s.start)
			if err != nil {
				s.err = err.Error()
			}
			p.mu.Lock()
			p.samples = append(p.samples, s)
			p.mu.Unlock()
			select {
			case <-p.stopCh:
				return
			case <-time.After(time.Until(s.start.Add(every))):
			}
		}
	}()
	return p
}

func (p *poller) stop() []sample {
	select {
	case <-p.stopCh:
	default:
		close(p.stopCh)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]sample(nil), p.samples...)
}

func slowest(ss []sample) time.Duration {
	var m time.Duration
	for _, s := range ss {
		m = max(m, s.took)
	}
	return m
}
