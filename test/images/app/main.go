// Command app is the entrypoint of the test images App1, App2, Crash and Large
// (see test/harness). It is built twice with -ldflags "-X main.version=v1|v2" so
// that the two images carry different binaries.
//
// It prints its version, serves HTTP on -listen (GET /version, GET /healthz,
// GET /peer: version and the client's address, GET /listen?port=N: listen on another port too, and 200 for any other GET) and otherwise waits; SIGTERM or SIGINT make it exit
// 0 after a graceful shutdown (with -drain, it first stops accepting and serves what it accepted for that long). -exit N makes it print its version and exit at once with code N (the Crash
// image uses -exit 3). With -listen "" it only waits; as PID 1 it reaps
// orphaned children (the Pause image runs it as /pause -listen=).
//
// The same binary stands in for upstream images critest pulls (see
// test/harness PushCritestImages): installed as "nginx" with -pidfile it is a
// web server whose pid `pidof nginx` finds; setuid root with -print-euid it
// prints "Effective uid: N" like the nonewprivs image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// reapChildren waits for orphans re-parented to us as PID 1 (the Pause image
// runs this binary as the sandbox's init), so no zombies pile up.
func reapChildren(ctx context.Context) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigc:
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "HTTP listen address; empty disables the server")
	exitCode := fs.Int("exit", -1, "print the version and exit at once with this code")
	pidFile := fs.String("pidfile", "", "write the pid to this file")
	printEUID := fs.Bool("print-euid", false, `print "Effective uid: N" and exit 0`)
	var sh shape
	fs.IntVar(&sh.spawnDepth, "spawn-depth", 0, "run the server N processes down: each level starts the next as its child, forwards SIGTERM and waits (an init such as tini, a launcher)")
	fs.IntVar(&sh.backlog, "backlog", 0, "listen backlog (0: the system's)")
	fs.BoolVar(&sh.serial, "serial", false, "serve one connection at a time, 1 ms of work each (busybox httpd, Python's http.server)")
	fs.DurationVar(&sh.listenDelay, "listen-delay", 0, "wait this long before listening")
	drain := fs.Duration("drain", 0, "on SIGTERM, stop accepting (close the listeners) and serve the connections already accepted this long before the graceful shutdown: Go's Shutdown drops unanswered a request it reads after it began")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if sh.spawnDepth > 0 {
		return spawn(args, sh.spawnDepth)
	}
	if *printEUID {
		fmt.Printf("Effective uid: %d\n", os.Geteuid())
		return 0
	}
	if *pidFile != "" {
		if err := os.WriteFile(*pidFile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "app: %v\n", err)
			return 1
		}
	}

	fmt.Printf("app version %s pid %d\n", version, os.Getpid())
	if *exitCode >= 0 {
		return *exitCode
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if os.Getpid() == 1 {
		go reapChildren(ctx)
	}

	if *listen == "" {
		<-ctx.Done()
		fmt.Println("app: signal received, exiting")
		return 0
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, version)
	})
	// /peer: the version and the client's address as this process sees it
	// (the connection-hold e2e checks that a held client's own address
	// reaches the new process).
	mux.HandleFunc("GET /peer", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", version, r.RemoteAddr)
	})
	// /listen?port=N: bind and listen on another port, served like the
	// first (the overlap e2e: a bind() of the swapped process once
	// inplaced's takeover agent has restarted).
	mux.HandleFunc("GET /listen", func(w http.ResponseWriter, r *http.Request) {
		l, err := net.Listen("tcp", ":"+r.URL.Query().Get("port"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		go func() { _ = http.Serve(l, mux) }()
		fmt.Fprintf(w, "listening on %s\n", l.Addr())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "app %s\n", version)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	// A serial server answers one request per connection, as HTTP/1.0
	// servers do: an idle keep-alive connection would block all others.
	srv.SetKeepAlivesEnabled(!sh.serial)
	if sh.listenDelay > 0 {
		select {
		case <-time.After(sh.listenDelay):
		case <-ctx.Done():
			return 0
		}
	}
	ls, err := sh.listen(*listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "app: %v\n", err)
		return 1
	}
	errc := make(chan error, len(ls))
	for _, l := range ls {
		go func() { errc <- srv.Serve(l) }()
	}

	select {
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "app: http server: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	fmt.Println("app: signal received, exiting")
	if *drain > 0 {
		for _, l := range ls {
			_ = l.Close()
		}
		time.Sleep(*drain)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "app: shutdown: %v\n", err)
	}
	return 0
}
