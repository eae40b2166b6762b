package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// resizeMillis are the two CPU limits every variant alternates between, so
// that each operation changes something: 1000m and 1200m (quota 100000 and
// 120000 in the container's 100000 µs period).
var resizeMillis = [2]int64{1000, 1200}

// BenchmarkResize measures the latency of one in-place CPU limit change of a
// running container, per backend, three ways in the same run:
//
//   - inplaced: the control API's Resize through inplaced (what `inplacectl
//     resize` does, without the process start): resolve, runtime call,
//     cgroup read-back and verification, history record (a bbolt fsync);
//   - cri: CRI UpdateContainerResources directly on containerd (runc update);
//   - cgroup: writing the container's cpu.cfs_quota_us alone, the floor.
//
// Each sub-benchmark reports ns/op (b.ReportMetric) for its variant; the
// bench driver computes the ratios. Root and the harness' tools are needed
// (skipped without them, failed under CI=true).
func BenchmarkResize(b *testing.B) {
	harness.RequireRoot(b)
	backends := harness.BackendsFromEnv()
	harness.Require(b, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	reg := harness.StartRegistry(b)
	for _, be := range backends {
		b.Run(string(be), func(b *testing.B) {
			resizeBenchBackend(b, harness.StartContainerd(b, be, reg))
		})
	}
}

func resizeBenchBackend(b *testing.B, ctrd *harness.Containerd) {
	// inplaced as a node runs it: at info level (the harness starts it at
	// debug, which logs every call).
	px := harness.StartInplaced(b, ctrd.Endpoint)
	if err := px.Stop(); err != nil {
		b.Fatal(err)
	}
	px.ExtraArgs = []string{"--log-level", "info"}
	if err := px.Start(); err != nil {
		b.Fatalf("restart inplaced at info level: %v\n%s", err, px.LogTail(20))
	}
	direct := ctrd.CRI(b)
	id, cgQuota := resizeBenchPod(b, direct, ctrd.Images.Pause)

	conn, err := grpc.NewClient("unix://"+px.ControlSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ctl := inplacedv1.NewControlClient(conn)
	ctx := context.Background()

	criQuota := func(i int) *runtimeapi.UpdateContainerResourcesRequest {
		return &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id,
			Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: resizeMillis[i%2] * 100}}
	}
	variants := []struct {
		name string
		op   func(i int) error
	}{
		{"inplaced", func(i int) error {
			rec, err := ctl.Resize(ctx, &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: id},
				Resources: &inplacedv1.Resources{CpuLimitMillis: resizeMillis[i%2]}})
			if err == nil && rec.GetInEffect().GetCpuQuota() != resizeMillis[i%2]*100 {
				b.Fatalf("resize %d: in effect %v", i, rec.GetInEffect())
			}
			return err
		}},
		{"cri", func(i int) error {
			_, err := direct.Runtime.UpdateContainerResources(ctx, criQuota(i))
			return err
		}},
		{"cgroup", func(i int) error {
			return os.WriteFile(cgQuota, []byte(strconv.FormatInt(resizeMillis[i%2]*100, 10)), 0)
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			// Start from the other value, so that operation 0 changes it too.
			if _, err := direct.Runtime.UpdateContainerResources(ctx, criQuota(1)); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if err := v.op(i); err != nil {
					b.Fatalf("%s resize %d: %v", v.name, i, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/op")
			if got := resizeReadFile(b, cgQuota); got != strconv.FormatInt(resizeMillis[(b.N-1)%2]*100, 10) {
				b.Fatalf("after %d %s resizes cpu.cfs_quota_us is %s", b.N, v.name, got)
			}
		})
	}
}

// resizeBenchPod runs one pod (kubelet's labels, the pause image) with a
// 1 CPU / 128 MiB container and returns the container's ID and the path of
// its cpu.cfs_quota_us. The pod is removed at cleanup.
func resizeBenchPod(b *testing.B, cri *harness.CRIClient, image string) (id, quotaFile string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name = "bench-resize"
	labels := map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "uid-" + name}
	sb := harness.PodConfig(name, b.TempDir())
	sb.Labels = labels
	rs, err := cri.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sb})
	if err != nil {
		b.Fatalf("RunPodSandbox: %v", err)
	}
	b.Cleanup(func() {
		cc, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cri.Runtime.StopPodSandbox(cc, &runtimeapi.StopPodSandboxRequest{PodSandboxId: rs.PodSandboxId})
		_, _ = cri.Runtime.RemovePodSandbox(cc, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: rs.PodSandboxId})
	})
	if _, err := cri.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		b.Fatalf("PullImage: %v", err)
	}
	cfg := harness.ContainerConfig("app", image)
	cfg.Labels = map[string]string{"io.kubernetes.container.name": "app"}
	for k, v := range labels {
		cfg.Labels[k] = v
	}
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 100000, CpuShares: 1024, MemoryLimitInBytes: 128 << 20}
	cr, err := cri.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: rs.PodSandboxId, Config: cfg, SandboxConfig: sb})
	if err != nil {
		b.Fatalf("CreateContainer: %v", err)
	}
	if _, err := cri.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		b.Fatalf("StartContainer: %v", err)
	}
	st, err := cri.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: cr.ContainerId, Verbose: true})
	if err != nil {
		b.Fatalf("ContainerStatus: %v", err)
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.RuntimeSpec.Linux.CgroupsPath == "" {
		b.Fatalf("no cgroupsPath in the verbose status (%v)", err)
	}
	quotaFile = filepath.Join("/sys/fs/cgroup/cpu", info.RuntimeSpec.Linux.CgroupsPath, "cpu.cfs_quota_us")
	harness.Require(b, "cgroup v1 cpu controller", resizeFileExists(quotaFile), quotaFile+" not found: the cgroup variant needs cgroup v1")
	return cr.ContainerId, quotaFile
}

func resizeFileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func resizeReadFile(b *testing.B, p string) string {
	b.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}
