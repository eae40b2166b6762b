package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// kubeletSync is the test kubelet's syncFrequency: every pod is synced at
// least that often, so "no call during three sync periods" means kubelet
// looked at the swapped pod three times and left it alone.
const kubeletSync = 3 * time.Second

// kenv is a real kubelet whose CRI endpoints are inplaced's socket, in front
// of a private containerd.
type kenv struct {
	*env
	k       *harness.Kubelet
	ns      string
	deleted *deletedPod
}

// TestKubelet proves that a real kubelet (v1.37, standalone, static pods)
// adopts swaps, keeps them across its own restarts of the container, lets
// the declared spec win, never races a swap (fencing and masking), and that
// deleting a pod mid-swap aborts the swap cleanly.
func TestKubelet(t *testing.T) {
	harness.KubeletPrerequisites(t)
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		start := time.Now()
		e := newEnv(t, c)
		k := harness.StartKubelet(t, harness.KubeletOptions{
			RuntimeEndpoint: e.px.Endpoint, BackendEndpoint: c.Endpoint, SyncFrequency: kubeletSync,
		})
		ke := &kenv{env: e, k: k, ns: "kt"}
		app := func(image string, env ...[2]string) []harness.StaticContainer {
			return []harness.StaticContainer{{Name: "app", Image: image, Env: env}}
		}
		// Every pod is declared up front: kubelet starts them in parallel.
		pods := []harness.StaticPod{
			{Name: "adopt", Namespace: ke.ns, Containers: app(e.imgs.App1, [2]string{"A", "1"})},
			{Name: "churn", Namespace: ke.ns, Containers: app(e.imgs.App1)},
			{Name: "rp-always", Namespace: ke.ns, RestartPolicy: "Always", Containers: app(e.imgs.App1)},
			{Name: "rp-onfailure", Namespace: ke.ns, RestartPolicy: "OnFailure", Containers: app(e.imgs.App1)},
			{Name: "rp-never", Namespace: ke.ns, RestartPolicy: "Never", Containers: app(e.imgs.App1)},
			{Name: "doomed", Namespace: ke.ns, Containers: app(e.imgs.App1)},
			{Name: "racer", Namespace: ke.ns, TerminationGracePeriodSeconds: 10, Containers: []harness.StaticContainer{
				{Name: "app", Image: e.imgs.App1, Env: [][2]string{{"A", "1"}}, PreStopSleep: 4}}},
		}
		for _, p := range pods {
			k.WritePod(t, p)
		}
		for _, p := range pods {
			k.WaitPod(t, ke.ns, k.PodName(p.Name), 2*time.Minute, harness.Running("app"))
		}
		t.Logf("kubelet runs %d static pods after %s", len(pods), time.Since(start).Round(time.Millisecond))

		// First, so that kubelet's garbage collection of the deleted pod
		// overlaps the other tests.
		t.Run("pod deleted mid-swap", ke.testDeleteMidSwap)
		// One pod through its life: swapped, killed, then re-declared.
		if t.Run("adopt", ke.testAdopt) && t.Run("restart keeps the swap", ke.testStickyRestart) {
			t.Run("declared spec wins", func(t *testing.T) { ke.testSpecWins(t, pods[0]) })
		}
		t.Run("kubelet's racing create gets the swap's container", ke.testFencedCreate)
		t.Run("30 swaps back to back", ke.testBackToBack)
		if t.Run("restart policies", ke.testRestartPolicies) {
			t.Run("revert", ke.testRevert)
		}
		t.Run("deleted pod collected", ke.testDeletedPodCollected)

		if bad := k.LogGrep("name is reserved", "CreateContainerError", "failed to reserve container name"); len(bad) > 0 {
			t.Errorf("kubelet raced a swap for a container name (%d lines), first: %s", len(bad), bad[0])
		}

		// Teardown leaves nothing: kubelet first, then the proxy, then containerd.
		if err := k.Close(); err != nil {
			t.Errorf("kubelet close: %v", err)
		}
		if l := k.Leftovers(); len(l) > 0 {
			t.Errorf("kubelet left behind: %v", l)
		}
		_ = e.px.Stop()
		if err := c.Close(); err != nil {
			t.Errorf("containerd close: %v", err)
		}
		if l := c.Leftovers(); len(l) > 0 {
			t.Errorf("containerd left behind: %v", l)
		}
		t.Logf("TestKubelet on %s took %s", c.Backend, time.Since(start).Round(time.Millisecond))
	})
}

// testAdopt: a swap of a static pod's container is adopted by kubelet (new
// image, ready, restartCount+1, the swap's container), and kubelet makes no
// Create/Start/Stop/RemoveContainer call for the pod, during the swap nor
// in the next three sync periods.
func (ke *kenv) testAdopt(t *testing.T) {
	name := ke.k.PodName("adopt")
	before := ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app"))
	r0 := before.Container("app").RestartCount
	sb := ke.sandboxOf(t, name)

	off := ke.logOffset(t)
	rec := ke.swap(t, name, "--image", ke.imgs.App2, "--env", "X=Y", "--min-runtime", "1s")
	swapEnd := time.Now()
	if rec.State != "SWAP_STATE_COMMITTED" {
		t.Fatalf("swap: %+v", rec)
	}
	during := ke.kubeletCalls(t, off, sb)

	p := ke.k.WaitPod(t, ke.ns, name, 2*kubeletSync+5*time.Second, func(p *harness.KubePod) error {
		c := p.Container("app")
		switch {
		case c == nil:
			return fmt.Errorf("no status")
		case c.ID() != rec.RunningContainerID:
			return fmt.Errorf("kubelet follows %s, swap runs %s", short(c.ID()), short(rec.RunningContainerID))
		case c.Image != ke.imgs.App2 || !c.Ready || c.State.Running == nil || c.RestartCount != r0+1:
			b, _ := json.Marshal(c)
			return fmt.Errorf("status %s", b)
		}
		return nil
	})
	adopted := time.Since(swapEnd)
	c := p.Container("app")
	if c.LastState.Terminated == nil || c.LastState.Terminated.ContainerID == "" ||
		!strings.HasSuffix(c.LastState.Terminated.ContainerID, rec.OldContainerID) {
		t.Errorf("lastState is not the replaced container %s: %+v", short(rec.OldContainerID), c.LastState)
	}
	// Three sync periods after the swap: kubelet still leaves it alone.
	time.Sleep(time.Until(swapEnd.Add(3 * kubeletSync)))
	after := ke.kubeletCalls(t, off, sb)
	t.Logf("kubelet adopted the swap %s after it ended: image %s, ready %v, restartCount %d→%d; kubelet's calls for the pod: during the swap %v, swap + 3 sync periods (%s) %v",
		adopted.Round(time.Millisecond), c.Image, c.Ready, r0, c.RestartCount, during, 3*kubeletSync, after)
	for _, m := range []string{"CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "StopPodSandbox"} {
		if after[m] != 0 {
			t.Errorf("kubelet called %s %d times for the swapped pod", m, after[m])
		}
	}
	now, err := ke.k.Pod(context.Background(), ke.ns, name)
	if err != nil || now.Container("app").ID() != rec.RunningContainerID || now.Container("app").RestartCount != r0+1 {
		t.Fatalf("after three sync periods kubelet no longer shows the swap: %+v %v", now, err)
	}
	if st, in := containerInfo(t, ke.direct, rec.RunningContainerID); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("swapped container %s", st.State)
	} else {
		ke.checkProcess(t, in.Pid, "v2", []string{"X=Y", "A=1"}, nil)
	}
}

// testStickyRestart: kubelet restarts the killed swapped container, and the
// proxy's override makes it run the swap's image and env.
func (ke *kenv) testStickyRestart(t *testing.T) {
	name := ke.k.PodName("adopt")
	before := ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app"))
	bc := before.Container("app")
	_, in := containerInfo(t, ke.direct, bc.ID())
	off := ke.logOffset(t)
	if err := syscall.Kill(in.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	p := ke.k.WaitPod(t, ke.ns, name, 30*time.Second, func(p *harness.KubePod) error {
		c := p.Container("app")
		if c == nil || c.ID() == bc.ID() || c.State.Running == nil || !c.Ready || c.RestartCount != bc.RestartCount+1 {
			b, _ := json.Marshal(c)
			return fmt.Errorf("not restarted yet: %s", b)
		}
		return nil
	})
	c := p.Container("app")
	st, in2 := containerInfo(t, ke.direct, c.ID())
	calls := ke.kubeletCalls(t, off, ke.sandboxOf(t, name))
	t.Logf("kubelet restarted the killed container in %s: %s image %s restartCount %d; kubelet calls %v",
		time.Since(killed).Round(time.Millisecond), short(c.ID()), c.Image, c.RestartCount, calls)
	if calls["CreateContainer"] != 1 {
		t.Errorf("kubelet's CreateContainer calls: %d, want 1", calls["CreateContainer"])
	}
	if st.GetImage().GetImage() != ke.imgs.App2 || c.Image != ke.imgs.App2 {
		t.Errorf("restarted container's image: runtime %q, kubelet %q; want the swap's %s", st.GetImage().GetImage(), c.Image, ke.imgs.App2)
	}
	ke.checkProcess(t, in2.Pid, "v2", []string{"X=Y", "A=1"}, nil)
	if n := ke.pxLogCount(t, off, "applied swap override to kubelet's CreateContainer"); n != 1 {
		t.Errorf("inplaced logged %d applied overrides, want 1", n)
	}
	if o := ke.overrides(t, name); len(o) != 1 {
		t.Errorf("overrides for %s: %+v, want one", name, o)
	}
}

// testSpecWins: a new manifest (image App1 → App2, env A=1 → A=2) makes a
// new pod from the manifest only: the old pod's override dies with its
// sandbox and never reaches the new pod.
func (ke *kenv) testSpecWins(t *testing.T, p harness.StaticPod) {
	name := ke.k.PodName(p.Name)
	oldSB := ke.sandboxOf(t, name)
	if o := ke.overrides(t, name); len(o) != 1 {
		t.Fatalf("want the swap's override before the manifest change, have %+v", o)
	}
	off := ke.logOffset(t)
	p.Containers = []harness.StaticContainer{{Name: "app", Image: ke.imgs.App2, Env: [][2]string{{"A", "2"}}}}
	ke.k.WritePod(t, p)
	changed := time.Now()
	var newSB string
	kp := ke.k.WaitPod(t, ke.ns, name, time.Minute, func(kp *harness.KubePod) error {
		if err := harness.Running("app")(kp); err != nil {
			return err
		}
		newSB = ke.readySandboxOf(name)
		if newSB == "" || newSB == oldSB {
			return fmt.Errorf("no new sandbox yet")
		}
		if kp.Container("app").RestartCount != 0 {
			return fmt.Errorf("restartCount %d", kp.Container("app").RestartCount)
		}
		return nil
	})
	c := kp.Container("app")
	_, in := containerInfo(t, ke.direct, c.ID())
	ke.checkProcess(t, in.Pid, "v2", []string{"A=2"}, []string{"X=", "A=1"})
	if c.Image != ke.imgs.App2 {
		t.Errorf("kubelet shows image %s, want the manifest's %s", c.Image, ke.imgs.App2)
	}
	if n := ke.pxLogCount(t, off, "applied swap override to kubelet's CreateContainer"); n != 0 {
		t.Errorf("an override was applied to the new pod (%d times)", n)
	}
	// The old pod's override ends with its sandbox.
	var left []override
	eventually(t, 90*time.Second, "the old pod's override ends with its sandbox", func() error {
		if left = ke.overrides(t, name); len(left) > 0 {
			return fmt.Errorf("overrides: %+v", left)
		}
		return nil
	})
	dropped := 0
	for _, r := range swaps(t, ke.env) {
		if strings.Contains(r.ID, "override-dropped") {
			dropped++
		}
	}
	t.Logf("new pod from the manifest in %s (sandbox %s → %s): v2, A=2, no X; no override applied; override gone after %s; override-dropped records: %d",
		time.Since(changed).Round(time.Millisecond), short(oldSB), short(newSB), time.Since(changed).Round(time.Millisecond), dropped)
}

// testFencedCreate: the old container dies while the swap runs its preStop
// (before the mask is on), so kubelet sees it exited and restarts it. Its
// CreateContainer waits for the swap and is answered with the swap's
// container: one container runs, kubelet follows it, containerd never saw a
// second CreateContainer for the name.
func (ke *kenv) testFencedCreate(t *testing.T) {
	name := ke.k.PodName("racer")
	before := ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app"))
	sb := ke.sandboxOf(t, name)
	_, in := containerInfo(t, ke.direct, before.Container("app").ID())
	off := ke.logOffset(t)
	done := make(chan swapRecord, 1)
	go func() {
		done <- ke.swapNoFatal(name, "--image", ke.imgs.App2, "--env", "X=Y", "--min-runtime", "1s")
	}()
	// Once the pull is done the preStop sleep (4 s) runs: kill the old
	// container under it.
	eventually(t, 30*time.Second, "the swap in its preStop", func() error {
		if ke.pxLogCount(t, off, `"step": "pull"`) == 0 { // pull done: preStop runs
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if err := syscall.Kill(in.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var rec swapRecord
	select {
	case rec = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("swap did not end")
	}
	if rec.State != "SWAP_STATE_COMMITTED" {
		t.Fatalf("swap: %+v", rec)
	}
	p := ke.k.WaitPod(t, ke.ns, name, 2*kubeletSync+5*time.Second, func(p *harness.KubePod) error {
		c := p.Container("app")
		if c == nil || c.ID() != rec.RunningContainerID || c.State.Running == nil || !c.Ready || c.Image != ke.imgs.App2 {
			b, _ := json.Marshal(c)
			return fmt.Errorf("kubelet does not follow the swap's %s: %s", short(rec.RunningContainerID), b)
		}
		return nil
	})
	calls := ke.kubeletCalls(t, off, sb)
	answered := ke.pxLogCount(t, off, "answered kubelet's CreateContainer with the swap's container")
	waited := ke.pxLogCount(t, off, "kubelet call waits for a swap")
	cs := ke.listDirect(t, sb)
	t.Logf("old container killed in the swap's preStop: kubelet's calls %v, %d waited on the fence, %d CreateContainer answered with the swap's container %s; containerd holds %d app containers, %d running; kubelet restartCount %d",
		calls, waited, answered, short(rec.RunningContainerID), len(cs), runningNamed(cs, "app"), p.Container("app").RestartCount)
	if calls["CreateContainer"] != 1 || answered != 1 {
		t.Errorf("want kubelet's one CreateContainer answered with the swap's container: calls %v, answered %d", calls, answered)
	}
	if len(cs) != 2 || runningNamed(cs, "app") != 1 {
		t.Errorf("containerd holds %d containers (%d running), want the old and the swap's", len(cs), runningNamed(cs, "app"))
	}
	time.Sleep(kubeletSync)
	if now, _ := ke.k.Pod(context.Background(), ke.ns, name); now == nil || now.Container("app").ID() != rec.RunningContainerID {
		t.Errorf("a sync period later kubelet no longer follows the swap: %+v", now)
	}
	if after := ke.kubeletCalls(t, off, sb); after["CreateContainer"] != 1 || after["StopContainer"] != 0 {
		t.Errorf("kubelet acted again: %v", after)
	}
}

// testRevert: inplacectl revert swaps the rp-always pod back to its
// declared config; kubelet adopts it and the override is gone.
func (ke *kenv) testRevert(t *testing.T) {
	name := ke.k.PodName("rp-always")
	before := ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app"))
	if o := ke.overrides(t, name); len(o) != 1 {
		t.Fatalf("want the swap's override, have %+v", o)
	}
	sb := ke.sandboxOf(t, name)
	off := ke.logOffset(t)
	out, err := ke.px.Ctl("revert", name, "-n", ke.ns, "-c", "app", "-o", "json")
	if err != nil {
		t.Fatalf("revert: %v\n%s", err, out)
	}
	rec := lastJSONObject(t, out)
	p := ke.k.WaitPod(t, ke.ns, name, 2*kubeletSync+5*time.Second, func(p *harness.KubePod) error {
		c := p.Container("app")
		if c == nil || c.ID() != rec.RunningContainerID || !c.Ready || c.Image != ke.imgs.App1 || c.RestartCount != before.Container("app").RestartCount+1 {
			b, _ := json.Marshal(c)
			return fmt.Errorf("%s", b)
		}
		return nil
	})
	_, in := containerInfo(t, ke.direct, rec.RunningContainerID)
	ke.checkProcess(t, in.Pid, "v1", nil, []string{"X="})
	if o := ke.overrides(t, name); len(o) != 0 {
		t.Errorf("override left after revert: %+v", o)
	}
	time.Sleep(kubeletSync)
	calls := ke.kubeletCalls(t, off, sb)
	t.Logf("revert %s: kubelet follows %s, image %s, restartCount %d; no override; kubelet's calls %v", rec.State, short(rec.RunningContainerID),
		p.Container("app").Image, p.Container("app").RestartCount, calls)
	if calls["CreateContainer"] != 0 || calls["StopContainer"] != 0 {
		t.Errorf("kubelet acted on the reverted pod: %v", calls)
	}
}

// testBackToBack: 30 swaps in a row while kubelet syncs every few seconds.
// At no moment do two containers of the name run (containerd's truth) or
// is kubelet shown an exited newest container (the proxy's view); kubelet
// never creates or stops one; its restartCount counts the swaps.
func (ke *kenv) testBackToBack(t *testing.T) {
	const n = 30
	name := ke.k.PodName("churn")
	r0 := ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app")).Container("app").RestartCount
	sb := ke.sandboxOf(t, name)
	off := ke.logOffset(t)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var polls int
	var violations []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			direct, err1 := ke.direct.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}})
			viaProxy, err2 := ke.cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}})
			cancel()
			mu.Lock()
			polls++
			if err1 != nil || err2 != nil {
				violations = append(violations, fmt.Sprintf("list: %v %v", err1, err2))
			} else {
				if r := runningNamed(direct.Containers, "app"); r > 1 {
					violations = append(violations, fmt.Sprintf("%d running app containers at containerd", r))
				}
				if nw := newestNamed(viaProxy.Containers, "app"); nw == nil || nw.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
					violations = append(violations, fmt.Sprintf("kubelet's view: newest app container %v", describe(nw)))
				}
			}
			mu.Unlock()
		}
	}()
	began := time.Now()
	var durations []time.Duration
	for i := range n {
		img := ke.imgs.App2
		if i%2 == 1 {
			img = ke.imgs.App1
		}
		t0 := time.Now()
		rec := ke.swap(t, name, "--image", img, "--env", "N="+strconv.Itoa(i), "--min-runtime", "500ms")
		durations = append(durations, time.Since(t0))
		if rec.State != "SWAP_STATE_COMMITTED" {
			close(stop)
			wg.Wait()
			t.Fatalf("swap %d: %+v", i+1, rec)
		}
	}
	total := time.Since(began)
	close(stop)
	wg.Wait()

	p := ke.k.WaitPod(t, ke.ns, name, 2*kubeletSync+5*time.Second, func(p *harness.KubePod) error {
		c := p.Container("app")
		if c == nil || c.RestartCount != r0+n || !c.Ready || c.Image != ke.imgs.App1 {
			b, _ := json.Marshal(c)
			return fmt.Errorf("want restartCount %d, image %s, ready: %s", r0+n, ke.imgs.App1, b)
		}
		return nil
	})
	calls := ke.kubeletCalls(t, off, sb)
	t.Logf("median step durations of the %d swaps: %s", n, ke.stepMedians(t, name))
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	t.Logf("%d swaps committed in %s (per swap: min %s, median %s, max %s); kubelet restartCount %d→%d; %d polls of containerd and of kubelet's view, %d violations; kubelet's calls for the pod %v",
		n, total.Round(time.Millisecond), durations[0].Round(time.Millisecond), durations[n/2].Round(time.Millisecond),
		durations[n-1].Round(time.Millisecond), r0, p.Container("app").RestartCount, polls, len(violations), calls)
	if len(violations) > 0 {
		t.Errorf("%d violations, first: %s", len(violations), violations[0])
	}
	if calls["CreateContainer"] != 0 || calls["StopContainer"] != 0 || calls["StartContainer"] != 0 {
		t.Errorf("kubelet created, started or stopped containers during the swaps: %v", calls)
	}
	if st, in := containerInfo(t, ke.direct, p.Container("app").ID()); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("kubelet's container %s", st.State)
	} else {
		ke.checkProcess(t, in.Pid, "v1", []string{"N=" + strconv.Itoa(n-1)}, nil)
	}
}

// testRestartPolicies: the same swap on Always, OnFailure and Never pods;
// each pod keeps its sandbox and runs the swapped container for two sync
// periods after, and kubelet never stops the pod.
func (ke *kenv) testRestartPolicies(t *testing.T) {
	names := []string{"rp-always", "rp-onfailure", "rp-never"}
	sbs := map[string]string{}
	for _, n := range names {
		ke.k.WaitPod(t, ke.ns, ke.k.PodName(n), time.Minute, harness.Running("app"))
		sbs[n] = ke.sandboxOf(t, ke.k.PodName(n))
	}
	off := ke.logOffset(t)
	recs := make([]swapRecord, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i] = ke.swapNoFatal(ke.k.PodName(n), "--image", ke.imgs.App2, "--env", "X=Y", "--min-runtime", "1s")
		}()
	}
	wg.Wait()
	ended := time.Now()
	for i, n := range names {
		if recs[i].State != "SWAP_STATE_COMMITTED" {
			t.Fatalf("%s: swap %+v", n, recs[i])
		}
	}
	time.Sleep(2 * kubeletSync)
	for i, n := range names {
		name := ke.k.PodName(n)
		p := ke.k.WaitPod(t, ke.ns, name, 5*time.Second, harness.Running("app"))
		c := p.Container("app")
		sbNow := ke.readySandboxOf(name)
		calls := ke.kubeletCalls(t, off, sbs[n])
		t.Logf("%s: %s after the swap: phase %s, sandbox %s (was %s), container %s (swap's %s) restartCount %d, image %s; kubelet calls %v",
			n, time.Since(ended).Round(time.Millisecond), p.Status.Phase, short(sbNow), short(sbs[n]), short(c.ID()), short(recs[i].RunningContainerID), c.RestartCount, c.Image, calls)
		if p.Status.Phase != "Running" || sbNow != sbs[n] || c.ID() != recs[i].RunningContainerID || c.RestartCount != 1 || c.Image != ke.imgs.App2 {
			t.Errorf("%s did not keep the swap", n)
		}
		if calls["StopPodSandbox"] != 0 || calls["StopContainer"] != 0 || calls["CreateContainer"] != 0 {
			t.Errorf("%s: kubelet acted on the pod: %v", n, calls)
		}
	}
}

// testDeleteMidSwap: the manifest goes while a swap sits in its health gate:
// kubelet's pod deletion aborts the swap, and nothing of the pod is left.
func (ke *kenv) testDeleteMidSwap(t *testing.T) {
	name := ke.k.PodName("doomed")
	ke.k.WaitPod(t, ke.ns, name, time.Minute, harness.Running("app"))
	sb := ke.sandboxOf(t, name)
	oldID := newestNamed(ke.listDirect(t, sb), "app").Id

	type result struct {
		out string
		err error
	}
	off := ke.logOffset(t)
	done := make(chan result, 1)
	go func() {
		out, err := ke.px.Ctl("swap", name, "-n", ke.ns, "-c", "app", "--image", ke.imgs.App2, "--min-runtime", "20s", "-o", "json")
		done <- result{out, err}
	}()
	// Mid-swap: the new container runs and the swap sits in its 20 s health
	// gate; the old container is stopped.
	eventually(t, 30*time.Second, "the swap in its health gate", func() error {
		if ke.pxLogCount(t, off, `"step": "start-new"`) == 0 {
			return fmt.Errorf("new container not started yet")
		}
		if nw := newestNamed(ke.listDirect(t, sb), "app"); nw == nil || nw.Id == oldID || nw.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			return fmt.Errorf("newest %v", describe(nw))
		}
		return nil
	})
	ke.k.RemovePod(t, "doomed")
	removed := time.Now()
	var res result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the swap did not end within 60s of the pod's deletion")
	}
	aborted := time.Since(removed)
	rec := lastJSONObject(t, res.out)
	if res.err == nil || rec.State != "SWAP_STATE_ABORTED" || !strings.Contains(rec.Error, "health gate") {
		t.Fatalf("swap of a deleted pod: %v %+v", res.err, rec)
	}
	eventually(t, 30*time.Second, "kubelet forgets the pod", func() error {
		p, err := ke.k.Pod(context.Background(), ke.ns, name)
		if err != nil || p != nil {
			return fmt.Errorf("pod still there: %v", err)
		}
		return nil
	})
	gone := time.Since(removed)
	// At once: nothing of the pod runs; no override; the swap's container is gone.
	for _, ct := range ke.listDirect(t, sb) {
		if ct.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s of the deleted pod still runs", short(ct.Id))
		}
		if ct.Id == rec.NewContainerID {
			t.Errorf("the aborted swap's container %s was left behind", short(ct.Id))
		}
	}
	eventually(t, 30*time.Second, "the deleted pod's sandbox stopped", func() error {
		if st := ke.sandboxState(sb); st == runtimeapi.PodSandboxState_SANDBOX_READY {
			return fmt.Errorf("sandbox %s still ready", short(sb))
		}
		return nil
	})
	if o := ke.overrides(t, name); len(o) > 0 {
		t.Errorf("override left for the deleted pod: %+v", o)
	}
	t.Logf("pod deleted mid-swap: swap %s ABORTED %s after the manifest went (%q); kubelet dropped the pod after %s; nothing of it runs, no override",
		rec.ID, aborted.Round(time.Millisecond), rec.Error, gone.Round(time.Millisecond))
	ke.deleted = &deletedPod{name: name, sandboxID: sb, at: removed}
}

// deletedPod is the pod testDeleteMidSwap deleted: kubelet's garbage
// collection (every minute) removes what is left of it while the other
// tests run; testDeletedPodCollected checks at the end.
type deletedPod struct {
	name, sandboxID string
	at              time.Time
}

// testDeletedPodCollected: no orphan of the pod deleted mid-swap is left
// at containerd once kubelet has collected it.
func (ke *kenv) testDeletedPodCollected(t *testing.T) {
	d := ke.deleted
	if d == nil {
		t.Skip("the pod deleted mid-swap test did not get that far")
	}
	eventually(t, 100*time.Second, "no container or sandbox of the deleted pod at containerd", func() error {
		if cs := ke.listByPod(t, d.name); len(cs) > 0 {
			return fmt.Errorf("%d containers left, first %s", len(cs), describe(cs[0]))
		}
		if st := ke.sandboxState(d.sandboxID); st != -1 {
			return fmt.Errorf("sandbox %s is %s", short(d.sandboxID), st)
		}
		return nil
	})
	t.Logf("containerd holds no container or sandbox of the pod deleted mid-swap %s after its deletion", time.Since(d.at).Round(time.Millisecond))
}

// ---- helpers ----

func (ke *kenv) swap(t *testing.T, pod string, args ...string) swapRecord {
	t.Helper()
	full := append([]string{"swap", pod, "-n", ke.ns, "-c", "app", "-o", "json"}, args...)
	out, err := ke.px.Ctl(full...)
	if err != nil {
		t.Fatalf("%v\n%s\ninplaced log:\n%s", err, out, ke.px.LogTail(30))
	}
	return lastJSONObject(t, out)
}

// swapNoFatal is swap for goroutines: failures come back in the record.
func (ke *kenv) swapNoFatal(pod string, args ...string) swapRecord {
	full := append([]string{"swap", pod, "-n", ke.ns, "-c", "app", "-o", "json"}, args...)
	out, err := ke.px.Ctl(full...)
	var r swapRecord
	if i := strings.Index(out, "{"); i >= 0 {
		_ = json.Unmarshal([]byte(out[i:]), &r)
	}
	if err != nil && r.Error == "" {
		r.Error = err.Error()
	}
	return r
}

// readySandboxOf is the ready sandbox of kubelet's pod name, "" if none.
func (ke *kenv) readySandboxOf(name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := ke.direct.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ke.ns},
	}})
	if err != nil || len(resp.Items) != 1 {
		return ""
	}
	return resp.Items[0].Id
}

func (ke *kenv) sandboxOf(t *testing.T, name string) string {
	t.Helper()
	sb := ke.readySandboxOf(name)
	if sb == "" {
		t.Fatalf("no single ready sandbox for pod %s", name)
	}
	return sb
}

// sandboxState is the state of sandbox id at containerd, -1 if it is gone.
func (ke *kenv) sandboxState(id string) runtimeapi.PodSandboxState {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := ke.direct.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: id}})
	if err != nil || len(resp.Items) == 0 {
		return -1
	}
	return resp.Items[0].State
}

func (ke *kenv) listDirect(t *testing.T, sb string) []*runtimeapi.Container {
	t.Helper()
	resp, err := ke.direct.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Containers
}

func (ke *kenv) listByPod(t *testing.T, name string) []*runtimeapi.Container {
	t.Helper()
	resp, err := ke.direct.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ke.ns}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Containers
}

func runningNamed(cs []*runtimeapi.Container, name string) int {
	n := 0
	for _, c := range cs {
		if c.GetMetadata().GetName() == name && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			n++
		}
	}
	return n
}

// newestNamed is the most recently created container of name: the one
// kubelet follows.
func newestNamed(cs []*runtimeapi.Container, name string) *runtimeapi.Container {
	var nw *runtimeapi.Container
	for _, c := range cs {
		if c.GetMetadata().GetName() == name && (nw == nil || c.CreatedAt > nw.CreatedAt) {
			nw = c
		}
	}
	return nw
}

func describe(c *runtimeapi.Container) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("%s attempt %d %s", short(c.Id), c.GetMetadata().GetAttempt(), c.State)
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// checkProcess reads a container process's /VERSION and environment.
func (ke *kenv) checkProcess(t *testing.T, pid int, version string, want, notPrefix []string) {
	t.Helper()
	v, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "root", "VERSION"))
	if err != nil || strings.TrimSpace(string(v)) != version {
		t.Errorf("pid %d runs %q (%v), want %s", pid, v, err, version)
	}
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(string(environ), "\x00")
	for _, w := range want {
		if !contains(vars, w) {
			t.Errorf("pid %d env lacks %s: %q", pid, w, vars)
		}
	}
	for _, p := range notPrefix {
		if containsPrefix(vars, p) {
			t.Errorf("pid %d env has %s...: %q", pid, p, vars)
		}
	}
}

type override struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	SwapID    string `json:"swap_id"`
	SandboxID string `json:"sandbox_id"`
}

// overrides are the active overrides of kubelet's pod name.
func (ke *kenv) overrides(t *testing.T, pod string) []override {
	t.Helper()
	out, err := ke.px.Ctl("overrides", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Overrides []override `json:"overrides"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("decode overrides: %v\n%s", err, out)
	}
	var o []override
	for _, x := range l.Overrides {
		if x.Pod == pod && x.Namespace == ke.ns {
			o = append(o, x)
		}
	}
	return o
}

// ---- kubelet's calls, from inplaced's debug log ----

// The swap engine talks to containerd directly; every RPC in the relay's
// log is kubelet's (or the test's own, which only lists and reads).

func (ke *kenv) logOffset(t *testing.T) int64 {
	t.Helper()
	st, err := os.Stat(ke.px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

type rpcLine struct {
	Method      string `json:"method"`
	Code        string `json:"code"`
	SandboxID   string `json:"sandbox_id"`
	ContainerID string `json:"container_id"`
}

func (ke *kenv) rpcs(t *testing.T, off int64) []rpcLine {
	t.Helper()
	f, err := os.Open(ke.px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(off, 0); err != nil {
		t.Fatal(err)
	}
	var out []rpcLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "\trpc\t{")
		if i < 0 {
			continue
		}
		var r rpcLine
		if json.Unmarshal([]byte(line[i+len("\trpc\t"):]), &r) == nil {
			r.Method = r.Method[strings.LastIndexByte(r.Method, '/')+1:]
			out = append(out, r)
		}
	}
	return out
}

// kubeletCalls counts kubelet's container and sandbox lifecycle calls for
// sandbox sb since log offset off: CreateContainer by sandbox, the others
// by the containers the sandbox holds or held.
func (ke *kenv) kubeletCalls(t *testing.T, off int64, sb string) map[string]int {
	t.Helper()
	ids := map[string]bool{}
	for _, c := range ke.listDirect(t, sb) {
		ids[c.Id] = true
	}
	js, err := ke.px.Ctl("swaps", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Swaps []struct {
			swapRecord
			SandboxID string `json:"sandbox_id"`
		} `json:"swaps"`
	}
	if err := json.Unmarshal([]byte(js), &l); err != nil {
		t.Fatalf("decode swaps: %v", err)
	}
	for _, r := range l.Swaps {
		if r.SandboxID != sb {
			continue
		}
		for _, id := range []string{r.OldContainerID, r.NewContainerID, r.RunningContainerID} {
			if id != "" {
				ids[id] = true
			}
		}
	}
	out := map[string]int{}
	for _, r := range ke.rpcs(t, off) {
		switch r.Method {
		case "CreateContainer", "StopPodSandbox", "RemovePodSandbox":
			if r.SandboxID == sb {
				out[r.Method]++
			}
		case "StartContainer", "StopContainer", "RemoveContainer":
			if ids[r.ContainerID] {
				out[r.Method]++
			}
		}
	}
	return out
}

// pxLogCount counts inplaced log lines since off that contain s.
func (ke *kenv) pxLogCount(t *testing.T, off int64, s string) int {
	t.Helper()
	b, err := os.ReadFile(ke.px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if off > int64(len(b)) {
		return 0
	}
	return strings.Count(string(b[off:]), s)
}

// stepMedians summarizes the swap history of pod: the median duration of
// each step, and of the downtime.
func (ke *kenv) stepMedians(t *testing.T, pod string) string {
	t.Helper()
	out, err := ke.px.Ctl("swaps", pod, "-n", ke.ns, "-c", "app", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Swaps []struct {
			DowntimeNs string `json:"downtime_ns"`
			Steps      []struct {
				Name       string `json:"name"`
				DurationNs string `json:"duration_ns"`
			} `json:"steps"`
		} `json:"swaps"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("decode swaps: %v", err)
	}
	per := map[string][]time.Duration{}
	var order []string
	for _, r := range l.Swaps {
		for _, st := range r.Steps {
			ns, _ := strconv.ParseInt(st.DurationNs, 10, 64)
			if per[st.Name] == nil {
				order = append(order, st.Name)
			}
			per[st.Name] = append(per[st.Name], time.Duration(ns))
		}
		ns, _ := strconv.ParseInt(r.DowntimeNs, 10, 64)
		per["downtime"] = append(per["downtime"], time.Duration(ns))
	}
	order = append(order, "downtime")
	var b strings.Builder
	for _, name := range order {
		d := per[name]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Fprintf(&b, "%s %s; ", name, d[len(d)/2].Round(time.Millisecond))
	}
	return strings.TrimSuffix(b.String(), "; ")
}
