// Command relayproc runs pkg/relay alone, with no interceptors, in front of
// a backend socket, so that its cost per call can be measured as a process
// of its own beside the floors (BenchmarkRelayCost):
//
//	relayproc -mode router LISTEN BACKEND   the relay as inplaced serves it
//	relayproc -mode grpc   LISTEN BACKEND   Relay.ServerOptions on a grpc.Server:
//	                                        every call through grpc-go's server
//	                                        and client (the relay before the
//	                                        HTTP/2 router; today its intercepted path)
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"google.golang.org/grpc"

	"github.com/inplaced/inplaced/pkg/relay"
)

func main() {
	mode := flag.String("mode", "router", "router or grpc")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile here until SIGTERM")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		go func() {
			<-sig
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(0)
		}()
	}
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: relayproc [-mode router|grpc] LISTEN_SOCKET BACKEND_SOCKET")
		os.Exit(2)
	}
	if err := run(*mode, flag.Arg(0), flag.Arg(1)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(mode, listen, backend string) error {
	conn, err := relay.Dial(backend)
	if err != nil {
		return err
	}
	r := relay.New(conn)
	_ = os.Remove(listen)
	lis, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	switch mode {
	case "router":
		return r.NewServer().Serve(lis)
	case "grpc":
		return grpc.NewServer(r.ServerOptions()...).Serve(lis)
	default:
		return fmt.Errorf("mode %q: want router or grpc", mode)
	}
}
