package e2e

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// TestConnectionHoldKubernetes: in Kubernetes mode, a `kubectl set image`
// patch (kubelet-driven swap) and a swap requested by annotation, each under
// a client opening a new connection to the pod IP every 5 ms: nothing
// refused, reset or timed out, each handshake waited at most until the new
// process listened + 50 ms, the new process saw the client's own address,
// and the pod netns has no inplaced table before or after.
func TestConnectionHoldKubernetes(t *testing.T) {
	requireNft(t)
	harness.KubeletPrerequisites(t)
	harness.ControlPlanePrerequisites(t)
	harness.RequireRoot(t)
	backends := harness.BackendsFromEnv()
	harness.Require(t, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	reg := harness.StartRegistry(t)
	cp := harness.StartControlPlane(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			km := startKubeMode(t, cp, b, reg, "iphold-")

			p := km.createPodWith(t, "held", km.imgs.App1, func(p *corev1.Pod) {
				p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
			})
			_, sbInfo := sandboxInfo(t, km.direct, km.sandboxOf(t, "held"))
			addr := net.JoinHostPort(p.Status.PodIP, "8080")
			eventually(t, 10*time.Second, "v1 answering", func() error { _, err := httpGet("http://" + addr + "/version"); return err })

			under := func(t *testing.T, kind string, seen int, change func()) *inplacedv1.SwapRecord {
				return km.holdUnder(t, "held", addr, sbInfo.Pid, kind, seen, change)
			}

			t.Run("kubectl set image", func(t *testing.T) {
				under(t, "kubelet", 0, func() { km.setImage(t, "held", km.imgs.App2) })
			})
			t.Run("annotation swap", func(t *testing.T) {
				req := `{"container":"app","env":{"GREETING":"held"},"minRuntime":"1s"}`
				under(t, "swap", 0, func() { km.requestSwap(t, "held", req) })
			})
			// The app shapes whose processes only the container's cgroup
			// finds: the same on every backend (runc, the host's cgroups),
			// so one backend is enough. The backlog-5 serial server is
			// swapped node-local only (TestHoldAppShapes, BenchmarkHoldRelease):
			// beside a kubelet on two loaded CPUs it drops SYNs itself at
			// 200 connections a second, before the hold and after it.
			if b != backends[0] {
				return
			}
			for i, sh := range appShapes[1:3] {
				t.Run("kubectl set image, "+sh.name, func(t *testing.T) {
					name := fmt.Sprintf("held-shape%d", i)
					p := km.createPodWith(t, name, km.imgs.App1, func(p *corev1.Pod) {
						p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = sh.command, sh.args
						p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
					})
					_, info := sandboxInfo(t, km.direct, km.sandboxOf(t, name))
					a := net.JoinHostPort(p.Status.PodIP, "8080")
					eventually(t, 10*time.Second, "v1 answering", func() error { _, err := httpGet("http://" + a + "/version"); return err })
					rec := km.holdUnder(t, name, a, info.Pid, "kubelet", 0, func() { km.setImage(t, name, km.imgs.App2) })
					if fmt.Sprint(rec.GetHold().GetPorts()) != "[8080]" {
						t.Errorf("held ports %v, want [8080]", rec.GetHold().GetPorts())
					}
				})
			}
		})
	}
}

// holdUnder runs change while a client dials addr, and returns the record
// of the (kind) swap it caused on pod: committed, the hold released for
// listening, no connection failed or waited past the release + 50 ms, no
// table in the pod netns (pid's) before or after.
func (km *kmenv) holdUnder(t *testing.T, pod, addr string, pid int, kind string, seen int, change func()) *inplacedv1.SwapRecord {
	t.Helper()
	checkNoHoldTable(t, pid, "before the swap")
	d := harness.StartDialer(addr)
	time.Sleep(300 * time.Millisecond)
	change()
	var rec *inplacedv1.SwapRecord
	eventually(t, 2*time.Minute, "the swap's record", func() error {
		var recs []*inplacedv1.SwapRecord
		for _, r := range km.swapsOf(t, pod) {
			if r.Kind == kind {
				recs = append(recs, r)
			}
		}
		if len(recs) <= seen {
			return fmt.Errorf("%d records of kind %s", len(recs), kind)
		}
		rec = slices.MaxFunc(recs, func(a, b *inplacedv1.SwapRecord) int { return strings.Compare(a.Id, b.Id) }) // IDs are time-ordered
		if rec.State == inplacedv1.SwapState_SWAP_STATE_RUNNING {
			return fmt.Errorf("swap %s running", rec.Id)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	ds := d.End()
	checkNoHoldTable(t, pid, "after the swap")
	h := rec.GetHold()
	s := harness.TallyDials(t, ds)
	t.Logf("%s swap %s, hold %v; %d connections: %+v", kind, rec.State, h, len(ds), s)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || h.GetMode() != "queue" || h.GetReason() != "listening" {
		t.Fatalf("record: %s %s, hold %v", rec.State, rec.Error, h)
	}
	if s.Failed() > 0 {
		t.Errorf("client: %+v, want no failure", s)
	}
	harness.CheckWaits(t, ds, time.Unix(0, h.StartedUnixNano+h.DurationNs))
	return rec
}
