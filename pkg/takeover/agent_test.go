package takeover

import (
	"os"
	"path/filepath"
	"testing"
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
