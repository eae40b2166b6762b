package resources

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Result is what Apply did.
type Result struct {
	// Before is what Apply read: the state after the runtime's own update.
	Before Current
	// Writes are the files written, in order, each with its content before
	// (From) and after (To). Every one was read back and matched. Empty when
	// the runtime had already applied everything.
	Writes []Write
}

// ApplyOption modifies one Apply.
type ApplyOption func(*applyOpts)

type applyOpts struct{ beforeContainer func(context.Context) }

// BeforeContainer runs f once during Apply, after every write that raises the
// pod (memory, CPU limit, CPU request alike) and before the first write of the
// container's files or of a pod lowering — the moment to let the runtime
// change the container itself: the pod has room for it, and the container is
// not yet lowered below the pod's coming values. Writes planned before f ran
// that f made unnecessary (the file already has the value) are skipped.
// f runs even when there is nothing to write; it does not run when Apply
// refuses or fails before reaching it.
func BeforeContainer(f func(context.Context)) ApplyOption {
	return func(o *applyOpts) { o.beforeContainer = f }
}

// Apply reads t's cgroups, plans the writes that make them match want (see
// Plan; prev is optional) and performs them in order, all or nothing: each
// file is read back after it is written, and on the first failure every file
// already written is restored, newest first, before an *ApplyError is
// returned that says what is in effect now. A refusal (ErrBelowUsage,
// ErrInvalidLimits, ErrInvalidTarget) or a read error writes nothing.
//
// With the systemd driver each write also sets the matching property of the
// cgroup's unit first (see Systemd), and each restore puts it back.
//
// A file that already has its planned value is not written again, and is
// not in Result.Writes.
//
// ctx is checked between writes; once writing has begun the restore runs to
// the end whatever ctx says, because an undo that can be cancelled leaves a
// half-resized container behind.
func (m *Manager) Apply(ctx context.Context, t Target, want Limits, prev *Limits, opts ...ApplyOption) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("resources: apply: %w", err)
	}
	var o applyOpts
	for _, opt := range opts {
		opt(&o)
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	cur, err := m.Read(t)
	if err != nil {
		return Result{}, err
	}
	res := Result{Before: cur}
	plan, err := m.Plan(cur, want, prev)
	if err != nil {
		return res, err
	}
	hook := len(plan) // where beforeContainer runs
	if o.beforeContainer != nil {
		var raises, rest []Write
		for _, w := range plan {
			if w.podRaise {
				raises = append(raises, w)
			} else {
				rest = append(rest, w)
			}
		}
		plan, hook = append(raises, rest...), len(raises)
	}
	done := make([]Write, 0, len(plan))
	for i := 0; i <= len(plan); i++ {
		if i == hook && o.beforeContainer != nil {
			o.beforeContainer(ctx)
		}
		if i == len(plan) {
			break
		}
		w := plan[i]
		if err := ctx.Err(); err != nil {
			return res, m.undo(i+1, len(plan), w, fmt.Errorf("not attempted: %w", err), done, false)
		}
		w, changed, skipped, err := m.writeChecked(w)
		if err != nil {
			return res, m.undo(i+1, len(plan), w, err, done, changed)
		}
		if !skipped {
			done = append(done, w)
		}
	}
	res.Writes = done
	return res, nil
}

// writeChecked performs one write and reads it back. From is re-read just
// before writing, so a restore puts back what was really there; a file that
// already has To is left alone (skipped). changed reports that the file or
// the unit may no longer have From, so the undo must cover it too.
func (m *Manager) writeChecked(w Write) (_ Write, changed, skipped bool, _ error) {
	before, err := m.fs.ReadFile(w.Path)
	if err != nil {
		return w, false, false, fmt.Errorf("read before writing: %w", err)
	}
	w.From = strings.TrimSpace(string(before))
	if m.sameContent(w.File, w.From, w.To) {
		return w, false, true, nil
	}
	// systemd first: it writes the file too, possibly rounded; ours is exact.
	if err := m.setUnit(w, w.To); err != nil {
		return w, true, false, err
	}
	if err := m.fs.WriteFile(w.Path, []byte(w.To)); err != nil {
		return w, w.Unit != "" && m.systemd != nil, false, fmt.Errorf("write %q: %w", w.To, err)
	}
	return w, true, false, m.verify(w.Path, w.File, w.To)
}

// verify reads path back and compares it with what was written. Its errors
// name no path: the caller's message already does.
func (m *Manager) verify(path, file, want string) error {
	got, err := m.fs.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if !m.sameContent(file, string(got), want) {
		return fmt.Errorf("%w: reads %q after writing %q", ErrNotApplied, strings.TrimSpace(string(got)), want)
	}
	return nil
}

// undo restores the writes in done, newest first, and builds the error that
// tells the caller what is in effect now.
func (m *Manager) undo(step, steps int, failed Write, cause error, done []Write, failedChanged bool) error {
	e := &ApplyError{Step: step, Steps: steps, Failed: failed, Err: cause}
	toRestore := done
	if failedChanged {
		toRestore = append(toRestore[:len(toRestore):len(toRestore)], failed)
	}
	var errs []error
	for i := len(toRestore) - 1; i >= 0; i-- {
		w := toRestore[i]
		if err := m.setUnit(w, w.From); err != nil {
			errs = append(errs, fmt.Errorf("restore %s to %q: %w", w.Path, w.From, err))
		}
		if err := m.fs.WriteFile(w.Path, []byte(w.From)); err != nil {
			errs = append(errs, fmt.Errorf("restore %s to %q: %w", w.Path, w.From, err))
			continue
		}
		if err := m.verify(w.Path, w.File, w.From); err != nil {
			errs = append(errs, fmt.Errorf("restore %s to %q: %w", w.Path, w.From, err))
			continue
		}
		e.Restored = append(e.Restored, w)
	}
	if len(errs) > 0 {
		e.RestoreErr = fmt.Errorf("%w: %w", ErrRestoreFailed, errors.Join(errs...))
	}
	// The failed file is reported too: it is the one the caller will ask about.
	for _, w := range append(done[:len(done):len(done)], failed) {
		v := FileValue{Level: w.Level, Path: w.Path}
		if b, err := m.fs.ReadFile(w.Path); err != nil {
			v.Err = err
		} else {
			v.Value = strings.TrimSpace(string(b))
		}
		e.InEffect = append(e.InEffect, v)
	}
	return e
}
