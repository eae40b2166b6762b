package takeover

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/inplaced/inplaced/test/harness"
)

// The agent's socket: root's alone, one agent at a time, a stale file
// replaced, removed at Close only while it is the agent's own.
func TestListenSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.WriteFile(sock, nil, 0o644); err != nil { // stale
		t.Fatal(err)
	}
	a, err := Listen(Config{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve() }()
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v mode %v", err, fi.Mode())
	}
	if b, err := Listen(Config{Socket: sock}); err == nil {
		b.Close()
		t.Fatal("a second agent listened on a served socket")
	}
	if err := a.Register(Old{Swap: "", Pid: os.Getpid()}); err == nil {
		t.Error("registered a swap with no name")
	}
	files, err := a.Detach()
	if err != nil || len(files) != 0 {
		t.Fatalf("detach with no container: %v %v", files, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve after detach: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after close: %v", err)
	}
	if err := a.Close(); err == nil {
		t.Error("closed twice without an error")
	}
}

// The old container's listening sockets are looked for in its network
// namespace only: a socket of another (a process that reused an old pid)
// is not one.
func TestScanListenersNetNS(t *testing.T) {
	harness.Require(t, "root", os.Geteuid() == 0, "pidfd_getfd and SIOCGSKNS need root")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	mine, err := netNS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ls, err := scanListeners([]int{os.Getpid()}, port, mine)
	if err != nil || len(ls) != 1 || ls[0].addr.Port() != port || !ls[0].listening {
		t.Fatalf("in its own namespace: %+v %v", ls, err)
	}
	ls.close()
	other := mine
	other.ino++
	if ls, err := scanListeners([]int{os.Getpid()}, port, other); err != nil || len(ls) != 0 {
		ls.close()
		t.Fatalf("in another namespace: %+v %v", ls, err)
	}
}
