package control

import (
	"context"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// peerCreds is a TransportCredentials for unix sockets that reads the
// connecting process's uid and pid (SO_PEERCRED) during the handshake, so
// each swap records who asked for it.
type peerCreds struct{}

// AuthInfo carries the peer's credentials.
type AuthInfo struct {
	credentials.CommonAuthInfo
	UID, PID int64
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "peercred" }

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
	return c, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID: int64(cred.Uid), PID: int64(cred.Pid)}, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, AuthInfo{}, nil
}
func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }

// callerOf returns the peer's uid and pid, or -1s when unknown.
func callerOf(ctx context.Context) (uid, pid int64) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return -1, -1
	}
	if ai, ok := p.AuthInfo.(AuthInfo); ok {
		return ai.UID, ai.PID
	}
	return -1, -1
}
