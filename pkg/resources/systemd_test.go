package resources

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// fakeSystemd records SetUnitProperties calls into the same log as the file
// writes of a logFS, so the interleaving can be asserted, and can fail.
type fakeSystemd struct {
	log  *[]string
	fail error
}

func (f *fakeSystemd) SetUnitProperties(_ context.Context, unit string, props []UnitProperty) error {
	if f.fail != nil {
		return f.fail
	}
	var ps []string
	for _, p := range props {
		ps = append(ps, p.String())
	}
	*f.log = append(*f.log, "unit "+unit+" "+strings.Join(ps, " "))
	return nil
}

// logFS logs file writes as "file <cgroup>/<file>=<value>", with a failure at
// the failAt-th write.
type logFS struct {
	FS
	root   string
	log    *[]string
	n      int
	failAt int
}

func (f *logFS) WriteFile(p string, data []byte) error {
	f.n++
	if f.n == f.failAt {
		return fmt.Errorf("injected: %w", syscall.EINVAL)
	}
	rel, _ := filepath.Rel(f.root, p)
	*f.log = append(*f.log, "file "+rel+"="+string(data))
	return f.FS.WriteFile(p, data)
}

func systemdSetup(t *testing.T, l layout, failAt int) (*fakeTree, *[]string, *fakeSystemd, *Manager) {
	t.Helper()
	tr, _, _ := setup(t, l)
	var log []string
	sd := &fakeSystemd{log: &log}
	m, err := New(tr.root, WithFS(&logFS{FS: OSFS(), root: tr.root, log: &log, failAt: failAt}), WithSystemd(sd))
	if err != nil {
		t.Fatal(err)
	}
	return tr, &log, sd, m
}

// With the systemd driver every write sets the unit's property first (systemd
// writes the file itself, maybe rounded), then the exact file; cgroupfs
// targets never reach systemd.
func TestApplySetsSystemdUnits(t *testing.T) {
	const pod, ctr = "kubepods-burstable-pod6d1e0c1e_aa55.slice", "cri-containerd-c0ffee.scope"
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			_, log, _, m := systemdSetup(t, l, 0)
			if _, err := m.Apply(context.Background(), l.target, raise, nil); err != nil {
				t.Fatal(err)
			}
			var want []string
			files := l.rel(
				"pod:memory.limit_in_bytes=805306368", "ctr:memory.limit_in_bytes=536870912",
				"pod:cpu.cfs_quota_us=200000", "ctr:cpu.cfs_quota_us=150000",
				"pod:cpu.shares=1536", "ctr:cpu.shares=1024")
			units := []string{
				pod + " MemoryLimit=805306368", ctr + " MemoryLimit=536870912",
				pod + " CPUQuotaPerSecUSec=2000000 CPUQuotaPeriodUSec=100000", ctr + " CPUQuotaPerSecUSec=1500000 CPUQuotaPeriodUSec=100000",
				pod + " CPUShares=1536", ctr + " CPUShares=1024"}
			if l.v2 {
				files = l.rel(
					"pod:memory.max=805306368", "ctr:memory.max=536870912",
					"pod:cpu.max=200000 100000", "ctr:cpu.max=150000 100000",
					"pod:cpu.weight=58", "ctr:cpu.weight=39")
				units = []string{
					pod + " MemoryMax=805306368", ctr + " MemoryMax=536870912",
					pod + " CPUQuotaPerSecUSec=2000000 CPUQuotaPeriodUSec=100000", ctr + " CPUQuotaPerSecUSec=1500000 CPUQuotaPeriodUSec=100000",
					pod + " CPUWeight=58", ctr + " CPUWeight=39"}
			}
			for i, f := range files {
				if l.target.Driver == DriverSystemd {
					want = append(want, "unit "+units[i])
				}
				want = append(want, "file "+f)
			}
			if !slices.Equal(*log, want) {
				t.Errorf("log:\n  %s\nwant:\n  %s", strings.Join(*log, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

// A failed write undoes the units too: property first, then the file.
func TestApplyRestoresSystemdUnits(t *testing.T) {
	l := layouts()[3] // v2-systemd
	_, log, _, m := systemdSetup(t, l, 2)
	_, err := m.Apply(context.Background(), l.target, raise, nil)
	if !errors.Is(err, ErrRolledBack) {
		t.Fatalf("err %v, want rolled back", err)
	}
	const pod = "kubepods-burstable-pod6d1e0c1e_aa55.slice"
	want := []string{
		"unit " + pod + " MemoryMax=805306368", "file " + l.rel("pod:memory.max=805306368")[0],
		"unit cri-containerd-c0ffee.scope MemoryMax=536870912", // its file write fails
		"unit cri-containerd-c0ffee.scope MemoryMax=268435456", "file " + l.rel("ctr:memory.max=268435456")[0],
		"unit " + pod + " MemoryMax=536870912", "file " + l.rel("pod:memory.max=536870912")[0],
	}
	if !slices.Equal(*log, want) {
		t.Errorf("log:\n  %s\nwant:\n  %s", strings.Join(*log, "\n  "), strings.Join(want, "\n  "))
	}
}

// systemd refusing a property fails the write before its file is touched,
// and the resize is rolled back.
func TestApplySystemdFailure(t *testing.T) {
	l := layouts()[3]
	tr, _, sd, m := systemdSetup(t, l, 0)
	before := snapshot(tr, l)
	sd.fail = errors.New("Unit kubepods-burstable-pod6d1e0c1e_aa55.slice not loaded")
	_, err := m.Apply(context.Background(), l.target, raise, nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Step != 1 || !strings.Contains(err.Error(), "systemd: set") {
		t.Fatalf("err %v, want an ApplyError at step 1 naming systemd", err)
	}
	if after := snapshot(tr, l); !slices.Equal(before, after) {
		t.Errorf("files changed:\n%v\n%v", before, after)
	}
}

func TestCPUQuotaProps(t *testing.T) {
	for _, tc := range []struct {
		quota  int64
		period uint64
		want   string
	}{
		{150000, 100000, "[CPUQuotaPerSecUSec=1500000 CPUQuotaPeriodUSec=100000]"},
		{33333, 100000, "[CPUQuotaPerSecUSec=340000 CPUQuotaPeriodUSec=100000]"}, // rounded up to 10 ms, as runc does
		{5000, 10000, "[CPUQuotaPerSecUSec=500000 CPUQuotaPeriodUSec=10000]"},
		{Unlimited, 100000, "[CPUQuotaPerSecUSec=infinity CPUQuotaPeriodUSec=100000]"},
	} {
		if got := fmt.Sprint(cpuQuotaProps(tc.quota, tc.period)); got != tc.want {
			t.Errorf("cpuQuotaProps(%d, %d) = %s, want %s", tc.quota, tc.period, got, tc.want)
		}
	}
	if memProp(Unlimited) != math.MaxUint64 || memProp(4096) != 4096 {
		t.Errorf("memProp")
	}
}

// BeforeContainer: every pod raise, then the hook, then the rest.
func TestApplyBeforeContainer(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			_, rec, m := setup(t, l)
			calls := 0
			_, err := m.Apply(context.Background(), l.target, raise, nil, BeforeContainer(func(context.Context) {
				calls++
				rec.writes = append(rec.writes, "hook")
			}))
			if err != nil {
				t.Fatal(err)
			}
			want := l.rel("pod:memory.limit_in_bytes=805306368", "pod:cpu.cfs_quota_us=200000", "pod:cpu.shares=1536")
			rest := l.rel("ctr:memory.limit_in_bytes=536870912", "ctr:cpu.cfs_quota_us=150000", "ctr:cpu.shares=1024")
			if l.v2 {
				want = l.rel("pod:memory.max=805306368", "pod:cpu.max=200000 100000", "pod:cpu.weight=58")
				rest = l.rel("ctr:memory.max=536870912", "ctr:cpu.max=150000 100000", "ctr:cpu.weight=39")
			}
			want = append(append(want, "hook"), rest...)
			if calls != 1 || !slices.Equal(rec.writes, want) {
				t.Errorf("%d calls, writes:\n  %s\nwant:\n  %s", calls, strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}
