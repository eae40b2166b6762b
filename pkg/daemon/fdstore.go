package daemon

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fdStore keeps file descriptors in systemd's file descriptor store
// (sd_notify FDSTORE=1, FDNAME=): systemd holds them while inplaced is
// down and passes them back, named, to the next process (LISTEN_FDS,
// LISTEN_FDNAMES). The unit's FileDescriptorStoreMax= must allow them.
// Without $NOTIFY_SOCKET (not run by systemd) it keeps nothing.
type fdStore struct {
	socket string // $NOTIFY_SOCKET; "" for none
}

func newFDStore() fdStore { return fdStore{socket: os.Getenv("NOTIFY_SOCKET")} }

// enabled reports whether there is a store to keep fds in.
func (s fdStore) enabled() bool { return s.socket != "" }

// put hands systemd a copy of f under name (f stays the caller's).
func (s fdStore) put(name string, f *os.File) error {
	if !s.enabled() {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("fd store %s: %w", name, err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = s.send("FDSTORE=1\nFDNAME="+name, int(fd)) }); err != nil {
		return fmt.Errorf("fd store %s: %w", name, err)
	}
	if serr != nil {
		return fmt.Errorf("fd store %s: %w", name, serr)
	}
	return nil
}

// remove drops the fds called name from the store.
func (s fdStore) remove(name string) error {
	if !s.enabled() {
		return nil
	}
	if err := s.send("FDSTOREREMOVE=1\nFDNAME="+name, -1); err != nil {
		return fmt.Errorf("fd store: remove %s: %w", name, err)
	}
	return nil
}

// send writes one notification, with fd (when not -1) as SCM_RIGHTS.
func (s fdStore) send(state string, fd int) error {
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("notify socket: %w", err)
	}
	defer unix.Close(sock)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if err := unix.Sendmsg(sock, []byte(state), oob, &unix.SockaddrUnix{Name: s.socket} /* "@…": abstract */, 0); err != nil {
		return fmt.Errorf("notify socket %s: %w", s.socket, err)
	}
	return nil
}
