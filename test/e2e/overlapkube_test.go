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

// TestOverlapKubernetes: in Kubernetes mode, `kubectl set image` of a pod
// with inplaced.io/swap-strategy: overlap goes in place with the overlap
// strategy, under a client opening a new connection every 5 ms and 20
// keep-alive clients: nothing refused, reset or timed out, no request
// failed, the slowest new connection during the swap within 5 ms of the
// slowest in as long a time before it, no keep-alive connection ended by
// the server before the old container was asked to stop; v2 answers
// after, and kubelet adopts the new container (restartCount 1, and no
// further restart in three sync periods).
func TestOverlapKubernetes(t *testing.T) {
	backends, reg := kubeModeBed(t)
	cp := harness.StartControlPlane(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			km := startKubeMode(t, cp, b, reg, "ipov-")
			before := km.createPodWith(t, "ov", km.imgs.App1, func(p *corev1.Pod) {
				p.Annotations = map[string]string{"inplaced.io/swap-strategy": "overlap"}
				p.Spec.Containers[0].Args = overlapArgs
				p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
			})
			oldID := criID(appStatus(before))
			addr := net.JoinHostPort(before.Status.PodIP, "8080")
			eventually(t, 10*time.Second, "v1 answering", func() error { _, err := httpGet("http://" + addr + "/version"); return err })
			o := &overlapRun{addr: addr, dial: harness.StartDialer(addr), ka: harness.StartKeepAlive(addr, 20), start: time.Now()}
			time.Sleep(4 * time.Second)

			km.setImage(t, "ov", km.imgs.App2)
			var rec *inplacedv1.SwapRecord
			eventually(t, 2*time.Minute, "the kubelet-driven swap's record", func() error {
				i := slices.IndexFunc(km.swapsOf(t, "ov"), func(r *inplacedv1.SwapRecord) bool {
					return r.Kind == "kubelet" && r.State != inplacedv1.SwapState_SWAP_STATE_RUNNING
				})
				if i < 0 {
					return fmt.Errorf("no ended kubelet-driven swap")
				}
				rec = km.swapsOf(t, "ov")[i]
				return nil
			})
			after := km.waitInPlace(t, before, oldID, km.imgs.App2)
			time.Sleep(500 * time.Millisecond)
			dials, s := o.end(t)
			t.Logf("record %s %s: strategy %s (%s), takeover %v; steps %s", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy, rec.Takeover, stepList(rec))
			if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != "overlap" || fmt.Sprint(rec.GetTakeover().GetHandedOver()) != "[8080]" {
				t.Fatalf("record %s %s, strategy %s (%s), takeover %v: want committed with overlap, 8080 handed over", rec.State, rec.Error,
					rec.Strategy, rec.StrategyWhy, rec.Takeover)
			}
			start, end := time.Unix(0, rec.StartedUnixNano), time.Unix(0, rec.FinishedUnixNano)
			// kubelet-driven: the swap starts with the pull, and waits for
			// kubelet's stop; the window is the record's.
			during, duringAt, nd := slowestAt(dials, start, end)
			before4, nb := slowest(dials, start.Add(-end.Sub(start)), start)
			if from := o.start.Add(300 * time.Millisecond); start.Add(-end.Sub(start)).Before(from) {
				before4, nb = slowest(dials, from, start)
			}
			t.Logf("swap %s; slowest new connection during it %s (%d, began %s in), before it %s (%d)", end.Sub(start).Round(time.Millisecond),
				during, nd, duringAt.Sub(start).Round(time.Millisecond), before4, nb)
			judgeOverlapSlowest(t, during, before4)
			for _, st := range rec.Steps {
				if st.Name != "stop-old" {
					continue
				}
				for _, c := range o.ka.Tally().Closes {
					if c.At.Before(time.Unix(0, st.StartedUnixNano)) {
						t.Errorf("keep-alive connection ended by the server at %s, before the old container was asked to stop", c.At.Format("15:04:05.000"))
					}
				}
			}
			if s.ByVersion["v1"] == 0 || s.ByVersion["v2"] == 0 {
				t.Errorf("answers %v: want v1, then v2", s.ByVersion)
			}
			if v, err := httpGet("http://" + addr + "/version"); err != nil || strings.TrimSpace(v) != "v2" {
				t.Errorf("after the swap: %q %v", v, err)
			}
			// kubelet adopted it: no further restart in three sync periods.
			newID := criID(appStatus(after))
			time.Sleep(3 * kubeletSync)
			now := km.cp.WaitPod(t, km.ns, "ov", 10*time.Second, podReady)
			if st := appStatus(now); criID(st) != newID || st.RestartCount != 1 {
				t.Errorf("after three sync periods: container %s restartCount %d, want %s and 1", short(criID(st)), st.RestartCount, short(newID))
			}
		})
	}
}

func stepList(rec *inplacedv1.SwapRecord) string {
	var out []string
	for _, s := range rec.Steps {
		n := s.Name
		if s.Error != "" {
			n += "!"
		}
		out = append(out, n)
	}
	return strings.Join(out, ",")
}
