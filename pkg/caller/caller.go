// Package caller says who is on the other end of a control-socket call: the
// peer's uid and pid (SO_PEERCRED) and its executable (/proc/<pid>/exe),
// read once when the connection is accepted, so a process that exits or
// execs afterwards is still named by what it was when it asked.
package caller

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Info identifies a control-socket peer. UID and PID are -1 when unknown.
type Info struct {
	credentials.CommonAuthInfo
	UID, PID int64
	Exe      string // empty when /proc/<pid>/exe could not be read
}

// AuthType implements credentials.AuthInfo.
func (Info) AuthType() string { return "peercred" }

// Unknown is the Info of a call with no peer credentials.
var Unknown = Info{UID: -1, PID: -1}

// FromContext returns the peer of a gRPC call served with Credentials.
func FromContext(ctx context.Context) Info {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Unknown
	}
	if ai, ok := p.AuthInfo.(Info); ok {
		return ai
	}
	return Unknown
}

// Credentials returns TransportCredentials for a unix-socket server that
// read the connecting process's credentials during the handshake.
func Credentials() credentials.TransportCredentials { return peerCreds{} }

type peerCreds struct{}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("control API: %T is not a unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, nil, err
	}
	if credErr != nil {
		return nil, nil, fmt.Errorf("read peer credentials: %w", credErr)
	}
	// Read at accept time: the pid could be reused later. A peer in
	// another pid namespace shows as 0 and has no readable exe.
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(int(cred.Pid)) + "/exe")
	return c, Info{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID: int64(cred.Uid), PID: int64(cred.Pid), Exe: exe}, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, Info{}, nil
}
func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }
