package takeover

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sockInfo is what a handover compares of two sockets.
type sockInfo struct {
	domain, typ, protocol int
	listening             bool
	v6only                bool // AF_INET6 only
	nonblock              bool // O_NONBLOCK of the open file description
	addr                  netip.AddrPort
	ino                   uint64 // the socket's inode: its identity
}

// tcp reports whether the socket is TCP or MPTCP (Go 1.24 and later listen
// with MPTCP where the kernel has it, falling back to TCP).
func (s sockInfo) tcp() bool {
	return s.typ == unix.SOCK_STREAM && (s.protocol == unix.IPPROTO_TCP || s.protocol == unix.IPPROTO_MPTCP)
}

func (s sockInfo) inet() bool { return s.domain == unix.AF_INET || s.domain == unix.AF_INET6 }

// inspect reads a socket's kind, state, flags and address. A socket that
// is not AF_INET/AF_INET6 is returned with its domain only.
func inspect(fd int) (sockInfo, error) {
	var s sockInfo
	var err error
	if s.domain, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil {
		return s, fmt.Errorf("socket domain: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return s, fmt.Errorf("socket inode: %w", err)
	}
	s.ino = st.Ino
	if !s.inet() {
		return s, nil
	}
	for _, o := range []struct {
		level, opt int
		v          *int
	}{
		{unix.SOL_SOCKET, unix.SO_TYPE, &s.typ},
		{unix.SOL_SOCKET, unix.SO_PROTOCOL, &s.protocol},
	} {
		if *o.v, err = unix.GetsockoptInt(fd, o.level, o.opt); err != nil {
			return s, fmt.Errorf("socket option %d: %w", o.opt, err)
		}
	}
	return s, inspectInet(fd, &s)
}

// inspectInet reads what an AF_INET/AF_INET6 socket adds.
func inspectInet(fd int, s *sockInfo) error {
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Errorf("socket listening: %w", err)
	}
	s.listening = acc != 0
	if s.domain == unix.AF_INET6 {
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
		if err != nil {
			return fmt.Errorf("socket IPV6_V6ONLY: %w", err)
		}
		s.v6only = v != 0
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("socket flags: %w", err)
	}
	s.nonblock = fl&unix.O_NONBLOCK != 0
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("socket address: %w", err)
	}
	s.addr = addrPort(sa)
	return nil
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// oldListener is a listening socket of the old container, copied into the
// agent by pidfd_getfd.
type oldListener struct {
	sockInfo
	pid, fd int // a process that has it open and its fd number there
	copy    int // the agent's copy: close it
}

// listeners is a scan's result; close releases the agent's copies (which
// keep the sockets open while the agent has them).
type listeners []oldListener

func (ls listeners) close() {
	for _, l := range ls {
		unix.Close(l.copy)
	}
}

// scanListeners copies the listening TCP/MPTCP sockets on port in network
// namespace ns open in the processes pids (each socket once, where several
// processes share it). A process that exits meanwhile is skipped. The
// namespace is the socket's own: a pid listed earlier may have been
// reused by a process of another pod by now.
func scanListeners(pids []int, port uint16, ns nsID) (listeners, error) {
	seen := map[string]bool{}
	var out listeners
	for _, pid := range pids {
		ls, err := scanProcess(pid, port, ns, seen)
		if err != nil {
			out.close()
			return nil, err
		}
		out = append(out, ls...)
	}
	return out, nil
}

func scanProcess(pid int, port uint16, ns nsID, seen map[string]bool) (listeners, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil // gone, or a kernel thread
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, nil // exited since the directory was read
	}
	defer unix.Close(pidfd)
	var out listeners
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") || seen[link] {
			continue
		}
		seen[link] = true
		fd, _ := strconv.Atoi(e.Name())
		l, ok, err := copyListener(pidfd, pid, fd, port, ns)
		if err != nil {
			out.close()
			return nil, err
		}
		if ok {
			out = append(out, l)
		}
	}
	return out, nil
}

// copyListener copies fd of the process and keeps it when it is a TCP
// socket listening on port in network namespace ns.
func copyListener(pidfd, pid, fd int, port uint16, ns nsID) (oldListener, bool, error) {
	c, err := unix.PidfdGetfd(pidfd, fd, 0)
	if errors.Is(err, unix.EBADF) || errors.Is(err, unix.ESRCH) {
		return oldListener{}, false, nil // closed, or the process exited
	}
	if err != nil {
		return oldListener{}, false, fmt.Errorf("copy fd %d of %d: %w", fd, pid, err)
	}
	s, err := inspect(c)
	if err != nil || !s.inet() || !s.tcp() || !s.listening || s.addr.Port() != port || !inNetNS(c, ns) {
		unix.Close(c)
		// A socket the agent cannot read is not one to hand over.
		return oldListener{}, false, nil
	}
	return oldListener{sockInfo: s, pid: pid, fd: fd, copy: c}, true, nil
}

// inNetNS reports whether socket fd belongs to network namespace ns
// (SIOCGSKNS opens the socket's namespace).
func inNetNS(fd int, ns nsID) bool {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return false
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	return unix.Fstat(nsfd, &st) == nil && nsID{dev: st.Dev, ino: st.Ino} == ns
}
