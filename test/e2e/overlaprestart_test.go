package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// fdStore stands in for systemd's file descriptor store: it keeps the fds
// inplaced sends to NOTIFY_SOCKET with FDSTORE=1 under their FDNAME, and
// drops those it is told to with FDSTOREREMOVE=1.
type fdStore struct {
	path string
	c    *net.UnixConn

	mu    sync.Mutex
	files map[string]*os.File
}

func startFDStore(t *testing.T) *fdStore {
	t.Helper()
	dir, err := os.MkdirTemp("", "fds") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	s := &fdStore{path: filepath.Join(dir, "notify"), files: map[string]*os.File{}}
	if s.c, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"}); err != nil {
		t.Fatal(err)
	}
	go s.serve()
	t.Cleanup(func() {
		s.c.Close()
		os.RemoveAll(dir)
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, f := range s.files {
			f.Close()
		}
	})
	return s
}

func (s *fdStore) serve() {
	b, oob := make([]byte, 4096), make([]byte, 4096)
	for {
		n, oobn, _, _, err := s.c.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			rights, _ := unix.ParseUnixRights(&m)
			fds = append(fds, rights...)
		}
		s.note(string(b[:n]), fds)
	}
}

func (s *fdStore) note(msg string, fds []int) {
	vars := map[string]string{}
	for _, l := range strings.Split(msg, "\n") {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name := vars["FDNAME"]
	switch {
	case vars["FDSTORE"] == "1" && len(fds) == 1:
		if old := s.files[name]; old != nil {
			old.Close()
		}
		s.files[name] = os.NewFile(uintptr(fds[0]), name)
		return
	case vars["FDSTOREREMOVE"] == "1":
		if f := s.files[name]; f != nil {
			f.Close()
			delete(s.files, name)
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// stored are the fds held, by name order.
func (s *fdStore) stored() []*os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*os.File
	for _, f := range s.files {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// TestOverlapAgentRestart: a container swapped with overlap keeps its
// bind trap for life, and inplaced's takeover agent answers its binds. The
// agent keeps each notify fd in systemd's fd store (a stand-in here), so
// that after a kill -9 of inplaced a bind() in the container waits rather
// than fails with ENOSYS, and the restarted inplaced, given the stored fds
// back, answers it; exec into the container works again.
func TestOverlapAgentRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		store := startFDStore(t)
		notify := "NOTIFY_SOCKET=" + store.path
		e := newEnv(t, c, notify)
		p := runPod(t, e.cri, "overlap-restart", e.imgs.App1, podOpts{annotations: overlapAnnotation, args: overlapArgs})
		sb, _ := sandboxInfo(t, e.cri, p.sandboxID)
		ip := sb.GetNetwork().GetIp()
		url := func(port int, path string) string {
			return fmt.Sprintf("http://%s/%s", net.JoinHostPort(ip, fmt.Sprint(port)), path)
		}
		eventually(t, 20*time.Second, "v1 answering", func() error { _, err := httpGet(url(8080, "version")); return err })
		out, err := e.px.Ctl("swap", p.name, "-c", "app", "-o", "json", "--image", e.imgs.App2)
		r := parseOverlap(t, out)
		if err != nil || r.State != "SWAP_STATE_COMMITTED" || r.Strategy != "overlap" {
			t.Fatalf("swap: %v; %s %s, strategy %s (%s)", err, r.State, r.Error, r.Strategy, r.StrategyWhy)
		}
		var kept []string
		for _, f := range store.stored() {
			kept = append(kept, f.Name())
		}
		if len(kept) == 0 || !strings.HasPrefix(kept[0], "takeover.") {
			t.Fatalf("fd store holds %v: want the new container's notify fd", kept)
		}
		// With the agent serving: a bind of a new port continues in the
		// kernel.
		if got, err := httpGet(url(8080, "listen?port=9091")); err != nil || !strings.Contains(got, "listening") {
			t.Fatalf("bind with the agent serving: %q %v", got, err)
		}

		if err := e.px.Kill(); err != nil {
			t.Fatal(err)
		}
		// No agent: the bind waits on the stored fd.
		bound := make(chan string, 1)
		go func() {
			got, err := httpGetWithin(url(8080, "listen?port=9092"), 60*time.Second)
			bound <- fmt.Sprintf("%s %v", strings.TrimSpace(got), err)
		}()
		select {
		case got := <-bound:
			t.Fatalf("a bind with no agent ended at once (%s): want it to wait for the next inplaced", got)
		case <-time.After(time.Second):
		}
		e.px.Stored = store.stored()
		if err := e.px.Start(notify); err != nil {
			t.Fatalf("restart inplaced: %v\n%s", err, e.px.LogTail(40))
		}
		select {
		case got := <-bound:
			if !strings.Contains(got, "listening") {
				t.Fatalf("the waiting bind after the restart: %s", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the waiting bind was not answered by the restarted inplaced\n%s", e.px.LogTail(40))
		}
		for _, port := range []int{9092, 8080} {
			if v, err := httpGet(url(port, "version")); err != nil || strings.TrimSpace(v) != "v2" {
				t.Errorf("port %d: %q %v", port, v, err)
			}
		}
		if got, err := httpGet(url(8080, "listen?port=9093")); err != nil || !strings.Contains(got, "listening") {
			t.Errorf("a later bind: %q %v", got, err)
		}
		res, err := e.cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: r.NewContainerID, Cmd: []string{"cat", "/VERSION"}, Timeout: 10})
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "v2" {
			t.Errorf("exec into the swapped container: %v, %+v", err, res)
		}
	})
}

// httpGetWithin is httpGet with another timeout.
func httpGetWithin(url string, d time.Duration) (string, error) {
	c := &http.Client{Timeout: d}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}
