package e2e

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// brokenState is one way inplaced's state store cannot be used.
type brokenState struct {
	name string
	// breakIt makes dir unusable before inplaced starts on it and returns
	// what the operator does to fix it.
	breakIt func(t *testing.T, dir string) (fix func(t *testing.T))
	// refusal is in the refused swap's error and in inplacectl status.
	refusal string
}

// TestFailOpen: inplaced started on a state store it cannot use — a
// damaged state.db, a full filesystem, a read-only one — serves a real
// kubelet (its pod keeps running, a new pod starts), refuses swaps with the
// reason, keeps the damaged file as it was, and swaps again once the cause
// is fixed (file moved aside, space freed, filesystem remounted), without a
// restart of inplaced or kubelet.
func TestFailOpen(t *testing.T) {
	harness.KubeletPrerequisites(t)
	harness.Require(t, "mount", haveCmd("mount") && haveCmd("umount"), "mount and umount are needed for a full and a read-only state filesystem")
	// The state store is inplaced's own: one containerd proves it.
	forFirstBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		k := harness.StartKubelet(t, harness.KubeletOptions{
			RuntimeEndpoint: e.px.Endpoint, BackendEndpoint: c.Endpoint, SyncFrequency: kubeletSync,
		})
		ke := &kenv{env: e, k: k, ns: "fo"}
		k.WritePod(t, harness.StaticPod{Name: "keep", Namespace: ke.ns, Containers: []harness.StaticContainer{
			{Name: "app", Image: e.imgs.App1, Env: [][2]string{{"A", "0"}}}}})
		k.WaitPod(t, ke.ns, k.PodName("keep"), 2*time.Minute, harness.Running("app"))
		for i, b := range []brokenState{
			{name: "damaged", breakIt: damagedStateDB, refusal: "damaged"},
			{name: "full", breakIt: fullStateFS, refusal: "no space left on device"},
			{name: "read-only", breakIt: readOnlyStateFS, refusal: "read-only file system"},
		} {
			t.Run(b.name, func(t *testing.T) { ke.testBrokenState(t, b, i+1) })
		}
		if n := ke.pxLogCount(t, 0, "panic:"); n > 0 {
			t.Errorf("inplaced panicked:\n%s", e.px.LogTail(40))
		}
	})
}

func (ke *kenv) testBrokenState(t *testing.T, b brokenState, round int) {
	dir := filepath.Join(ke.px.Dir, "state-"+b.name)
	if err := ke.px.Stop(); err != nil {
		t.Fatal(err)
	}
	fix := b.breakIt(t, dir)
	ke.px.ExtraArgs = []string{"--state-dir", dir}
	started := time.Now()
	if err := ke.px.Start(); err != nil {
		t.Fatalf("inplaced on a %s state store: %v\n%s", b.name, err, ke.px.LogTail(30))
	}
	t.Logf("inplaced serves CRI on a %s state store %s after its start", b.name, time.Since(started).Round(time.Millisecond))
	pid, kpid := ke.px.PID(), ke.k.PID()
	keep := ke.k.PodName("keep")
	before := ke.k.WaitPod(t, ke.ns, keep, time.Minute, harness.Running("app")).Container("app").ID()

	// kubelet's calls pass through: a new pod starts.
	fresh := fmt.Sprintf("new-%s", b.name)
	ke.k.WritePod(t, harness.StaticPod{Name: fresh, Namespace: ke.ns, Containers: []harness.StaticContainer{{Name: "app", Image: ke.imgs.App1}}})
	t.Cleanup(func() { ke.k.RemovePod(t, fresh) })
	ke.k.WaitPod(t, ke.ns, ke.k.PodName(fresh), 2*time.Minute, harness.Running("app"))

	// Swaps are refused with the reason; status says what is wrong.
	out, err := ke.px.Ctl("swap", keep, "-n", ke.ns, "-c", "app", "--env", "A=refused")
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), b.refusal) {
		t.Fatalf("swap on a %s state store: %v\n%s; want it refused with %q", b.name, err, out, b.refusal)
	}
	t.Logf("refused: %v", err)
	st := ke.status(t)
	if st.SwapsAllowed || len(st.Problems) == 0 || st.Problems[0].Part != "state" || !strings.Contains(st.Problems[0].What, b.refusal) || st.Problems[0].Action == "" {
		t.Fatalf("status on a %s state store: %v", b.name, st)
	}
	t.Logf("inplacectl status: %s — %s", st.Problems[0].What, st.Problems[0].Action)
	if n := ke.pxLogCount(t, 0, "out of service: kubelet's CRI calls still pass through"); n < round {
		t.Errorf("the log said %d times that the state store is out of service, want %d", n, round)
	}

	// The pod kept running all along: same container.
	if now := ke.k.WaitPod(t, ke.ns, keep, time.Minute, harness.Running("app")).Container("app").ID(); now != before {
		t.Errorf("kubelet's container of %s changed while the state store was out: %s → %s", keep, short(before), short(now))
	}

	fix(t)
	fixed := time.Now()
	eventually(t, 30*time.Second, "swaps allowed again", func() error {
		if st := ke.status(t); !st.SwapsAllowed {
			return errorf("status %v", st)
		}
		return nil
	})
	t.Logf("swaps allowed again %s after the fix", time.Since(fixed).Round(time.Millisecond))
	rec := ke.swap(t, keep, "--env", "A="+b.name)
	if rec.State != "SWAP_STATE_COMMITTED" {
		t.Fatalf("swap after the fix: %+v", rec)
	}
	ke.k.WaitPod(t, ke.ns, keep, time.Minute, func(p *harness.KubePod) error {
		if err := harness.Running("app")(p); err != nil {
			return err
		}
		if id := p.Container("app").ID(); id != rec.RunningContainerID {
			return fmt.Errorf("kubelet shows %s, the swap runs %s", short(id), short(rec.RunningContainerID))
		}
		return nil
	})
	if ke.px.PID() != pid || ke.k.PID() != kpid {
		t.Errorf("inplaced (%d → %d) or kubelet (%d → %d) restarted", pid, ke.px.PID(), kpid, ke.k.PID())
	}
}

func (ke *kenv) status(t *testing.T) *inplacedv1.StatusResponse {
	t.Helper()
	out, err := ke.px.Ctl("status", "-o", "json")
	if err != nil {
		t.Fatalf("inplacectl status: %v\n%s", err, out)
	}
	st := &inplacedv1.StatusResponse{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), st); err != nil {
		t.Fatalf("decode status: %v\n%s", err, out)
	}
	return st
}

// damagedStateDB writes a state.db that is not a bbolt file; the fix is the
// documented one: move it aside. The file must be kept byte for byte.
func damagedStateDB(t *testing.T, dir string) func(*testing.T) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 64<<10)
	_, _ = rand.Read(junk)
	path := filepath.Join(dir, "state.db")
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T) {
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, junk) {
			t.Errorf("the damaged state.db was not kept as it was (%v)", err)
		}
		if err := os.Rename(path, path+".damaged"); err != nil {
			t.Fatal(err)
		}
	}
}

// fullStateFS mounts a small tmpfs at dir and fills it; the fix frees it.
func fullStateFS(t *testing.T, dir string) func(*testing.T) {
	mountTmpfs(t, dir, "size=512k")
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	f.Close()
	return func(t *testing.T) {
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	}
}

// readOnlyStateFS mounts a tmpfs at dir read-only; the fix remounts it
// read-write.
func readOnlyStateFS(t *testing.T, dir string) func(*testing.T) {
	mountTmpfs(t, dir, "size=4m")
	run(t, "mount", "-o", "remount,ro", dir)
	return func(t *testing.T) { run(t, "mount", "-o", "remount,rw", dir) }
}

func mountTmpfs(t *testing.T, dir, opts string) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-t", "tmpfs", "-o", opts+",mode=0700", "tmpfs", dir)
	t.Cleanup(func() {
		// Lazily: inplaced may still hold the state file when the test ends.
		_ = exec.Command("umount", "-l", dir).Run()
	})
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func haveCmd(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// TestKubeconfigLate: inplaced started with a --kubeconfig that does not
// exist yet (a k3s node's first boot) serves kubelet's CRI calls from the
// start, says it waits for the kubeconfig, starts Kubernetes mode when the
// file appears, and then an image patch goes in place.
func TestKubeconfigLate(t *testing.T) {
	backends, reg := kubeModeBed(t)
	cp := harness.StartControlPlane(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			c := harness.StartContainerd(t, b, reg)
			node := "ipkl-" + randSuffix()
			kubeconfig := cp.NodeKubeconfig(t, node)
			late := filepath.Join(t.TempDir(), "kubelet.conf")
			e := newEnv(t, c)
			if err := e.px.Stop(); err != nil {
				t.Fatal(err)
			}
			e.px.ExtraArgs = []string{"--kubeconfig", late, "--node-name", node}
			if err := e.px.Start(); err != nil {
				t.Fatalf("inplaced with a kubeconfig still to come: %v\n%s", err, e.px.LogTail(30))
			}
			pid := e.px.PID()
			k := cp.StartKubelet(t, harness.KubeletOptions{RuntimeEndpoint: e.px.Endpoint, BackendEndpoint: c.Endpoint,
				SyncFrequency: kubeletSync, NodeName: node})
			cp.WaitNodeReady(t, node, 2*time.Minute)
			km := &kmenv{kenv: &kenv{env: e, k: k, ns: "default"}, cp: cp, node: node}
			// CRI is served before the kubeconfig exists: a pod runs.
			early := km.createPod(t, "early", e.imgs.App1)
			st := km.status(t)
			if st.Kubernetes != "waiting" || len(st.Problems) == 0 || st.Problems[0].Part != "kubeconfig" || !st.SwapsAllowed {
				t.Fatalf("status before the kubeconfig exists: %v", st)
			}
			t.Logf("before the kubeconfig exists: pod %s runs; status: %s — %s", early.Name, st.Problems[0].What, st.Problems[0].Action)

			data, err := os.ReadFile(kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(late, data, 0o600); err != nil {
				t.Fatal(err)
			}
			appeared := time.Now()
			eventually(t, 30*time.Second, "Kubernetes mode on", func() error {
				if st := km.status(t); st.Kubernetes != "on" || len(st.Problems) != 0 {
					return errorf("status %v", st)
				}
				return nil
			})
			t.Logf("Kubernetes mode on %s after the kubeconfig appeared", time.Since(appeared).Round(time.Millisecond))

			before := km.createPod(t, "later", e.imgs.App1)
			oldID := criID(appStatus(before))
			km.setImage(t, "later", e.imgs.App2)
			km.waitInPlace(t, before, oldID, e.imgs.App2)
			recs := km.kubeletSwaps(t, "later")
			if len(recs) != 1 || recs[0].State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || recs[0].OldContainerId != oldID {
				t.Fatalf("kubelet-driven swap records of the patched pod: %v, want one committed from %s", recs, short(oldID))
			}
			if e.px.PID() != pid {
				t.Errorf("inplaced restarted (%d → %d)", pid, e.px.PID())
			}
		})
	}
}
