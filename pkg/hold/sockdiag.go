package hold

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// listener is a listening TCP socket as sock_diag reports it.
type listener struct {
	family uint8
	port   uint16
	inode  uint32
	// rqueue is the accept queue: connections the kernel completed that the
	// application has not accepted yet; backlog is its length as listen()
	// set it (sk_max_ack_backlog: the queue holds backlog+1).
	rqueue, backlog uint32
	// v6only and anyAddr say which families an AF_INET6 socket takes: one
	// bound to [::] without IPV6_V6ONLY takes IPv4 too.
	v6only, anyAddr bool
}

// Families a listener takes connections for.
const (
	takesV4 = 1 << iota
	takesV6
)

// takes is the families the listener takes.
func (l listener) takes() int {
	switch {
	case l.family == unix.AF_INET:
		return takesV4
	case !l.v6only && l.anyAddr:
		return takesV4 | takesV6
	}
	return takesV6
}

// diag is a NETLINK_SOCK_DIAG socket in one network namespace.
type diag struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	buf []byte
}

const (
	tcpListen = 10 // TCP_LISTEN in the kernel's tcp_states.h

	sizeofInetDiagReqV2 = 56 // struct inet_diag_req_v2
	sizeofInetDiagMsg   = 72 // struct inet_diag_msg
	inetDiagSkV6Only    = 11 // INET_DIAG_SKV6ONLY: the kernel adds it for every AF_INET6 socket
)

func newDiag() (*diag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	// A dump is answered at once; the timeout only guards against a kernel
	// that never answers.
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sock_diag bind: %w", err)
	}
	return &diag{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (d *diag) close() { unix.Close(d.fd) }

// listeners dumps the TCP sockets in LISTEN state, IPv4 and IPv6.
func (d *diag) listeners() ([]listener, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []listener
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		ls, err := d.dump(fam)
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	return out, nil
}

func (d *diag) dump(family uint8) ([]listener, error) {
	req := make([]byte, sizeofInetDiagReqV2)
	req[0] = family
	req[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:8], 1<<tcpListen)
	d.seq++
	m := nlMsg{typ: unix.SOCK_DIAG_BY_FAMILY, flags: unix.NLM_F_REQUEST | unix.NLM_F_DUMP, seq: d.seq, data: req}
	if err := unix.Sendto(d.fd, m.marshal(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	var out []listener
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag dump: %w", err)
		}
		msgs, err := parseMsgs(d.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != d.seq {
				continue // a late answer to an earlier request
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				return nil, fmt.Errorf("sock_diag dump: %w", nlError(m))
			case unix.SOCK_DIAG_BY_FAMILY:
				if len(m.data) < sizeofInetDiagMsg {
					continue
				}
				out = append(out, parseListener(m.data))
			}
		}
	}
}

// parseListener reads an inet_diag_msg and its attributes.
func parseListener(b []byte) listener {
	l := listener{
		family:  b[0],
		port:    binary.BigEndian.Uint16(b[4:6]),
		anyAddr: allZero(b[8:24]),
		rqueue:  binary.NativeEndian.Uint32(b[56:60]),
		backlog: binary.NativeEndian.Uint32(b[60:64]),
		inode:   binary.NativeEndian.Uint32(b[68:72]),
	}
	attrs(b[sizeofInetDiagMsg:], func(typ uint16, v []byte) {
		if typ == inetDiagSkV6Only && len(v) > 0 {
			l.v6only = v[0] != 0
		}
	})
	return l
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
