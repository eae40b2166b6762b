package harness

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Inplaced is an inplaced daemon started by a test, in front of a backend.
type Inplaced struct {
	Dir           string // state dir, sockets and log
	Socket        string // CRI socket
	Endpoint      string // unix://Socket
	ControlSocket string
	LogPath       string
	Backend       string // runtime endpoint
	ExtraArgs     []string
	Bin           string // the inplaced binary; "" for BinDir's
	// Activated, when set, is the CRI socket held by the test as systemd
	// holds a socket unit's (StartInplacedActivated): each Start passes it
	// as systemd does — fd 3, LISTEN_FDS=1, LISTEN_PID, LISTEN_FDNAMES —
	// and it outlives every process.
	Activated *os.File
	// Stored are fds kept as systemd's fd store keeps them (a test's
	// stand-in for it gets them through NOTIFY_SOCKET's FDSTORE=1): each
	// Start passes them after Activated, named by their Name().
	Stored []*os.File

	tb      testing.TB
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// BinDir is where inplaced, inplacectl and kubectl-inplace are: $INPLACED_BIN, else built
// once per test process into a temp dir.
func BinDir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("INPLACED_BIN"); d != "" {
		return d
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inplaced-bin")
		if err != nil {
			binErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		for _, c := range []string{"inplaced", "inplacectl", "kubectl-inplace"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, c), "./cmd/"+c)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("build %s: %v\n%s", c, err, out)
				return
			}
		}
		binDir = dir
	})
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binDir
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// StartInplaced starts inplaced in front of backendEndpoint with its own
// sockets and state; tb.Cleanup stops it (SIGTERM) and removes its files.
// env is added to its environment (e.g. the crash test switch).
func StartInplaced(tb testing.TB, backendEndpoint string, env ...string) *Inplaced {
	tb.Helper()
	return StartInplacedBinary(tb, "", backendEndpoint, env...)
}

// StartInplacedBinary is StartInplaced with the inplaced binary bin ("" for
// BinDir's), e.g. another commit's build to compare with.
func StartInplacedBinary(tb testing.TB, bin, backendEndpoint string, env ...string) *Inplaced {
	tb.Helper()
	return startInplaced(tb, bin, backendEndpoint, nil, false, env...)
}

// StartInplacedWith is StartInplaced with extra command-line arguments
// (ExtraArgs) from the first start on, e.g. the --kubeconfig of a node.
func StartInplacedWith(tb testing.TB, backendEndpoint string, args []string, env ...string) *Inplaced {
	tb.Helper()
	return startInplaced(tb, "", backendEndpoint, args, false, env...)
}

// StartInplacedActivated is StartInplacedWith with the CRI socket bound by
// the test and passed to inplaced as systemd's socket activation passes
// it: Stop or Kill then Start is a restart behind a socket that stays,
// and a connection made in between waits in its backlog.
func StartInplacedActivated(tb testing.TB, backendEndpoint string, args []string, env ...string) *Inplaced {
	tb.Helper()
	return startInplaced(tb, "", backendEndpoint, args, true, env...)
}

func startInplaced(tb testing.TB, bin, backendEndpoint string, args []string, activated bool, env ...string) *Inplaced {
	tb.Helper()
	dir, err := os.MkdirTemp(shortTempDir(), "ipx")
	if err != nil {
		tb.Fatal(err)
	}
	d := &Inplaced{
		Dir: dir, Socket: filepath.Join(dir, "i.sock"), ControlSocket: filepath.Join(dir, "ctl.sock"),
		LogPath: filepath.Join(dir, "inplaced.log"), Backend: backendEndpoint, Bin: bin, ExtraArgs: args, tb: tb,
	}
	d.Endpoint = "unix://" + d.Socket
	if activated {
		f, err := holdSocket(d.Socket)
		if err != nil {
			tb.Fatal(err)
		}
		d.Activated = f
	}
	tb.Cleanup(func() {
		_ = d.Stop()
		if d.Activated != nil {
			d.Activated.Close()
		}
		if tb.Failed() {
			tb.Logf("inplaced log tail:\n%s", d.LogTail(60))
			saveArtifacts(tb, "-"+filepath.Base(dir), d.LogPath) // d.LogPath is <dir>/inplaced.log
		}
		_ = os.RemoveAll(dir)
	})
	if err := d.Start(env...); err != nil {
		tb.Fatalf("start inplaced: %v\n%s", err, d.LogTail(40))
	}
	return d
}

// passed are the files a Start passes as systemd would, with their names.
func (d *Inplaced) passed() ([]*os.File, []string) {
	var files []*os.File
	var names []string
	if d.Activated != nil {
		files, names = append(files, d.Activated), append(names, "inplaced.socket")
	}
	for _, f := range d.Stored {
		files, names = append(files, f), append(names, f.Name())
	}
	return files, names
}

// Start (re)starts the daemon with the same state dir and sockets.
func (d *Inplaced) Start(env ...string) error {
	bin := d.Bin
	if bin == "" {
		bin = filepath.Join(BinDir(d.tb), "inplaced")
	}
	args := append([]string{
		"--listen", d.Socket, "--control-socket", d.ControlSocket, "--state-dir", filepath.Join(d.Dir, "state"),
		"--runtime-endpoint", d.Backend, "--log-level", "debug", "--log-format", "console",
		"--config", filepath.Join(d.Dir, "absent.yaml.optional"),
	}, d.ExtraArgs...)
	// --config pointing at a missing file that was asked for is an error;
	// write an empty one so the machine's /etc/inplaced is never read.
	_ = os.WriteFile(filepath.Join(d.Dir, "absent.yaml.optional"), nil, 0o600)
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	env = append(filteredEnv("NOTIFY_SOCKET", "INPLACED_TEST_CRASH_AFTER", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"), env...)
	if files, names := d.passed(); len(files) > 0 {
		// LISTEN_PID is the pid of the process that runs inplaced, known
		// only once it runs: a shell sets it to its own, then execs.
		cmd = exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin}, args...)...)
		cmd.ExtraFiles = files
		env = append(env, fmt.Sprintf("LISTEN_FDS=%d", len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		logf.Close()
		d.mu.Lock()
		d.waitErr = err
		d.mu.Unlock()
		close(exited)
	}()
	d.mu.Lock()
	d.cmd, d.exited = cmd, exited
	d.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("inplaced exited at start: %v", d.waitErr)
		default:
		}
		// A killed daemon leaves its socket files: wait until both answer.
		// A held CRI socket answers connect() whether a process serves it
		// or not; the control socket is served after it.
		if canDial(d.ControlSocket) && (d.Activated != nil || canDial(d.Socket)) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("inplaced sockets did not appear within 30s")
}

// holdSocket binds a listening unix socket at path, mode 0600, as a socket
// unit does, and returns it as a file; the path is never unlinked by the
// processes it is passed to.
func holdSocket(path string) (*os.File, error) {
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	return l.File()
}

// Signal sends sig to the running daemon without waiting.
func (d *Inplaced) Signal(sig syscall.Signal) {
	d.mu.Lock()
	cmd := d.cmd
	d.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(sig)
	}
}

func canDial(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// PID is the running daemon's pid, 0 if it is not running.
func (d *Inplaced) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	select {
	case <-d.exited:
		return 0
	default:
		return d.cmd.Process.Pid
	}
}

// Exited is closed when the current process ends.
func (d *Inplaced) Exited() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exited
}

// ExitError is the current process's wait error once it has exited.
func (d *Inplaced) ExitError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waitErr
}

// Stop sends SIGTERM and waits (SIGKILL after 20 s).
func (d *Inplaced) Stop() error { return d.signal(syscall.SIGTERM, 20*time.Second) }

// Kill sends SIGKILL and waits.
func (d *Inplaced) Kill() error { return d.signal(syscall.SIGKILL, 5*time.Second) }

func (d *Inplaced) signal(sig syscall.Signal, grace time.Duration) error {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}

// Ctl runs inplacectl against this daemon's control socket.
func (d *Inplaced) Ctl(args ...string) (string, error) {
	bin := filepath.Join(BinDir(d.tb), "inplacectl")
	cmd := exec.Command(bin, append([]string{"--control-socket", d.ControlSocket}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("inplacectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// LogTail returns the last n lines of the daemon's log.
func (d *Inplaced) LogTail(n int) string {
	data, err := os.ReadFile(d.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
