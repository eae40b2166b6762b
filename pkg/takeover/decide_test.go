package takeover

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sockets as the agent reads them.
func tcp4(addr string, nonblock bool) sockInfo {
	return sockInfo{domain: unix.AF_INET, typ: unix.SOCK_STREAM, protocol: unix.IPPROTO_TCP, listening: true,
		nonblock: nonblock, addr: netip.MustParseAddrPort(addr)}
}

func tcp6(addr string, v6only, nonblock bool) sockInfo {
	return sockInfo{domain: unix.AF_INET6, typ: unix.SOCK_STREAM, protocol: unix.IPPROTO_MPTCP, listening: true,
		v6only: v6only, nonblock: nonblock, addr: netip.MustParseAddrPort(addr)}
}

// fresh is a new, unbound socket like s.
func fresh(s sockInfo) sockInfo {
	s.listening, s.addr = false, netip.AddrPort{}
	return s
}

func TestDecide(t *testing.T) {
	goNew6 := fresh(tcp6("[::]:0", false, true)) // what a Go app binds
	goOld6 := tcp6("[::]:8080", false, true)
	call := func(addr string, sock sockInfo) bindCall {
		ap := netip.MustParseAddrPort(addr)
		fam := unix.AF_INET
		if ap.Addr().Is6() {
			fam = unix.AF_INET6
		}
		return bindCall{family: fam, addr: ap, sock: sock, sameNetNS: true}
	}
	udp := fresh(tcp4("0.0.0.0:0", true))
	udp.typ, udp.protocol = unix.SOCK_DGRAM, unix.IPPROTO_UDP
	unixSock := sockInfo{domain: unix.AF_UNIX}
	bound := tcp4("0.0.0.0:9000", true)
	bound.listening = false
	otherNS := call("[::]:8080", goNew6)
	otherNS.sameNetNS = false
	priv := call("[::]:80", goNew6)
	priv.privileged = true

	cases := []struct {
		name   string
		call   bindCall
		olds   []sockInfo
		action action
		reason Reason
		from   int
	}{
		{"a Go app takes a Go app's socket (MPTCP, dual stack)", call("[::]:8080", goNew6), []sockInfo{goOld6}, handOver, "", 0},
		{"TCP takes MPTCP", call("[::]:8080", func() sockInfo { s := goNew6; s.protocol = unix.IPPROTO_TCP; return s }()), []sockInfo{goOld6}, handOver, "", 0},
		{"the matching one of two ports", call("0.0.0.0:8081", fresh(tcp4("0.0.0.0:0", false))),
			[]sockInfo{tcp4("0.0.0.0:8080", false), tcp4("0.0.0.0:8081", false)}, handOver, "", 1},
		{"a specific address", call("10.0.0.2:8080", fresh(tcp4("0.0.0.0:0", false))), []sockInfo{tcp4("10.0.0.2:8080", false)}, handOver, "", 0},
		{"another port", call("[::]:9090", goNew6), []sockInfo{goOld6}, pass, ReasonNoListener, 0},
		{"an ephemeral port", call("[::]:0", goNew6), []sockInfo{goOld6}, pass, ReasonNoListener, 0},
		{"no old socket", call("[::]:8080", goNew6), nil, pass, ReasonNoListener, 0},
		{"another address of the port", call("10.0.0.3:8080", fresh(tcp4("0.0.0.0:0", false))), []sockInfo{tcp4("10.0.0.2:8080", false)}, pass, ReasonNoListener, 0},
		{"IPv4 beside a V6ONLY wildcard", call("0.0.0.0:8080", fresh(tcp4("0.0.0.0:0", true))), []sockInfo{tcp6("[::]:8080", true, true)}, pass, ReasonNoListener, 0},
		{"UDP on the port", call("0.0.0.0:8080", udp), []sockInfo{tcp4("0.0.0.0:8080", true)}, pass, ReasonNotTCP, 0},
		{"a unix socket", bindCall{family: unix.AF_UNIX, sock: unixSock, sameNetNS: true}, []sockInfo{goOld6}, pass, ReasonNotIP, 0},
		{"an IPv4 address on an IPv6 socket", call("0.0.0.0:8080", goNew6), []sockInfo{goOld6}, pass, ReasonNotIP, 0},
		{"already bound", call("0.0.0.0:8080", bound), []sockInfo{tcp4("0.0.0.0:8080", true)}, pass, ReasonBound, 0},
		{"another network namespace", otherNS, []sockInfo{goOld6}, pass, ReasonOtherNetNS, 0},
		{"IPv4 wildcard under a dual-stack wildcard", call("0.0.0.0:8080", fresh(tcp4("0.0.0.0:0", true))), []sockInfo{goOld6}, wait, ReasonFamily, 0},
		{"dual-stack wildcard over IPv4", call("[::]:8080", goNew6), []sockInfo{tcp4("127.0.0.1:8080", true)}, wait, ReasonFamily, 0},
		{"a specific address under the wildcard", call("10.0.0.2:8080", fresh(tcp4("0.0.0.0:0", true))), []sockInfo{tcp4("0.0.0.0:8080", true)}, wait, ReasonAddress, 0},
		{"the wildcard over a specific address", call("0.0.0.0:8080", fresh(tcp4("0.0.0.0:0", true))), []sockInfo{tcp4("10.0.0.2:8080", true)}, wait, ReasonAddress, 0},
		{"V6ONLY differs", call("[::]:8080", goNew6), []sockInfo{tcp6("[::]:8080", true, true)}, wait, ReasonV6Only, 0},
		{"blocking app after a non-blocking one", call("[::]:8080", fresh(tcp6("[::]:0", false, false))), []sockInfo{goOld6}, wait, ReasonBlocking, 0},
		{"SO_REUSEPORT group", call("[::]:8080", goNew6), []sockInfo{goOld6, goOld6}, wait, ReasonShared, 0},
		{"one of two matches", call("[::]:8080", goNew6), []sockInfo{tcp6("[::]:8080", true, true), goOld6}, handOver, "", 1},
		{"privileged port without the capability", priv, []sockInfo{tcp6("[::]:80", false, true)}, wait, ReasonPrivileged, 0},
		{"v4-mapped old address", call("10.0.0.2:8080", fresh(tcp4("0.0.0.0:0", true))), []sockInfo{tcp6("[::ffff:10.0.0.2]:8080", false, true)}, wait, ReasonFamily, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := decide(c.call, c.olds)
			if v.action != c.action || v.reason != c.reason || (c.action == handOver && v.from != c.from) {
				t.Errorf("got %d %q from %d, want %d %q from %d", v.action, v.reason, v.from, c.action, c.reason, c.from)
			}
		})
	}
}

func TestParseSockaddr(t *testing.T) {
	v4 := make([]byte, unix.SizeofSockaddrInet4)
	binary.NativeEndian.PutUint16(v4[0:2], unix.AF_INET)
	binary.BigEndian.PutUint16(v4[2:4], 8080)
	copy(v4[4:8], []byte{10, 0, 0, 2})
	v6 := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(v6[0:2], unix.AF_INET6)
	binary.BigEndian.PutUint16(v6[2:4], 443)
	v6[23] = 1 // ::1
	un := []byte{unix.AF_UNIX, 0, '/', 't'}
	cases := []struct {
		name   string
		b      []byte
		family int
		addr   string
		ok     bool
	}{
		{"IPv4", v4, unix.AF_INET, "10.0.0.2:8080", true},
		{"IPv6", v6, unix.AF_INET6, "[::1]:443", true},
		{"unix", un, unix.AF_UNIX, "", false},
		{"truncated IPv6", v6[:20], unix.AF_INET6, "", false},
		{"too short", []byte{2}, 0, "", false},
	}
	for _, c := range cases {
		fam, ap, ok := parseSockaddr(c.b)
		if fam != c.family || ok != c.ok || (ok && ap.String() != c.addr) {
			t.Errorf("%s: %d %s %v, want %d %s %v", c.name, fam, ap, ok, c.family, c.addr, c.ok)
		}
	}
}

func TestParseStatus(t *testing.T) {
	s, err := parseStatus([]byte("Name:\tapp\nTgid:\t4242\nPid:\t4250\nCapEff:\t00000000a80425fb\n"))
	if err != nil || s.tgid != 4242 || !s.canBindPrivileged() {
		t.Fatalf("%+v %v", s, err)
	}
	s, err = parseStatus([]byte("Tgid:\t7\nCapEff:\t0000000000000000\n"))
	if err != nil || s.canBindPrivileged() {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Fatal("no error for a status without Tgid")
	}
}

// Both ways of reading a bind's address, on this process's own memory.
func TestReadSockaddr(t *testing.T) {
	want := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(want[0:2], unix.AF_INET6)
	binary.BigEndian.PutUint16(want[2:4], 8080)
	addr := uint64(uintptr(unsafe.Pointer(&want[0])))
	got, err := readSockaddr(os.Getpid(), addr, uint64(len(want)))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("process_vm_readv: %x %v", got, err)
	}
	got, err = readMem(os.Getpid(), addr, make([]byte, len(want)))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("/proc/PID/mem: %x %v", got, err)
	}
	runtime.KeepAlive(want)
	if _, err := readSockaddr(os.Getpid(), addr, 1); err == nil {
		t.Error("a 1-byte address read")
	}
}
