package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/swap"
	"github.com/inplaced/inplaced/pkg/takeover"
)

// taker is package takeover's agent behind the engine's Taker interface,
// so that the engine stays free of seccomp and netlink and testable with a
// fake. One agent serves every overlap swap of the node; the events of its
// binds go to the swap that registered them.
type taker struct {
	socket string
	agent  *takeover.Agent
	err    error // why there is no agent (fail open: swaps run stop-first)
	log    *zap.Logger
	// store keeps a copy of every notify fd in systemd's fd store, so that
	// the trapped containers' binds wait for the next inplaced rather than
	// fail (ENOSYS) once this one is gone; adopted are the names it passed
	// back at the start, stored already.
	store   fdStore
	adopted map[string]bool

	mu   sync.Mutex
	subs map[string]func(swap.TakeoverEvent)
}

// newTaker listens on socket, in a directory only root may enter, and
// serves again the notify fds systemd passed back from its fd store (the
// files named takeover.*; it returns the others). An agent that cannot be
// made is not fatal: every overlap swap then runs stop-first, its record
// saying why.
func newTaker(socket string, store fdStore, files []*os.File, log *zap.Logger) (*taker, []*os.File) {
	t := &taker{socket: socket, log: log, store: store, adopted: map[string]bool{}, subs: map[string]func(swap.TakeoverEvent){}}
	if err := rootOnlyDir(filepath.Dir(socket)); err != nil {
		t.err = err
	} else {
		t.agent, t.err = takeover.Listen(takeover.Config{Socket: socket, Logger: log, OnEvent: t.onEvent})
	}
	if t.err != nil {
		log.Warn("takeover agent not running: overlap swaps run stop-first", zap.String("socket", socket), zap.Error(t.err))
	}
	return t, t.adopt(files)
}

// adopt serves the stored notify fds among files and returns the rest.
// Without an agent they are closed: systemd's store keeps its own copies,
// and the containers' binds wait for an inplaced that serves them.
func (t *taker) adopt(files []*os.File) []*os.File {
	var rest []*os.File
	for _, f := range files {
		name := f.Name()
		if !strings.HasPrefix(name, "takeover.") {
			rest = append(rest, f)
			continue
		}
		if t.agent == nil {
			f.Close()
			continue
		}
		t.mu.Lock()
		t.adopted[name] = true
		t.mu.Unlock()
		if err := t.agent.Adopt(name, f); err != nil {
			t.log.Error("a stored notify fd not served: its container's binds wait", zap.String("name", name), zap.Error(err))
			continue
		}
		t.log.Info("serving a stored notify fd again", zap.String("name", name))
	}
	return rest
}

// rootOnlyDir makes dir, or checks that it is root's and nobody else may
// write into it: runc hands the agent behind the socket every trapped
// container's notify fd.
func rootOnlyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("takeover socket directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("takeover socket directory: %w", err)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("takeover socket directory %s is writable by others than its owner (%s): make it 0755 or tighter", dir, fi.Mode().Perm())
	}
	return nil
}

// serve serves runc's connections until close.
func (t *taker) serve() {
	if t.agent == nil {
		return
	}
	if err := t.agent.Serve(); err != nil {
		t.log.Error("takeover agent stopped serving: new overlap swaps' containers cannot start", zap.Error(err))
	}
}

// close closes the agent: the notify fds of the containers it served close
// with it (their later binds fail with ENOSYS until an fd store keeps
// them, see docs/takeover.md).
func (t *taker) close() {
	if t.agent == nil {
		return
	}
	if err := t.agent.Close(); err != nil {
		t.log.Warn("close the takeover agent", zap.Error(err))
	}
}

func (t *taker) Running() string {
	if t.err != nil {
		return t.err.Error()
	}
	return ""
}

// Profile is the pod's own seccomp profile with the bind trap.
func (t *taker) Profile(base swap.SeccompBase, swapID string) ([]byte, error) {
	var b *specs.LinuxSeccomp
	switch base.Kind {
	case runtimeapi.SecurityProfile_RuntimeDefault:
		b = takeover.RuntimeDefault(base.Capabilities)
	case runtimeapi.SecurityProfile_Localhost:
		raw, err := os.ReadFile(base.Path)
		if err != nil {
			return nil, fmt.Errorf("the pod's Localhost seccomp profile: %w", err)
		}
		b = &specs.LinuxSeccomp{}
		if err := json.Unmarshal(raw, b); err != nil {
			return nil, fmt.Errorf("the pod's Localhost seccomp profile %s: %w", base.Path, err)
		}
	default:
		b = takeover.Unconfined()
	}
	return takeover.Profile(b, t.socket, swapID)
}

func (t *taker) Register(swapID string, pid int, deadline time.Time, events func(swap.TakeoverEvent)) error {
	if t.agent == nil {
		return errors.New("takeover agent not running")
	}
	t.mu.Lock()
	t.subs[swapID] = events
	t.mu.Unlock()
	if err := t.agent.Register(takeover.Old{Swap: swapID, Pid: pid, Deadline: deadline}); err != nil {
		t.mu.Lock()
		delete(t.subs, swapID)
		t.mu.Unlock()
		return err
	}
	return nil
}

func (t *taker) Unregister(swapID string) {
	if t.agent != nil {
		t.agent.Unregister(swapID)
	}
	t.mu.Lock()
	delete(t.subs, swapID)
	t.mu.Unlock()
}

// keep puts a notify fd that arrived in the fd store, and takes out one
// whose processes are all gone. Called before the fd's first bind is
// answered.
func (t *taker) keep(e takeover.Event) {
	if !t.store.enabled() {
		return
	}
	var err error
	switch e.Kind {
	case takeover.Attached:
		t.mu.Lock()
		stored := t.adopted[e.Name]
		t.mu.Unlock()
		if stored {
			return
		}
		var f *os.File
		if f, err = t.agent.File(e.Name); err == nil {
			err = t.store.put(e.Name, f)
			f.Close()
		}
	case takeover.Detached:
		t.mu.Lock()
		delete(t.adopted, e.Name)
		t.mu.Unlock()
		err = t.store.remove(e.Name)
	}
	if err != nil {
		t.log.Error("systemd's fd store: the container's binds fail (ENOSYS) once inplaced stops", zap.String("name", e.Name), zap.Error(err))
	}
}

// onEvent passes a swap its handovers and refusals, and logs what the
// agent does.
func (t *taker) onEvent(e takeover.Event) {
	fields := []zap.Field{zap.String("event", string(e.Kind)), zap.String("swap_id", e.Swap), zap.String("container_id", e.Container),
		zap.String("addr", e.Addr.String()), zap.String("reason", string(e.Reason)), zap.Duration("took", e.Took)}
	if e.Err != nil {
		fields = append(fields, zap.Error(e.Err))
	}
	switch e.Kind {
	case takeover.HandedOver, takeover.Refused, takeover.Attached, takeover.Detached:
		t.log.Info("takeover", fields...)
	default:
		t.log.Debug("takeover", fields...)
	}
	t.keep(e)
	if e.Kind != takeover.HandedOver && e.Kind != takeover.Refused {
		return
	}
	t.mu.Lock()
	f := t.subs[e.Swap]
	t.mu.Unlock()
	if f != nil {
		f(swap.TakeoverEvent{HandedOver: e.Kind == takeover.HandedOver, Port: e.Addr.Port(), Reason: string(e.Reason)})
	}
}
