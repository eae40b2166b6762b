// Package bench measures inplaced against the direct path on a real
// containerd (each backend of harness.BackendsFromEnv), in the same run, and
// reports ratios: `make bench` (hack/bench.sh) turns the results into
// docs/benchmarks.md.
//
//   - BenchmarkCRI (cri_bench_test.go): per-call latency of read calls,
//     directly on containerd's socket and through inplaced, in alternating
//     batches, at 1 and 16 concurrent callers, with 100 containers on the
//     node; then inplaced's RSS.
//   - BenchmarkReplace (replace_bench_test.go): a swap's downtime against a
//     kubelet-style replacement and a pod recreation.
//   - BenchmarkRelay (relay_bench_test.go): the relay in process, for
//     profiles (-cpuprofile) of what the proxy costs.
//   - the resize benchmark (resize_bench_test.go) is reported from the
//     `go test -bench` output.
//
// Helpers here are prefixed or specific on purpose: other files of the
// package are written by others.
package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// benchBackends starts one registry and runs fn as a sub-benchmark per
// backend, each with its own containerd.
func benchBackends(b *testing.B, fn func(b *testing.B, c *harness.Containerd)) {
	harness.RequireRoot(b)
	backends := harness.BackendsFromEnv()
	harness.Require(b, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	reg := harness.StartRegistry(b)
	benchLinks = nil
	for _, l := range replaceLinks {
		benchLinks = append(benchLinks, benchLink{name: l.name, addr: reg.StartLink(b, l.bitsPerSec)})
	}
	for _, be := range backends {
		b.Run(string(be), func(b *testing.B) {
			c := harness.StartContainerd(b, be, reg)
			recordBackend(b, c)
			fn(b, c)
		})
	}
}

// benchLink is a registry link (harness.Registry.StartLink) of this run.
type benchLink struct{ name, addr string }

// benchLinks are the links benchBackends started, for the benchmarks that
// pull over them; the backends' containerd pull from them like from the
// registry itself.
var benchLinks []benchLink

// startBenchProxy starts inplaced in front of endpoint as a node runs it:
// the harness starts it at debug level, which logs every RPC and decodes
// the IDs in it, so it is restarted at info level. minRuntime is its health
// gate default (--health-min-runtime); env is added to its environment.
func startBenchProxy(b *testing.B, endpoint string, minRuntime time.Duration, env ...string) *harness.Inplaced {
	b.Helper()
	return startBenchProxyBinary(b, "", endpoint, minRuntime, env...)
}

// startBenchProxyBinary is startBenchProxy with the inplaced binary bin
// ("" for the one under test).
func startBenchProxyBinary(b *testing.B, bin, endpoint string, minRuntime time.Duration, env ...string) *harness.Inplaced {
	b.Helper()
	px := harness.StartInplacedBinary(b, bin, endpoint, env...)
	if err := px.Stop(); err != nil {
		b.Fatal(err)
	}
	px.ExtraArgs = []string{"--log-level", benchLogLevel(), "--health-min-runtime", minRuntime.String()}
	if err := px.Start(env...); err != nil {
		b.Fatalf("restart inplaced at info level: %v\n%s", err, px.LogTail(20))
	}
	return px
}

// recordBackend writes the backend's version into the results.
func recordBackend(b *testing.B, c *harness.Containerd) {
	b.Helper()
	cri := c.CRI(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cri.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		b.Fatalf("Version: %v", err)
	}
	b.Logf("%s: %s %s", c.Backend, v.RuntimeName, v.RuntimeVersion)
	mustAppend(b, report.Record{Backend: &report.Backend{Backend: string(c.Backend),
		Binary: harness.ContainerdBinary(c.Backend), RuntimeName: v.RuntimeName, RuntimeVersion: v.RuntimeVersion}})
}

func mustAppend(b *testing.B, rec report.Record) {
	b.Helper()
	if err := report.Append(rec); err != nil {
		b.Fatalf("write results: %v", err)
	}
}

// kubePod is a pod made the way kubelet makes one (kubelet's labels and
// annotations on the sandbox and its containers), as in test/e2e.
type kubePod struct {
	name, ns, uid string
	sandboxID     string
	containerIDs  []string
	sandboxConfig *runtimeapi.PodSandboxConfig
	hostDir       string
	handler       string // CRI runtime handler; "" is containerd's default (runc)
}

// newKubePodConfig is the sandbox config of pod name at attempt.
func newKubePodConfig(b *testing.B, name string) *kubePod {
	b.Helper()
	p := &kubePod{name: name, ns: "default", uid: "uid-" + name, hostDir: b.TempDir()}
	p.sandboxConfig = harness.PodConfig(name, b.TempDir())
	p.sandboxConfig.Labels = map[string]string{
		"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.pod.uid": p.uid, "app": name,
	}
	p.sandboxConfig.Annotations = map[string]string{
		"kubernetes.io/config.seen": "2026-01-01T00:00:00.000000000Z", "kubernetes.io/config.source": "api",
	}
	return p
}

// kubeContainerConfig is the config kubelet sends for container ctr of p
// running image at attempt; command replaces the image's entrypoint when set.
func (p *kubePod) kubeContainerConfig(ctr, image string, attempt int, command ...string) *runtimeapi.ContainerConfig {
	cfg := harness.ContainerConfig(ctr, image)
	cfg.Image.UserSpecifiedImage = image
	cfg.Command = command
	cfg.Metadata.Attempt = uint32(attempt)
	cfg.LogPath = fmt.Sprintf("%s/%d.log", ctr, attempt)
	cfg.Labels = map[string]string{
		"io.kubernetes.pod.name": p.name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.pod.uid": p.uid,
		"io.kubernetes.container.name": ctr,
	}
	cfg.Annotations = map[string]string{
		"io.kubernetes.container.hash":                     "1a2b3c4d",
		"io.kubernetes.container.restartCount":             strconv.Itoa(attempt),
		"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
		"io.kubernetes.container.terminationMessagePolicy": "File",
		"io.kubernetes.pod.terminationGracePeriod":         "5",
	}
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: p.hostDir, ContainerPath: "/data"}}
	return cfg
}

// run starts the sandbox of p through cri.
func (p *kubePod) run(ctx context.Context, cri *harness.CRIClient) error {
	rs, err := cri.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: p.sandboxConfig, RuntimeHandler: p.handler})
	if err != nil {
		return fmt.Errorf("RunPodSandbox %s: %w", p.name, err)
	}
	p.sandboxID = rs.PodSandboxId
	return nil
}

// start creates and starts a container from cfg in p's sandbox.
func (p *kubePod) start(ctx context.Context, cri *harness.CRIClient, cfg *runtimeapi.ContainerConfig) (string, error) {
	cr, err := cri.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: cfg, SandboxConfig: p.sandboxConfig})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s/%s: %w", p.name, cfg.Metadata.Name, err)
	}
	if _, err := cri.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		return "", fmt.Errorf("StartContainer %s/%s: %w", p.name, cfg.Metadata.Name, err)
	}
	p.containerIDs = append(p.containerIDs, cr.ContainerId)
	return cr.ContainerId, nil
}

// remove stops and removes p's sandbox (and so its containers) through cri.
func (p *kubePod) remove(cri *harness.CRIClient) error {
	if p.sandboxID == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cri.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", p.name, err)
	}
	if _, err := cri.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", p.name, err)
	}
	p.sandboxID = ""
	return nil
}

// vmStatus reads VmRSS and VmHWM (KiB) of pid.
func vmStatus(pid int) (rss, hwm int64, err error) {
	st, err := loadStatus(pid)
	if err != nil {
		return 0, 0, err
	}
	return st["VmRSS"], st["VmHWM"], nil
}

// relayPhase labels in-process relay results ($INPLACED_BENCH_PHASE), e.g.
// "before" and "after" a relay change.
func relayPhase() string { return os.Getenv("INPLACED_BENCH_PHASE") }

// benchLogLevel is the log level of the inplaced daemons the benchmarks
// start: info, or $INPLACED_BENCH_LOG_LEVEL (debug says why a connection
// ended; each log is kept under $INPLACED_ARTIFACTS when a benchmark fails).
func benchLogLevel() string {
	if l := os.Getenv("INPLACED_BENCH_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
