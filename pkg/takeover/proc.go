package takeover

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// What the agent reads about a process from /proc. The agent runs in the
// host's PID namespace, where a notification's pid is a host thread id.

// sizeofSockaddrMax is how much of a bind()'s address is read: an
// AF_INET6 address is 28 bytes, sockaddr_storage 128.
const sizeofSockaddrMax = 128

// readSockaddr reads the address a bind() passes (args[1], args[2]) from
// the thread's memory: process_vm_readv, one syscall, or /proc/TID/mem
// where that is refused.
func readSockaddr(tid int, addr, length uint64) ([]byte, error) {
	n := int(min(length, sizeofSockaddrMax))
	if n < 2 {
		return nil, fmt.Errorf("bind address of thread %d: %d bytes", tid, length)
	}
	b := make([]byte, n)
	local := []unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(n)
	got, err := unix.ProcessVMReadv(tid, local, []unix.RemoteIovec{{Base: uintptr(addr), Len: n}}, 0)
	if err == nil && got > 0 {
		return b[:got], nil
	}
	return readMem(tid, addr, b)
}

// readMem reads len(b) bytes at addr of the thread's memory from /proc.
func readMem(tid int, addr uint64, b []byte) ([]byte, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", tid))
	if err != nil {
		return nil, fmt.Errorf("memory of thread %d: %w", tid, err)
	}
	defer f.Close()
	n, err := f.ReadAt(b, int64(addr))
	if n == 0 {
		return nil, fmt.Errorf("bind address of thread %d at %#x: %w", tid, addr, err)
	}
	return b[:n], nil
}

// parseSockaddr decodes an AF_INET or AF_INET6 sockaddr; ok is false for
// any other family (and for a truncated one, which the kernel refuses).
func parseSockaddr(b []byte) (family int, ap netip.AddrPort, ok bool) {
	if len(b) < 2 {
		return 0, netip.AddrPort{}, false
	}
	family = int(binary.NativeEndian.Uint16(b[0:2]))
	switch {
	case family == unix.AF_INET && len(b) >= unix.SizeofSockaddrInet4:
		port := binary.BigEndian.Uint16(b[2:4])
		return family, netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), true
	case family == unix.AF_INET6 && len(b) >= unix.SizeofSockaddrInet6:
		port := binary.BigEndian.Uint16(b[2:4])
		return family, netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port), true
	}
	return family, netip.AddrPort{}, false
}

// taskStatus is what the agent needs of /proc/PID/status.
type taskStatus struct {
	tgid   int
	capEff uint64
}

func readStatus(tid int) (taskStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return taskStatus{}, fmt.Errorf("status of thread %d: %w", tid, err)
	}
	return parseStatus(b)
}

func parseStatus(b []byte) (taskStatus, error) {
	var s taskStatus
	var haveTgid, haveCap bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		v = strings.TrimSpace(v)
		var err error
		switch k {
		case "Tgid":
			s.tgid, err = strconv.Atoi(v)
			haveTgid = err == nil
		case "CapEff":
			s.capEff, err = strconv.ParseUint(v, 16, 64)
			haveCap = err == nil
		}
	}
	if !haveTgid || !haveCap {
		return s, fmt.Errorf("status: no Tgid or CapEff")
	}
	return s, nil
}

// canBindPrivileged reports whether CAP_NET_BIND_SERVICE is effective.
func (s taskStatus) canBindPrivileged() bool {
	return s.capEff&(1<<unix.CAP_NET_BIND_SERVICE) != 0
}

// nsID is a namespace's identity: the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

// netNS is the network namespace of a process (or thread).
func netNS(pid int) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return nsID{}, fmt.Errorf("network namespace of %d: %w", pid, err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// fdCloexec reports whether fd of process pid is close-on-exec: the
// "flags" of /proc/PID/fdinfo/FD carry O_CLOEXEC from the fd table.
func fdCloexec(pid, fd int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		return false, fmt.Errorf("fd %d of %d: %w", fd, pid, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			if err != nil {
				return false, fmt.Errorf("fd %d of %d: flags %q: %w", fd, pid, v, err)
			}
			return flags&unix.O_CLOEXEC != 0, nil
		}
	}
	return false, fmt.Errorf("fd %d of %d: no flags in fdinfo", fd, pid)
}

// unprivilegedPortStart is the lowest port a process without
// CAP_NET_BIND_SERVICE may bind in the network namespace of pid
// (net.ipv4.ip_unprivileged_port_start, a per-namespace sysctl that
// /proc/sys shows for the reader's own namespace only, hence the setns).
func unprivilegedPortStart(pid int) (int, error) {
	var v int
	err := inNetNSOf(pid, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
		if err != nil {
			return err
		}
		v, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("unprivileged port start of the network namespace of %d: %w", pid, err)
	}
	return v, nil
}
