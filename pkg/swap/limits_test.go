package swap

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// The runtime's OCI spec (containerd's verbose status) says 200m and 48 MiB
// where kubelet's recorded create says what fakecri.ContainerConfig gives:
// kubelet resized the container since, and lowered its pod (cgroup v1
// refuses a container quota above its pod's). The swap's new container and
// its rollback get the running limits; the rest of the create is kept.
const specAt200m = `{"pid":42,"runtimeSpec":{"linux":{"resources":{"cpu":{"shares":5,"quota":20000,"period":100000},"memory":{"limit":50331648}}}}}`

func TestRunningLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   *runtimeapi.ContainerStatusResponse // its Info and Status
		want *runtimeapi.LinuxContainerResources
	}{
		{"OCI spec", &runtimeapi.ContainerStatusResponse{Info: map[string]string{"info": specAt200m}},
			&runtimeapi.LinuxContainerResources{CpuShares: 5, CpuQuota: 20000, CpuPeriod: 100000, MemoryLimitInBytes: 48 << 20}},
		{"CRI status resources", &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Resources: &runtimeapi.ContainerResources{
			Linux: &runtimeapi.LinuxContainerResources{CpuQuota: 30000, CpuPeriod: 100000}}}},
			&runtimeapi.LinuxContainerResources{CpuQuota: 30000, CpuPeriod: 100000}},
		{"neither", &runtimeapi.ContainerStatusResponse{Info: map[string]string{"info": `{"pid":42}`}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runningLimits(criinfo.ContainerOf(tc.st.GetInfo()), tc.st.GetStatus())
			if (got == nil) != (tc.want == nil) || got.String() != tc.want.String() {
				t.Errorf("runningLimits = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSwapKeepsRunningLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		image     string
		wantState inplacedv1.SwapState
	}{
		{"committed", "registry.local/app:v2", inplacedv1.SwapState_SWAP_STATE_COMMITTED},
		{"rolled back", "registry.local/app:crash", inplacedv1.SwapState_SWAP_STATE_FAILED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			req := e.containerReq(0)
			req.Config.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
				CpuShares: 5, CpuQuota: 30000, CpuPeriod: 100000, MemoryLimitInBytes: 64 << 20, OomScoreAdj: 999}}
			oldID := e.create(t, req, true)
			e.be.SetInfo(oldID, specAt200m)
			e.be.ExitOnStart("registry.local/app:crash", 3)

			rec := e.swap(t, &inplacedv1.Change{Image: strp(tc.image)}, nil)
			if rec.State != tc.wantState {
				t.Fatalf("state %s (%s), want %s", rec.State, rec.Error, tc.wantState)
			}
			got, err := e.st.Container(rec.RunningContainerId)
			if err != nil {
				t.Fatalf("record of the running container %s: %v", rec.RunningContainerId, err)
			}
			r := got.GetConfig().GetLinux().GetResources()
			if r.GetCpuQuota() != 20000 || r.GetCpuPeriod() != 100000 || r.GetMemoryLimitInBytes() != 48<<20 || r.GetOomScoreAdj() != 999 {
				t.Errorf("running container's resources %v: want the running limits (quota 20000, 48 MiB) and the rest kept (oom_score_adj 999)", r)
			}
		})
	}
}
