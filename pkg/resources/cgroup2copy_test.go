package resources

import (
	"fmt"
	"math"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// The package copies two small functions of
// github.com/containerd/cgroups/v3/cgroup2 instead of importing it (the
// import would link cilium/ebpf into inplaced; see newCPUMax). These tests
// keep the copies equal to the library's. Importing cgroup2 here is fine:
// test imports do not reach the binary.

func TestSharesToWeightQuadraticMatchesLibrary(t *testing.T) {
	check := func(s uint64) {
		t.Helper()
		if got, want := sharesToWeightQuadratic(s), cgroup2.ConvertCPUSharesToCgroupV2Value(s); got != want {
			t.Errorf("sharesToWeightQuadratic(%d) = %d, library gives %d", s, got, want)
		}
	}
	for s := uint64(0); s <= maxShares+10; s++ {
		check(s)
	}
	for _, s := range []uint64{
		1 << 20, 1 << 32, math.MaxInt32, math.MaxUint32,
		math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64 - 1, math.MaxUint64,
	} {
		check(s)
	}
	// The points the quadratic is fitted to.
	for s, w := range map[uint64]uint64{0: 0, 1: 1, 2: 1, 1024: 100, 262144: 10000} {
		if got := sharesToWeightQuadratic(s); got != w {
			t.Errorf("sharesToWeightQuadratic(%d) = %d, want %d", s, got, w)
		}
	}
}

func TestNewCPUMaxMatchesLibrary(t *testing.T) {
	quotas := []*int64{
		nil, // unlimited: "max"
		ptr(int64(0)), ptr(int64(1)), ptr(int64(minQuota)), ptr(int64(50000)),
		ptr(int64(100000)), ptr(int64(150000)), ptr(int64(1000000)),
		ptr(Unlimited), ptr(int64(-2)), ptr(int64(math.MaxInt64)), ptr(int64(math.MinInt64)),
	}
	periods := []*uint64{
		nil, // the library's (and kernel's) default, 100000
		ptr(uint64(0)), ptr(uint64(1)), ptr(uint64(minPeriod)), ptr(uint64(100000)),
		ptr(uint64(maxPeriod)), ptr(uint64(math.MaxInt64)), ptr(uint64(math.MaxUint64)),
	}
	for _, q := range quotas {
		for _, p := range periods {
			if got, want := newCPUMax(q, p), string(cgroup2.NewCPUMax(q, p)); got != want {
				t.Errorf("newCPUMax(%s, %s) = %q, library gives %q", fmtPtr(q), fmtPtr(p), got, want)
			}
		}
	}
	// formatCPUMax: Unlimited is spelled "max", as the library spells a nil quota.
	for _, tc := range []struct {
		quota  int64
		period uint64
	}{
		{Unlimited, 100000}, {50000, 100000}, {minQuota, minPeriod}, {200000, maxPeriod},
	} {
		var q *int64
		if tc.quota != Unlimited {
			q = &tc.quota
		}
		if got, want := formatCPUMax(tc.quota, tc.period), string(cgroup2.NewCPUMax(q, &tc.period)); got != want {
			t.Errorf("formatCPUMax(%d, %d) = %q, library gives %q", tc.quota, tc.period, got, want)
		}
	}
}

func fmtPtr[T int64 | uint64](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}
