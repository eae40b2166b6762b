package takeover

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A notify fd's name says whose it is, so that an agent given the fd back
// (from systemd's fd store, after a restart) serves it as before:
//
//	takeover.<n>.<container id>.<swap>
//
// with the container id and the swap in unpadded base64url, so that the
// name has only the characters an fd store name may have (no ':'), and n
// telling apart the fds of one container (one per runc exec).
const namePrefix = "takeover."

// maxNameLen is systemd's limit on an fd store name (FDNAME_MAX).
const maxNameLen = 255

func fileName(seq int, container, swap string) string {
	enc := base64.RawURLEncoding
	return namePrefix + strconv.Itoa(seq) + "." + enc.EncodeToString([]byte(container)) + "." + enc.EncodeToString([]byte(swap))
}

// parseFileName reads a name fileName made.
func parseFileName(name string) (seq int, container, swap string, err error) {
	rest, ok := strings.CutPrefix(name, namePrefix)
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 3 {
		return 0, "", "", fmt.Errorf("notify fd name %q: not %s<n>.<container>.<swap>", name, namePrefix)
	}
	enc := base64.RawURLEncoding
	c, cerr := enc.DecodeString(parts[1])
	s, serr := enc.DecodeString(parts[2])
	seq, nerr := strconv.Atoi(parts[0])
	if err := errors.Join(nerr, cerr, serr); err != nil {
		return 0, "", "", fmt.Errorf("notify fd name %q: %w", name, err)
	}
	return seq, string(c), string(s), nil
}

// attach serves notify fd fd of container, whose profile named swap; pid
// is the process runc started (0 when unknown).
func (a *Agent) attach(fd int, container, swap string, pid int) error {
	a.mu.Lock()
	a.seq++
	name := fileName(a.seq, container, swap)
	a.mu.Unlock()
	return a.serveFile(fd, name, container, swap, pid)
}

// serveFile starts the loop of one notify fd, owning fd.
func (a *Agent) serveFile(fd int, name, container, swap string, pid int) error {
	if err := isNotifyFD(fd); err != nil {
		unix.Close(fd)
		return err
	}
	// Non-blocking makes os.File put it in the runtime's poller: a loop
	// waiting for binds holds no thread. (RECV itself is only called
	// when poll says a notification is there.)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("notify fd %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("notify fd %s: %w", name, err)
	}
	n := &notifier{a: a, name: name, container: container, swap: swap, f: f, rc: rc, buf: make([]byte, a.sizes.notif)}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		f.Close()
		return errors.New("takeover agent: closed")
	}
	a.notifiers[name] = n
	a.mu.Unlock()
	if len(name) > maxNameLen {
		a.log.Warn("takeover: notify fd name too long for an fd store", zap.String("name", name))
	}
	a.log.Info("takeover: notify fd attached", zap.String("container_id", container), zap.String("swap_id", swap),
		zap.String("name", name), zap.Int("pid", pid))
	// Before the loop starts: a handler that stores the fd (File) does so
	// before any of its binds is answered.
	a.emit(Event{Kind: Attached, At: time.Now(), Name: name, Container: container, Swap: swap, Pid: pid})
	if !a.spawn(&a.loops, n.serve) {
		a.forget(n)
		return errors.New("takeover agent: closed")
	}
	return nil
}

// isNotifyFD checks that fd is a seccomp notify fd.
func isNotifyFD(fd int) error {
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return fmt.Errorf("notify fd: %w", err)
	}
	if link != "anon_inode:seccomp notify" {
		return fmt.Errorf("fd %d is %q, not a seccomp notify fd", fd, link)
	}
	return nil
}

// forget drops a notifier and closes its fd.
func (a *Agent) forget(n *notifier) {
	a.mu.Lock()
	delete(a.notifiers, n.name)
	a.mu.Unlock()
	n.close()
}

// File returns a copy of the notify fd called name, for an fd store: the
// filter's notifications keep waiting for an agent as long as one copy is
// open. The caller closes it.
func (a *Agent) File(name string) (*os.File, error) {
	a.mu.Lock()
	n, ok := a.notifiers[name]
	a.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("takeover: no notify fd %q", name)
	}
	return n.dup()
}

// Files returns a copy of every notify fd the agent serves, by name.
func (a *Agent) Files() (map[string]*os.File, error) {
	a.mu.Lock()
	ns := make([]*notifier, 0, len(a.notifiers))
	for _, n := range a.notifiers {
		ns = append(ns, n)
	}
	a.mu.Unlock()
	out := make(map[string]*os.File, len(ns))
	for _, n := range ns {
		f, err := n.dup()
		if err != nil {
			for _, g := range out {
				g.Close()
			}
			return nil, err
		}
		out[n.name] = f
	}
	return out, nil
}

// Adopt serves a notify fd a previous agent served (from File or Files,
// through an fd store or in-process), under its name. It owns f. Hand a
// copy over only once the previous agent is closed: two agents reading one
// fd would each get some of the binds.
func (a *Agent) Adopt(name string, f *os.File) error {
	defer f.Close()
	seq, container, swap, err := parseFileName(name)
	if err != nil {
		return fmt.Errorf("takeover: adopt: %w", err)
	}
	// Through SyscallConn, not Fd: Fd would make the file description,
	// shared with every copy, blocking.
	fd, err := dupFile(f)
	if err != nil {
		return fmt.Errorf("takeover: adopt %s: %w", name, err)
	}
	a.mu.Lock()
	_, taken := a.notifiers[name]
	a.seq = max(a.seq, seq)
	a.mu.Unlock()
	if taken {
		unix.Close(fd)
		return fmt.Errorf("takeover: adopt %s: served already", name)
	}
	if err := a.serveFile(fd, name, container, swap, 0); err != nil {
		return fmt.Errorf("takeover: adopt: %w", err)
	}
	return nil
}

// dupFile duplicates f's fd (close-on-exec).
func dupFile(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(raw uintptr) { fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return fd, derr
}
