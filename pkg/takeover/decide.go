package takeover

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// Reason says why a bind was passed through or refused.
type Reason string

// Why a bind continued in the kernel: nothing of the old container's is in
// its way.
const (
	ReasonNoSwap     Reason = "no swap registered for the container"
	ReasonNotIP      Reason = "not an IP address"
	ReasonOtherABI   Reason = "a bind of another ABI than the agent's (32-bit x86)"
	ReasonNotTCP     Reason = "not a TCP socket"
	ReasonBound      Reason = "the socket is bound already"
	ReasonOtherNetNS Reason = "another network namespace than the old container's"
	ReasonNoListener Reason = "no listening socket of the old container on the port"
	ReasonUnreadable Reason = "the call could not be read"
)

// Why a port the old container listens on is not handed over: the bind
// waits (see Agent).
const (
	ReasonFamily     Reason = "the old socket's address family differs"
	ReasonAddress    Reason = "the old socket's address differs"
	ReasonV6Only     Reason = "the old socket's IPV6_V6ONLY differs"
	ReasonBlocking   Reason = "the old socket's blocking mode differs"
	ReasonShared     Reason = "the old container has several listening sockets on the address (SO_REUSEPORT)"
	ReasonPrivileged Reason = "the port is privileged and the new process lacks CAP_NET_BIND_SERVICE"
	ReasonFailed     Reason = "installing the socket failed"
)

// Why a waiting bind continued.
const (
	ReasonReleased     Reason = "the old container no longer listens on the port"
	ReasonDeadline     Reason = "the deadline passed"
	ReasonUnregistered Reason = "the swap was unregistered"
	ReasonClosing      Reason = "the agent is closing"
)

// What the agent does with a bind.
type action int

const (
	pass     action = iota // continue in the kernel
	handOver               // install the old listening socket, answer 0
	wait                   // wait for the old socket to go, then continue
)

// bindCall is a trapped bind() and what the agent learnt about it.
type bindCall struct {
	family int            // of the address
	addr   netip.AddrPort // the address
	sock   sockInfo       // the new process's socket
	// sameNetNS: the process is in the old container's network namespace.
	sameNetNS bool
	// privileged: the port is below the namespace's
	// ip_unprivileged_port_start and the process lacks CAP_NET_BIND_SERVICE.
	privileged bool
}

// verdict is decide's answer; from indexes the listener to hand over.
type verdict struct {
	action action
	reason Reason
	from   int
}

// decide applies the handover rules to a bind and the old container's
// listening sockets on its port: a pure function of what the agent read.
func decide(c bindCall, olds []sockInfo) verdict {
	switch {
	case !c.sock.inet() || c.family != c.sock.domain:
		return verdict{action: pass, reason: ReasonNotIP}
	case !c.sock.tcp():
		return verdict{action: pass, reason: ReasonNotTCP}
	case c.sock.addr.Port() != 0:
		return verdict{action: pass, reason: ReasonBound}
	case !c.sameNetNS:
		return verdict{action: pass, reason: ReasonOtherNetNS}
	}
	var occupants []int
	for i, o := range olds {
		if occupies(o, c.sock, c.addr) {
			occupants = append(occupants, i)
		}
	}
	if len(occupants) == 0 {
		return verdict{action: pass, reason: ReasonNoListener}
	}
	if c.privileged {
		return verdict{action: wait, reason: ReasonPrivileged}
	}
	match, why := -1, Reason("")
	for _, i := range occupants {
		switch r := mismatch(olds[i], c.sock, c.addr); {
		case r != "":
			why = cmpOr(why, r)
		case match >= 0:
			return verdict{action: wait, reason: ReasonShared}
		default:
			match = i
		}
	}
	if match < 0 {
		return verdict{action: wait, reason: why}
	}
	return verdict{action: handOver, from: match}
}

func cmpOr(a, b Reason) Reason {
	if a != "" {
		return a
	}
	return b
}

// occupies reports whether the listening socket old makes the kernel
// refuse (EADDRINUSE) a bind of sock to addr: whether the port, for that
// address, is the old container's.
func occupies(old, sock sockInfo, addr netip.AddrPort) bool {
	if old.addr.Port() != addr.Port() {
		return false
	}
	oa, na := old.addr.Addr(), addr.Addr()
	if old.domain == sock.domain {
		return oa.IsUnspecified() || na.IsUnspecified() || oa == na
	}
	// One of each family: the AF_INET6 one takes IPv4 when it is not
	// V6ONLY and bound to the wildcard or to a v4-mapped address.
	v6, v6only, v4 := oa, old.v6only, na
	if sock.domain == unix.AF_INET6 {
		v6, v6only, v4 = na, sock.v6only, oa
	}
	switch {
	case v6only:
		return false
	case v6.IsUnspecified():
		return true
	case v6.Is4In6():
		return v4.IsUnspecified() || v6.Unmap() == v4
	}
	return false
}

// mismatch says why old cannot stand in for sock bound to addr, or "".
func mismatch(old, sock sockInfo, addr netip.AddrPort) Reason {
	switch {
	case old.domain != sock.domain:
		return ReasonFamily
	case old.addr.Addr() != addr.Addr():
		return ReasonAddress
	case old.domain == unix.AF_INET6 && old.v6only != sock.v6only:
		return ReasonV6Only
	case old.nonblock != sock.nonblock:
		return ReasonBlocking
	}
	return ""
}
