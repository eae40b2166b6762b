package install

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeSystemd is the host's systemd as far as the plans see it: units that
// start, stop and restart (a new main PID each start), enablement, and
// every call in order. A unit whose file is under the host root is loaded.
type fakeSystemd struct {
	root  string
	mu    sync.Mutex
	units map[string]UnitState
	calls []string
	fail  map[string]error // by call, e.g. "restart kubelet.service"
	hang  map[string]int   // by call: how many of them never finish by themselves
	pid   uint32
}

func newFakeSystemd(root string) *fakeSystemd {
	return &fakeSystemd{root: root, units: map[string]UnitState{KubeletUnit: running(100)}, fail: map[string]error{}, hang: map[string]int{}, pid: 1000}
}

func (s *fakeSystemd) call(c string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
	return s.fail[c]
}

func (s *fakeSystemd) set(unit string, fn func(u *UnitState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.units[unit]
	u.Load = "loaded"
	fn(&u)
	s.units[unit] = u
}

func (s *fakeSystemd) Reload(context.Context) error { return s.call("daemon-reload") }

func (s *fakeSystemd) Enable(_ context.Context, units []string) error {
	if err := s.call("enable " + strings.Join(units, " ")); err != nil {
		return err
	}
	for _, u := range units {
		s.set(u, func(st *UnitState) { st.FileState = "enabled" })
	}
	return nil
}

func (s *fakeSystemd) Disable(_ context.Context, units []string) error {
	if err := s.call("disable " + strings.Join(units, " ")); err != nil {
		return err
	}
	for _, u := range units {
		s.set(u, func(st *UnitState) { st.FileState = "disabled" })
	}
	return nil
}

func (s *fakeSystemd) Start(_ context.Context, unit string) error {
	if err := s.call("start " + unit); err != nil {
		return err
	}
	s.set(unit, func(st *UnitState) {
		if st.Active != "active" {
			s.pid++
			st.Active, st.MainPID, st.Started = "active", s.pid, uint64(s.pid)
		}
	})
	return nil
}

func (s *fakeSystemd) Restart(ctx context.Context, unit string) error {
	if err := s.call("restart " + unit); err != nil {
		return err
	}
	s.mu.Lock()
	hang := s.hang["restart "+unit] > 0
	s.hang["restart "+unit]--
	s.mu.Unlock()
	if hang {
		<-ctx.Done() // a job systemd never finishes (a unit with no start timeout)
		return ctx.Err()
	}
	s.set(unit, func(st *UnitState) { s.pid++; st.Active, st.MainPID, st.Started = "active", s.pid, uint64(s.pid) })
	return nil
}

func (s *fakeSystemd) Stop(_ context.Context, unit string) error {
	if err := s.call("stop " + unit); err != nil {
		return err
	}
	s.set(unit, func(st *UnitState) { st.Active, st.MainPID = "inactive", 0 })
	return nil
}

func (s *fakeSystemd) ResetFailed(_ context.Context, unit string) error {
	return s.call("reset-failed " + unit)
}

func (s *fakeSystemd) Unit(_ context.Context, name string) (UnitState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[name]
	if _, err := os.Stat(filepath.Join(s.root, UnitDir, name)); err == nil {
		u.Load = "loaded"
	} else if !ok || u.Active != "active" {
		u.Load = "not-found"
	}
	if u.Active == "" {
		u.Active = "inactive"
	}
	return u, nil
}

// take returns the calls made since the last take.
func (s *fakeSystemd) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

type fakeCRI struct {
	mu   sync.Mutex
	fail error
	asks []string
}

func (c *fakeCRI) Version(_ context.Context, socket string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asks = append(c.asks, socket)
	if c.fail != nil {
		return "", c.fail
	}
	return "containerd v2.4.2", nil
}

// fakeNode is the Node: Ready with a fresh heartbeat on every read, unless
// notReady.
type fakeNode struct {
	mu       sync.Mutex
	node     corev1.Node
	notReady bool
	events   []string
}

func (n *fakeNode) Get(context.Context) (*corev1.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	status := corev1.ConditionTrue
	if n.notReady {
		status = corev1.ConditionFalse
	}
	out := n.node.DeepCopy()
	out.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now()}}
	return out, nil
}

func (n *fakeNode) Annotate(_ context.Context, key string, value *string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if value == nil {
		delete(n.node.Annotations, key)
		return nil
	}
	if n.node.Annotations == nil {
		n.node.Annotations = map[string]string{}
	}
	n.node.Annotations[key] = *value
	return nil
}

func (n *fakeNode) Event(_ context.Context, typ, reason, msg string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, typ+" "+reason+": "+msg)
	return nil
}

// fakeSwaps has running swaps for its first polls.
type fakeSwaps struct {
	mu      sync.Mutex
	running []string
	polls   int // polls left before none runs; -1: never ends
}

func (f *fakeSwaps) Running(context.Context, string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.polls == 0 {
		return nil, nil
	}
	if f.polls > 0 {
		f.polls--
	}
	return f.running, nil
}

type fakeKernel struct{ tables []string }

func (k fakeKernel) RemoveHoldTables(context.Context) ([]string, error) { return k.tables, nil }
func (k fakeKernel) Mounts(context.Context, []string) ([]string, error) { return nil, nil }

// host is a fake node: a host root in a temporary directory, a payload
// directory, and the fakes.
type host struct {
	t       *testing.T
	root    string
	payload string
	sd      *fakeSystemd
	cri     *fakeCRI
	node    *fakeNode
	kernel  fakeKernel
	swaps   *fakeSwaps
}

func newHost(t *testing.T) *host {
	h := &host{t: t, root: t.TempDir(), payload: t.TempDir(), cri: &fakeCRI{}, node: &fakeNode{}, swaps: &fakeSwaps{}}
	h.node.node.Name = "node-1"
	h.sd = newFakeSystemd(h.root)
	h.writeHost(kubeletCfg, kubeadmConfig)
	h.writeHost("/proc/100/cmdline", "/usr/bin/kubelet\x00--config="+kubeletCfg+"\x00")
	for _, rel := range append([]string{payloadServiceUnitRel}, PayloadTemplates...) {
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		h.writePayload(rel, string(b), 0o644)
	}
	h.release("v1")
	return h
}

func (h *host) write(p, data string, mode fs.FileMode) {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) writeHost(p, data string) { h.write(filepath.Join(h.root, p), data, 0o644) }
func (h *host) writePayload(rel, data string, mode fs.FileMode) {
	h.write(filepath.Join(h.payload, rel), data, mode)
}

// release puts version v's binaries in the payload.
func (h *host) release(v string) {
	h.writePayload("bin/inplaced", "#!inplaced "+v+"\n", 0o755)
	h.writePayload("bin/inplacectl", "#!inplacectl "+v+"\n", 0o755)
}

func (h *host) read(p string) string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, p))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

func (h *host) exists(p string) bool {
	_, err := os.Lstat(filepath.Join(h.root, p))
	return err == nil
}

func (h *host) executor() *Executor {
	return &Executor{Root: h.root, Systemd: h.sd, CRI: h.cri, Node: h.node, Kernel: h.kernel, Swaps: h.swaps,
		CRITimeout: 300 * time.Millisecond, ReadyTimeout: 300 * time.Millisecond, APITimeout: time.Second,
		SwapTimeout: 300 * time.Millisecond, Poll: 10 * time.Millisecond}
}

// run inspects the host, plans for action and runs the plan.
func (h *host) run(action, version string) (*Plan, error) {
	h.t.Helper()
	payload, err := LoadPayload(h.payload, filepath.Join(h.payload, "bin"))
	if err != nil {
		h.t.Fatal(err)
	}
	in := &Inspector{Root: h.root, Proc: filepath.Join(h.root, "proc"), Systemd: h.sd, Node: h.node}
	f, err := in.Facts(context.Background(), Kubeadm, payload)
	if err != nil {
		h.t.Fatal(err)
	}
	s := Spec{Layout: Kubeadm, Version: version, NodeName: "node-1", Payload: payload, KubernetesMode: true, Now: time.Now()}
	plan := PlanInstall
	if action == "uninstall" {
		plan = PlanUninstall
	}
	p, err := plan(s, f)
	if err != nil {
		h.t.Fatal(err)
	}
	return p, h.executor().Run(context.Background(), p)
}

// leftovers lists the backups and temporary files the executor left.
func (h *host) leftovers() []string {
	var out []string
	_ = filepath.WalkDir(h.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (strings.HasSuffix(p, backupSuffix) || strings.HasSuffix(p, tmpSuffix)) {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func (h *host) files() []string {
	var out []string
	_ = filepath.WalkDir(h.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(h.root, p)
			out = append(out, "/"+rel)
		}
		return nil
	})
	return out
}

// TestExecutorInstallAgainUpgradeUninstall: a fake host root and a fake
// systemd through a node's life: install (kubelet restarted once), a second
// run (nothing restarted), an upgrade (inplaced restarted, kubelet not),
// uninstall (kubelet's file byte for byte as it was, nothing left).
func TestExecutorInstallAgainUpgradeUninstall(t *testing.T) {
	h := newHost(t)
	if _, err := h.run("install", "v1"); err != nil {
		t.Fatal(err)
	}
	wantCalls := []string{"daemon-reload", "enable inplaced.service", "start inplaced.service", "daemon-reload", "restart kubelet.service"}
	if got := h.sd.take(); !slices.Equal(got, wantCalls) {
		t.Errorf("install's systemd calls %q, want %q", got, wantCalls)
	}
	if got := h.read("/usr/local/bin/inplaced"); got != "#!inplaced v1\n" {
		t.Errorf("binary %q", got)
	}
	if st, _ := os.Stat(filepath.Join(h.root, "/usr/local/bin/inplaced")); st.Mode().Perm() != 0o755 {
		t.Errorf("binary mode %v", st.Mode())
	}
	if cfg := h.read(kubeletCfg); !strings.Contains(cfg, "containerRuntimeEndpoint: "+inplacedSock) {
		t.Errorf("kubelet's config:\n%s", cfg)
	}
	if len(h.cri.asks) == 0 || h.cri.asks[0] != filepath.Join(h.root, "/run/inplaced/inplaced.sock") {
		t.Errorf("CRI asked at %q", h.cri.asks)
	}
	ann, err := ParseInstalled(h.node.node.Annotations[AnnotationInstalled])
	if err != nil || ann.Version != "v1" || ann.PreviousRuntimeEndpoint != containerd || ann.Layout != Kubeadm {
		t.Errorf("annotation %+v (%v)", ann, err)
	}
	if len(h.node.events) != 1 || !strings.HasPrefix(h.node.events[0], "Normal "+ReasonInstalled) {
		t.Errorf("events %q", h.node.events)
	}

	p, err := h.run("install", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := h.sd.take(); len(got) != 0 || !p.Empty() {
		t.Errorf("a second run called systemd %q; plan:\n%s", got, p)
	}

	h.release("v2")
	if _, err := h.run("install", "v2"); err != nil {
		t.Fatal(err)
	}
	if got := h.sd.take(); !slices.Equal(got, []string{"restart inplaced.service"}) {
		t.Errorf("upgrade's systemd calls %q: want inplaced restarted, kubelet not", got)
	}
	if got := h.read("/usr/local/bin/inplaced"); got != "#!inplaced v2\n" {
		t.Errorf("binary after upgrade %q", got)
	}
	if l := h.leftovers(); len(l) > 0 {
		t.Errorf("left behind: %q", l)
	}

	if _, err := h.run("uninstall", "v2"); err != nil {
		t.Fatal(err)
	}
	wantCalls = []string{"daemon-reload", "restart kubelet.service", "stop inplaced.service", "disable inplaced.service",
		"daemon-reload", "reset-failed inplaced.service"}
	if got := h.sd.take(); !slices.Equal(got, wantCalls) {
		t.Errorf("uninstall's systemd calls %q, want %q", got, wantCalls)
	}
	if got := h.read(kubeletCfg); got != kubeadmConfig {
		t.Errorf("kubelet's config after uninstall:\n%s\nwant as it was:\n%s", got, kubeadmConfig)
	}
	if got, want := h.files(), []string{"/proc/100/cmdline", kubeletCfg}; !slices.Equal(got, want) {
		t.Errorf("files on the host after uninstall: %q, want only %q", got, want)
	}
	for _, d := range []string{ConfigDir, UnitDir + "/inplaced.service.d", UnitDir + "/kubelet.service.d"} {
		if h.exists(d) {
			t.Errorf("%s left", d)
		}
	}
	if _, ok := h.node.node.Annotations[AnnotationInstalled]; ok {
		t.Error("annotation left")
	}
	if n := len(h.node.events); n != 3 || !strings.HasPrefix(h.node.events[n-1], "Normal "+ReasonUninstalled) {
		t.Errorf("events %q", h.node.events)
	}
	if p, err := h.run("uninstall", "v2"); err != nil || len(p.Phases) != 0 || len(h.sd.take()) != 0 {
		t.Errorf("a second uninstall: %v\n%s", err, p)
	}
}

// TestExecutorUndoesFailedInstall: kubelet never Ready through inplaced:
// kubelet goes back to containerd (restarted a second time), inplaced is
// stopped, disabled and removed, the host's files are as they were.
func TestExecutorUndoesFailedInstall(t *testing.T) {
	h := newHost(t)
	before := h.files()
	h.node.notReady = true
	_, err := h.run("install", "v1")
	if err == nil || !strings.Contains(err.Error(), "undone") || !strings.Contains(err.Error(), "not Ready") {
		t.Fatalf("install on a node that never gets Ready: %v", err)
	}
	want := []string{"daemon-reload", "enable inplaced.service", "start inplaced.service", "daemon-reload", "restart kubelet.service",
		"daemon-reload", "restart kubelet.service", // the kubelet phase undone
		"stop inplaced.service", "disable inplaced.service", "daemon-reload"} // the inplaced phase undone
	if got := h.sd.take(); !slices.Equal(got, want) {
		t.Errorf("systemd calls %q, want %q", got, want)
	}
	if got := h.read(kubeletCfg); got != kubeadmConfig {
		t.Errorf("kubelet's config after the undo:\n%s", got)
	}
	if got := h.files(); !slices.Equal(got, before) {
		t.Errorf("files after the undo %q, want %q", got, before)
	}
	if h.exists(ConfigDir) || h.exists("/usr/local/bin/inplaced") {
		t.Error("directories or binaries left after the undo")
	}
	if len(h.node.events) != 0 || h.node.node.Annotations[AnnotationInstalled] != "" {
		t.Errorf("a failed install recorded on the Node: %q %v", h.node.events, h.node.node.Annotations)
	}
}

// TestExecutorUndoesFailedUpgrade: the new version never answers CRI: the
// old binary is back and restarted, kubelet untouched.
func TestExecutorUndoesFailedUpgrade(t *testing.T) {
	h := newHost(t)
	if _, err := h.run("install", "v1"); err != nil {
		t.Fatal(err)
	}
	h.sd.take()
	h.release("v2")
	h.cri.fail = errors.New("connection refused")
	_, err := h.run("install", "v2")
	if err == nil || !strings.Contains(err.Error(), "did not answer CRI") || !strings.Contains(err.Error(), "undone") {
		t.Fatalf("upgrade to a version that never answers: %v", err)
	}
	if got := h.sd.take(); !slices.Equal(got, []string{"restart inplaced.service", "restart inplaced.service"}) {
		t.Errorf("systemd calls %q: want the new version restarted, then the old one", got)
	}
	if got := h.read("/usr/local/bin/inplaced"); got != "#!inplaced v1\n" {
		t.Errorf("binary after the undo %q", got)
	}
	rec, err := RecordOf(Facts{Files: map[string]HostFile{RecordPath: hostFile(h.read(RecordPath))}})
	if err != nil || rec.Version != "v1" {
		t.Errorf("record after the undo %+v %v", rec, err)
	}
	if l := h.leftovers(); len(l) > 0 {
		t.Errorf("left behind: %q", l)
	}
}

// TestExecutorBoundsUnitJobs: a restart whose job never ends is given up
// after UnitTimeout, and the install undone.
func TestExecutorBoundsUnitJobs(t *testing.T) {
	h := newHost(t)
	h.sd.hang["restart kubelet.service"] = 1
	ex := h.executor()
	ex.UnitTimeout = 50 * time.Millisecond
	payload, err := LoadPayload(h.payload, filepath.Join(h.payload, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	in := &Inspector{Root: h.root, Proc: filepath.Join(h.root, "proc"), Systemd: h.sd, Node: h.node}
	f, err := in.Facts(context.Background(), Kubeadm, payload)
	if err != nil {
		t.Fatal(err)
	}
	p, err := PlanInstall(Spec{Layout: Kubeadm, Version: "v1", NodeName: "node-1", Payload: payload, Now: time.Now()}, f)
	if err != nil {
		t.Fatal(err)
	}
	err = ex.Run(context.Background(), p)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "undone") {
		t.Fatalf("error %v", err)
	}
	if got := h.read(kubeletCfg); got != kubeadmConfig {
		t.Errorf("kubelet's config after the undo:\n%s", got)
	}
}

// TestExecutorUndoFailsToo: an undo that cannot finish says so with both
// errors.
func TestExecutorUndoFailsToo(t *testing.T) {
	h := newHost(t)
	h.cri.fail = errors.New("connection refused")
	h.sd.fail["stop inplaced.service"] = errors.New("access denied")
	_, err := h.run("install", "v1")
	if err == nil || !strings.Contains(err.Error(), "the undo failed too") || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("error %v", err)
	}
	if h.exists("/usr/local/bin/inplaced") {
		t.Error("the binary stays although the other undo steps ran")
	}
}

// TestExecutorUninstallReportsLeftovers: hold tables a killed inplaced left
// are removed, and a swap that outlasts the wait is cut; the Event says so,
// as a warning.
func TestExecutorUninstallReportsLeftovers(t *testing.T) {
	h := newHost(t)
	if _, err := h.run("install", "v1"); err != nil {
		t.Fatal(err)
	}
	h.kernel = fakeKernel{tables: []string{"inplaced_hold_1 (network namespace of pid 4242)"}}
	h.swaps.running, h.swaps.polls = []string{"shop/web/app"}, -1
	if _, err := h.run("uninstall", "v1"); err != nil {
		t.Fatal(err)
	}
	last := h.node.events[len(h.node.events)-1]
	if !strings.HasPrefix(last, "Warning "+ReasonUninstalled) || !strings.Contains(last, "inplaced_hold_1") ||
		!strings.Contains(last, "shop/web/app") {
		t.Errorf("event %q", last)
	}
}

// TestExecutorUninstallWaitsForSwaps: a swap in flight ends before
// inplaced stops; nothing to report.
func TestExecutorUninstallWaitsForSwaps(t *testing.T) {
	h := newHost(t)
	if _, err := h.run("install", "v1"); err != nil {
		t.Fatal(err)
	}
	h.swaps.running, h.swaps.polls = []string{"shop/web/app"}, 3
	if _, err := h.run("uninstall", "v1"); err != nil {
		t.Fatal(err)
	}
	if h.swaps.polls != 0 {
		t.Errorf("stopped with the swap still running (%d polls left)", h.swaps.polls)
	}
	if last := h.node.events[len(h.node.events)-1]; !strings.HasPrefix(last, "Normal "+ReasonUninstalled) {
		t.Errorf("event %q", last)
	}
}

func TestReadySince(t *testing.T) {
	restart := time.Date(2026, 12, 7, 10, 0, 0, 500e6, time.UTC)
	node := func(status corev1.ConditionStatus, hb time.Time) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(hb)}}}}
	}
	for _, c := range []struct {
		n    *corev1.Node
		want bool
	}{
		{node(corev1.ConditionTrue, restart.Add(2*time.Second)), true},
		{node(corev1.ConditionTrue, restart.Truncate(time.Second)), true}, // the API keeps seconds
		{node(corev1.ConditionTrue, restart.Add(-2*time.Second)), false},  // before the restart
		{node(corev1.ConditionFalse, restart.Add(2*time.Second)), false},
		{&corev1.Node{}, false},
	} {
		if got, why := readySince(c.n, restart); got != c.want {
			t.Errorf("%v: ready %v (%s), want %v", c.n.Status.Conditions, got, why, c.want)
		}
	}
}

func TestSetLine(t *testing.T) {
	for _, c := range []struct{ in, key, line, want string }{
		{"a: 1\nb: 2\n", "b", "b: 3", "a: 1\nb: 3\n"},
		{"a: 1\nb: 2\n", "c", "c: 3", "a: 1\nb: 2\nc: 3\n"},
		{"a: 1", "c", "c: 3", "a: 1\nc: 3\n"},
		{"a: 1\nb: 2\nc: 3\n", "b", "", "a: 1\nc: 3\n"},
		{"a:\n  b: 2\nb: 1\n", "b", "b: 9", "a:\n  b: 2\nb: 9\n"}, // top level only
		{"a: 1\n", "b", "", "a: 1\n"},
	} {
		if got := string(setLine([]byte(c.in), c.key, c.line)); got != c.want {
			t.Errorf("setLine(%q, %s, %q) = %q, want %q", c.in, c.key, c.line, got, c.want)
		}
	}
	if got := string(setTemplateKey([]byte("# kubeconfig: /x\n#   kubeadm: /y\n"), "kubeconfig", "/k")); got != "kubeconfig: \"/k\"\n#   kubeadm: /y\n" {
		t.Errorf("template key: %q", got)
	}
	if v, ok := flagValue([]string{"k3s", "agent", "-c", "/etc/k.yaml"}, "config", "c"); !ok || v != "/etc/k.yaml" {
		t.Errorf("flag -c: %q %v", v, ok)
	}
	if got := quoteExecArg(`a "b" 50% $HOME\`); got != `"a \"b\" 50%% $$HOME\\"` {
		t.Errorf("quoted %s", got)
	}
}
