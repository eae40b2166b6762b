package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A slot gives a containerd instance a number that no other live instance on
// the machine holds, in any process: the bridge name ipd<N>, the subnet
// 10.213.<N>.0/24 and the CNI network name derive from it. It is an flock on
// /run/inplaced-test/slot-<N>.lock, released by the kernel when the process
// dies, so a lock file that can be taken but names a directory belongs to a
// harness that crashed: its leftovers are reaped when the slot is taken again.
type slot struct {
	n    int
	file *os.File
}

const maxSlots = 250

func slotDir() string {
	if d := os.Getenv("INPLACED_TEST_RUN_DIR"); d != "" {
		return d
	}
	return "/run/inplaced-test"
}

func bridgeName(n int) string { return fmt.Sprintf("ipd%d", n) }
func subnet(n int) string     { return fmt.Sprintf("10.213.%d.0/24", n) }
func subnet6(n int) string    { return fmt.Sprintf("fd00:213:%x::/64", n) }
func networkName(n int) string {
	return fmt.Sprintf("inplaced-test-%d", n)
}

// acquireSlot takes a free slot for an instance living in dir.
func acquireSlot(tb testing.TB, dir string) (*slot, error) {
	tb.Helper()
	if err := os.MkdirAll(slotDir(), 0o755); err != nil {
		return nil, err
	}
	for n := 1; n <= maxSlots; n++ {
		f, err := os.OpenFile(filepath.Join(slotDir(), fmt.Sprintf("slot-%d.lock", n)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue
			}
			return nil, fmt.Errorf("flock slot %d: %w", n, err)
		}
		s := &slot{n: n, file: f}
		s.reapStale(tb)
		if err := s.record(dir); err != nil {
			s.release()
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("all %d harness slots under %s are in use", maxSlots, slotDir())
}

func (s *slot) record(dir string) error {
	if err := s.file.Truncate(0); err != nil {
		return err
	}
	_, err := s.file.WriteAt([]byte(dir+"\n"), 0)
	return err
}

// reapStale removes what a crashed harness left in this slot: its processes
// (found by its directory), mounts, directory, bridge and CNI cache files.
func (s *slot) reapStale(tb testing.TB) {
	data := make([]byte, 4096)
	n, _ := s.file.ReadAt(data, 0)
	old := strings.TrimSpace(string(data[:n]))
	if old != "" && filepath.IsAbs(old) && strings.HasPrefix(filepath.Base(old), instanceDirPrefix) {
		if ps := procsOf(old); len(ps) > 0 {
			tb.Logf("slot %d: killing %d processes left by a crashed harness in %s", s.n, len(ps), old)
			if err := killInstanceProcs(old, 10*time.Second); err != nil {
				tb.Logf("slot %d: %v", s.n, err)
			}
		}
		if err := unmountUnder(old); err != nil {
			tb.Logf("slot %d: %v", s.n, err)
		} else if _, err := os.Stat(old); err == nil {
			tb.Logf("slot %d: removing %s left by a crashed harness", s.n, old)
			_ = os.RemoveAll(old)
		}
	}
	if linkExists(bridgeName(s.n)) {
		tb.Logf("slot %d: deleting bridge %s left by a crashed harness", s.n, bridgeName(s.n))
		if err := deleteLink(bridgeName(s.n)); err != nil {
			tb.Logf("slot %d: %v", s.n, err)
		}
	}
	removeCNICache(networkName(s.n))
}

func (s *slot) release() {
	if s == nil || s.file == nil {
		return
	}
	_ = s.file.Truncate(0)
	_ = syscall.Flock(int(s.file.Fd()), syscall.LOCK_UN)
	_ = s.file.Close()
	s.file = nil
}

// removeCNICache removes libcni's cached results of network netName
// (/var/lib/cni/results/<net>-<container>-<if>), normally gone after CNI DEL.
func removeCNICache(netName string) {
	matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", netName+"-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}
