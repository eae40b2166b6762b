// Command floorrelay is the cheapest relay there is between a CRI client
// and containerd: it accepts on a unix socket and copies bytes both ways to
// the backend's socket, one goroutine per direction, without parsing HTTP/2
// or gRPC. It cannot intercept anything, so it is not a CRI proxy; BenchmarkCRI
// measures it beside inplaced, in the same rounds, as the floor: what any
// process between kubelet and containerd costs on the machine at hand.
//
// Usage: floorrelay LISTEN_SOCKET BACKEND_SOCKET
package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: floorrelay LISTEN_SOCKET BACKEND_SOCKET")
		os.Exit(2)
	}
	listen, backend := os.Args[1], os.Args[2]
	_ = os.Remove(listen)
	l, err := net.Listen("unix", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go relay(c, backend)
	}
}

func relay(c net.Conn, backend string) {
	defer c.Close()
	u, err := net.Dial("unix", backend)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer u.Close()
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.Close()
	}()
	_, _ = io.Copy(c, u)
}
