package resources

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const (
	mi = int64(1 << 20)
	gi = int64(1 << 30)
)

// v1Cgroup is a cgroup as Read reports it on v1 (no memsw unless set).
func v1Cgroup(path string, quota int64, shares uint64, mem int64) Cgroup {
	return Cgroup{Path: path, Values: Values{CPUQuota: quota, CPUPeriod: 100000, CPUShares: shares, MemoryLimit: mem, MemoryUsage: uint64(100 * mi)}}
}

func v2Cgroup(path string, quota int64, weight uint64, mem int64) Cgroup {
	return Cgroup{Path: path, Values: Values{CPUQuota: quota, CPUPeriod: 100000, CPUWeight: weight, MemoryLimit: mem, MemoryUsage: uint64(100 * mi)}}
}

// A pod of two containers at 0.5 CPU / 256Mi each: kubelet made the pod the sum.
func twoContainerPod(v2 bool) Current {
	if v2 {
		return Current{
			Container: v2Cgroup("/kubepods/burstable/podA/c1", 50000, 20, 256*mi),
			Pod:       v2Cgroup("/kubepods/burstable/podA", 100000, 39, 512*mi),
		}
	}
	return Current{
		Container: v1Cgroup("/kubepods/burstable/podA/c1", 50000, 512, 256*mi),
		Pod:       v1Cgroup("/kubepods/burstable/podA", 100000, 1024, 512*mi),
	}
}

// steps renders a plan as "<level> <file> <from>-><to>" for readable diffs.
func steps(ws []Write) []string {
	var out []string
	for _, w := range ws {
		out = append(out, fmt.Sprintf("%s %s %s->%s", w.Level, w.File, w.From, w.To))
	}
	return out
}

func TestPlan(t *testing.T) {
	v1 := &Manager{root: "/cg", page: 4096}
	v2 := &Manager{root: "/cg", page: 4096, v2: true}
	withMemsw := func(c Current) Current {
		c.Container.MemorySwapLimit = ptr(c.Container.MemoryLimit) // containerd: memsw = limit
		c.Pod.MemorySwapLimit = ptr(Unlimited)                     // kubelet leaves the pod's alone
		return c
	}
	for _, tc := range []struct {
		name string
		m    *Manager
		cur  Current
		want Limits
		prev *Limits
		plan []string
	}{
		{
			name: "v1 cpu raise: pod first, by the delta",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr[int64](150000)},
			plan: []string{"pod cpu.cfs_quota_us 100000->200000", "container cpu.cfs_quota_us 50000->150000"},
		},
		{
			name: "v1 cpu lower: container first, then pod by the delta",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr[int64](20000)},
			plan: []string{"container cpu.cfs_quota_us 50000->20000", "pod cpu.cfs_quota_us 100000->70000"},
		},
		{
			name: "v1 memory raise, runtime applied it, prev known: pod by the delta only",
			m:    v1,
			cur: Current{
				Container: v1Cgroup("/p/c", 50000, 512, 1*gi),
				Pod:       v1Cgroup("/p", 100000, 1024, 512*mi),
			},
			want: Limits{MemoryLimit: ptr(1 * gi)},
			prev: &Limits{MemoryLimit: ptr(256 * mi)},
			plan: []string{"pod memory.limit_in_bytes 536870912->1342177280"},
		},
		{
			name: "v1 memory raise, runtime applied it, no prev: pod raised to the container (floor)",
			m:    v1,
			cur: Current{
				Container: v1Cgroup("/p/c", 50000, 512, 1*gi),
				Pod:       v1Cgroup("/p", 100000, 1024, 512*mi),
			},
			want: Limits{MemoryLimit: ptr(1 * gi)},
			plan: []string{"pod memory.limit_in_bytes 536870912->1073741824"},
		},
		{
			name: "runtime applied, pod has room, no prev: nothing to do",
			m:    v1,
			cur: Current{
				Container: v1Cgroup("/p/c", 80000, 512, 300*mi),
				Pod:       v1Cgroup("/p", 200000, 1024, 1*gi),
			},
			want: Limits{CPUQuota: ptr[int64](80000), CPUShares: ptr[uint64](512), MemoryLimit: ptr(300 * mi)},
			plan: nil,
		},
		{
			name: "memory before cpu, each ordered on its own",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr[int64](20000), MemoryLimit: ptr(512 * mi)},
			plan: []string{
				"pod memory.limit_in_bytes 536870912->805306368", "container memory.limit_in_bytes 268435456->536870912",
				"container cpu.cfs_quota_us 50000->20000", "pod cpu.cfs_quota_us 100000->70000",
			},
		},
		{
			name: "container becomes unlimited: pod unlimited first",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr(Unlimited), MemoryLimit: ptr(Unlimited)},
			plan: []string{
				"pod memory.limit_in_bytes 536870912->-1", "container memory.limit_in_bytes 268435456->-1",
				"pod cpu.cfs_quota_us 100000->-1", "container cpu.cfs_quota_us 50000->-1",
			},
		},
		{
			name: "unlimited pod is left alone",
			m:    v1,
			cur: Current{
				Container: v1Cgroup("/p/c", 50000, 512, 256*mi),
				Pod:       v1Cgroup("/p", Unlimited, 1024, Unlimited),
			},
			want: Limits{CPUQuota: ptr[int64](150000), MemoryLimit: ptr(1 * gi)},
			plan: []string{"container memory.limit_in_bytes 268435456->1073741824", "container cpu.cfs_quota_us 50000->150000"},
		},
		{
			name: "container was unlimited: pod only floored",
			m:    v1,
			cur: Current{
				Container: v1Cgroup("/p/c", Unlimited, 512, 256*mi),
				Pod:       v1Cgroup("/p", 100000, 1024, 512*mi),
			},
			want: Limits{CPUQuota: ptr[int64](150000)},
			plan: []string{"pod cpu.cfs_quota_us 100000->150000", "container cpu.cfs_quota_us -1->150000"},
		},
		{
			name: "v1 memsw moves with the limit: memsw first on a raise",
			m:    v1, cur: withMemsw(twoContainerPod(false)),
			want: Limits{MemoryLimit: ptr(512 * mi)},
			plan: []string{
				"pod memory.limit_in_bytes 536870912->805306368",
				"container memory.memsw.limit_in_bytes 268435456->536870912",
				"container memory.limit_in_bytes 268435456->536870912",
			},
		},
		{
			name: "v1 memsw moves with the limit: memsw last on a lowering",
			m:    v1, cur: withMemsw(twoContainerPod(false)),
			want: Limits{MemoryLimit: ptr(200 * mi)},
			plan: []string{
				"container memory.limit_in_bytes 268435456->209715200",
				"container memory.memsw.limit_in_bytes 268435456->209715200",
				"pod memory.limit_in_bytes 536870912->478150656",
			},
		},
		{
			name: "v1 period grows: period before quota",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr[int64](100000), CPUPeriod: ptr[uint64](200000)},
			plan: []string{"container cpu.cfs_period_us 100000->200000", "container cpu.cfs_quota_us 50000->100000"},
		},
		{
			name: "v1 period shrinks: quota before period",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUQuota: ptr[int64](25000), CPUPeriod: ptr[uint64](50000)},
			plan: []string{"container cpu.cfs_quota_us 50000->25000", "container cpu.cfs_period_us 100000->50000"},
		},
		{
			name: "v1 shares: pod by the delta",
			m:    v1, cur: twoContainerPod(false),
			want: Limits{CPUShares: ptr[uint64](1024)},
			plan: []string{"pod cpu.shares 1024->1536", "container cpu.shares 512->1024"},
		},
		{
			name: "v2 cpu.max and memory.max, one write each per cgroup",
			m:    v2, cur: twoContainerPod(true),
			want: Limits{CPUQuota: ptr[int64](150000), MemoryLimit: ptr(1 * gi)},
			plan: []string{
				"pod memory.max 536870912->1342177280", "container memory.max 268435456->1073741824",
				"pod cpu.max 100000 100000->200000 100000", "container cpu.max 50000 100000->150000 100000",
			},
		},
		{
			name: "v2 unlimited is spelled max",
			m:    v2, cur: twoContainerPod(true),
			want: Limits{CPUQuota: ptr(Unlimited), MemoryLimit: ptr(Unlimited)},
			plan: []string{
				"pod memory.max 536870912->max", "container memory.max 268435456->max",
				"pod cpu.max 100000 100000->max 100000", "container cpu.max 50000 100000->max 100000",
			},
		},
		{
			name: "v2 weight: linear when the runtime did not apply it, pod by the same delta",
			m:    v2, cur: twoContainerPod(true),
			want: Limits{CPUShares: ptr[uint64](1024)},
			plan: []string{"pod cpu.weight 39->58", "container cpu.weight 20->39"},
		},
		{
			name: "v2 weight the runtime wrote with the quadratic formula is kept; prev moves the pod",
			m:    v2,
			cur: Current{
				Container: v2Cgroup("/p/c", 50000, 100, 256*mi), // quadratic(1024)
				Pod:       v2Cgroup("/p", 100000, 39, 512*mi),
			},
			want: Limits{CPUShares: ptr[uint64](1024)},
			prev: &Limits{CPUShares: ptr[uint64](512)},
			plan: []string{"pod cpu.weight 39->58"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := tc.m.Plan(tc.cur, tc.want, tc.prev)
			if err != nil {
				t.Fatal(err)
			}
			if got := steps(plan); !slices.Equal(got, tc.plan) {
				t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.plan, "\n  "))
			}
		})
	}
}

func TestPlanPaths(t *testing.T) {
	cur := twoContainerPod(false)
	m := &Manager{root: "/sys/fs/cgroup", page: 4096}
	plan, err := m.Plan(cur, Limits{CPUQuota: ptr[int64](150000), MemoryLimit: ptr(300 * mi)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range plan {
		got = append(got, w.Path)
	}
	want := []string{
		"/sys/fs/cgroup/memory/kubepods/burstable/podA/memory.limit_in_bytes",
		"/sys/fs/cgroup/memory/kubepods/burstable/podA/c1/memory.limit_in_bytes",
		"/sys/fs/cgroup/cpu/kubepods/burstable/podA/cpu.cfs_quota_us",
		"/sys/fs/cgroup/cpu/kubepods/burstable/podA/c1/cpu.cfs_quota_us",
	}
	if !slices.Equal(got, want) {
		t.Errorf("paths:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestPlanRefusesBelowUsage(t *testing.T) {
	m := &Manager{root: "/cg", page: 4096}
	for _, tc := range []struct {
		name  string
		cur   Current
		limit int64
		level Level
	}{
		{"container below usage", twoContainerPod(false), 64 * mi, LevelContainer},
		{"container at usage", twoContainerPod(false), 100 * mi, LevelContainer},
		{
			"pod below its usage",
			func() Current {
				c := twoContainerPod(false)
				c.Pod.MemoryUsage = uint64(400 * mi) // the sibling uses a lot
				return c
			}(),
			128 * mi, LevelPod,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Plan(tc.cur, Limits{MemoryLimit: ptr(tc.limit)}, nil)
			var ue *UsageError
			if !errors.Is(err, ErrBelowUsage) || !errors.As(err, &ue) {
				t.Fatalf("Plan() error = %v, want ErrBelowUsage", err)
			}
			if ue.Level != tc.level {
				t.Errorf("level = %s, want %s", ue.Level, tc.level)
			}
			if ue.Usage == 0 || ue.Requested > int64(ue.Usage) {
				t.Errorf("figures: %+v", ue)
			}
			t.Log(err)
		})
	}
	// A raise is never refused, whatever the usage.
	cur := twoContainerPod(false)
	cur.Container.MemoryUsage = uint64(300 * mi)
	if _, err := m.Plan(cur, Limits{MemoryLimit: ptr(280 * mi)}, nil); err != nil {
		t.Errorf("raise refused: %v", err)
	}
}

func TestPlanRejectsInvalidLimits(t *testing.T) {
	m := &Manager{root: "/cg", page: 4096}
	if _, err := m.Plan(twoContainerPod(false), Limits{CPUQuota: ptr[int64](10)}, nil); !errors.Is(err, ErrInvalidLimits) {
		t.Errorf("want ErrInvalidLimits, got %v", err)
	}
	if _, err := m.Plan(twoContainerPod(false), Limits{}, &Limits{MemoryLimit: ptr[int64](0)}); !errors.Is(err, ErrInvalidLimits) {
		t.Errorf("prev: want ErrInvalidLimits, got %v", err)
	}
}
