package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// asInplaced makes this test binary run inplaced's main instead of the
// tests: the tests below start it as a child process, the way systemd
// starts inplaced.
const asInplaced = "INPLACED_TEST_AS_INPLACED"

func TestMain(m *testing.M) {
	if os.Getenv(asInplaced) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rig is a fake CRI backend and the paths of one inplaced.
type rig struct {
	dir, cri, ctl string
	args          []string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	dir := t.TempDir()
	be := filepath.Join(dir, "be.sock")
	lis, err := net.Listen("unix", be)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, fakeBackend{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	empty := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &rig{dir: dir, cri: filepath.Join(dir, "cri.sock"), ctl: filepath.Join(dir, "ctl.sock")}
	r.args = []string{"--listen", r.cri, "--control-socket", r.ctl, "--state-dir", filepath.Join(dir, "state"),
		"--runtime-endpoint", "unix://" + be, "--config", empty, "--log-format", "json", "--shutdown-grace", "5s"}
	return r
}

type fakeBackend struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (fakeBackend) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake-backend"}, nil
}

// listening is a socket bound at path as a socket unit binds it, kept open
// by the test as systemd keeps it.
func listening(t *testing.T, path string) *os.File {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// child is one inplaced process.
type child struct {
	cmd     *exec.Cmd
	logPath string
}

// log is what the process wrote so far.
func (c *child) log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// start runs inplaced with socket as fd 3 the way systemd passes it:
// LISTEN_FDS=1, LISTEN_FDNAMES, and LISTEN_PID set to the pid that
// execs inplaced (a shell sets it to its own, then execs). listenPID
// overrides LISTEN_PID ("" for the child's own); socket nil passes
// nothing. It waits until the control socket answers: the CRI socket is
// served by then.
func (r *rig) start(t *testing.T, socket *os.File, listenPID string) *child {
	t.Helper()
	logf, err := os.CreateTemp(r.dir, "inplaced-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c := &child{logPath: logf.Name()}
	env := []string{asInplaced + "=1"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "LISTEN_") && !strings.HasPrefix(e, "NOTIFY_SOCKET=") {
			env = append(env, e)
		}
	}
	pid := "$$"
	if listenPID != "" {
		pid = listenPID
	}
	c.cmd = exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=` + pid + ` exec "$0" "$@"`, os.Args[0]}, r.args...)...)
	if socket != nil {
		c.cmd.ExtraFiles = []*os.File{socket}
		env = append(env, "LISTEN_FDS=1", "LISTEN_FDNAMES=inplaced.socket")
	}
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if conn, err := net.Dial("unix", r.ctl); err == nil {
			conn.Close()
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("inplaced did not serve within 60 s:\n%s", c.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and wants exit status 0.
func (c *child) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("inplaced after SIGTERM: %v\n%s", err, c.log())
	}
}

// fromSystemd says what inplaced logged about where its CRI socket came from.
func (c *child) fromSystemd(t *testing.T) bool {
	t.Helper()
	for _, line := range strings.Split(c.log(), "\n") {
		if strings.Contains(line, `"msg":"serving CRI"`) {
			return strings.Contains(line, `"socket_from_systemd":true`)
		}
	}
	t.Fatalf("no \"serving CRI\" line in inplaced's log:\n%s", c.log())
	return false
}

func callVersion(t *testing.T, sock string) (string, error) {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(cc).Version(ctx, &runtimeapi.VersionRequest{})
	return resp.GetRuntimeName(), err
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().Type() == os.ModeSocket
}

// TestSocketActivation: inplaced serves the socket systemd passes it as fd
// 3, leaves it in place when it exits, and a call made while no inplaced
// runs waits in the socket's backlog and is answered by the next one.
func TestSocketActivation(t *testing.T) {
	r := newRig(t)
	sock := listening(t, r.cri)
	first := r.start(t, sock, "")
	if !first.fromSystemd(t) {
		t.Fatalf("inplaced did not take the socket systemd passed:\n%s", first.log())
	}
	if got, err := callVersion(t, r.cri); err != nil || got != "fake-backend" {
		t.Fatalf("Version through inplaced: %q %v", got, err)
	}
	first.stop(t)
	if !isSocket(r.cri) {
		t.Fatalf("%s is gone after inplaced exited: it unlinked systemd's socket", r.cri)
	}
	type result struct {
		name string
		err  error
	}
	waiting := make(chan result, 1)
	t0 := time.Now()
	go func() {
		name, err := callVersion(t, r.cri)
		waiting <- result{name, err}
	}()
	select {
	case res := <-waiting:
		t.Fatalf("a call with no inplaced running ended: %q %v", res.name, res.err)
	case <-time.After(500 * time.Millisecond):
	}
	second := r.start(t, sock, "")
	res := <-waiting
	if res.err != nil || res.name != "fake-backend" {
		t.Fatalf("the call made while no inplaced ran: %q %v", res.name, res.err)
	}
	t.Logf("a call made while no inplaced ran waited %s and was answered by the next one", time.Since(t0).Round(time.Millisecond))
	if !second.fromSystemd(t) {
		t.Fatalf("the second inplaced did not take the socket:\n%s", second.log())
	}
	second.stop(t)
	if !isSocket(r.cri) {
		t.Fatalf("%s is gone after the second inplaced exited", r.cri)
	}
}

// TestSocketActivationNotOurs: a socket passed for another process
// (LISTEN_PID not inplaced's) or bound elsewhere than --listen is not
// served; inplaced binds --listen itself, removes it when it exits, and
// leaves the passed socket alone.
func TestSocketActivationNotOurs(t *testing.T) {
	for _, c := range []struct {
		name, listenPID string
		elsewhere       bool
	}{
		{name: "LISTEN_PID of another process", listenPID: strconv.Itoa(os.Getpid())},
		{name: "bound elsewhere than --listen", elsewhere: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			passed := filepath.Join(r.dir, "other.sock")
			d := r.start(t, listening(t, passed), c.listenPID)
			if d.fromSystemd(t) {
				t.Fatalf("inplaced took a socket that is not its own:\n%s", d.log())
			}
			if got, err := callVersion(t, r.cri); err != nil || got != "fake-backend" {
				t.Fatalf("Version through the socket inplaced bound: %q %v", got, err)
			}
			if c.elsewhere && !strings.Contains(d.log(), "systemd passed a socket that is not --listen") {
				t.Errorf("no warning about the socket bound elsewhere:\n%s", d.log())
			}
			d.stop(t)
			if isSocket(r.cri) {
				t.Errorf("%s is still there: inplaced leaves the socket it bound", r.cri)
			}
			if !isSocket(passed) {
				t.Errorf("%s, passed to inplaced, is gone", passed)
			}
		})
	}
}

// TestWithoutSystemd: with nothing passed, inplaced binds --listen itself.
func TestWithoutSystemd(t *testing.T) {
	r := newRig(t)
	d := r.start(t, nil, "")
	if d.fromSystemd(t) {
		t.Fatal("inplaced says its socket came from systemd")
	}
	if got, err := callVersion(t, r.cri); err != nil || got != "fake-backend" {
		t.Fatalf("Version: %q %v", got, err)
	}
	d.stop(t)
}
