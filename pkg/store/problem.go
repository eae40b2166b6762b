package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ErrUnavailable is returned by every call on a store that cannot be used
// now; the wrapped text says why and what to do.
var ErrUnavailable = errors.New("state store unavailable")

// errDamaged marks what bbolt found wrong inside the file (a failed
// consistency check, a panic on a bad page).
var errDamaged = errors.New("damaged")

// RetryInterval is how often the daemon calls Retry on an unusable store;
// the operator's actions name it.
const RetryInterval = 5 * time.Second

// lockTimeout bounds the wait for the file lock another process has taken.
const lockTimeout = 2 * time.Second

// probeSize is what probeWrite writes: a bbolt commit writes a few pages.
const probeSize = 64 << 10

// Cause is what kind of trouble the store is in.
type Cause string

// Causes, each with its own operator action.
const (
	CauseDamaged  Cause = "damaged"
	CauseFull     Cause = "full"
	CauseReadOnly Cause = "read-only"
	CauseLocked   Cause = "locked"
	CauseDenied   Cause = "permission-denied"
	CauseIO       Cause = "io-error"
	CauseOther    Cause = "other"
)

// Problem is why the store cannot be used, in an operator's words.
type Problem struct {
	Cause Cause
	Err   error
	// Path is the state file.
	Path string
	// Action is what the operator does about it.
	Action string
	// Since is when the trouble was first seen.
	Since time.Time
}

func (p *Problem) Error() string {
	return fmt.Sprintf("%s: %v; %s", p.Path, p.Err, p.Action)
}

func (p *Problem) Unwrap() error { return p.Err }

func newProblem(path string, err error) *Problem {
	p := &Problem{Cause: causeOf(err), Err: err, Path: path, Since: time.Now()}
	dir := filepath.Dir(path)
	every := fmt.Sprintf("inplaced retries every %s and resumes swaps on its own", RetryInterval)
	switch p.Cause {
	case CauseDamaged:
		p.Action = fmt.Sprintf("the file is damaged and is kept as it is: move it aside (mv %s %s.damaged) and inplaced "+
			"creates a new one within %s (swap history and overrides in the old file are not carried over)", path, path, RetryInterval)
	case CauseFull:
		p.Action = fmt.Sprintf("the filesystem of %s is full: free space on it; %s", dir, every)
	case CauseReadOnly:
		p.Action = fmt.Sprintf("the filesystem of %s is read-only: remount it read-write (or give a writable --state-dir and restart inplaced); %s", dir, every)
	case CauseLocked:
		p.Action = fmt.Sprintf("another process holds %s locked (a second inplaced?): stop it; %s", path, every)
	case CauseDenied:
		p.Action = fmt.Sprintf("inplaced may not write %s: give it (root) read-write access; %s", dir, every)
	case CauseIO:
		p.Action = fmt.Sprintf("the disk of %s returns I/O errors: check it (dmesg); %s", dir, every)
	default:
		p.Action = fmt.Sprintf("fix the cause; %s", every)
	}
	return p
}

// keepSince keeps the first sighting of a trouble that goes on.
func keepSince(old, p *Problem) *Problem {
	if old != nil && old.Cause == p.Cause {
		p.Since = old.Since
	}
	return p
}

func causeOf(err error) Cause {
	switch {
	case errors.Is(err, errDamaged), errors.Is(err, bolt.ErrInvalid), errors.Is(err, bolt.ErrChecksum),
		errors.Is(err, bolt.ErrVersionMismatch), errors.Is(err, bolt.ErrInvalidMapping):
		return CauseDamaged
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return CauseFull
	case errors.Is(err, syscall.EROFS):
		return CauseReadOnly
	case errors.Is(err, bolt.ErrTimeout):
		return CauseLocked
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return CauseDenied
	case errors.Is(err, syscall.EIO):
		return CauseIO
	}
	return CauseOther
}

// isStorageError tells a failure of the file or filesystem (which makes
// the store unusable) from a bad key or a missing record (which does not).
func isStorageError(err error) bool {
	return causeOf(err) != CauseOther
}

// probeWrite checks that the filesystem of dir takes a write of a few
// pages: bbolt reuses pages inside its file, so a commit can succeed on a
// full filesystem until the file must grow, and an open can succeed on one
// that refuses every write.
func probeWrite(dir string) error {
	f, err := os.CreateTemp(dir, ".state.db.probe-*")
	if err != nil {
		return fmt.Errorf("write to %s: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(make([]byte, probeSize)); err != nil {
		return fmt.Errorf("write to %s: %w", dir, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	return nil
}
