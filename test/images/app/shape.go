package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// shape is how the server runs: the app shapes real images have, for the
// connection hold's tests.
type shape struct {
	spawnDepth  int
	backlog     int
	serial      bool
	listenDelay time.Duration
}

// listen opens every address of a comma-separated list. An address may
// name its network: "tcp4/0.0.0.0:8080", "tcp6/[::]:8080" (IPv6 only),
// ":8080" or "tcp/[::]:8080" (dual stack, as Go listens by default).
func (sh shape) listen(list string) ([]net.Listener, error) {
	var out []net.Listener
	for _, a := range strings.Split(list, ",") {
		network, addr, ok := strings.Cut(a, "/")
		if !ok {
			network, addr = "tcp", a
		}
		l, err := sh.listenOne(network, addr)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("listen %s %s: %w", network, addr, err)
		}
		if sh.serial {
			l = &serialListener{Listener: l, token: make(chan struct{}, 1)}
		}
		out = append(out, l)
	}
	return out, nil
}

func (sh shape) listenOne(network, addr string) (net.Listener, error) {
	if sh.backlog == 0 {
		return net.Listen(network, addr)
	}
	// net.Listen takes the system's backlog: a small one needs the socket
	// made by hand.
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, err
	}
	fam, sa := syscall.AF_INET6, syscall.Sockaddr(&syscall.SockaddrInet6{Port: port})
	if network == "tcp4" {
		fam, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: port}
	}
	if host != "" && host != "::" && host != "0.0.0.0" {
		return nil, fmt.Errorf("-backlog listens on the unspecified address only")
	}
	fd, err := syscall.Socket(fam, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if fam == syscall.AF_INET6 {
		v6only := 0
		if network == "tcp6" {
			v6only = 1
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, v6only)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Listen(fd, sh.backlog); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), addr)
	defer f.Close()
	return net.FileListener(f)
}

// serialListener hands out one connection at a time: the next Accept waits
// until the previous connection is closed, and each takes 1 ms of work.
type serialListener struct {
	net.Listener
	token chan struct{}
}

func (l *serialListener) Accept() (net.Conn, error) {
	l.token <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.token
		return nil, err
	}
	time.Sleep(time.Millisecond)
	return &serialConn{Conn: c, done: func() { <-l.token }}, nil
}

type serialConn struct {
	net.Conn
	done   func()
	closed bool
}

func (c *serialConn) Close() error {
	if !c.closed {
		c.closed = true
		defer c.done()
	}
	return c.Conn.Close()
}

// spawn runs this binary again as a child one level less deep, forwards
// SIGTERM and SIGINT to it, reaps orphans as PID 1 does, and exits with the
// child's status.
func spawn(args []string, depth int) int {
	var rest []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-spawn-depth") && !strings.HasPrefix(a, "--spawn-depth") {
			rest = append(rest, a)
		}
	}
	rest = append(rest, fmt.Sprintf("-spawn-depth=%d", depth-1))
	cmd := exec.Command("/proc/self/exe", rest...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "app: spawn: %v\n", err)
		return 1
	}
	fmt.Printf("app init pid %d: server %d levels down (child %d)\n", os.Getpid(), depth, cmd.Process.Pid)
	go func() {
		for s := range sigc {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return 1
	}
	return 0
}
