package resources

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// layout is one of the four ways a container's cgroup can be laid out.
type layout struct {
	name     string
	v2       bool
	target   Target
	pod, ctr string // hierarchy-relative
}

func layouts() []layout {
	const uid, id = "6d1e0c1e_aa55", "c0ffee"
	fsT := Target{CgroupsPath: "/kubepods/burstable/pod" + uid + "/" + id, Driver: DriverCgroupfs}
	fsPod := "/kubepods/burstable/pod" + uid
	sdT := Target{CgroupsPath: "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id, Driver: DriverSystemd}
	sdPod := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice"
	sdCtr := sdPod + "/cri-containerd-" + id + ".scope"
	return []layout{
		{"v1-cgroupfs", false, fsT, fsPod, fsPod + "/" + id},
		{"v1-systemd", false, sdT, sdPod, sdCtr},
		{"v2-cgroupfs", true, fsT, fsPod, fsPod + "/" + id},
		{"v2-systemd", true, sdT, sdPod, sdCtr},
	}
}

// setup builds the two-container pod of twoContainerPod on a fake tree:
// container 0.5 CPU / 512 shares / 256Mi, pod 1 CPU / 1024 shares / 512Mi.
func setup(t *testing.T, l layout, failAt ...int) (*fakeTree, *recFS, *Manager) {
	t.Helper()
	tr := newFakeTree(t, l.v2)
	if l.v2 {
		tr.cgroup(l.pod, v2Files("100000 100000", "39", "536870912"))
		tr.cgroup(l.ctr, v2Files("50000 100000", "20", "268435456"))
	} else {
		tr.cgroup(l.pod, v1Files("100000", "1024", "536870912"))
		tr.cgroup(l.ctr, v1Files("50000", "512", "268435456"))
	}
	rec := newRecFS(tr.root, failAt...)
	return tr, rec, newTestManager(t, tr, rec)
}

// rel renders expected writes: "pod:<file>=<value>" → the recorded form.
func (l layout) rel(specs ...string) []string {
	var out []string
	for _, s := range specs {
		level, rest, _ := strings.Cut(s, ":")
		file, value, _ := strings.Cut(rest, "=")
		cg := l.ctr
		if level == "pod" {
			cg = l.pod
		}
		p := filepath.Join(strings.TrimPrefix(cg, "/"), file)
		if !l.v2 {
			controller, _, _ := strings.Cut(file, ".")
			p = filepath.Join(controller, p)
		}
		out = append(out, p+"="+value)
	}
	return out
}

var raise = Limits{CPUQuota: ptr[int64](150000), CPUShares: ptr[uint64](1024), MemoryLimit: ptr(512 * mi)}

func TestApplyRaise(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			tr, rec, m := setup(t, l)
			res, err := m.Apply(context.Background(), l.target, raise, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := l.rel(
				"pod:memory.limit_in_bytes=805306368", "ctr:memory.limit_in_bytes=536870912",
				"pod:cpu.cfs_quota_us=200000", "ctr:cpu.cfs_quota_us=150000",
				"pod:cpu.shares=1536", "ctr:cpu.shares=1024",
			)
			if l.v2 {
				want = l.rel(
					"pod:memory.max=805306368", "ctr:memory.max=536870912",
					"pod:cpu.max=200000 100000", "ctr:cpu.max=150000 100000",
					"pod:cpu.weight=58", "ctr:cpu.weight=39",
				)
			}
			if !slices.Equal(rec.writes, want) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
			}
			if len(res.Writes) != len(want) {
				t.Fatalf("Result has %d writes, want %d", len(res.Writes), len(want))
			}
			for _, w := range res.Writes {
				if got := tr.get(w.Cgroup, w.File); !m.sameContent(w.File, got, w.To) {
					t.Errorf("%s reads %q, Result says %q", w.Path, got, w.To)
				}
				if w.From == w.To {
					t.Errorf("%s: From == To == %q", w.Path, w.From)
				}
			}
			if res.Before.Container.Path != l.ctr || res.Before.Pod.Path != l.pod {
				t.Errorf("Before paths = %q, %q", res.Before.Container.Path, res.Before.Pod.Path)
			}
			// Everything is in place now: a second Apply without prev writes nothing.
			rec.writes = nil
			if res, err := m.Apply(context.Background(), l.target, raise, nil); err != nil || len(res.Writes)+len(rec.writes) != 0 {
				t.Errorf("second Apply: %v, writes %v", err, rec.writes)
			}
		})
	}
}

func TestApplyLower(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			_, rec, m := setup(t, l)
			lower := Limits{CPUQuota: ptr[int64](20000), MemoryLimit: ptr(200 * mi)}
			if _, err := m.Apply(context.Background(), l.target, lower, nil); err != nil {
				t.Fatal(err)
			}
			want := l.rel(
				"ctr:memory.limit_in_bytes=209715200", "pod:memory.limit_in_bytes=478150656",
				"ctr:cpu.cfs_quota_us=20000", "pod:cpu.cfs_quota_us=70000",
			)
			if l.v2 {
				want = l.rel(
					"ctr:memory.max=209715200", "pod:memory.max=478150656",
					"ctr:cpu.max=20000 100000", "pod:cpu.max=70000 100000",
				)
			}
			if !slices.Equal(rec.writes, want) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

func TestApplyRefusesBelowUsage(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			tr, rec, m := setup(t, l)
			before := snapshot(tr, l)
			// The usage check comes before any write, even the CPU ones that
			// would have come after memory anyway.
			_, err := m.Apply(context.Background(), l.target, Limits{CPUQuota: ptr[int64](150000), MemoryLimit: ptr(64 * mi)}, nil)
			var ue *UsageError
			if !errors.As(err, &ue) || !errors.Is(err, ErrBelowUsage) {
				t.Fatalf("err = %v, want *UsageError", err)
			}
			if ue.Usage != uint64(100*mi) || ue.Requested != 64*mi || ue.Level != LevelContainer {
				t.Errorf("UsageError = %+v", ue)
			}
			if len(rec.writes) != 0 {
				t.Errorf("wrote %v", rec.writes)
			}
			if after := snapshot(tr, l); !slices.Equal(before, after) {
				t.Errorf("files changed:\n%v\n%v", before, after)
			}
		})
	}
}

func TestApplyRestoresAfterSecondWriteFails(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			tr, rec, m := setup(t, l, 2)
			before := snapshot(tr, l)
			res, err := m.Apply(context.Background(), l.target, raise, nil)
			t.Log(err)
			var ae *ApplyError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *ApplyError", err)
			}
			if !errors.Is(err, ErrRolledBack) || errors.Is(err, ErrRestoreFailed) || !errors.Is(err, syscall.EINVAL) {
				t.Errorf("errors.Is: rolled back %v, restore failed %v, EINVAL %v",
					errors.Is(err, ErrRolledBack), errors.Is(err, ErrRestoreFailed), errors.Is(err, syscall.EINVAL))
			}
			if ae.Step != 2 || ae.Steps != 6 || ae.Failed.Level != LevelContainer || len(ae.Restored) != 1 || ae.Restored[0].Level != LevelPod {
				t.Errorf("ApplyError step %d/%d failed %s restored %v", ae.Step, ae.Steps, ae.Failed, ae.Restored)
			}
			// write 1 (pod memory), write 2 failed, write 3 = restore of write 1
			memFile := fileMemLimit
			if l.v2 {
				memFile = fileMemMax
			}
			want := l.rel("pod:"+memFile+"=805306368", "pod:"+memFile+"=536870912")
			if !slices.Equal(rec.writes, want) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
			}
			if after := snapshot(tr, l); !slices.Equal(before, after) {
				t.Errorf("not restored:\n%v\n%v", before, after)
			}
			if len(ae.InEffect) != 2 || ae.InEffect[0].Value != "536870912" || ae.InEffect[1].Value != "268435456" {
				t.Errorf("InEffect = %+v", ae.InEffect)
			}
			if len(res.Writes) != 0 {
				t.Errorf("Result.Writes = %v after a rollback", res.Writes)
			}
		})
	}
}

func TestApplyReportsFailedRestore(t *testing.T) {
	l := layouts()[0]
	_, _, m := setup(t, l, 2, 3) // the write fails, and so does the restore of write 1
	_, err := m.Apply(context.Background(), l.target, raise, nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, ErrRestoreFailed) || errors.Is(err, ErrRolledBack) {
		t.Fatalf("err = %v, want ErrRestoreFailed", err)
	}
	// The pod kept its raised limit, and the error says so.
	if len(ae.InEffect) == 0 || ae.InEffect[0].Value != "805306368" || !strings.Contains(err.Error(), "805306368") {
		t.Errorf("InEffect = %+v\nerr = %v", ae.InEffect, err)
	}
}

// clampFS stands for a kernel that accepts a write and keeps another value.
type clampFS struct {
	FS
	suffix, value, keep string
}

func (f clampFS) WriteFile(p string, data []byte) error {
	if strings.HasSuffix(p, f.suffix) && string(data) == f.value {
		data = []byte(f.keep)
	}
	return f.FS.WriteFile(p, data)
}

func TestApplyVerifiesReadBack(t *testing.T) {
	l := layouts()[0]
	tr, rec, _ := setup(t, l)
	before := snapshot(tr, l)
	m := newTestManager(t, tr, clampFS{FS: rec, suffix: l.ctr + "/cpu.cfs_quota_us", value: "150000", keep: "60000"})
	_, err := m.Apply(context.Background(), l.target, raise, nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, ErrNotApplied) || !errors.Is(err, ErrRolledBack) {
		t.Fatalf("err = %v, want ErrNotApplied, rolled back", err)
	}
	if ae.Step != 4 || len(ae.Restored) != 4 { // the mismatched file itself is restored too
		t.Errorf("step %d, restored %v", ae.Step, ae.Restored)
	}
	if after := snapshot(tr, l); !slices.Equal(before, after) {
		t.Errorf("not restored:\n%v\n%v", before, after)
	}
}

// cancelFS cancels the context during the first write.
type cancelFS struct {
	FS
	cancel context.CancelFunc
}

func (f cancelFS) WriteFile(p string, data []byte) error {
	f.cancel()
	return f.FS.WriteFile(p, data)
}

func TestApplyCancellation(t *testing.T) {
	l := layouts()[0]
	tr, rec, m := setup(t, l)
	before := snapshot(tr, l)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Apply(ctx, l.target, raise, nil); !errors.Is(err, context.Canceled) || len(rec.writes) != 0 {
		t.Fatalf("canceled before: err %v, writes %v", err, rec.writes)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	m = newTestManager(t, tr, cancelFS{FS: rec, cancel: cancel})
	_, err := m.Apply(ctx, l.target, raise, nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrRolledBack) {
		t.Fatalf("canceled during: err = %v", err)
	}
	if ae.Step != 2 || len(ae.Restored) != 1 {
		t.Errorf("step %d, restored %v", ae.Step, ae.Restored)
	}
	if after := snapshot(tr, l); !slices.Equal(before, after) {
		t.Errorf("not restored:\n%v\n%v", before, after)
	}
}

func TestApplyWithPrev(t *testing.T) {
	// The runtime applied the container's memory and shares, failed on the
	// CPU quota (v1: above the pod's). With prev the pod moves by the full
	// delta of each.
	l := layouts()[0]
	tr, rec, m := setup(t, l)
	tr.cgroup(l.ctr, map[string]string{fileMemLimit: "536870912", fileShares: "1024"})
	prev := Limits{CPUQuota: ptr[int64](50000), CPUShares: ptr[uint64](512), MemoryLimit: ptr(256 * mi)}
	if _, err := m.Apply(context.Background(), l.target, raise, &prev); err != nil {
		t.Fatal(err)
	}
	want := l.rel(
		"pod:memory.limit_in_bytes=805306368",
		"pod:cpu.cfs_quota_us=200000", "ctr:cpu.cfs_quota_us=150000",
		"pod:cpu.shares=1536",
	)
	if !slices.Equal(rec.writes, want) {
		t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestReadMissingCgroup(t *testing.T) {
	l := layouts()[0]
	_, _, m := setup(t, l)
	_, err := m.Read(Target{CgroupsPath: l.pod + "/gone"})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want fs.ErrNotExist", err)
	}
}

func TestReadValues(t *testing.T) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			tr, _, m := setup(t, l)
			if !l.v2 {
				tr.cgroup(l.ctr, map[string]string{fileMemswLimit: "268435456"})
				tr.cgroup(l.pod, map[string]string{fileMemLimit: "9223372036854771712"})
			} else {
				tr.cgroup(l.pod, map[string]string{fileMemMax: "max"})
			}
			cur, err := m.Read(l.target)
			if err != nil {
				t.Fatal(err)
			}
			c, p := cur.Container.Values, cur.Pod.Values
			if c.CPUQuota != 50000 || c.CPUPeriod != 100000 || c.MemoryLimit != 256*mi || c.MemoryUsage != uint64(100*mi) {
				t.Errorf("container = %+v", c)
			}
			if p.CPUQuota != 100000 || p.MemoryLimit != Unlimited {
				t.Errorf("pod = %+v", p)
			}
			if l.v2 && (c.CPUWeight != 20 || c.CPUShares != 0 || c.MemorySwapLimit != nil) {
				t.Errorf("v2 container = %+v", c)
			}
			if !l.v2 && (c.CPUShares != 512 || c.CPUWeight != 0 || c.MemorySwapLimit == nil || *c.MemorySwapLimit != 256*mi || p.MemorySwapLimit != nil) {
				t.Errorf("v1 container = %+v, pod memsw %v", c, p.MemorySwapLimit)
			}
		})
	}
}

func TestNewDetectsVersion(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		tr := newFakeTree(t, v2)
		m, err := New(tr.root)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Version() == 2; got != v2 {
			t.Errorf("v2=%v: Version() = %d", v2, m.Version())
		}
	}
	if _, err := New(t.TempDir(), WithFS(nil)); err == nil {
		t.Error("New with a nil FS succeeded")
	}
}

// snapshot reads every file of both cgroups.
func snapshot(tr *fakeTree, l layout) []string {
	files := []string{fileQuota, filePeriod, fileShares, fileMemLimit, fileMemUsageV1}
	if l.v2 {
		files = []string{fileCPUMax, fileWeight, fileMemMax, fileMemCurrent}
	}
	var out []string
	for _, cg := range []string{l.pod, l.ctr} {
		for _, f := range files {
			out = append(out, fmt.Sprintf("%s/%s=%s", cg, f, tr.get(cg, f)))
		}
	}
	return out
}
