package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// The floors BenchmarkCRI measures beside inplaced: byte relays that copy
// between the caller's socket and containerd's without parsing anything.
// No CRI proxy can be cheaper than the cheapest of them, since it has the
// same two sockets to read and write and must also find the method in the
// HTTP/2 stream; what a floor adds over direct is what the machine charges
// for one more process on the path.
//
// startFloors starts each floor (loadFloors) in front of the backend socket
// and returns them as paths to measure. socat is measured when installed
// (hack/install-deps.sh installs it).
func startFloors(b *testing.B, backendSocket string) []criProxy {
	b.Helper()
	dir := b.TempDir()
	var out []criProxy
	for i, f := range loadFloors(b, buildFloorRelay(b, dir)) {
		sock := filepath.Join(dir, fmt.Sprintf("floor-%d.sock", i))
		out = append(out, startFloor(b, f.name, sock, f.argv(sock, backendSocket)...))
	}
	return out
}

// buildFloorRelay builds test/bench/floorrelay into dir and returns its
// path.
func buildFloorRelay(tb testing.TB, dir string) string {
	tb.Helper()
	bin := filepath.Join(dir, "floorrelay")
	// go test runs in the package's directory.
	if out, err := exec.Command("go", "build", "-o", bin, "./floorrelay").CombinedOutput(); err != nil {
		tb.Fatalf("go build ./test/bench/floorrelay: %v\n%s", err, out)
	}
	return bin
}

// startFloor runs a floor and dials it.
func startFloor(b *testing.B, variant, sock string, argv ...string) criProxy {
	b.Helper()
	p := runFloor(b, variant, sock, argv...)
	pid := p.pid()
	if variant == report.SocatFloor {
		pid = 0 // the relaying is done by a forked child
	}
	return criProxy{variant: variant, pid: pid, cri: harness.DialCRI(b, "unix://"+sock)}
}

// floorProc is a floor's process, the leader of a process group of its
// own (socat forks a child per connection).
type floorProc struct {
	cmd  *exec.Cmd
	once sync.Once
}

// runFloor runs argv as a floor and waits for sock to appear; tb.Cleanup
// stops it unless stop did.
func runFloor(tb testing.TB, variant, sock string, argv ...string) *floorProc {
	tb.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("%s: %v", variant, err)
	}
	p := &floorProc{cmd: cmd}
	tb.Cleanup(p.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %s did not appear", variant, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *floorProc) pid() int { return p.cmd.Process.Pid }

// stop kills the floor's process group and waits for its leader, and
// (briefly) for the children it forked to be gone.
func (p *floorProc) stop() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Wait()
		for deadline := time.Now().Add(5 * time.Second); len(p.children()) > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// members are the pids of the floor's process group: the leader and, for
// socat, the child it forked for each connection.
func (p *floorProc) members() []int { return append([]int{p.pid()}, p.children()...) }

// children are the live processes of the floor's process group other than
// its leader (zombies left out).
func (p *floorProc) children() []int {
	leader := p.pid()
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == leader {
			continue
		}
		// state(3) ppid(4) pgrp(5)
		f, err := procStat(pid)
		if err == nil && len(f) > 2 && f[2] == strconv.Itoa(leader) && f[0] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

// cpu is the CPU time of the floor's process group: its live members'
// and what the leader has of children it reaped (cutime, cstime: fields 16
// and 17), so that a socat child whose connection closed still counts.
func (p *floorProc) cpu() (time.Duration, error) {
	live, err := p.sum(func(pid int) (int64, error) {
		t, err := procCPU(pid)
		return int64(t), err
	})
	if err != nil {
		return 0, fmt.Errorf("floor (pid %d): %w", p.pid(), err)
	}
	reaped, err := statTicks(p.pid(), 16, 17)
	if err != nil {
		return 0, err
	}
	return time.Duration(live) + reaped, nil
}

// sum adds up f over the group's members (a member that exited meanwhile
// is left out).
func (p *floorProc) sum(f func(pid int) (int64, error)) (int64, error) {
	var total int64
	for i, pid := range p.members() {
		n, err := f(pid)
		if err != nil {
			if i == 0 {
				return 0, err
			}
			continue
		}
		total += n
	}
	return total, nil
}

// rssKiB is the group's VmRSS, its members' added up.
func (p *floorProc) rssKiB() (int64, error) {
	return p.sum(func(pid int) (int64, error) {
		st, err := loadStatus(pid)
		return st["VmRSS"], err
	})
}

// rchar is what the group read, all descriptors (/proc/<pid>/io).
func (p *floorProc) rchar() (int64, error) {
	return p.sum(func(pid int) (int64, error) {
		io, err := loadProcNumbers(pid, "io")
		return io["rchar"], err
	})
}

// sockets counts the group's open sockets.
func (p *floorProc) sockets() (int, error) {
	n, err := p.sum(func(pid int) (int64, error) {
		n, err := loadFDs(pid, "socket:")
		return int64(n), err
	})
	return int(n), err
}
