package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// Systemd is the host's service manager, as the plans use it. Stop,
// Disable and ResetFailed of a unit systemd does not know succeed.
type Systemd interface {
	Reload(ctx context.Context) error
	Enable(ctx context.Context, units []string) error
	Disable(ctx context.Context, units []string) error
	// Start, Stop and Restart return when systemd's job has finished.
	Start(ctx context.Context, unit string) error
	Stop(ctx context.Context, unit string) error
	Restart(ctx context.Context, unit string) error
	ResetFailed(ctx context.Context, unit string) error
	Unit(ctx context.Context, name string) (UnitState, error)
}

// CRI asks a CRI socket (a path in the installer's view) for its version.
type CRI interface {
	Version(ctx context.Context, socket string) (string, error)
}

// Node is this node's object in the API.
type Node interface {
	Get(ctx context.Context) (*corev1.Node, error)
	// Annotate sets key to value, or removes it for nil.
	Annotate(ctx context.Context, key string, value *string) error
	Event(ctx context.Context, eventType, reason, message string) error
}

// Swaps lists the swaps an inplaced runs, through its control socket (a
// path in the installer's view).
type Swaps interface {
	Running(ctx context.Context, socket string) ([]string, error)
}

// Kernel is what an uninstall checks is left in the kernel.
type Kernel interface {
	// RemoveHoldTables deletes every inplaced_hold_* table in every network
	// namespace and says which it found.
	RemoveHoldTables(ctx context.Context) ([]string, error)
	// Mounts lists the mounts at or under paths (host paths).
	Mounts(ctx context.Context, paths []string) ([]string, error)
}

// Executor runs plans on the host whose root is Root.
type Executor struct {
	Root    string
	Systemd Systemd
	CRI     CRI
	// Node is nil when no API server is at hand: the annotation and the
	// event are then skipped, and the Ready wait checks only the unit.
	Node   Node
	Kernel Kernel
	Swaps  Swaps
	Log    *zap.Logger
	Now    func() time.Time
	// CRITimeout bounds the wait for inplaced to answer, ReadyTimeout the
	// wait for the Node to be Ready after kubelet's restart, APITimeout
	// each write to the API (retried meanwhile), SwapTimeout the wait for
	// running swaps before inplaced stops for good, UnitTimeout each
	// systemd job (k3s's units start with no timeout of their own), UndoTimeout
	// the undo.
	CRITimeout, ReadyTimeout, APITimeout, SwapTimeout, UnitTimeout, UndoTimeout time.Duration
	// Poll is the pause between tries of a wait.
	Poll time.Duration
}

// fileUndo puts one file back: from backup when it existed, else removed.
type fileUndo struct {
	path, backup string
	existed      bool
}

// run is one plan's execution.
type run struct {
	e         *Executor
	plan      *Plan
	phase     int
	undoable  bool
	files     map[int][]fileUndo
	dirs      map[int][]string // directories made, deepest first
	restarted map[string]time.Time
	notes     []string
}

const (
	backupSuffix = ".inplaced-installer-undo"
	tmpSuffix    = ".inplaced-installer-tmp"
)

// Run does p. When a step fails in one of the plan's undoable phases,
// that phase and every earlier one are undone, with a context the caller's
// cancellation does not end; the error says what failed and whether the
// undo did its part. What Run found worth telling (hold tables removed, a
// mount left) goes into the plan's Event and the log.
func (e *Executor) Run(ctx context.Context, p *Plan) error {
	x := &run{e: e, plan: p, files: map[int][]fileUndo{}, dirs: map[int][]string{}, restarted: map[string]time.Time{}}
	for i, ph := range p.Phases {
		x.phase, x.undoable = i, i < p.Undoable
		for _, s := range ph.Steps {
			e.log().Info("step", zap.String("phase", ph.Name), zap.String("step", s.String()))
			if err := x.do(ctx, s); err != nil {
				err = fmt.Errorf("%s: %s: %w", ph.Name, s.Op, err)
				if !x.undoable {
					return err
				}
				return x.rollback(ctx, i, err)
			}
		}
		if i+1 == p.Undoable {
			x.commit()
		}
	}
	x.commit()
	return nil
}

func (x *run) rollback(ctx context.Context, failed int, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.e.undoTimeout())
	defer cancel()
	x.e.log().Warn("undoing", zap.Error(cause))
	var errs []error
	for i := failed; i >= 0; i-- {
		ph := x.plan.Phases[i]
		x.phase, x.undoable = i, false
		errs = append(errs, x.undoSteps(ctx, ph.UndoBefore)...)
		errs = append(errs, x.restoreFiles(i)...)
		errs = append(errs, x.undoSteps(ctx, ph.UndoAfter)...)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w; the undo failed too: %w", cause, err)
	}
	return fmt.Errorf("%w (undone: the node is as it was)", cause)
}

func (x *run) undoSteps(ctx context.Context, steps []Step) []error {
	var errs []error
	for _, s := range steps {
		x.e.log().Info("undo step", zap.String("step", s.String()))
		if err := x.do(ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
	}
	return errs
}

func (x *run) restoreFiles(phase int) []error {
	var errs []error
	fu := x.files[phase]
	for i := len(fu) - 1; i >= 0; i-- {
		u := fu[i]
		var err error
		if u.existed {
			err = os.Rename(u.backup, u.path)
		} else {
			err = os.Remove(u.path)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, d := range x.dirs[phase] {
		_ = os.Remove(d) // only when empty: left when someone else put a file there
	}
	delete(x.files, phase)
	delete(x.dirs, phase)
	return errs
}

// commit drops the backups: what is done stays.
func (x *run) commit() {
	for ph, fu := range x.files {
		for _, u := range fu {
			if u.existed {
				_ = os.Remove(u.backup)
			}
		}
		delete(x.files, ph)
	}
	x.dirs = map[int][]string{}
}

func (x *run) do(ctx context.Context, s Step) error {
	sd := x.e.Systemd
	switch s.Op {
	case OpWrite:
		return x.write(s)
	case OpRemove:
		return x.remove(s.Path)
	case OpRemoveAll:
		p, err := hostPath(x.e.Root, s.Path, true)
		if err != nil {
			return err
		}
		return os.RemoveAll(p)
	case OpRemoveEmptyDir:
		p, err := hostPath(x.e.Root, s.Path, true)
		if err != nil {
			return err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !isNotEmpty(err) {
			return err
		}
		return nil
	case OpReload:
		return sd.Reload(ctx)
	case OpEnable:
		return sd.Enable(ctx, s.Units)
	case OpDisable:
		return sd.Disable(ctx, s.Units)
	case OpStart, OpStop, OpRestart:
		return x.job(ctx, s)
	case OpResetFailed:
		return x.resetFailed(ctx, s.Units)
	}
	return x.doCheck(ctx, s)
}

// job starts, stops or restarts a unit, waiting at most UnitTimeout for
// systemd's job to finish.
func (x *run) job(ctx context.Context, s Step) error {
	ctx, cancel := context.WithTimeout(ctx, x.e.unitTimeout())
	defer cancel()
	u := s.Units[0]
	switch s.Op {
	case OpStart:
		return x.e.Systemd.Start(ctx, u)
	case OpStop:
		return x.e.Systemd.Stop(ctx, u)
	}
	x.restarted[u] = x.e.now()
	return x.e.Systemd.Restart(ctx, u)
}

func (x *run) doCheck(ctx context.Context, s Step) error {
	switch s.Op {
	case OpWaitCRI:
		return x.waitCRI(ctx, s.Path)
	case OpWaitReady:
		return x.waitReady(ctx, s.Units[0])
	case OpWaitSwaps:
		x.waitSwaps(ctx, s.Path)
		return nil
	case OpRemoveHolds:
		found, err := x.e.Kernel.RemoveHoldTables(ctx)
		if len(found) > 0 {
			x.note("removed hold tables a killed inplaced left: " + strings.Join(found, ", "))
		}
		return err
	case OpCheckMounts:
		m, err := x.e.Kernel.Mounts(ctx, s.Paths)
		if len(m) > 0 {
			x.note("mounts left under inplaced's directories: " + strings.Join(m, ", "))
		}
		return err
	case OpAnnotate:
		return x.api(ctx, func(ctx context.Context) error { return x.e.Node.Annotate(ctx, AnnotationInstalled, s.Value) })
	case OpEvent:
		typ, msg := s.EventType, s.Message
		if len(x.notes) > 0 {
			typ, msg = corev1.EventTypeWarning, msg+"; "+strings.Join(x.notes, "; ")
		}
		return x.api(ctx, func(ctx context.Context) error { return x.e.Node.Event(ctx, typ, s.Reason, msg) })
	}
	return fmt.Errorf("unknown step %q", s.Op)
}

func (x *run) note(s string) {
	x.e.log().Warn(s)
	x.notes = append(x.notes, s)
}

func (x *run) resetFailed(ctx context.Context, units []string) error {
	var errs []error
	for _, u := range units {
		errs = append(errs, x.e.Systemd.ResetFailed(ctx, u))
	}
	return errors.Join(errs...)
}

// write replaces a file atomically: the new content goes to a temporary
// file beside it, renamed over the old one, which a hard link keeps as the
// backup until the plan is done (a running binary keeps its old inode).
func (x *run) write(s Step) error {
	p, err := hostPath(x.e.Root, s.Path, false)
	if err != nil {
		return err
	}
	if err := x.mkdirs(filepath.Dir(p)); err != nil {
		return err
	}
	if x.undoable {
		backup := p + backupSuffix
		_ = os.Remove(backup) // a killed run's
		existed := true
		if err := os.Link(p, backup); errors.Is(err, fs.ErrNotExist) {
			existed = false
		} else if err != nil {
			return err
		}
		x.files[x.phase] = append(x.files[x.phase], fileUndo{path: p, backup: backup, existed: existed})
	}
	tmp := p + tmpSuffix
	if err := x.writeTmp(tmp, s); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, p)
}

func (x *run) writeTmp(tmp string, s Step) error {
	mode := s.Mode
	if mode == 0 {
		mode = 0o644
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	defer f.Close()
	if s.Data != nil || s.Source == "" {
		_, err = f.Write(s.Data)
	} else {
		err = copyFrom(f, s.Source)
	}
	if err == nil {
		err = f.Chmod(mode) // the umask does not decide a binary's mode
	}
	if err == nil {
		err = f.Sync()
	}
	return err
}

func copyFrom(w io.Writer, src string) error {
	r, err := os.Open(src)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(w, r)
	return err
}

// remove takes a file away: into its backup in an undoable phase.
func (x *run) remove(rel string) error {
	p, err := hostPath(x.e.Root, rel, true)
	if err != nil {
		return err
	}
	backup := p + backupSuffix
	_ = os.Remove(backup)
	if !x.undoable {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := os.Rename(p, backup); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	x.files[x.phase] = append(x.files[x.phase], fileUndo{path: p, backup: backup, existed: true})
	return nil
}

// mkdirs makes dir and the parents missing, remembering which it made.
func (x *run) mkdirs(dir string) error {
	var made []string
	for d := dir; d != x.e.Root && d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if x.undoable {
		x.dirs[x.phase] = append(x.dirs[x.phase], made...)
	}
	return nil
}

func (x *run) waitCRI(ctx context.Context, socket string) error {
	var last error
	err := poll(ctx, x.e.CRITimeout, x.e.poll(), func(ctx context.Context) (bool, error) {
		p, err := hostPath(x.e.Root, socket, false)
		if err != nil {
			return false, err
		}
		v, err := x.e.CRI.Version(ctx, p)
		if err != nil {
			last = err
			return false, nil
		}
		x.e.log().Info("inplaced answers CRI", zap.String("runtime", v))
		return true, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%s did not answer CRI Version within %s: %w", socket, x.e.CRITimeout, last)
	}
	return err
}

// waitSwaps gives swaps in flight SwapTimeout to end. An inplaced that
// does not answer runs none; one still running at the end is cut by the
// stop, and said so.
func (x *run) waitSwaps(ctx context.Context, socket string) {
	if x.e.Swaps == nil {
		return
	}
	var running []string
	_ = poll(ctx, x.e.SwapTimeout, x.e.poll(), func(ctx context.Context) (bool, error) {
		p, err := hostPath(x.e.Root, socket, false)
		if err != nil {
			return true, nil
		}
		r, err := x.e.Swaps.Running(ctx, p)
		running = r
		return err != nil || len(r) == 0, nil
	})
	if len(running) > 0 {
		x.note(fmt.Sprintf("swaps still running when inplaced stopped (kubelet restarts their containers from the pod spec): %s",
			strings.Join(running, ", ")))
	}
}

// waitReady waits for the Node's Ready condition with a heartbeat after
// the unit's restart: kubelet reports Ready only once its runtime answered
// CRI Status, so that is kubelet working through the new endpoint.
func (x *run) waitReady(ctx context.Context, unit string) error {
	since := x.restarted[unit]
	if x.e.Node == nil {
		st, err := x.e.Systemd.Unit(ctx, unit)
		if err == nil && !st.running() {
			err = fmt.Errorf("%s is %s", unit, st.Active)
		}
		x.e.log().Warn("no API server: kubelet's readiness not checked, only its unit")
		return err
	}
	var last string
	err := poll(ctx, x.e.ReadyTimeout, x.e.poll(), func(ctx context.Context) (bool, error) {
		n, err := x.e.Node.Get(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ok, why := readySince(n, since)
		last = why
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("the Node was not Ready after %s restarted (%s): %w", unit, last, err)
	}
	return nil
}

// readySince says whether n is Ready with a heartbeat at or after since
// (to the second, as the API keeps it).
func readySince(n *corev1.Node, since time.Time) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status != corev1.ConditionTrue {
			return false, fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
		}
		if c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
			return false, "no heartbeat since the restart yet"
		}
		return true, ""
	}
	return false, "no Ready condition"
}

// api runs an API write, retried until APITimeout: a k3s server restarts
// its API server along with kubelet.
func (x *run) api(ctx context.Context, fn func(context.Context) error) error {
	if x.e.Node == nil {
		x.e.log().Warn("no API server: the Node's record is not written")
		return nil
	}
	var last error
	err := poll(ctx, x.e.APITimeout, x.e.poll(), func(ctx context.Context) (bool, error) {
		last = fn(ctx)
		return last == nil, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// poll calls fn every interval until it says done, fails, or timeout ends.
func poll(ctx context.Context, timeout, interval time.Duration, fn func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := fn(ctx)
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (e *Executor) log() *zap.Logger {
	if e.Log == nil {
		return zap.NewNop()
	}
	return e.Log
}

func (e *Executor) now() time.Time {
	if e.Now == nil {
		return time.Now()
	}
	return e.Now()
}

func (e *Executor) poll() time.Duration {
	if e.Poll <= 0 {
		return time.Second
	}
	return e.Poll
}

func (e *Executor) unitTimeout() time.Duration {
	if e.UnitTimeout <= 0 {
		return 5 * time.Minute
	}
	return e.UnitTimeout
}

func (e *Executor) undoTimeout() time.Duration {
	if e.UndoTimeout <= 0 {
		return 5 * time.Minute
	}
	return e.UndoTimeout
}

func isNotEmpty(err error) bool { return errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) }
