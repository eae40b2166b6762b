package resources

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
)

// Write is one cgroup file write, planned or done.
type Write struct {
	Level  Level
	Cgroup string // relative to the hierarchy root
	// Unit is the systemd unit owning Cgroup with the systemd driver (its
	// properties are set along with the file, see Systemd), else empty.
	Unit string
	File string // e.g. "cpu.cfs_quota_us"
	Path string // absolute path of the file
	From string // content before the write (Apply: read just before writing)
	To   string // content written

	// podRaise: a pod value that goes up, written before the container's.
	podRaise bool
}

func (w Write) String() string {
	return fmt.Sprintf("%s %s: %s -> %s", w.Level, w.Path, w.From, w.To)
}

// Plan returns the ordered writes that bring cur to want, without touching
// anything. prev, when known, is what the container's limits were before the
// runtime's update; it makes the pod's adjustment exact (see the package
// documentation for the pod rule). Plan refuses with a *UsageError
// (ErrBelowUsage) a memory lowering at or below usage, and with
// ErrInvalidLimits values the kernel would reject.
//
// Order: memory, then CPU limit, then CPU request, as kubelet does. Within
// each, a pod value that goes up is written before the container and one that
// goes down after it, so the container never sits above its pod.
func (m *Manager) Plan(cur Current, want Limits, prev *Limits) ([]Write, error) {
	if err := want.Validate(); err != nil {
		return nil, err
	}
	var base Limits
	if prev != nil {
		if err := prev.Validate(); err != nil {
			return nil, fmt.Errorf("previous limits: %w", err)
		}
		base = *prev
	}
	plan, err := m.planMemory(cur, want, base)
	if err != nil {
		return nil, err
	}
	plan = append(plan, m.planCPULimit(cur, want, base)...)
	plan = append(plan, m.planCPURequest(cur, want, base)...)
	return plan, nil
}

func (m *Manager) planMemory(cur Current, want, base Limits) ([]Write, error) {
	if want.MemoryLimit == nil {
		return nil, nil
	}
	limit := *want.MemoryLimit
	c, p := cur.Container, cur.Pod
	var ctr []Write
	if m.pageRound(c.MemoryLimit) != m.pageRound(limit) {
		if err := m.checkUsage(LevelContainer, c, limit); err != nil {
			return nil, err
		}
		ctr = m.memWrites(LevelContainer, c, limit)
	}
	target := podLimit(p.MemoryLimit, deref(base.MemoryLimit, c.MemoryLimit), limit)
	if m.pageRound(target) == m.pageRound(p.MemoryLimit) {
		return ctr, nil
	}
	if err := m.checkUsage(LevelPod, p, target); err != nil {
		return nil, err
	}
	return ordered(lessLimit(p.MemoryLimit, target), m.memWrites(LevelPod, p, target), ctr), nil
}

// checkUsage refuses to lower a memory limit to or below usage, as kubelet
// does: the kernel would reclaim, then OOM-kill or fail with EBUSY.
func (m *Manager) checkUsage(level Level, c Cgroup, limit int64) error {
	if limit == Unlimited || !lessLimit(limit, c.MemoryLimit) || uint64(m.pageRound(limit)) > c.MemoryUsage {
		return nil
	}
	return &UsageError{Level: level, Cgroup: c.Path, Usage: c.MemoryUsage, Requested: limit}
}

// memWrites sets one cgroup's memory limit. On v1 with swap accounting the
// kernel refuses memory.limit_in_bytes above memory.memsw.limit_in_bytes;
// containerd sets the two equal (no swap), so they move together: memsw
// first on a raise, last on a lowering. A memsw that allows some swap is
// left alone unless it would end up below the new limit.
func (m *Manager) memWrites(level Level, c Cgroup, limit int64) []Write {
	if m.v2 {
		return []Write{m.newWrite(level, c, fileMemMax, m.formatMemLimit(c.MemoryLimit), m.formatMemLimit(limit))}
	}
	lim := m.newWrite(level, c, fileMemLimit, m.formatMemLimit(c.MemoryLimit), m.formatMemLimit(limit))
	sw := c.MemorySwapLimit
	if sw == nil || *sw == Unlimited {
		return []Write{lim}
	}
	if m.pageRound(*sw) != m.pageRound(c.MemoryLimit) && !lessLimit(*sw, limit) {
		return []Write{lim}
	}
	swW := m.newWrite(level, c, fileMemswLimit, m.formatMemLimit(*sw), m.formatMemLimit(limit))
	if lessLimit(c.MemoryLimit, limit) {
		return []Write{swW, lim}
	}
	return []Write{lim, swW}
}

func (m *Manager) planCPULimit(cur Current, want, base Limits) []Write {
	if want.CPUQuota == nil && want.CPUPeriod == nil {
		return nil
	}
	c, p := cur.Container, cur.Pod
	quota, period := deref(want.CPUQuota, c.CPUQuota), deref(want.CPUPeriod, c.CPUPeriod)
	ctr := m.quotaWrites(LevelContainer, c, quota, period)

	// The kernel compares rates (quota/period), so the pod rule works in
	// quota per the pod's own period, which this package never changes.
	wantRate := rate(quota, period, p.CPUPeriod)
	fromRate := rate(deref(base.CPUQuota, c.CPUQuota), deref(base.CPUPeriod, c.CPUPeriod), p.CPUPeriod)
	target := podLimit(p.CPUQuota, fromRate, wantRate)
	if target != Unlimited {
		target = max(target, minQuota)
	}
	if target == p.CPUQuota {
		return ctr
	}
	return ordered(lessLimit(p.CPUQuota, target), m.quotaWrites(LevelPod, p, target, p.CPUPeriod), ctr)
}

// quotaWrites sets one cgroup's CPU quota and period: one write of cpu.max on
// v2, up to two files on v1. On v1 the kernel checks quota/period against
// the parent after each file, so the period goes first when it grows and
// last when it shrinks; either way the rate in between stays at or below
// the larger of the old and new rates, which the pod allows at that point.
func (m *Manager) quotaWrites(level Level, c Cgroup, quota int64, period uint64) []Write {
	if m.v2 {
		if quota == c.CPUQuota && period == c.CPUPeriod {
			return nil
		}
		return []Write{m.newWrite(level, c, fileCPUMax, formatCPUMax(c.CPUQuota, c.CPUPeriod), formatCPUMax(quota, period))}
	}
	var ws []Write
	if quota != c.CPUQuota {
		ws = append(ws, m.newWrite(level, c, fileQuota, strconv.FormatInt(c.CPUQuota, 10), strconv.FormatInt(quota, 10)))
	}
	if period != c.CPUPeriod {
		pw := m.newWrite(level, c, filePeriod, strconv.FormatUint(c.CPUPeriod, 10), strconv.FormatUint(period, 10))
		if period > c.CPUPeriod {
			ws = append([]Write{pw}, ws...)
		} else {
			ws = append(ws, pw)
		}
	}
	return ws
}

// planCPURequest sets the CPU request: cpu.shares on v1, cpu.weight on v2.
// The pod moves by the container's change, like its limits, but without a
// floor: shares are relative, a pod below its container is legal.
func (m *Manager) planCPURequest(cur Current, want, base Limits) []Write {
	if want.CPUShares == nil {
		return nil
	}
	shares := clampShares(*want.CPUShares)
	c, p := cur.Container, cur.Pod
	var ctr, pod []Write
	if !m.v2 {
		if c.CPUShares != shares {
			ctr = []Write{m.newWrite(LevelContainer, c, fileShares, strconv.FormatUint(c.CPUShares, 10), strconv.FormatUint(shares, 10))}
		}
		from := c.CPUShares
		if base.CPUShares != nil {
			from = clampShares(*base.CPUShares)
		}
		target := clampShares(uint64(max(int64(p.CPUShares)+int64(shares)-int64(from), 0)))
		if target == p.CPUShares {
			return ctr
		}
		pod = []Write{m.newWrite(LevelPod, p, fileShares, strconv.FormatUint(p.CPUShares, 10), strconv.FormatUint(target, 10))}
		return ordered(target > p.CPUShares, pod, ctr)
	}
	after := c.CPUWeight
	if !weightMatches(c.CPUWeight, shares) {
		after = SharesToWeight(shares)
		ctr = []Write{m.newWrite(LevelContainer, c, fileWeight, strconv.FormatUint(c.CPUWeight, 10), strconv.FormatUint(after, 10))}
	}
	// kubelet writes the pod's weight with the linear formula from the sum
	// of shares; with prev the delta is taken in that formula. Without it,
	// the pod moves as much as the container's weight file moves.
	delta := int64(after) - int64(c.CPUWeight)
	if base.CPUShares != nil {
		delta = int64(SharesToWeight(shares)) - int64(SharesToWeight(*base.CPUShares))
	}
	target := clampWeight(int64(p.CPUWeight) + delta)
	if target == p.CPUWeight {
		return ctr
	}
	pod = []Write{m.newWrite(LevelPod, p, fileWeight, strconv.FormatUint(p.CPUWeight, 10), strconv.FormatUint(target, 10))}
	return ordered(target > p.CPUWeight, pod, ctr)
}

// podLimit is the pod rule for one limit (memory bytes, or CPU quota in the
// pod's period), Unlimited meaning +∞:
//
//	pod unlimited               → stays unlimited (nothing to make room in)
//	container becomes unlimited → pod unlimited (a sum with ∞ in it is ∞)
//	container was unlimited     → pod unchanged (the other terms of the sum
//	                              are unknown), but see the floor
//	otherwise                   → pod + (want - from)
//
// and never below the container's new limit: a pod under its container makes
// the container's memory limit meaningless and is refused by the v1 kernel
// for CPU.
func podLimit(pod, from, want int64) int64 {
	switch {
	case pod == Unlimited:
		return Unlimited
	case want == Unlimited:
		return Unlimited
	case from == Unlimited:
		return max(pod, want)
	}
	delta := want - from
	if delta > 0 && pod > math.MaxInt64-delta {
		return Unlimited
	}
	return max(pod+delta, want)
}

// rate converts quota per period into quota per podPeriod, rounding up so a
// raise of the pod is never short by a rounding error.
func rate(quota int64, period, podPeriod uint64) int64 {
	if quota == Unlimited || period == podPeriod {
		return quota
	}
	hi, lo := bits.Mul64(uint64(quota), podPeriod)
	if hi >= period {
		return Unlimited // does not fit in 64 bits: no real limit
	}
	q, r := bits.Div64(hi, lo, period)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return Unlimited
	}
	return int64(q)
}

// ordered puts one resource's writes in the order the kernel accepts: a pod
// value that goes up before the container, one that goes down after it.
func ordered(podUp bool, pod, ctr []Write) []Write {
	if podUp {
		for i := range pod {
			pod[i].podRaise = true
		}
		return append(pod, ctr...)
	}
	return append(ctr, pod...)
}

// lessLimit reports a < b for limits where Unlimited is +∞.
func lessLimit(a, b int64) bool {
	switch {
	case a == b, a == Unlimited:
		return false
	case b == Unlimited:
		return true
	}
	return a < b
}

func (m *Manager) newWrite(level Level, c Cgroup, file, from, to string) Write {
	return Write{Level: level, Cgroup: c.Path, Unit: c.Unit, File: file, Path: m.filePath(c.Path, file), From: from, To: to}
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
