package harness

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is one process of /proc.
type proc struct {
	pid, ppid int
	cmdline   string // arguments joined by spaces
	zombie    bool
}

func listProcs() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, proc{
			pid:     pid,
			ppid:    ppid,
			cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")),
			zombie:  fields[0] == "Z",
		})
	}
	return out
}

// procsOf returns the live processes whose command line contains marker (the
// instance's directory: containerd's --config, the shims' -address, runc's
// --root/--log) and all their descendants (the containers the shims started),
// never this process or its ancestors.
func procsOf(marker string) []proc {
	all := listProcs()
	children := map[int][]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	protected := map[int]bool{}
	for pid := os.Getpid(); pid > 1; {
		protected[pid] = true
		ppid := 0
		for _, p := range all {
			if p.pid == pid {
				ppid = p.ppid
				break
			}
		}
		pid = ppid
	}
	seen := map[int]bool{}
	var out []proc
	var walk func(p proc)
	walk = func(p proc) {
		if seen[p.pid] || protected[p.pid] || p.pid <= 1 {
			return
		}
		seen[p.pid] = true
		if !p.zombie {
			out = append(out, p)
		}
		for _, c := range children[p.pid] {
			walk(c)
		}
	}
	for _, p := range all {
		if strings.Contains(p.cmdline, marker) {
			walk(p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// killProcsOf SIGKILLs procsOf(marker) until none is left or timeout passes.
func killProcsOf(marker string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ps := procsOf(marker)
		if len(ps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still alive: %s", describeProcs(ps))
		}
		for _, p := range ps {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func describeProcs(ps []proc) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString("; ")
		}
		cmd := p.cmdline
		if len(cmd) > 160 {
			cmd = cmd[:160] + "..."
		}
		fmt.Fprintf(&b, "%d %s", p.pid, cmd)
	}
	return b.String()
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	mountPoint string
	fsType     string
}

func readMountInfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		e := mountEntry{mountPoint: unescapeMountInfo(fields[4])}
		if i := strings.Index(line, " - "); i >= 0 {
			if rest := strings.Fields(line[i+3:]); len(rest) > 0 {
				e.fsType = rest[0]
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// unescapeMountInfo decodes the octal escapes (\040 for a space) of mountinfo.
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// mountsUnder lists the mount points at or below dir, deepest (latest) first.
func mountsUnder(dir string) []string {
	ms, err := readMountInfo()
	if err != nil {
		return nil
	}
	var out []string
	for i := len(ms) - 1; i >= 0; i-- {
		if under(ms[i].mountPoint, dir) {
			out = append(out, ms[i].mountPoint)
		}
	}
	return out
}

// unmountUnder lazily unmounts everything at or below dir.
func unmountUnder(dir string) error {
	for range 10 {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
		}
	}
	if mps := mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, mps)
	}
	return nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func deleteLink(name string) error {
	if !linkExists(name) {
		return nil
	}
	out, err := exec.Command(lookPathOr("ip", "/usr/sbin/ip"), "link", "delete", name).CombinedOutput()
	if err != nil && linkExists(name) {
		return fmt.Errorf("ip link delete %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cgroupRoots are the mount points of the machine's cgroup hierarchies (v1
// controllers and the unified v2 one).
func cgroupRoots() []string {
	ms, err := readMountInfo()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if m.fsType == "cgroup" || m.fsType == "cgroup2" {
			out = append(out, m.mountPoint)
		}
	}
	return out
}

// removeCgroupTree removes the cgroup directory rel (e.g. "/inplaced-test/pod")
// and its empty descendants in every hierarchy, bottom-up with rmdir only: a
// cgroup that still has processes stays (and is reported). A cgroup whose
// last task was killed a moment ago answers EBUSY until the task is reaped,
// so the tree is retried for a few seconds, as kubelet's removeCgroups does.
func removeCgroupTree(rel string) error {
	var errs []error
	for _, root := range cgroupRoots() {
		top := filepath.Join(root, rel)
		if !under(top, root) || top == root {
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := rmdirTree(top)
			if err == nil || time.Now().After(deadline) {
				if err != nil {
					errs = append(errs, err)
				}
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// removeEmptyCgroup removes rel in every hierarchy if it has no children left.
func removeEmptyCgroup(rel string) {
	for _, root := range cgroupRoots() {
		top := filepath.Join(root, rel)
		if under(top, root) && top != root {
			_ = os.Remove(top) // fails while in use: fine
		}
	}
}

// shimFiles are the files a containerd shim leaves behind when it is killed
// rather than told to shut down: its socket under /run/containerd/s (named
// after sha256(<containerd address>/<namespace>/<id>), as containerd's
// shim.SocketAddress computes it) and libcni's loopback result cache of the
// sandbox (cni-loopback-<id>-lo). Both names derive from the shim's own
// command line, so only this instance's files are ever touched.
func shimFiles(ps []proc) []string {
	var out []string
	for _, p := range ps {
		if !strings.Contains(p.cmdline, "containerd-shim") {
			continue
		}
		args := strings.Fields(p.cmdline)
		var ns, id, addr string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace":
				ns = args[i+1]
			case "-id":
				id = args[i+1]
			case "-address":
				addr = args[i+1]
			}
		}
		if ns == "" || id == "" || addr == "" {
			continue
		}
		sum := sha256.Sum256([]byte(filepath.Join(addr, ns, id)))
		out = append(out,
			filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:])),
			filepath.Join("/var/lib/cni/results", "cni-loopback-"+id+"-lo"))
	}
	return out
}

// killInstanceProcs kills procsOf(marker) and removes the files of the shims
// among them (see shimFiles).
func killInstanceProcs(marker string, timeout time.Duration) error {
	files := shimFiles(procsOf(marker))
	err := killProcsOf(marker, timeout)
	for _, f := range files {
		_ = os.Remove(f)
	}
	return err
}
