package takeover

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inplaced/inplaced/pkg/hold"
	"github.com/inplaced/inplaced/test/harness"
)

// agentEnv makes the test binary an agent process (TestRuncAgentKilled
// kills it with SIGKILL).
const agentEnv = "INPLACED_TAKEOVER_TEST_AGENT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(agentEnv); sock != "" {
		os.Exit(runAgentProcess(sock))
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func runAgentProcess(sock string) int {
	a, err := Listen(Config{Socket: sock})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	if err := a.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startAgentProcess runs an agent in a process of its own.
func (r *rig) startAgentProcess() *exec.Cmd {
	r.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), agentEnv+"="+r.socket)
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		r.t.Fatalf("agent process: %q %v", line, err)
	}
	return cmd
}

// The overlap: the new container's app binds the port the old one
// listens on, gets the old socket, and both accept from it; the old one
// gets SIGTERM and drains; a client dialling every 5 ms throughout sees no
// failure.
func TestRuncHandover(t *testing.T) {
	r := newRig(t)
	a, evs := r.startAgent()
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	oldSocks := socketInodes(old.pid)
	ns, err := netNS(old.pid)
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := scanListeners([]int{old.pid}, 8080, ns); err == nil && len(ls) == 1 {
		// Go listens with MPTCP where the namespace has it: the dump of
		// TCP listeners sees it through its TCP subflow's listener.
		t.Logf("the old app's listener: domain %d, protocol %d, nonblocking %v", ls[0].domain, ls[0].protocol, ls[0].nonblock)
		ls.close()
	}

	d := harness.StartDialer(net.JoinHostPort(r.podIP, "8080"))
	ended := false
	defer func() {
		if !ended {
			d.End()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	startNew := time.Now()
	nc := r.run("new", []string{"/probe", "/app-v2", "-listen", ":8080"}, defaultCaps, r.profile("swap-1", defaultCaps))
	ev := evs.wait(t, "handover of 8080", 10*time.Second, func(e Event) bool { return e.Kind == HandedOver && e.Addr.Port() == 8080 })
	app := ev.Pid
	if ps, err := hold.ContainerPids(nc.pid); err != nil || !slices.Contains(ps, app) || app == nc.pid {
		t.Fatalf("handed to pid %d: the new container's processes are %v (%v), the probe is %d", app, ps, err, nc.pid)
	}
	t.Logf("handed over %s from pid %d fd %d to pid %d fd %d in %s, %s after runc create",
		ev.Addr, ev.FromPid, ev.FromFd, ev.Pid, ev.Fd, ev.Took, ev.At.Sub(startNew))
	r.waitServing(8080, "v2", 5*time.Second) // the new app serves from the shared socket
	shared := 0
	for ino := range socketInodes(app) {
		if oldSocks[ino] && socketInodes(old.pid)[ino] {
			shared++
		}
	}
	if shared != 1 {
		t.Fatalf("the old and the new app share %d sockets, want the listening one", shared)
	}

	time.Sleep(300 * time.Millisecond)
	sigterm := time.Now()
	old.kill("TERM")
	old.waitExit(10 * time.Second)
	exited := time.Now()
	time.Sleep(300 * time.Millisecond)
	ds := d.End()
	ended = true
	checkDials(t, ds, window{startNew, sigterm, exited})
	r.waitServing(8080, "v2", time.Second)
}

// window is a swap's times: the new container started, the old one got
// SIGTERM, it exited.
type window struct{ start, sigterm, exited time.Time }

// checkDials wants no connection refused or timed out, both versions
// during the overlap and only v2 once the old process exited. A connection
// may fail only between the SIGTERM and the exit, with no answer: Go's
// http.Server drops a connection whose first request it reads after its
// Shutdown began, the app's own race, which stopping first has too.
func checkDials(t *testing.T, ds []harness.Dial, w window) {
	t.Helper()
	tally := harness.TallyDials(t, ds)
	var slowIn, slowOut time.Duration
	dropped := 0
	for _, d := range ds {
		switch {
		case d.Err != nil && d.At.After(w.sigterm.Add(-50*time.Millisecond)) && d.At.Before(w.exited) &&
			!errors.Is(d.Err, syscall.ECONNREFUSED) && !errors.Is(d.Err, os.ErrDeadlineExceeded):
			dropped++
			continue
		case d.Err != nil:
			t.Errorf("dial at %s: %v", d.At.Format("15:04:05.000"), d.Err)
			continue
		case d.At.After(w.start) && d.At.Before(w.exited):
			slowIn = max(slowIn, d.Connect)
		default:
			slowOut = max(slowOut, d.Connect)
		}
		if d.At.After(w.exited.Add(10*time.Millisecond)) && !strings.HasPrefix(d.Reply, "v2 ") {
			t.Errorf("dial at %s after the old process exited answered %q", d.At.Format("15:04:05.000"), d.Reply)
		}
	}
	t.Logf("%d connections: %d ok (%v), %d refused, %d reset, %d timeouts, %d other (%d dropped by the old app's shutdown); slowest connect %s from the new container's start to the old one's exit, %s outside",
		len(ds), tally.OK, tally.ByVersion, tally.Refused, tally.Reset, tally.Timeout, tally.Other, dropped, slowIn, slowOut)
	if tally.Refused+tally.Timeout != 0 {
		t.Errorf("%d refused, %d timed out", tally.Refused, tally.Timeout)
	}
	if tally.ByVersion["v1"] == 0 || tally.ByVersion["v2"] == 0 {
		t.Errorf("answers by version %v: want both", tally.ByVersion)
	}
}

// Binds of anything but a port the old container listens on continue in
// the kernel; a runc exec'd process has a notify fd of its own, served the
// same way.
func TestRuncPassThrough(t *testing.T) {
	r := newRig(t)
	a, evs := r.startAgent()
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	for _, c := range []struct {
		cmd    command
		port   uint16
		reason Reason
	}{
		{command{Op: "bind", Port: 9090}, 9090, ReasonNoListener},
		{command{Op: "bind", Family: 4, Port: 9091}, 9091, ReasonNoListener},
		{command{Op: "bind", Port: 0}, 0, ReasonNoListener},
		{command{Op: "bind-unix", Path: "/tmp/probe.sock"}, 0, ReasonNotIP},
	} {
		res := nc.probe(c.cmd, 10*time.Second)
		if res.OK != 1 {
			t.Errorf("%+v: %+v", c.cmd, res)
		}
		ev := evs.wait(t, fmt.Sprintf("pass of %+v", c.cmd), 5*time.Second, func(e Event) bool {
			return e.Kind == Passed && e.Addr.Port() == c.port && e.Reason == c.reason
		})
		t.Logf("%s %+v: %s (%s)", ev.Kind, c.cmd, ev.Reason, ev.Took)
	}
	out, err := nc.exec("/probe", "-run", `{"op":"bind","port":8080,"keep":true}`)
	if err != nil {
		t.Fatalf("runc exec: %v: %s", err, out)
	}
	res := lastResult(t, out)
	if res.OK != 1 || !socketInodes(old.pid)[res.Inode] {
		t.Errorf("exec'd bind of 8080: %+v; the old container's sockets: %v", res, socketInodes(old.pid))
	}
	if n := countEvents(evs.snapshot(), Attached); n != 2 {
		t.Errorf("%d notify fds attached, want 2 (the container, the exec)", n)
	}
	evs.wait(t, "handover to the exec'd process", time.Second, func(e Event) bool { return e.Kind == HandedOver && e.Pid != nc.pid })
}

// The socket installed keeps the app's close-on-exec flag, set or not.
func TestRuncHandoverKeepsCloexec(t *testing.T) {
	r := newRig(t)
	a, _ := r.startAgent()
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	for _, inherit := range []bool{false, true} {
		res := nc.probe(command{Op: "bind", Port: 8080, Keep: true, Inherit: inherit}, 10*time.Second)
		if res.OK != 1 || !socketInodes(old.pid)[res.Inode] {
			t.Fatalf("bind of 8080 (inherit %v): %+v, want the old socket", inherit, res)
		}
		cloexec, err := fdCloexec(nc.pid, res.Fd)
		if err != nil || cloexec == inherit {
			t.Errorf("fd %d of a socket made with inherit %v: close-on-exec %v %v", res.Fd, inherit, cloexec, err)
		}
	}
}

func lastResult(t *testing.T, out []byte) result {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return r
}

func countEvents(evs []Event, k EventKind) int {
	n := 0
	for _, e := range evs {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// A bind of the old container's port that cannot be handed over (a
// blocking socket, the old one is not) waits: until the deadline, then the
// kernel refuses it (EADDRINUSE); or until the old container stops, then
// it binds a socket of its own.
func TestRuncRefusedWaits(t *testing.T) {
	r := newRig(t)
	a, evs := r.startAgent()
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	deadline := time.Now().Add(1500 * time.Millisecond)
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid, Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	// Judged against the deadline itself: starting the new container
	// takes a good part of the 1.5 s on a loaded host, so the bind's own
	// wait may be short.
	res := nc.probe(command{Op: "bind", Port: 8080, Blocking: true}, 10*time.Second)
	if early := time.Until(deadline); res.errno() != syscall.EADDRINUSE || early > 0 {
		t.Errorf("blocking bind at the deadline: %+v, %s before the deadline; want EADDRINUSE at or after it", res, early)
	}
	evs.wait(t, "refusal", time.Second, func(e Event) bool { return e.Kind == Refused && e.Reason == ReasonBlocking })
	evs.wait(t, "release at the deadline", time.Second, func(e Event) bool { return e.Kind == Released && e.Reason == ReasonDeadline })

	a.Unregister("swap-1")
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	resc := make(chan result, 1)
	go func() { resc <- nc.probe(command{Op: "bind", Port: 8080, Blocking: true, Keep: true}, 20*time.Second) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case res := <-resc:
		t.Fatalf("the bind did not wait: %+v", res)
	default:
	}
	old.kill("TERM")
	old.waitExit(10 * time.Second)
	res = <-resc
	if res.OK != 1 || socketInodes(old.pid)[res.Inode] {
		t.Errorf("bind after the old container stopped: %+v, want a socket of its own", res)
	}
	ev := evs.wait(t, "release", time.Second, func(e Event) bool { return e.Kind == Released && e.Reason == ReasonReleased })
	t.Logf("released after %s", ev.Took)
}

// A privileged port is handed over only to a process that could bind it:
// without CAP_NET_BIND_SERVICE the bind waits, and the kernel refuses it
// (EACCES) once the old container stopped, as it would have without us.
func TestRuncPrivilegedPortWaits(t *testing.T) {
	r := newRig(t)
	a, evs := r.startAgent()
	old := r.run("old", []string{"/app-v1", "-listen", ":80"}, defaultCaps, nil)
	r.waitServing(80, "v1", 10*time.Second)
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL"}
	nc := r.run("new", []string{"/probe"}, caps, r.profile("swap-1", caps))
	resc := make(chan result, 1)
	go func() { resc <- nc.probe(command{Op: "bind", Port: 80}, 20*time.Second) }()
	evs.wait(t, "refusal", 5*time.Second, func(e Event) bool { return e.Kind == Refused && e.Reason == ReasonPrivileged })
	old.kill("TERM")
	old.waitExit(10 * time.Second)
	if res := <-resc; res.errno() != syscall.EACCES {
		t.Errorf("bind of 80 without CAP_NET_BIND_SERVICE: %+v, want EACCES", res)
	}
}

// The agent is gone (SIGKILL) and kept no copy of the notify fd: every
// later bind in the container fails with ENOSYS, runc exec fails while
// nothing listens on the agent's socket, and a restarted agent gets no fd
// for the running container (binds keep failing), only for new execs.
func TestRuncAgentKilled(t *testing.T) {
	r := newRig(t)
	agent := r.startAgentProcess()
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	if res := nc.probe(command{Op: "bind", Port: 9090}, 10*time.Second); res.OK != 1 {
		t.Fatalf("bind with the agent up: %+v", res)
	}
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = agent.Wait()
	if res := nc.probe(command{Op: "bind", Port: 9091}, 10*time.Second); res.errno() != syscall.ENOSYS {
		t.Errorf("bind after the agent was killed: %+v, want ENOSYS", res)
	}
	out, err := nc.exec("/probe", "-run", `{"op":"bind","port":9092}`)
	if err == nil {
		t.Errorf("runc exec with no agent succeeded: %s", out)
	}
	t.Logf("runc exec with no agent: %v: %s", err, strings.TrimSpace(string(out)))

	_, evs := r.startAgent()
	if res := nc.probe(command{Op: "bind", Port: 9093}, 10*time.Second); res.errno() != syscall.ENOSYS {
		t.Errorf("bind after the agent restarted: %+v, want ENOSYS (the fd is gone)", res)
	}
	out, err = nc.exec("/probe", "-run", `{"op":"bind","port":9094}`)
	if err != nil || lastResult(t, out).OK != 1 {
		t.Errorf("runc exec with the agent back: %v: %s", err, out)
	}
	evs.wait(t, "the exec's notify fd", time.Second, func(e Event) bool { return e.Kind == Attached })
}

// The notify fds kept (Detach; Files gives the same, named alike) outlive
// the agent: with no agent reading, a bind waits instead of failing; a new
// agent that adopts them answers it and serves handovers again.
func TestRuncAdopt(t *testing.T) {
	r := newRig(t)
	a1, err := Listen(Config{Socket: r.socket})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a1.Serve() }()
	closed := false
	defer func() {
		if !closed {
			a1.Close()
		}
	}()
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	if res := nc.probe(command{Op: "bind", Port: 9090}, 10*time.Second); res.OK != 1 {
		t.Fatalf("bind with the first agent: %+v", res)
	}
	copies, err := a1.Files()
	if err != nil || len(copies) != 1 {
		t.Fatalf("files: %v %v", copies, err)
	}
	closed = true
	files, err := a1.Detach()
	if err != nil || len(files) != 1 {
		t.Fatalf("detach: %v %v", files, err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	for name, f := range copies {
		if _, ok := files[name]; !ok {
			t.Errorf("Files named %s, Detach did not", name)
		}
		f.Close()
	}

	resc := make(chan result, 1)
	go func() { resc <- nc.probe(command{Op: "bind", Port: 9091}, 20*time.Second) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case res := <-resc:
		t.Fatalf("bind answered with no agent: %+v", res)
	default:
	}
	a2, evs := r.startAgent()
	for name, f := range files {
		if err := a2.Adopt(name, f); err != nil {
			t.Fatal(err)
		}
	}
	if res := <-resc; res.OK != 1 {
		t.Errorf("the waiting bind, once adopted: %+v", res)
	}
	if err := a2.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	res := nc.probe(command{Op: "bind", Port: 8080, Keep: true}, 10*time.Second)
	if res.OK != 1 || !socketInodes(old.pid)[res.Inode] {
		t.Errorf("bind of 8080 after the adoption: %+v, want the old socket", res)
	}
	evs.wait(t, "handover", time.Second, func(e Event) bool { return e.Kind == HandedOver })
}
