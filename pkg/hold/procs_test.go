package hold

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Mount tables as three kinds of host print them (only the cgroup lines and
// their neighbours matter). cgroupV1 is the build machines' own (kernel 6.18:
// every v1 controller, and an empty unified tree at /sys/fs/cgroup/unified
// that systemd does not use); pureV1 has no unified tree at all; hybrid is
// systemd's hybrid layout (Ubuntu 20.04, Debian 10); v2 is a unified host.
const (
	mountinfoBuildMachine = `25 1 253:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	mountinfoPureV1 = `25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
26 25 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:23 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
29 26 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
30 26 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
31 26 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
`
	mountinfoHybrid = `25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
26 25 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
29 26 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
30 26 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
31 26 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
`
	mountinfoV2 = `25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
26 25 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
)

// host is a recorded host: its mount table, the container init's
// /proc/PID/cgroup, and the cgroup.procs of each directory.
type host struct {
	name, mountinfo, cgroup string
	procs                   map[string][]int
}

// The container: init 100 (a shell or tini), its child 101 and grandchild
// 102 (the server). 200 is a sidecar of the same pod; 50 and 51 containerd
// and the shim; 1 systemd.
var hosts = []host{
	{"build machine (cgroup v1, empty unified tree)", mountinfoBuildMachine,
		"9:name=systemd:/kubepods/besteffort/podu/c1\n8:pids:/kubepods/besteffort/podu/c1\n4:memory:/kubepods/besteffort/podu/c1\n1:cpu:/kubepods/besteffort/podu/c1\n0::/\n",
		map[string][]int{
			"/sys/fs/cgroup/unified":                          {1, 50, 51, 100, 101, 102, 200},
			"/sys/fs/cgroup/pids/kubepods/besteffort/podu/c1": {100, 101, 102},
			"/sys/fs/cgroup/pids/kubepods/besteffort/podu/c2": {200},
		}},
	{"cgroup v1, no unified tree", mountinfoPureV1,
		"11:pids:/kubepods/burstable/podu/c1\n5:memory:/kubepods/burstable/podu/c1\n3:cpu,cpuacct:/kubepods/burstable/podu/c1\n1:name=systemd:/kubepods/burstable/podu/c1\n0::/\n",
		map[string][]int{
			"/sys/fs/cgroup/cpu,cpuacct/kubepods/burstable/podu/c1": {100, 101, 102},
			"/sys/fs/cgroup/cpu,cpuacct/kubepods/burstable/podu/c2": {200},
		}},
	{"hybrid (systemd's unified tree beside v1)", mountinfoHybrid,
		"12:pids:/kubepods/podu/c1\n6:memory:/kubepods/podu/c1\n3:cpu,cpuacct:/kubepods/podu/c1\n1:name=systemd:/kubepods/podu/c1\n0::/system.slice/containerd.service\n",
		map[string][]int{
			"/sys/fs/cgroup/unified/system.slice/containerd.service": {50, 51, 100, 101, 102, 200},
			"/sys/fs/cgroup/systemd/kubepods/podu/c1":                {100, 101, 102},
			"/sys/fs/cgroup/pids/kubepods/podu/c1":                   {100, 101, 102},
		}},
	{"cgroup v2, systemd driver", mountinfoV2,
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice/cri-containerd-c1.scope\n",
		map[string][]int{
			"/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice/cri-containerd-c1.scope": {100, 101, 102},
			"/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice/cri-containerd-c2.scope": {200},
		}},
}

// write lays the host's files out under a directory.
func (h host) write(t *testing.T) procFS {
	t.Helper()
	root := t.TempDir()
	put := func(p, data string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("/proc/self/mountinfo", h.mountinfo)
	put("/proc/100/cgroup", h.cgroup)
	for dir, pids := range h.procs {
		put(filepath.Join(dir, "cgroup.procs"), strings.Trim(fmt.Sprint(pids), "[]")+"\n")
	}
	return procFS{root: root}
}

func TestContainerPidsOnEveryHost(t *testing.T) {
	for _, h := range hosts {
		t.Run(h.name, func(t *testing.T) {
			got, err := h.write(t).containerPids(100)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != "[100 101 102]" {
				t.Errorf("container's processes = %v, want [100 101 102] (init, the shell's child, the server)", got)
			}
		})
	}
}

// Where no cgroup tree can be read, the container's processes are those in
// its PID namespace.
func TestContainerPidsByPidNamespace(t *testing.T) {
	h := host{mountinfo: mountinfoV2, cgroup: "0::/gone\n"}
	fs := h.write(t)
	link := func(pid int, ns string) {
		dir := filepath.Join(fs.root, fmt.Sprintf("/proc/%d/ns", pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ns, filepath.Join(dir, "pid")); err != nil {
			t.Fatal(err)
		}
	}
	link(1, "pid:[4026531836]")
	link(100, "pid:[4026532999]")
	link(101, "pid:[4026532999]")
	link(200, "pid:[4026533000]")
	got, err := fs.containerPids(100)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[100 101]" {
		t.Errorf("by PID namespace = %v, want [100 101]", got)
	}
}

func TestCgroupDirs(t *testing.T) {
	got := cgroupDirs(hosts[2].cgroup, hosts[2].mountinfo)
	want := []string{"/sys/fs/cgroup/unified/system.slice/containerd.service", "/sys/fs/cgroup/pids/kubepods/podu/c1",
		"/sys/fs/cgroup/memory/kubepods/podu/c1", "/sys/fs/cgroup/cpu,cpuacct/kubepods/podu/c1", "/sys/fs/cgroup/systemd/kubepods/podu/c1"}
	if !slices.Equal(got, want) {
		t.Errorf("hybrid dirs = %q\nwant %q", got, want)
	}
	// A mount of a sub-tree (a cgroup namespace's view) maps below its root.
	mi := "26 25 0:22 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	if got := cgroupDirs("0::/kubepods/podu/c1\n", mi); !slices.Equal(got, []string{"/sys/fs/cgroup/podu/c1"}) {
		t.Errorf("sub-tree mount: %q", got)
	}
	if got := cgroupDirs("0::/other\n", mi); len(got) != 0 {
		t.Errorf("path outside the mount's root mapped: %q", got)
	}
}
