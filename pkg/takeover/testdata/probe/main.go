// Command probe is the init of the takeover tests' new containers: it
// starts the app given after its flags as its child (forwarding SIGTERM
// and SIGINT, exiting with it), and runs the binds the test asks for, in
// its own process, which is under the container's seccomp filter.
//
// The test writes a command as DIR/cmd-ID.json and reads the result from
// DIR/res-ID.json (DIR is a directory of the bundle's rootfs, so no socket
// and no bind is needed to talk). With -run it runs one command and prints
// the result (for runc exec).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// command is one request of the test.
type command struct {
	Op       string `json:"op"` // "bind" (AF_INET/AF_INET6) or "bind-unix"
	Family   int    `json:"family"`
	Port     int    `json:"port"`
	N        int    `json:"n"`
	Blocking bool   `json:"blocking"` // a blocking socket (Go's are not)
	Keep     bool   `json:"keep"`     // keep the last socket open
	Inherit  bool   `json:"inherit"`  // no SOCK_CLOEXEC
	Path     string `json:"path"`
}

// result is what the binds got: each one's duration, the first error and
// the socket inode the fd had after the first bind.
type result struct {
	OK    int     `json:"ok"`
	Errno int     `json:"errno"`
	Error string  `json:"error"`
	Ns    []int64 `json:"ns"`
	Inode uint64  `json:"inode"`
	Fd    int     `json:"fd"` // the socket kept
}

func main() {
	dir := flag.String("dir", "/ctl", "directory of commands and results")
	once := flag.String("run", "", "run this command (JSON), print the result and exit")
	flag.Parse()
	if *once != "" {
		var c command
		if err := json.Unmarshal([]byte(*once), &c); err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(2)
		}
		out, _ := json.Marshal(run(c))
		fmt.Println(string(out))
		return
	}
	var child *exec.Cmd
	if args := flag.Args(); len(args) > 0 {
		child = exec.Command(args[0], args[1:]...)
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(1)
		}
	}
	exited := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		if child != nil {
			_ = child.Wait()
		} else {
			<-sigs
		}
		close(exited)
	}()
	go func() {
		for s := range sigs {
			if child != nil {
				_ = child.Process.Signal(s)
			}
		}
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			return
		case <-tick.C:
			serveCommands(*dir)
		}
	}
}

func serveCommands(dir string) {
	cmds, _ := filepath.Glob(filepath.Join(dir, "cmd-*.json"))
	for _, path := range cmds {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		os.Remove(path)
		var c command
		var r result
		if err := json.Unmarshal(b, &c); err != nil {
			r.Error = err.Error()
		} else {
			r = run(c)
		}
		out, _ := json.Marshal(r)
		id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "cmd-"), ".json")
		tmp := filepath.Join(dir, ".res-"+id)
		if os.WriteFile(tmp, out, 0o644) == nil {
			os.Rename(tmp, filepath.Join(dir, "res-"+id+".json"))
		}
	}
}

func run(c command) result {
	var r result
	for i := 0; i < max(c.N, 1); i++ {
		fd, d, err := bindOnce(c)
		if err == nil {
			r.OK++
			r.Ns = append(r.Ns, d.Nanoseconds())
			if i == 0 {
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil {
					r.Inode = st.Ino
				}
			}
		} else if r.Error == "" {
			r.Error = err.Error()
			var errno syscall.Errno
			if errors.As(err, &errno) {
				r.Errno = int(errno)
			}
		}
		if fd >= 0 && c.Keep && i == max(c.N, 1)-1 {
			r.Fd = fd
		} else if fd >= 0 {
			unix.Close(fd)
		}
	}
	return r
}

// bindOnce opens a socket and binds it, timing the bind alone.
func bindOnce(c command) (int, time.Duration, error) {
	flags := unix.SOCK_CLOEXEC
	if c.Inherit {
		flags = 0
	}
	if !c.Blocking {
		flags |= unix.SOCK_NONBLOCK
	}
	var sa unix.Sockaddr
	domain := unix.AF_INET6
	switch {
	case c.Op == "bind-unix":
		domain = unix.AF_UNIX
		os.Remove(c.Path)
		sa = &unix.SockaddrUnix{Name: c.Path}
	case c.Family == 4:
		domain = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: c.Port}
	default:
		sa = &unix.SockaddrInet6{Port: c.Port}
	}
	fd, err := unix.Socket(domain, unix.SOCK_STREAM|flags, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("socket: %w", err)
	}
	if domain != unix.AF_UNIX {
		// As Go and most servers do: connections in TIME_WAIT on the port
		// would refuse the bind otherwise.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fd, 0, fmt.Errorf("SO_REUSEADDR: %w", err)
		}
	}
	start := time.Now()
	err = unix.Bind(fd, sa)
	d := time.Since(start)
	if err != nil {
		return fd, d, err
	}
	return fd, d, nil
}
