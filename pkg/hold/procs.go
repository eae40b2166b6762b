package hold

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/inplaced/inplaced/pkg/internal/mountinfo"
)

// ContainerPids returns the processes of the container whose init is pid,
// pid itself included, at any depth of its process tree: a server started
// by a shell, an init such as tini, or a launcher is found as well as one
// that is the container's PID 1.
//
// The container's cgroup is what holds them on every host. Which hierarchy
// to read is not given by the cgroup version alone: the kernel prints a
// "0::" line in /proc/PID/cgroup on cgroup v1 and hybrid hosts too, where the
// unified tree is either not mounted or holds the process only in a parent
// shared with other processes (the runtime's own slice). So every hierarchy
// the process is in and the host has mounted (read from the mount table) is
// a candidate, and the one that lists the fewest processes (the container's
// own leaf) wins. Where no hierarchy can be read, the container's processes
// are those in its PID namespace.
func ContainerPids(pid int) ([]int, error) { return procFS{root: "/"}.containerPids(pid) }

// procFS reads /proc and the cgroup trees under root ("/" on a host; a
// directory of recorded files in tests).
type procFS struct{ root string }

func (fs procFS) path(p string) string { return filepath.Join(fs.root, p) }

func (fs procFS) containerPids(pid int) ([]int, error) {
	cg, err := os.ReadFile(fs.path(fmt.Sprintf("/proc/%d/cgroup", pid)))
	if err != nil {
		return nil, fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	mi, err := os.ReadFile(fs.path("/proc/self/mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("mount table: %w", err)
	}
	var best []int
	for _, dir := range cgroupDirs(string(cg), string(mi)) {
		procs, err := readPids(fs.path(filepath.Join(dir, "cgroup.procs")))
		if err != nil || !slices.Contains(procs, pid) {
			continue
		}
		if best == nil || len(procs) < len(best) {
			best = procs
		}
	}
	if best == nil {
		best = fs.samePidNS(pid)
	}
	return withFirst(best, pid), nil
}

// withFirst puts pid first (the init's own fds always count) and drops
// duplicates.
func withFirst(pids []int, pid int) []int {
	out := []int{pid}
	for _, p := range pids {
		if p != pid && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// samePidNS lists the processes whose PID namespace is pid's: the fallback
// where no cgroup tree can be read. It finds nothing extra for a process in
// the host's namespace (the caller would not hold a host process's ports).
func (fs procFS) samePidNS(pid int) []int {
	mine, err := os.Readlink(fs.path(fmt.Sprintf("/proc/%d/ns/pid", pid)))
	if err != nil {
		return nil
	}
	if host, err := os.Readlink(fs.path("/proc/1/ns/pid")); err == nil && host == mine && pid != 1 {
		return nil
	}
	ents, err := os.ReadDir(fs.path("/proc"))
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(fs.path(fmt.Sprintf("/proc/%d/ns/pid", n))); err == nil && ns == mine {
			out = append(out, n)
		}
	}
	return out
}

// readPids reads a cgroup.procs file.
func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, s := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(s); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// cgroupMount is one cgroup filesystem of the mount table.
type cgroupMount struct {
	root, point string
	v2          bool
	controllers []string // v1: the controllers and name= of the hierarchy
}

// cgroupDirs maps each line of a /proc/PID/cgroup to the directory that
// holds the process in that hierarchy, for the hierarchies mounted on the
// host (a pure function of the two files, so each host's layout is a table
// test). The unified hierarchy comes first.
func cgroupDirs(procCgroup, mountinfo string) []string {
	mounts := parseCgroupMounts(mountinfo)
	var dirs []string
	sc := bufio.NewScanner(strings.NewReader(procCgroup))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		v2 := parts[0] == "0" && parts[1] == ""
		for _, m := range mounts {
			if m.v2 != v2 || (!v2 && !sameHierarchy(m.controllers, parts[1])) {
				continue
			}
			if dir, ok := under(m, parts[2]); ok && !slices.Contains(dirs, dir) {
				if v2 {
					dirs = slices.Insert(dirs, 0, dir)
				} else {
					dirs = append(dirs, dir)
				}
			}
			break
		}
	}
	return dirs
}

// sameHierarchy reports whether a v1 mount's controllers are the line's
// ("cpu,cpuacct", "name=systemd").
func sameHierarchy(mounted []string, line string) bool {
	for _, c := range strings.Split(line, ",") {
		if !slices.Contains(mounted, c) {
			return false
		}
	}
	return line != ""
}

// under maps a cgroup path to the mount: the mount shows the hierarchy from
// its root down (a mount of a sub-tree has a root other than "/").
func under(m cgroupMount, path string) (string, bool) {
	rel, err := filepath.Rel(m.root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(m.point, rel), true
}

// parseCgroupMounts reads the cgroup and cgroup2 mounts of a mountinfo
// (proc(5): "ID parent maj:min root point options [optional...] - type
// source superoptions").
func parseCgroupMounts(mi string) []cgroupMount {
	var out []cgroupMount
	sc := bufio.NewScanner(strings.NewReader(mi))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		m := cgroupMount{root: mountinfo.Unescape(f[3]), point: mountinfo.Unescape(f[4])}
		switch f[sep+1] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			m.controllers = strings.Split(f[sep+3], ",")
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}
