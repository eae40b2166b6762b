package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// TestDamagedFileDegradesAndIsKept: a damaged state.db gives a store that
// refuses every call with the reason, leaves the file as it is, and comes
// back (a new file) once the damaged one is moved aside.
func TestDamagedFileDegradesAndIsKept(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	junk := bytes.Repeat([]byte("not a bbolt file "), 2048)
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("Open on a damaged file: want an error")
	}
	s := OpenOrDegrade(dir)
	defer s.Close()
	p := s.Problem()
	if p == nil || p.Cause != CauseDamaged || !strings.Contains(p.Action, "move it aside") {
		t.Fatalf("problem %+v, want damaged with the action", p)
	}
	if err := s.Usable(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Usable: %v, want ErrUnavailable", err)
	}
	if _, err := s.Overrides(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Overrides: %v, want ErrUnavailable", err)
	}
	if err := s.PutContainer("c1", containerReq("sb", "app")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("PutContainer: %v, want ErrUnavailable", err)
	}
	if s.Retry() {
		t.Error("Retry with the damaged file still there: want no repair")
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, junk) {
		t.Fatal("the damaged file was changed")
	}
	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	if !s.Retry() || s.Problem() != nil {
		t.Fatalf("Retry after the file was moved aside: problem %v", s.Problem())
	}
	if err := s.PutContainer("c1", containerReq("sb", "app")); err != nil {
		t.Errorf("PutContainer after repair: %v", err)
	}
	if got, _ := os.ReadFile(path + ".damaged"); !bytes.Equal(got, junk) {
		t.Error("the moved-aside file was changed")
	}
}

func TestCauses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Cause
	}{
		{&os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, CauseFull},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EROFS}, CauseReadOnly},
		{errors.New("bucket not found"), CauseOther},
	} {
		if got := causeOf(c.err); got != c.want {
			t.Errorf("causeOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// TestWriteFailureDegradesAndRetryRepairs: a filesystem that fills up while
// the store is in use makes it refuse (Usable) with the cause, reads still
// work, and Retry repairs it once space is freed. It mounts a small tmpfs.
func TestWriteFailureDegradesAndRetryRepairs(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to mount a small tmpfs (CI runs as root)")
		}
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	s := OpenOrDegrade(dir)
	defer s.Close()
	if p := s.Problem(); p != nil {
		t.Fatalf("fresh store: %v", p)
	}
	if err := s.PutContainer("c1", containerReq("sb", "app")); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	f.Close()
	// Records big enough that bbolt must grow its file.
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		werr = s.PutSwap(&inplacedv1.SwapRecord{Id: fmt.Sprintf("s%03d", i), Error: strings.Repeat("x", 16<<10)})
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writes on a full filesystem: %v, want ENOSPC", werr)
	}
	if p := s.Problem(); p == nil || p.Cause != CauseFull || !strings.Contains(p.Action, "free space") {
		t.Fatalf("problem after a failed write: %+v", p)
	}
	if err := s.Usable(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Usable: %v", err)
	}
	if _, err := s.Container("c1"); err != nil {
		t.Errorf("read on a full filesystem: %v", err)
	}
	if s.Retry() {
		t.Error("Retry while still full: want no repair")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if !s.Retry() || s.Usable() != nil {
		t.Fatalf("Retry after space was freed: %v", s.Problem())
	}
	if err := s.PutSwap(&inplacedv1.SwapRecord{Id: "after", Error: strings.Repeat("x", 16<<10)}); err != nil {
		t.Errorf("write after the repair: %v", err)
	}
}
