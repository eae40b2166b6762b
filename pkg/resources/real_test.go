package resources

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestRealCgroupV1 resizes cgroups of its own on the host's cgroup v1
// hierarchies: /sys/fs/cgroup/{cpu,memory}/inplaced-unit-<rand>/pod/ctr, laid
// out as the cgroupfs driver does. It touches no other cgroup and removes its
// own, leaf first.
func TestRealCgroupV1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err != nil {
		t.Skip("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err != nil {
		t.Skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
	}
	top := fmt.Sprintf("/inplaced-unit-%08x", rand.Uint32())
	pod, ctr := top+"/pod", top+"/pod/ctr"
	for _, controller := range []string{"cpu", "memory"} {
		for _, cg := range []string{top, pod, ctr} {
			dir := filepath.Join(DefaultRoot, controller, cg)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { // registered parent first, so run leaf first
				if err := os.Remove(dir); err != nil {
					t.Errorf("remove %s: %v", dir, err)
				}
			})
		}
	}
	file := func(cg, name string) string {
		controller, _, _ := strings.Cut(name, ".")
		return filepath.Join(DefaultRoot, controller, cg, name)
	}
	set := func(cg, name, value string) error { return os.WriteFile(file(cg, name), []byte(value), 0) }
	get := func(cg, name string) string {
		t.Helper()
		b, err := os.ReadFile(file(cg, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	mustSet := func(cg, name, value string) {
		t.Helper()
		if err := set(cg, name, value); err != nil {
			t.Fatalf("set %s %s=%s: %v", cg, name, value, err)
		}
	}
	// A pod with one container at 0.5 CPU and 128Mi; the container's memsw
	// equals its limit, as containerd sets it.
	mustSet(pod, fileQuota, "50000")
	mustSet(ctr, fileQuota, "50000")
	mustSet(pod, fileShares, "512")
	mustSet(ctr, fileShares, "512")
	mustSet(pod, fileMemLimit, "134217728")
	mustSet(ctr, fileMemLimit, "134217728")
	hasMemsw := set(ctr, fileMemswLimit, "134217728") == nil

	// What the runtime runs into: the kernel refuses a container quota above
	// its pod's. This is why the pod must be raised first.
	if err := set(ctr, fileQuota, "150000"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("container quota above the pod's: err = %v, want EINVAL", err)
	}

	// And with memsw = limit, a memory limit above memsw: memsw must move first.
	if hasMemsw {
		if err := set(ctr, fileMemLimit, "268435456"); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("memory limit above memsw: err = %v, want EINVAL", err)
		}
	}

	rec := newRecFS(DefaultRoot)
	m, err := New(DefaultRoot, WithFS(rec))
	if err != nil {
		t.Fatal(err)
	}
	if m.Version() != 1 {
		t.Fatalf("Version() = %d on a cgroup v1 host", m.Version())
	}
	target := Target{CgroupsPath: ctr, Driver: DriverCgroupfs}
	ctx := context.Background()

	t.Run("raise", func(t *testing.T) {
		rec.writes = nil
		res, err := m.Apply(ctx, target, Limits{CPUQuota: ptr[int64](150000), CPUShares: ptr[uint64](1024), MemoryLimit: ptr(256 * mi)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("writes: %v", res.Writes)
		want := []string{"memory" + pod + "/memory.limit_in_bytes=268435456"}
		if hasMemsw {
			want = append(want, "memory"+ctr+"/memory.memsw.limit_in_bytes=268435456")
		}
		want = append(want,
			"memory"+ctr+"/memory.limit_in_bytes=268435456",
			"cpu"+pod+"/cpu.cfs_quota_us=150000", "cpu"+ctr+"/cpu.cfs_quota_us=150000",
			"cpu"+pod+"/cpu.shares=1024", "cpu"+ctr+"/cpu.shares=1024",
		)
		if !slices.Equal(rec.writes, want) {
			t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
		}
		for _, c := range []struct{ cg, file, want string }{
			{pod, fileQuota, "150000"}, {ctr, fileQuota, "150000"},
			{pod, fileShares, "1024"}, {ctr, fileShares, "1024"},
			{pod, fileMemLimit, "268435456"}, {ctr, fileMemLimit, "268435456"},
		} {
			if got := get(c.cg, c.file); got != c.want {
				t.Errorf("%s %s = %s, want %s", c.cg, c.file, got, c.want)
			}
		}
	})

	t.Run("failed write is undone", func(t *testing.T) {
		before := []string{get(pod, fileQuota), get(ctr, fileQuota), get(pod, fileMemLimit), get(ctr, fileMemLimit)}
		failing := newRecFS(DefaultRoot, 2)
		fm, err := New(DefaultRoot, WithFS(failing))
		if err != nil {
			t.Fatal(err)
		}
		_, err = fm.Apply(ctx, target, Limits{CPUQuota: ptr[int64](250000), MemoryLimit: ptr(384 * mi)}, nil)
		if !errors.Is(err, ErrRolledBack) {
			t.Fatalf("err = %v, want rolled back", err)
		}
		after := []string{get(pod, fileQuota), get(ctr, fileQuota), get(pod, fileMemLimit), get(ctr, fileMemLimit)}
		if !slices.Equal(before, after) {
			t.Errorf("not restored: %v, was %v", after, before)
		}
	})

	t.Run("lower", func(t *testing.T) {
		rec.writes = nil
		if _, err := m.Apply(ctx, target, Limits{CPUQuota: ptr[int64](50000), CPUShares: ptr[uint64](512), MemoryLimit: ptr(128 * mi)}, nil); err != nil {
			t.Fatal(err)
		}
		want := []string{"memory" + ctr + "/memory.limit_in_bytes=134217728"}
		if hasMemsw {
			want = append(want, "memory"+ctr+"/memory.memsw.limit_in_bytes=134217728")
		}
		want = append(want,
			"memory"+pod+"/memory.limit_in_bytes=134217728",
			"cpu"+ctr+"/cpu.cfs_quota_us=50000", "cpu"+pod+"/cpu.cfs_quota_us=50000",
			"cpu"+ctr+"/cpu.shares=512", "cpu"+pod+"/cpu.shares=512",
		)
		if !slices.Equal(rec.writes, want) {
			t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(rec.writes, "\n  "), strings.Join(want, "\n  "))
		}
		if got := []string{get(pod, fileQuota), get(ctr, fileQuota)}; !slices.Equal(got, []string{"50000", "50000"}) {
			t.Errorf("quotas pod, ctr = %v", got)
		}
	})

	t.Run("unaligned and unlimited", func(t *testing.T) {
		// The kernel keeps whole pages: 200000000 reads back as 199999488,
		// and the read-back check must accept that.
		if _, err := m.Apply(ctx, target, Limits{MemoryLimit: ptr[int64](200000000)}, nil); err != nil {
			t.Fatal(err)
		}
		if got := get(ctr, fileMemLimit); got != fmt.Sprint(200000000/os.Getpagesize()*os.Getpagesize()) {
			t.Errorf("container memory limit = %s", got)
		}
		if _, err := m.Apply(ctx, target, Limits{CPUQuota: ptr(Unlimited), MemoryLimit: ptr(Unlimited)}, nil); err != nil {
			t.Fatal(err)
		}
		cur, err := m.Read(target)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []Values{cur.Container.Values, cur.Pod.Values} {
			if v.CPUQuota != Unlimited || v.MemoryLimit != Unlimited {
				t.Errorf("not unlimited: %+v", v)
			}
		}
		if got := get(ctr, fileMemLimit); got == "-1" {
			t.Errorf("expected the kernel's spelling of no limit, got %s", got)
		}
	})
}
