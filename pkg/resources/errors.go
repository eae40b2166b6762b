package resources

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrInvalidTarget: the cgroupsPath or driver cannot name a container cgroup.
	ErrInvalidTarget = errors.New("resources: invalid target")
	// ErrInvalidLimits: a value the kernel would reject; nothing was written.
	ErrInvalidLimits = errors.New("resources: invalid limits")
	// ErrBelowUsage: a memory limit would be lowered to or below what the
	// cgroup uses now; nothing was written. errors.As gives a *UsageError.
	ErrBelowUsage = errors.New("resources: memory limit at or below current usage")
	// ErrNotApplied: a file was written without error but reads back another
	// value (the kernel clamped or ignored it).
	ErrNotApplied = errors.New("resources: value not applied")
	// ErrRolledBack: Apply failed and every file it had written has its
	// previous value again. Reported by *ApplyError.
	ErrRolledBack = errors.New("resources: rolled back")
	// ErrRestoreFailed: Apply failed and could not restore every file; the
	// *ApplyError lists what is in effect now.
	ErrRestoreFailed = errors.New("resources: restore failed")
)

// UsageError is the refusal to lower a memory limit at or below usage.
type UsageError struct {
	Level     Level
	Cgroup    string // hierarchy-relative cgroup path
	Usage     uint64 // bytes in use when Apply read the cgroup
	Requested int64  // the limit that was refused, bytes
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("%v: %s %s uses %d bytes, requested limit %d bytes", ErrBelowUsage, e.Level, e.Cgroup, e.Usage, e.Requested)
}

func (e *UsageError) Unwrap() error { return ErrBelowUsage }

// ApplyError is a failed Apply. It says which write failed, what was undone,
// and what each touched file has now.
type ApplyError struct {
	Step, Steps int   // the failed write, 1-based, of Steps planned
	Failed      Write // the write that failed (or was not attempted, on cancellation)
	Err         error // why it failed
	Restored    []Write
	RestoreErr  error       // nil when every written file was restored
	InEffect    []FileValue // every touched file, read after the undo
}

// FileValue is one file's content as read after an undo.
type FileValue struct {
	Level Level
	Path  string
	Value string
	Err   error // the read failed; Value is empty
}

func (e *ApplyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resources: write %d of %d (%s) failed: %v", e.Step, e.Steps, e.Failed, e.Err)
	if e.RestoreErr != nil {
		fmt.Fprintf(&b, "; %v", e.RestoreErr)
	} else {
		fmt.Fprintf(&b, "; restored %d file(s) to their previous values", len(e.Restored))
	}
	b.WriteString("; in effect now:")
	for _, v := range e.InEffect {
		if v.Err != nil {
			fmt.Fprintf(&b, " %s %s=<unreadable: %v>", v.Level, v.Path, v.Err)
			continue
		}
		fmt.Fprintf(&b, " %s %s=%s", v.Level, v.Path, v.Value)
	}
	return b.String()
}

// Unwrap exposes the cause, and ErrRolledBack or the restore failure (which
// wraps ErrRestoreFailed), to errors.Is and errors.As.
func (e *ApplyError) Unwrap() []error {
	if e.RestoreErr != nil {
		return []error{e.Err, e.RestoreErr}
	}
	return []error{e.Err, ErrRolledBack}
}
