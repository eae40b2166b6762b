package resources

import (
	"errors"
	"reflect"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestLimitsFromCRI(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *runtimeapi.LinuxContainerResources
		want Limits
	}{
		{"nil", nil, Limits{}},
		{"zero means not set", &runtimeapi.LinuxContainerResources{}, Limits{}},
		{
			"kubelet burstable 1.5 CPU / 256Mi",
			&runtimeapi.LinuxContainerResources{CpuQuota: 150000, CpuPeriod: 100000, CpuShares: 1536, MemoryLimitInBytes: 256 << 20},
			Limits{CPUQuota: ptr[int64](150000), CPUPeriod: ptr[uint64](100000), CPUShares: ptr[uint64](1536), MemoryLimit: ptr[int64](256 << 20)},
		},
		{
			"negative is unlimited",
			&runtimeapi.LinuxContainerResources{CpuQuota: -5, MemoryLimitInBytes: -1},
			Limits{CPUQuota: ptr(Unlimited), MemoryLimit: ptr(Unlimited)},
		},
		{
			"no CPU limit: kubelet sends quota 0, shares only",
			&runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 2},
			Limits{CPUPeriod: ptr[uint64](100000), CPUShares: ptr[uint64](2)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := LimitsFromCRI(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("LimitsFromCRI = %s, want %s", fmtLimits(got), fmtLimits(tc.want))
			}
		})
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limits
		ok   bool
	}{
		{"empty", Limits{}, true},
		{"unlimited", Limits{CPUQuota: ptr(Unlimited), MemoryLimit: ptr(Unlimited)}, true},
		{"min quota", Limits{CPUQuota: ptr[int64](1000)}, true},
		{"quota below 1ms", Limits{CPUQuota: ptr[int64](999)}, false},
		{"quota 0", Limits{CPUQuota: ptr[int64](0)}, false},
		{"quota -2", Limits{CPUQuota: ptr[int64](-2)}, false},
		{"period too small", Limits{CPUPeriod: ptr[uint64](999)}, false},
		{"period too large", Limits{CPUPeriod: ptr[uint64](1000001)}, false},
		{"shares 0", Limits{CPUShares: ptr[uint64](0)}, false},
		{"shares huge is clamped later", Limits{CPUShares: ptr[uint64](1 << 20)}, true},
		{"memory 0", Limits{MemoryLimit: ptr[int64](0)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidLimits) {
				t.Errorf("error %v is not ErrInvalidLimits", err)
			}
		})
	}
}

func TestSharesToWeight(t *testing.T) {
	for _, tc := range []struct{ shares, weight uint64 }{
		{0, 1}, // clamped to 2 like the kernel
		{2, 1},
		{512, 20},
		{1024, 39},
		{1536, 59},
		{262144, 10000},
		{1 << 20, 10000},
	} {
		if got := SharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("SharesToWeight(%d) = %d, want %d", tc.shares, got, tc.weight)
		}
	}
}

func TestWeightMatches(t *testing.T) {
	for _, tc := range []struct {
		weight, shares uint64
		want           bool
	}{
		{39, 1024, true},  // linear: kubelet pod cgroups, runc <= 1.3
		{100, 1024, true}, // quadratic: opencontainers/cgroups, cgroups/v3
		{50, 1024, false}, // neither: the runtime did not apply it
		{1, 2, true},      // both formulas agree at the ends
		{10000, 262144, true},
	} {
		if got := weightMatches(tc.weight, tc.shares); got != tc.want {
			t.Errorf("weightMatches(%d, %d) = %v, want %v", tc.weight, tc.shares, got, tc.want)
		}
	}
}
