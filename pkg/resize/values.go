package resize

import (
	"fmt"
	"math"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const (
	// defaultPeriod is kubelet's CFS period (cpuCFSQuotaPeriod), used when
	// the container has none.
	defaultPeriod = 100000
	// minQuota is kubelet's floor for a CPU quota (minQuotaPeriod, µs).
	minQuota = 1000
)

// validate checks a control API request before anything is looked up.
func validate(r *inplacedv1.Resources) error {
	if r.GetCpuLimitMillis() < 0 || r.GetCpuRequestMillis() < 0 || r.GetMemoryLimitBytes() < 0 {
		return errkind.Errorf(errkind.Invalid, "negative resources (cpu limit %dm, cpu request %dm, memory %d bytes): give positive values",
			r.GetCpuLimitMillis(), r.GetCpuRequestMillis(), r.GetMemoryLimitBytes())
	}
	if r.GetCpuLimitMillis() == 0 && r.GetCpuRequestMillis() == 0 && r.GetMemoryLimitBytes() == 0 {
		return errkind.Errorf(errkind.Invalid, "nothing to resize: give a CPU limit, a CPU request or a memory limit")
	}
	// millis * period must fit in an int64 for the largest period (1 s).
	if r.GetCpuLimitMillis() > math.MaxInt64/1000000 {
		return errkind.Errorf(errkind.Invalid, "cpu limit %dm is out of range", r.GetCpuLimitMillis())
	}
	return nil
}

// criResources turns a control API request into what kubelet would send in
// UpdateContainerResources, in the container's own CFS period. Fields not
// asked for stay 0, which CRI reads as "leave as it is".
func criResources(r *inplacedv1.Resources, period uint64) *runtimeapi.LinuxContainerResources {
	if period == 0 {
		period = defaultPeriod
	}
	lr := &runtimeapi.LinuxContainerResources{}
	if m := r.GetCpuLimitMillis(); m > 0 {
		lr.CpuPeriod = int64(period)
		lr.CpuQuota = max(m*int64(period)/1000, minQuota)
	}
	if m := r.GetCpuRequestMillis(); m > 0 {
		lr.CpuShares = swap.MilliCPUToShares(m)
	}
	if b := r.GetMemoryLimitBytes(); b > 0 {
		lr.MemoryLimitInBytes = b
	}
	return lr
}

// limitsCRI is the CRI form of l, for asking the runtime to put values back:
// the values l sets, zero (CRI's "leave it") for the others.
func limitsCRI(l resources.Limits) *runtimeapi.LinuxContainerResources {
	v := targetValues(l, nil)
	return &runtimeapi.LinuxContainerResources{CpuQuota: v.CpuQuota, CpuPeriod: v.CpuPeriod, CpuShares: v.CpuShares, MemoryLimitInBytes: v.MemoryLimitBytes}
}

// before returns, for each value want sets, what the container has now: the
// cgroup's value, or on cgroup v2 (no cpu.shares file) the shares the runtime
// reports. A value that is not known stays nil.
func before(c resources.Cgroup, want resources.Limits, st *runtimeapi.ContainerStatus) resources.Limits {
	var l resources.Limits
	if want.CPUQuota != nil || want.CPUPeriod != nil {
		l.CPUQuota, l.CPUPeriod = ptr(c.CPUQuota), ptr(c.CPUPeriod)
	}
	if want.CPUShares != nil {
		switch s := st.GetResources().GetLinux().GetCpuShares(); {
		case c.CPUShares > 0:
			l.CPUShares = ptr(c.CPUShares)
		case s > 0:
			l.CPUShares = ptr(uint64(s))
		}
	}
	if want.MemoryLimit != nil {
		l.MemoryLimit = ptr(c.MemoryLimit)
	}
	return l
}

// podPrev is the prev of the control API's pod rule (package resources:
// the pod moves by want - prev). A container counts in its pod for no less
// than what kubelet creates it with (declared): kubelet does not know of
// the control API's resize and creates the container again — a restart, a
// swap's new container — with its own limits, which cgroup v1 refuses above
// the pod's CPU quota (EINVAL: the container could not start again; found by
// the soak on a v1 node), and a memory limit above the pod's would be
// capped below what kubelet set. So the pod moves by
// max(want, declared) - max(old, declared): a lowering under the declared
// limit leaves the pod, a raise above it moves the pod by what is above it,
// and lowering back returns it to where it was. Without the declared limits
// (a container inplaced did not see created, or no limit) a raise moves the
// pod exactly and a lowering leaves it. The CPU request (shares) has no
// such bound and moves exactly.
func podPrev(old, want, declared resources.Limits, known bool) resources.Limits {
	out := old
	if want.MemoryLimit != nil && old.MemoryLimit != nil {
		d, ok := declaredMemory(declared, known)
		if v, changed := prevLimit(*want.MemoryLimit, *old.MemoryLimit, d, ok); changed {
			out.MemoryLimit = &v
		}
	}
	if (want.CPUQuota != nil || want.CPUPeriod != nil) && old.CPUQuota != nil && old.CPUPeriod != nil {
		// In want's period: the kernel compares rates.
		p := deref(want.CPUPeriod, *old.CPUPeriod)
		w, o := deref(want.CPUQuota, *old.CPUQuota), inPeriod(*old.CPUQuota, *old.CPUPeriod, p)
		d, ok := declaredQuota(declared, known, p)
		if v, changed := prevLimit(w, o, d, ok); changed {
			out.CPUQuota, out.CPUPeriod = &v, &p
		}
	}
	return out
}

// prevLimit is podPrev for one limit, want w over old o (the pod moves by
// w - prev): with the declared limit d (hasDeclared) and neither w nor o
// unlimited, the prev that moves the pod by max(w, d) - max(o, d); else,
// for a lowering, w itself (the pod stays). changed is false when prev is
// o (a raise without d: the pod moves exactly).
func prevLimit(w, o, d int64, hasDeclared bool) (prev int64, changed bool) {
	switch {
	case hasDeclared && w != resources.Unlimited && o != resources.Unlimited:
		return w + max(o, d) - max(w, d), true
	case below(w, o):
		return w, true
	}
	return 0, false
}

// declaredMemory is the container's declared memory limit, when known and
// set.
func declaredMemory(declared resources.Limits, known bool) (int64, bool) {
	if d := declared.MemoryLimit; known && d != nil && *d > 0 {
		return *d, true
	}
	return 0, false
}

// declaredQuota is the container's declared CPU quota in period p, when
// known and set.
func declaredQuota(declared resources.Limits, known bool, p uint64) (int64, bool) {
	dq, dp := declared.CPUQuota, declared.CPUPeriod
	if known && dq != nil && *dq > 0 && dp != nil && *dp > 0 {
		return inPeriod(*dq, *dp, p), true
	}
	return 0, false
}

// inPeriod is quota per period as a quota per p (rounded up).
func inPeriod(quota int64, period, p uint64) int64 {
	if quota == resources.Unlimited || period == p || period == 0 {
		return quota
	}
	return int64(math.Ceil(float64(quota) * float64(p) / float64(period)))
}

// below says whether limit a is below limit b (Unlimited is above all).
func below(a, b int64) bool {
	switch {
	case a == b || a == resources.Unlimited:
		return false
	case b == resources.Unlimited:
		return true
	}
	return a < b
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// cgroupValues reports a container cgroup's values. On cgroup v2 the shares
// are derived back from cpu.weight with kubelet's linear formula.
func cgroupValues(c resources.Cgroup) *inplacedv1.ResizeValues {
	shares := int64(c.CPUShares)
	if shares == 0 && c.CPUWeight > 0 {
		shares = int64(2 + (c.CPUWeight-1)*262142/9999)
	}
	return &inplacedv1.ResizeValues{CpuQuota: c.CPUQuota, CpuPeriod: int64(c.CPUPeriod), CpuShares: shares, MemoryLimitBytes: c.MemoryLimit}
}

// targetValues is what the container should have after the resize: the
// request, and for what it does not set, the values of from.
func targetValues(want resources.Limits, from *inplacedv1.ResizeValues) *inplacedv1.ResizeValues {
	v := &inplacedv1.ResizeValues{}
	if from != nil {
		*v = inplacedv1.ResizeValues{CpuQuota: from.CpuQuota, CpuPeriod: from.CpuPeriod, CpuShares: from.CpuShares, MemoryLimitBytes: from.MemoryLimitBytes}
	}
	if want.CPUQuota != nil {
		v.CpuQuota = *want.CPUQuota
	}
	if want.CPUPeriod != nil {
		v.CpuPeriod = int64(*want.CPUPeriod)
	}
	if want.CPUShares != nil {
		v.CpuShares = int64(*want.CPUShares)
	}
	if want.MemoryLimit != nil {
		v.MemoryLimitBytes = *want.MemoryLimit
	}
	return v
}

// criValues reports what the runtime says a container has (backend method).
func criValues(lr *runtimeapi.LinuxContainerResources) *inplacedv1.ResizeValues {
	if lr == nil {
		return nil
	}
	return &inplacedv1.ResizeValues{CpuQuota: lr.CpuQuota, CpuPeriod: lr.CpuPeriod, CpuShares: lr.CpuShares, MemoryLimitBytes: lr.MemoryLimitInBytes}
}

// criMatches reports whether the runtime's record has every value of want.
func criMatches(lr *runtimeapi.LinuxContainerResources, want resources.Limits) bool {
	if lr == nil {
		return false
	}
	got := resources.LimitsFromCRI(lr)
	eq := func(a, b *int64) bool { return a == nil || (b != nil && *a == *b) }
	equ := func(a, b *uint64) bool { return a == nil || (b != nil && *a == *b) }
	return eq(want.CPUQuota, got.CPUQuota) && equ(want.CPUPeriod, got.CPUPeriod) &&
		equ(want.CPUShares, got.CPUShares) && eq(want.MemoryLimit, got.MemoryLimit)
}

// describe spells values for messages: "cpu quota 150000/100000 µs, cpu
// shares 1024, memory 536870912 bytes".
func describe(v *inplacedv1.ResizeValues) string {
	if v == nil {
		return "unknown"
	}
	var b strings.Builder
	if v.CpuQuota < 0 {
		fmt.Fprintf(&b, "cpu quota unlimited (period %d µs)", v.CpuPeriod)
	} else {
		fmt.Fprintf(&b, "cpu quota %d/%d µs", v.CpuQuota, v.CpuPeriod)
	}
	fmt.Fprintf(&b, ", cpu shares %d", v.CpuShares)
	if v.MemoryLimitBytes < 0 {
		b.WriteString(", memory unlimited")
	} else {
		fmt.Fprintf(&b, ", memory %d bytes", v.MemoryLimitBytes)
	}
	return b.String()
}

func ptr[T any](v T) *T { return &v }
