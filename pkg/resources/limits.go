package resources

import (
	"fmt"
	"math"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Unlimited is the value of CPUQuota or MemoryLimit that removes the limit
// (v1 writes -1, v2 writes "max").
const Unlimited int64 = -1

// Kernel bounds (kernel/sched/core.c, and what runc and kubelet use).
const (
	minQuota  = 1000    // µs: cpu.cfs_quota_us / cpu.max quota floor
	minPeriod = 1000    // µs
	maxPeriod = 1000000 // µs
	minShares = 2
	maxShares = 262144
	minWeight = 1
	maxWeight = 10000
)

// Limits is the target of a resize, in CRI/OCI units. A nil field means
// "leave it as it is", for the container and for the pod.
type Limits struct {
	CPUQuota    *int64  // µs of CPU time per period; Unlimited removes the limit
	CPUPeriod   *uint64 // µs
	CPUShares   *uint64 // v1 cpu.shares; on v2 written as cpu.weight (see SharesToWeight)
	MemoryLimit *int64  // bytes; Unlimited removes the limit
}

// LimitsFromCRI converts what kubelet sends in UpdateContainerResources. In
// CRI a zero means "not set" and the runtime leaves that value alone, so the
// result has nil there too; a negative quota or memory limit is Unlimited.
// cpuset, hugepages, swap and unified entries are not handled by this package.
func LimitsFromCRI(r *runtimeapi.LinuxContainerResources) Limits {
	var l Limits
	if r == nil {
		return l
	}
	if q := r.GetCpuQuota(); q != 0 {
		l.CPUQuota = ptr(max(q, Unlimited))
	}
	if p := r.GetCpuPeriod(); p > 0 {
		l.CPUPeriod = ptr(uint64(p))
	}
	if s := r.GetCpuShares(); s > 0 {
		l.CPUShares = ptr(uint64(s))
	}
	if m := r.GetMemoryLimitInBytes(); m != 0 {
		l.MemoryLimit = ptr(max(m, Unlimited))
	}
	return l
}

// Validate rejects values the kernel would refuse, before anything is written.
func (l Limits) Validate() error {
	if q := l.CPUQuota; q != nil && *q != Unlimited && *q < minQuota {
		return fmt.Errorf("%w: cpu quota %d µs (want %d for unlimited or >= %d)", ErrInvalidLimits, *q, Unlimited, minQuota)
	}
	if p := l.CPUPeriod; p != nil && (*p < minPeriod || *p > maxPeriod) {
		return fmt.Errorf("%w: cpu period %d µs (want %d..%d)", ErrInvalidLimits, *p, minPeriod, maxPeriod)
	}
	if s := l.CPUShares; s != nil && *s == 0 {
		return fmt.Errorf("%w: cpu shares 0 (use nil to leave shares unchanged)", ErrInvalidLimits)
	}
	if m := l.MemoryLimit; m != nil && *m != Unlimited && *m <= 0 {
		return fmt.Errorf("%w: memory limit %d bytes (want %d for unlimited or > 0)", ErrInvalidLimits, *m, Unlimited)
	}
	return nil
}

// clampShares does what the v1 kernel does with an out-of-range cpu.shares, so
// that the value we expect to read back is the value the kernel keeps.
func clampShares(s uint64) uint64 { return min(max(s, minShares), maxShares) }

// SharesToWeight converts v1 cpu.shares to v2 cpu.weight with the linear
// formula kubelet uses for pod cgroups and runc used for containers until it
// moved to opencontainers/cgroups: 1 + ((shares-2)*9999)/262142.
func SharesToWeight(shares uint64) uint64 {
	s := clampShares(shares)
	return 1 + ((s-minShares)*(maxWeight-minWeight))/(maxShares-minShares)
}

// weightMatches reports whether a container's cpu.weight already stands for
// shares. Newer runtimes (runc with opencontainers/cgroups >= v0.0.5, and the
// containerd cgroups library) use a quadratic mapping instead of the linear
// one; a weight the runtime wrote with either is what it was asked for, and
// "repairing" it into the other formula would only fight the runtime.
func weightMatches(weight, shares uint64) bool {
	s := clampShares(shares)
	return weight == SharesToWeight(s) || weight == sharesToWeightQuadratic(s)
}

// sharesToWeightQuadratic is
// github.com/containerd/cgroups/v3/cgroup2.ConvertCPUSharesToCgroupV2Value
// (itself taken from opencontainers/cgroups v0.0.5): 0 stays 0 ("unset"),
// shares <= 2 give weight 1, shares >= 262144 give 10000, and in between the
// quadratic in log2(shares) that maps 2, 1024 and 262144 to 1, 100 and 10000.
//
// It is copied rather than called because importing package cgroup2 links
// its Manager, and with it github.com/cilium/ebpf (13 packages), into
// inplaced: without that import the binary is 1.5 MB smaller and its
// resident memory right after start ("inplaced version") 0.2 to 0.8 MB
// lower, depending on the commit and on cgo: a node pays for every MB. A test
// (TestSharesToWeightQuadraticMatchesLibrary) keeps it equal to the
// library's for every shares value.
func sharesToWeightQuadratic(shares uint64) uint64 {
	switch {
	case shares == 0:
		return 0
	case shares <= minShares:
		return minWeight
	case shares >= maxShares:
		return maxWeight
	}
	l := math.Log2(float64(shares))
	exponent := (l*l+125*l)/612.0 - 7.0/34.0
	return uint64(math.Ceil(math.Pow(10, exponent)))
}

func clampWeight(w int64) uint64 { return uint64(min(max(w, minWeight), maxWeight)) }

func ptr[T any](v T) *T { return &v }
