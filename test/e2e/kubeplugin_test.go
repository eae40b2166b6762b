package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/test/harness"
)

// notReadyPoller lists the selected pods every 50 ms and keeps the most
// that were not Ready at once.
type notReadyPoller struct {
	mu       sync.Mutex
	max      int
	maxAt    []string // the pods not Ready when max was reached
	samples  int
	stop     chan struct{}
	finished chan struct{}
}

func (km *kmenv) pollNotReady(selector string) *notReadyPoller {
	pl := &notReadyPoller{stop: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(pl.finished)
		for {
			select {
			case <-pl.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			l, err := km.cp.Admin.CoreV1().Pods(km.ns).List(c, metav1.ListOptions{LabelSelector: selector})
			cancel()
			if err != nil {
				continue
			}
			var notReady []string
			for i := range l.Items {
				if readyStatus(&l.Items[i]) != corev1.ConditionTrue {
					notReady = append(notReady, l.Items[i].Name)
				}
			}
			pl.mu.Lock()
			pl.samples++
			if len(notReady) > pl.max {
				pl.max, pl.maxAt = len(notReady), notReady
			}
			pl.mu.Unlock()
		}
	}()
	return pl
}

func (pl *notReadyPoller) end() (max int, at []string, samples int) {
	close(pl.stop)
	<-pl.finished
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.max, pl.maxAt, pl.samples
}

// kubectlInplace runs `kubectl inplace ...` as a user does: kubectl finds
// the plugin binary of `make build` on PATH (kubectl's plugin convention)
// and hands it the arguments, with the admin kubeconfig.
func (km *kmenv) kubectlInplace(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, harness.KubectlPath(), append([]string{"inplace", "--kubeconfig", km.cp.AdminKubeconfig, "-n", km.ns}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+harness.BinDir(t)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// testKubectlPlugin: `kubectl inplace swap -l`
// over three gated pods with --max-unavailable 1 goes highest ordinal
// first with at most one pod NotReady at any time (polled), and halts at
// the first pod whose swap fails, leaving the next one untouched.
func (km *kmenv) testKubectlPlugin(t *testing.T) {
	const sel = "app=kplugin"
	names := []string{"kplugin-0", "kplugin-1", "kplugin-2"}
	ids := map[string]string{}
	uids := map[string]string{}
	for _, n := range names {
		p := km.createPodWith(t, n, km.imgs.App1, func(p *corev1.Pod) {
			p.Labels = map[string]string{"app": "kplugin"}
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: podapi.ConditionInPlaceReady}}
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "hello"}}
		})
		ids[n], uids[n] = criID(appStatus(p)), string(p.UID)
	}
	get := func(n string) *corev1.Pod {
		p, err := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	status := func(p *corev1.Pod) *podapi.SwapStatus {
		var st podapi.SwapStatus
		if err := json.Unmarshal([]byte(p.Annotations[podapi.AnnotationSwapStatus]), &st); err != nil {
			return nil
		}
		return &st
	}

	// 1. An env change over the three, one at a time.
	pl := km.pollNotReady(sel)
	start := time.Now()
	out, err := km.kubectlInplace(t, "swap", "-l", sel, "-c", "app", "--env", "GREETING=bonjour",
		"--health-http", "8080/healthz", "--min-runtime", "1s", "--drain-seconds", "1", "--max-unavailable", "1", "--timeout", "2m")
	took := time.Since(start)
	maxNR, at, samples := pl.end()
	t.Logf("kubectl-inplace swap -l %s --env (%s, exit %v):\n%s", sel, took.Round(time.Millisecond), err, out)
	if err != nil {
		t.Fatalf("env change over %s: %v", sel, err)
	}
	if !strings.Contains(out, "3 committed, 0 failed") {
		t.Errorf("summary does not say 3 committed")
	}
	if maxNR != 1 {
		t.Errorf("at most %d pods NotReady at once in %d samples (%v), want exactly 1", maxNR, samples, at)
	}
	// Highest ordinal first.
	last := -1
	for _, n := range []string{"kplugin-2", "kplugin-1", "kplugin-0"} {
		i := strings.Index(out, "pod/"+n+": swap of container app requested")
		if i < 0 || i < last {
			t.Errorf("%s requested out of order (at %d, previous at %d)", n, i, last)
		}
		last = i
	}
	envReq := ""
	for _, n := range names {
		p := get(n)
		st := status(p)
		if st == nil || st.State != podapi.StateCommitted || string(p.UID) != uids[n] || criID(appStatus(p)) == ids[n] || readyStatus(p) != corev1.ConditionTrue {
			t.Errorf("%s after the env change: status %+v, UID %s (was %s), container %s (was %s), Ready %s",
				n, st, p.UID, uids[n], short(criID(appStatus(p))), short(ids[n]), readyStatus(p))
		}
		ids[n] = criID(appStatus(p))
		envReq = p.Annotations[podapi.AnnotationSwap]
	}
	t.Logf("env change over 3 pods in %s; at most %d NotReady at once (%d samples, e.g. %v)", took.Round(time.Millisecond), maxNR, samples, at)

	// `kubectl inplace` through kubectl itself (the plugin convention),
	// with the kubeconfig from $KUBECONFIG.
	{
		cmd := exec.Command(harness.KubectlPath(), "inplace", "status", "kplugin-0", "-o", "json")
		cmd.Env = append(os.Environ(), "PATH="+harness.BinDir(t)+":"+os.Getenv("PATH"), "KUBECONFIG="+km.cp.AdminKubeconfig)
		b, err := cmd.Output()
		var ps struct {
			Pod    string             `json:"pod"`
			Status *podapi.SwapStatus `json:"status"`
		}
		if err != nil || json.Unmarshal(b, &ps) != nil || ps.Pod != "kplugin-0" || ps.Status == nil || ps.Status.State != podapi.StateCommitted {
			t.Errorf("kubectl inplace status kplugin-0 -o json: %v\n%s", err, b)
		}
	}

	// 2. A new image that crashes: the first pod rolls back, the walk
	// halts, the next pod is untouched.
	pl = km.pollNotReady(sel)
	out, err = km.kubectlInplace(t, "swap", "-l", sel, "-c", "app", "--image", km.imgs.Crash,
		"--min-runtime", "1s", "--max-unavailable", "1", "--timeout", "2m")
	maxNR, at, samples = pl.end()
	t.Logf("kubectl-inplace swap -l %s --image %s (exit %v):\n%s", sel, km.imgs.Crash, err, out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("a crashing image over %s: exit %v, want non-zero", sel, err)
	}
	if !strings.Contains(out, "halted") || !strings.Contains(out, "0 committed, 1 failed, 0 below partition, 2 not started") {
		t.Errorf("output does not say it halted after one failure")
	}
	if maxNR > 1 {
		t.Errorf("%d pods NotReady at once (%v)", maxNR, at)
	}
	if st := status(get("kplugin-2")); st == nil || st.State != podapi.StateRolledBack {
		t.Errorf("kplugin-2: status %+v, want RolledBack", st)
	}
	for _, n := range []string{"kplugin-1", "kplugin-0"} {
		p := get(n)
		s := appStatus(p)
		if p.Annotations[podapi.AnnotationSwap] != envReq || criID(s) != ids[n] || s.State.Running == nil {
			t.Errorf("%s was touched after the halt: request %s, container %s (was %s)", n, p.Annotations[podapi.AnnotationSwap], short(criID(s)), short(ids[n]))
		}
		if st := status(p); st == nil || st.State != podapi.StateCommitted || st.RequestDigest != podapi.Digest(envReq) {
			t.Errorf("%s status changed: %+v", n, st)
		}
	}
	km.cp.WaitPod(t, km.ns, "kplugin-2", time.Minute, podReady)
	t.Logf("crashing command: halted at kplugin-2 (RolledBack), kplugin-1 and kplugin-0 untouched; at most %d NotReady at once (%d samples)", maxNR, samples)
}
