package takeover

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// plan reads what the handover rules need about a notification, cheapest
// first: most binds are decided by the address family or the port alone.
func (n *notifier) plan(nt notification) plan {
	reg := n.a.registration(n.swap)
	switch {
	case reg == nil:
		return passing(ReasonNoSwap, nil)
	case nt.nr != unix.SYS_BIND || nt.arch != nativeArch:
		return passing(ReasonOtherABI, nil)
	}
	raw, err := readSockaddr(nt.pid, nt.args[1], nt.args[2])
	if err != nil {
		return passing(ReasonUnreadable, err)
	}
	family, addr, ok := parseSockaddr(raw)
	if !ok {
		return passing(ReasonNotIP, nil)
	}
	p := plan{reg: reg, addr: addr}
	listened, err := reg.portListened(addr.Port())
	if err != nil || !listened {
		p.v, p.err = verdict{action: pass, reason: ReasonNoListener}, err
		return p
	}
	if p.olds, err = reg.listeners(addr.Port()); err != nil || len(p.olds) == 0 {
		p.v, p.err = verdict{action: pass, reason: ReasonNoListener}, err
		return p
	}
	c, err := n.caller(nt, &p, family)
	if err != nil {
		p.drop = isGone(err)
		p.v, p.err = verdict{action: pass, reason: ReasonUnreadable}, err
		return p
	}
	if p.installed {
		p.v = verdict{action: handOver, from: p.v.from}
		return p
	}
	p.v = decide(c, p.olds.infos())
	return p
}

// caller reads the calling process and its socket. The notification is
// checked to be still valid once the process is pinned by a pidfd, so
// that what is read is not a process that reused the thread id.
func (n *notifier) caller(nt notification, p *plan, family int) (bindCall, error) {
	st, err := readStatus(nt.pid)
	if err != nil {
		return bindCall{}, err
	}
	ns, err := netNS(nt.pid)
	if err != nil {
		return bindCall{}, err
	}
	pidfd, err := unix.PidfdOpen(st.tgid, 0)
	if err != nil {
		return bindCall{}, fmt.Errorf("pidfd of %d: %w", st.tgid, err)
	}
	defer unix.Close(pidfd)
	if err := n.idValid(nt.id); err != nil {
		return bindCall{}, err
	}
	p.tgid = st.tgid
	target := int(int32(nt.args[0]))
	c, err := unix.PidfdGetfd(pidfd, target, 0)
	if err != nil {
		return bindCall{}, fmt.Errorf("copy fd %d of %d: %w", target, st.tgid, err)
	}
	defer unix.Close(c)
	sock, err := inspect(c)
	if err != nil {
		return bindCall{}, fmt.Errorf("fd %d of %d: %w", target, st.tgid, err)
	}
	if i := p.olds.index(sock.ino); i >= 0 {
		p.installed, p.v.from = true, i
	}
	if p.cloexec, err = fdCloexec(st.tgid, target); err != nil {
		return bindCall{}, err
	}
	return bindCall{
		family: family, addr: p.addr, sock: sock,
		sameNetNS:  ns == p.reg.netns,
		privileged: int(p.addr.Port()) < p.reg.portStart && !st.canBindPrivileged(),
	}, nil
}

// infos returns the sockets' descriptions, for decide.
func (ls listeners) infos() []sockInfo {
	out := make([]sockInfo, len(ls))
	for i, l := range ls {
		out[i] = l.sockInfo
	}
	return out
}

// index finds the listener with inode ino, or -1.
func (ls listeners) index(ino uint64) int {
	for i, l := range ls {
		if l.ino == ino {
			return i
		}
	}
	return -1
}
