package swap

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestExitWatch: wait reports the exit only once the process is gone and
// its cgroup is empty, and gives up when the stop is answered first.
func TestExitWatch(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(procs, []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &exitWatch{pidfd: fd, procs: procs}
	defer w.close()

	// Still running: the answer comes first.
	done := make(chan struct{})
	go func() { time.Sleep(50 * time.Millisecond); close(done) }()
	if w.wait(done) {
		t.Fatal("wait reported an exit while the process runs")
	}

	// Exited, but a process is left in the cgroup: not yet.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	got := make(chan bool, 1)
	go func() { got <- w.wait(make(chan struct{})) }()
	select {
	case <-got:
		t.Fatal("wait reported the exit while the cgroup still held a process")
	case <-time.After(100 * time.Millisecond):
	}
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("wait gave up instead of reporting the exit")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("wait did not report the exit once the cgroup was empty")
	}
}
