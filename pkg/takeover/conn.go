package takeover

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// What runc sends (runc 1.1 and later, crun, youki): one message on a
// fresh connection, the ContainerProcessState JSON with the notify fd by
// SCM_RIGHTS at the index of "seccompFd" in its fds. runc 1.1.5 does not
// close its end afterwards, so the message ends where the JSON parses,
// not at EOF.
const (
	maxStateLen  = 1 << 20 // annotations make it a few KiB; more is not runc
	maxFds       = 16
	stateTimeout = 5 * time.Second
)

// attachConn reads runc's message and serves the notify fd it carries.
func (a *Agent) attachConn(c *net.UnixConn) {
	defer c.Close()
	if err := rootPeer(c); err != nil {
		a.log.Warn("takeover: connection refused", zap.Error(err))
		return
	}
	st, fd, err := readProcessState(c)
	if err != nil {
		a.log.Warn("takeover: runc's message", zap.Error(err))
		return
	}
	if err := a.attach(fd, st.State.ID, st.Metadata, st.Pid); err != nil {
		a.log.Warn("takeover: notify fd", zap.String("container_id", st.State.ID), zap.Error(err))
	}
}

// rootPeer refuses a peer other than root: the fds it sends decide which
// sockets the agent hands to whom.
func rootPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if cred.Uid != 0 {
		return fmt.Errorf("peer pid %d uid %d is not root", cred.Pid, cred.Uid)
	}
	return nil
}

// readProcessState reads one message: the state and its seccomp fd (the
// other fds, if any, are closed).
func readProcessState(c *net.UnixConn) (specs.ContainerProcessState, int, error) {
	var st specs.ContainerProcessState
	if err := c.SetReadDeadline(time.Now().Add(stateTimeout)); err != nil {
		return st, -1, fmt.Errorf("container state: %w", err)
	}
	data, fds, err := readMessage(c, func(b []byte) bool { return json.Unmarshal(b, &st) == nil })
	if err != nil {
		closeFds(fds)
		return st, -1, err
	}
	i := slices.Index(st.Fds, specs.SeccompFdName)
	if i < 0 || i >= len(fds) {
		closeFds(fds)
		return st, -1, fmt.Errorf("container state of %s: no %s among %d fds %q (%d bytes)",
			st.State.ID, specs.SeccompFdName, len(fds), st.Fds, len(data))
	}
	fd := fds[i]
	closeFds(slices.Delete(fds, i, i+1))
	return st, fd, nil
}

// readMessage reads until complete says the data is whole, collecting the
// fds of every control message on the way.
func readMessage(c *net.UnixConn, complete func([]byte) bool) ([]byte, []int, error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxFds))
	var data []byte
	var fds []int
	for len(data) < maxStateLen {
		n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
		got, perr := rights(oob[:oobn])
		fds = append(fds, got...)
		data = append(data, buf[:n]...)
		switch {
		case perr != nil:
			return data, fds, fmt.Errorf("container state: %w", perr)
		case flags&unix.MSG_CTRUNC != 0:
			return data, fds, errors.New("container state: control message truncated")
		case n > 0 && complete(data):
			return data, fds, nil
		case err != nil:
			return data, fds, fmt.Errorf("container state after %d bytes: %w", len(data), err)
		}
	}
	return data, fds, fmt.Errorf("container state: over %d bytes", maxStateLen)
}

// rights returns the fds of the SCM_RIGHTS messages in oob.
func rights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var out []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			return out, fmt.Errorf("control message: %w", err)
		}
		out = append(out, fds...)
	}
	return out, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
