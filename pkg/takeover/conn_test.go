package takeover

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// connPair is runc's end and the agent's end of one connection.
func connPair(t *testing.T) (runc, agent *net.UnixConn) {
	t.Helper()
	dir, err := os.MkdirTemp("", "tk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	runc, err = net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	agent, err = ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { runc.Close(); agent.Close() })
	return runc, agent
}

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A state as runc sends it, split over two writes with the fds on the
// first, and runc's end left open: the message ends where the JSON parses.
func TestReadProcessState(t *testing.T) {
	for _, c := range []struct {
		name    string
		fdNames []string
		want    int // index of the fd returned; -1: an error
		split   bool
	}{
		{"one fd", []string{specs.SeccompFdName}, 0, false},
		{"split over two writes", []string{specs.SeccompFdName}, 0, true},
		{"seccompFd second of two", []string{"other", specs.SeccompFdName}, 1, true},
		{"no seccompFd", []string{"other"}, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			runcEnd, agentEnd := connPair(t)
			var pipes []*os.File
			var fds []int
			for range c.fdNames {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer w.Close()
				pipes = append(pipes, r)
				fds = append(fds, int(r.Fd()))
			}
			st := specs.ContainerProcessState{Version: "1.0.2", Fds: c.fdNames, Pid: 42, Metadata: "swap-1",
				State: specs.State{ID: "ctr", Pid: 42, Annotations: map[string]string{"io.kubernetes.cri.sandbox-id": strings.Repeat("a", 64)}}}
			b, _ := json.Marshal(st)
			first, rest := b, []byte(nil)
			if c.split {
				first, rest = b[:len(b)/2], b[len(b)/2:]
			}
			if _, _, err := runcEnd.WriteMsgUnix(first, unix.UnixRights(fds...), nil); err != nil {
				t.Fatal(err)
			}
			if rest != nil {
				if _, err := runcEnd.Write(rest); err != nil {
					t.Fatal(err)
				}
			}
			got, fd, err := readProcessState(agentEnd)
			if c.want < 0 {
				if err == nil {
					t.Fatalf("no error, fd %d", fd)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if got.Metadata != "swap-1" || got.State.ID != "ctr" || got.Pid != 42 {
				t.Errorf("state %+v", got)
			}
			if inode(t, fd) != inode(t, int(pipes[c.want].Fd())) {
				t.Errorf("the fd returned is not the %s one", c.fdNames[c.want])
			}
		})
	}
}

// A connection closed before the JSON is whole is an error, not a wait.
func TestReadProcessStateTruncated(t *testing.T) {
	runcEnd, agentEnd := connPair(t)
	if _, err := runcEnd.Write([]byte(`{"ociVersion":"1.0.2","fds":["seccompFd"]`)); err != nil {
		t.Fatal(err)
	}
	runcEnd.Close()
	if _, fd, err := readProcessState(agentEnd); err == nil {
		t.Fatalf("no error, fd %d", fd)
	}
}

func TestFileName(t *testing.T) {
	id := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct{ container, swap string }{
		{id, "swap-7f3a"},
		{"a.b:c", "x.y/z:w"},
		{id, strings.Repeat("s", MaxSwapLen)},
	} {
		name := fileName(12, c.container, c.swap)
		if len(name) > maxNameLen || strings.ContainsAny(name, ": ") {
			t.Errorf("%q: %d bytes, or a character an fd store name may not have", name, len(name))
		}
		seq, container, swap, err := parseFileName(name)
		if err != nil || seq != 12 || container != c.container || swap != c.swap {
			t.Errorf("%q: %d %q %q %v", name, seq, container, swap, err)
		}
	}
	for _, bad := range []string{"", "takeover.1.x", "other.1.YQ.YQ", "takeover.x.YQ.YQ", "takeover.1.!!.YQ"} {
		if _, _, _, err := parseFileName(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestKernelSizes(t *testing.T) {
	s, err := kernelSizes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel: seccomp_notif %d, seccomp_notif_resp %d, seccomp_data %d bytes", s.notif, s.resp, s.data)
	if err := (notifSizes{notif: 72, resp: 24, data: 64}).check(); err == nil {
		t.Error("a struct seccomp_notif smaller than ours passes")
	}
}
