package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

const (
	ns = "default"
	// settleGrace is how long a pod may be off its expected state (a swap,
	// kubelet's backoff after a fault) before that counts against it.
	settleGrace = 2 * time.Minute
	// stuckAfter: a swap still running this long after it started is stuck.
	stuckAfter = 3 * time.Minute
	// goneAfter: this long after a pod's deletion nothing may run for it.
	goneAfter = 2 * time.Minute
	// upgradeBuild is the version ldflag of the second build.
	upgradeBuild = "soak-upgrade"
)

// TestSoak is the soak run (see the package comment): per backend of
// INPLACED_BACKENDS, SOAK_DURATION of churn and faults over SOAK_PODS pods.
func TestSoak(t *testing.T) {
	s, ok, err := SettingsFromEnv(os.Getenv)
	if !ok {
		t.Skip("SOAK_DURATION is not set: `make soak` runs the soak (SOAK_DURATION=30m), `make test` a 5-minute one")
	}
	if err != nil {
		t.Fatal(err)
	}
	harness.RequireRoot(t)
	harness.KubeletPrerequisites(t)
	harness.ControlPlanePrerequisites(t)
	_, merr := exec.LookPath("mount")
	harness.Require(t, "mount", merr == nil, "mount is needed for the state filesystem (a tmpfs)")
	backends := harness.BackendsFromEnv()
	harness.Require(t, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	interrupted := onInterrupt(t)
	upgrade := buildUpgrade(t)
	reg := harness.StartRegistry(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			r := setUp(t, s, b, reg, upgrade)
			r.interrupted = interrupted
			if !r.soak() {
				t.Fatal("interrupted: the soak ended early, no verdict; its cleanups ran")
			}
			r.finish()
		})
		select {
		case <-interrupted:
			return
		default:
		}
	}
}

// onInterrupt: the first SIGINT or SIGTERM ends the soak early, so that
// the test fails and its cleanups run (processes, mounts, bridges, cgroups,
// sysctls: nothing is left on the machine); without it an interrupted soak
// left all of them. A second signal ends the test binary at once. The
// returned channel is closed at the first signal.
func onInterrupt(t *testing.T) <-chan struct{} {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	interrupted, done := make(chan struct{}), make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			signal.Stop(sig)
			fmt.Fprintf(os.Stderr, "soak: %v: ending the soak and cleaning up (a second signal ends it at once)\n", s)
			close(interrupted)
		case <-done:
		}
	}()
	t.Cleanup(func() { signal.Stop(sig); close(done) })
	return interrupted
}

// buildUpgrade builds cmd/inplaced a second time with another version: the
// "newer build" an upgrade in the middle of a swap switches to.
func buildUpgrade(t *testing.T) string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "inplaced")
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/inplaced/inplaced/pkg/version.Version="+upgradeBuild, "-o", out, "./cmd/inplaced")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the upgrade: %v\n%s", err, b)
	}
	return out
}

// podState is what the harness expects of one pod.
type podState struct {
	name, uid string
	image     string // spec image of "app"
	meta      bool   // env from metadata, TIER from label tier
	tier      string
	sidecar   bool
	allowed   int // restarts of "app" the churn allows
	cpu       int // millicores of the last kubelet resize
	resized   bool
	created   time.Time
	busyUntil time.Time
	deletedAt time.Time
	// problemSince is when the pod was first seen off its expected state in
	// the current episode; reported once an episode outlasts settleGrace.
	problemSince time.Time
	reported     bool
	leftReported bool
}

type counts struct{ issued, ok, failed, skipped int }

type faultRec struct {
	ScheduledFault
	Start, End time.Time // the part of the stack was down (or the fs full)
	Detail     string
}

type invariant struct {
	name       string
	checks     int
	violations []string
}

type run struct {
	t       *testing.T
	s       Settings
	b       harness.Backend
	c       *harness.Containerd
	cp      *harness.ControlPlane
	px      *harness.Inplaced
	k       *harness.Kubelet
	direct  *harness.CRIClient
	node    string
	imgs    harness.Images
	upgrade string
	// interrupted is closed by the first SIGINT or SIGTERM (onInterrupt).
	interrupted <-chan struct{}
	metrics     string // host:port
	state       string // the state dir, a tmpfs
	imageID     map[string]string

	apiDown, pxDown, ctrdDown atomic.Bool

	started     time.Time // churn start
	setupTook   time.Duration
	podsUpTook  time.Duration
	commit      string
	rng         *rand.Rand
	mu          sync.Mutex
	pods        map[string]*podState
	deleted     []*podState
	next        int
	churn       map[ChurnKind]*counts
	churnErrs   map[ChurnKind][]string
	faults      []*faultRec
	windows     []Window
	probeCalls  int
	probeFails  []CallFailure
	samples     []Sample
	invs        []*invariant
	swapStates  map[string]int // kind/state → count, from the last listing
	checksRun   int
	finalDetail []string
	resizeEnd   string // what became of kubelet's resizes, at the end
	pending     sync.WaitGroup
	// extra lists pods restarted more often than the churn asked, every
	// restart by a swap (e.g. an env-from-metadata swap after an image patch).
	extra []string
}

// replace waits until deleted pod p is gone from the API, then creates a
// new pod.
func (r *run) replace(p *podState) error {
	deadline := time.Now().Add(goneAfter)
	for {
		c, cancel := bg()
		_, err := r.cp.Admin.CoreV1().Pods(ns).Get(c, p.name, metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not gone %s after its deletion (%v); no new pod", p.name, goneAfter, err)
		}
		time.Sleep(time.Second)
	}
	for {
		err := r.createPod()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(2 * time.Second) // the API server may be down
	}
}

func (r *run) inv(name string) *invariant {
	for _, i := range r.invs {
		if i.name == name {
			return i
		}
	}
	i := &invariant{name: name}
	r.invs = append(r.invs, i)
	return i
}

// The invariants, in report order.
const (
	invSwaps     = "every swap ends COMMITTED or rolled back (none stuck)"
	invPods      = "every pod Running, one running container per declared container, on the image its spec says"
	invEnv       = "env from metadata: the label's value in the running process (end of run)"
	invRestarts  = "restart counts grow only by the swaps"
	invDeleted   = "nothing left of deleted pods (containers, sandboxes, overrides, live swap records)"
	invCRI       = "CRI calls fail only while the backend is down, and only with Unavailable"
	invFootprint = "inplaced's RSS, goroutines and fds flat after warm-up"
)

func (r *run) violate(name, format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.inv(name)
	msg := fmt.Sprintf("%s: ", r.since(time.Now())) + fmt.Sprintf(format, a...)
	i.violations = append(i.violations, msg)
	r.t.Errorf("invariant %q violated: %s", name, msg)
}

func (r *run) checked(name string) {
	r.mu.Lock()
	r.inv(name).checks++
	r.mu.Unlock()
}

func (r *run) since(at time.Time) string {
	if r.started.IsZero() {
		return "set-up"
	}
	return "t+" + at.Sub(r.started).Round(time.Second).String()
}

func setUp(t *testing.T, s Settings, b harness.Backend, reg *harness.Registry, upgrade string) *run {
	begin := time.Now()
	r := &run{t: t, s: s, b: b, upgrade: upgrade, pods: map[string]*podState{}, churn: map[ChurnKind]*counts{},
		churnErrs: map[ChurnKind][]string{}, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 21))}
	for _, k := range ChurnKinds() {
		r.churn[k] = &counts{}
	}
	for _, n := range []string{invSwaps, invPods, invEnv, invRestarts, invDeleted, invCRI, invFootprint} {
		r.inv(n)
	}
	if root, err := harness.ModuleRoot(); err == nil {
		if out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
			r.commit = strings.TrimSpace(string(out))
		}
	}
	r.cp = harness.StartControlPlane(t)
	r.c = harness.StartContainerd(t, b, reg)
	r.imgs = r.c.Images
	r.direct = r.c.CRI(t)
	r.node = "soak-" + strconv.FormatInt(time.Now().UnixNano()&0xffffff, 16)
	kubeconfig := r.cp.NodeKubeconfig(t, r.node)
	r.px = harness.StartInplaced(t, r.c.Endpoint)
	if err := r.px.Stop(); err != nil {
		t.Fatal(err)
	}
	// The state dir on a tmpfs of its own, so that it can be filled.
	r.state = filepath.Join(r.px.Dir, "state-soak")
	if err := os.MkdirAll(r.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", r.state).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for the state: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// Lazily: inplaced may still hold the store when this runs.
		if out, err := exec.Command("umount", "-l", r.state).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", r.state, err, out)
		}
	})
	r.metrics = freeAddr(t)
	r.px.ExtraArgs = []string{"--kubeconfig", kubeconfig, "--node-name", r.node, "--state-dir", r.state,
		"--metrics-listen", r.metrics, "--log-level", "info"}
	if err := r.px.Start(); err != nil {
		t.Fatalf("inplaced in Kubernetes mode: %v\n%s", err, r.px.LogTail(30))
	}
	r.k = r.cp.StartKubelet(t, harness.KubeletOptions{RuntimeEndpoint: r.px.Endpoint, BackendEndpoint: r.c.Endpoint, NodeName: r.node})
	r.cp.WaitNodeReady(t, r.node, 2*time.Minute)
	r.imageID = map[string]string{}
	for _, img := range []string{r.imgs.App1, r.imgs.App2} {
		if _, err := r.direct.Image.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}}); err != nil {
			t.Fatalf("pull %s: %v", img, err)
		}
		st, err := r.direct.Image.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
		if err != nil || st.Image == nil {
			t.Fatalf("image status %s: %v", img, err)
		}
		r.imageID[img] = st.Image.Id
	}
	r.setupTook = time.Since(begin)

	// The pods, all at once as a node's would come after a reboot.
	up := time.Now()
	for range s.Pods {
		if err := r.createPod(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		n, notReady := r.readyPods()
		if n == s.Pods {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods Ready after 10 minutes; e.g. %s", n, s.Pods, notReady)
		}
		time.Sleep(2 * time.Second)
	}
	r.podsUpTook = time.Since(up)
	t.Logf("%s: bed up in %s, %d pods Running and Ready %s after the first was created",
		b, r.setupTook.Round(time.Second), s.Pods, r.podsUpTook.Round(time.Second))
	for _, p := range r.pods {
		p.busyUntil = time.Time{}
	}
	return r
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

// podSpec: container "app" (App1, :8080) with small limits to resize; every
// 4th pod takes env from metadata (TIER from label tier); every 10th has a
// second container.
func (r *run) podSpec(p *podState) *corev1.Pod {
	no := false
	grace := int64(2)
	app := corev1.Container{Name: "app", Image: p.image, ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: resources(200)}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Labels: map[string]string{"soak": "yes"}},
		Spec:       corev1.PodSpec{NodeName: r.node, AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: &grace},
	}
	if p.meta {
		pod.Labels["tier"] = p.tier
		pod.Annotations = map[string]string{podapi.AnnotationEnvFromMetadata: "true"}
		app.Env = []corev1.EnvVar{{Name: "TIER", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}}}
	}
	pod.Spec.Containers = []corev1.Container{app}
	if p.sidecar {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side", Image: r.imgs.App1,
			ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sleep", "2147483647"}, Resources: resources(100)})
	}
	return pod
}

func resources(cpuMilli int) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("8Mi")},
		Limits: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(cpuMilli), resource.DecimalSI),
			corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
}

func (r *run) createPod() error {
	r.mu.Lock()
	i := r.next
	r.next++
	p := &podState{name: fmt.Sprintf("soak-%04d", i), image: r.imgs.App1, meta: i%4 == 1, tier: "blue", sidecar: i%10 == 3,
		cpu: 200, created: time.Now(), busyUntil: time.Now().Add(3 * time.Minute)}
	r.mu.Unlock()
	c, cancel := bg()
	defer cancel()
	made, err := r.cp.Admin.CoreV1().Pods(ns).Create(c, r.podSpec(p), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", p.name, err)
	}
	p.uid = string(made.UID)
	r.mu.Lock()
	r.pods[p.name] = p
	r.mu.Unlock()
	return nil
}

// readyPods counts the soak pods that are Running and Ready.
func (r *run) readyPods() (int, string) {
	c, cancel := bg()
	defer cancel()
	l, err := r.cp.Admin.CoreV1().Pods(ns).List(c, metav1.ListOptions{LabelSelector: "soak=yes"})
	if err != nil {
		return 0, err.Error()
	}
	n, bad := 0, ""
	for i := range l.Items {
		if err := podReady(&l.Items[i]); err == nil {
			n++
		} else if bad == "" {
			bad = l.Items[i].Name + ": " + err.Error()
		}
	}
	return n, bad
}

func podReady(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return fmt.Errorf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return errors.New("not Ready")
}

// soak runs churn, faults, the probe, the sampler and the checker for the
// duration; false if interrupted before its end.
func (r *run) soak() bool {
	r.started = time.Now()
	end := r.started.Add(r.s.Duration)
	r.t.Logf("soak on %s from %s for %s: faults %v", r.b, r.started.UTC().Format(time.RFC3339), r.s.Duration, Schedule(r.s.Duration))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	loop := func(every time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(every)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					f()
				}
			}
		}()
	}
	probe := r.dialProbe()
	defer probe.Close()
	loop(250*time.Millisecond, func() { r.probe(probe) })
	loop(15*time.Second, r.sample)
	loop(r.s.ChurnEvery, r.churnOnce)
	loop(r.s.CheckEvery, func() { r.check(false) })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, f := range Schedule(r.s.Duration) {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(r.started.Add(f.At))):
			}
			r.fault(f)
		}
	}()
	ran := true
	select {
	case <-time.After(time.Until(end)):
	case <-r.interrupted:
		ran = false
	}
	r.sample()
	close(stop)
	wg.Wait()
	return ran
}

// --- churn ---

func (r *run) count(k ChurnKind, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.churn[k]
	c.issued++
	if err == nil {
		c.ok++
		return
	}
	c.failed++
	if len(r.churnErrs[k]) < 3 {
		r.churnErrs[k] = append(r.churnErrs[k], fmt.Sprintf("%s: %v", r.since(time.Now()), err))
	}
}

// idlePod picks a pod with nothing pending, marks it busy for busy.
func (r *run) idlePod(busy time.Duration, want func(*podState) bool) *podState {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	var cands []*podState
	for _, p := range r.pods {
		if now.After(p.busyUntil) && (want == nil || want(p)) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	p := cands[r.rng.IntN(len(cands))]
	p.busyUntil = now.Add(busy)
	return p
}

func (r *run) churnOnce() {
	r.mu.Lock()
	k := PickChurn(r.rng.Float64())
	n := r.churn[k].issued
	r.mu.Unlock()
	if k != ChurnCtlResize && r.apiDown.Load() {
		r.mu.Lock()
		r.churn[k].skipped++
		r.mu.Unlock()
		return
	}
	c, cancel := bg()
	defer cancel()
	pods := r.cp.Admin.CoreV1().Pods(ns)
	patch := func(p *podState, pt types.PatchType, body string, sub ...string) error {
		_, err := pods.Patch(c, p.name, pt, []byte(body), metav1.PatchOptions{}, sub...)
		return err
	}
	allow := func(p *podState, err error) {
		if err == nil {
			r.mu.Lock()
			p.allowed += RestartsAllowed(k)
			r.mu.Unlock()
		}
		r.count(k, err)
	}
	switch k {
	case ChurnImagePatch:
		p := r.idlePod(time.Minute, nil)
		if p == nil {
			return
		}
		img := r.imgs.App2
		if p.image == img {
			img = r.imgs.App1
		}
		err := patch(p, types.StrategicMergePatchType, fmt.Sprintf(`{"spec":{"containers":[{"name":"app","image":%q}]}}`, img))
		if err == nil {
			r.mu.Lock()
			p.image = img
			r.mu.Unlock()
		}
		allow(p, err)
	case ChurnAnnotationEnv, ChurnCrashSwap:
		p := r.idlePod(90*time.Second, nil)
		if p == nil {
			return
		}
		req := fmt.Sprintf(`{"container":"app","env":{"SOAK":"%d"},"minRuntime":"500ms"}`, n)
		if k == ChurnCrashSwap {
			req = fmt.Sprintf(`{"container":"app","image":%q,"env":{"SOAK_CRASH":"%d"},"minRuntime":"1s"}`, r.imgs.Crash, n)
		}
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podapi.AnnotationSwap: req}}})
		allow(p, patch(p, types.MergePatchType, string(body)))
	case ChurnLabelEnv:
		p := r.idlePod(time.Minute, func(p *podState) bool { return p.meta })
		if p == nil {
			return
		}
		tier := []string{"blue", "green", "red"}[n%3]
		if tier == p.tier {
			tier = "gold"
		}
		err := patch(p, types.MergePatchType, fmt.Sprintf(`{"metadata":{"labels":{"tier":%q}}}`, tier))
		if err == nil {
			r.mu.Lock()
			p.tier = tier
			r.mu.Unlock()
		}
		allow(p, err)
	case ChurnKubeletResize:
		p := r.idlePod(20*time.Second, nil)
		if p == nil {
			return
		}
		cpu := 300
		if p.cpu == 300 {
			cpu = 200
		}
		err := patch(p, types.StrategicMergePatchType, fmt.Sprintf(
			`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"5m","memory":"8Mi"},"limits":{"cpu":"%dm","memory":"64Mi"}}}]}}`, cpu), "resize")
		if err == nil {
			r.mu.Lock()
			p.cpu, p.resized = cpu, true
			r.mu.Unlock()
		}
		r.count(k, err)
	case ChurnCtlResize:
		p := r.idlePod(20*time.Second, nil)
		if p == nil {
			return
		}
		_, err := r.px.Ctl("resize", p.name, "-n", ns, "-c", "app", "--cpu", []string{"250m", "350m"}[n%2])
		if err == nil {
			r.mu.Lock()
			p.resized = false // the runtime now reports inplacectl's limit, not the spec's
			r.mu.Unlock()
		}
		r.count(k, err)
	case ChurnRecreate:
		p := r.idlePod(time.Hour, nil)
		if p == nil {
			return
		}
		grace := int64(2)
		if err := pods.Delete(c, p.name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			r.count(k, err)
			return
		}
		r.mu.Lock()
		delete(r.pods, p.name)
		p.deletedAt = time.Now()
		r.deleted = append(r.deleted, p)
		r.mu.Unlock()
		// The node runs kubelet's maximum of pods: the new one is admitted
		// once the old one is gone (else kubelet fails it, OutOfpods).
		r.pending.Add(1)
		go func() {
			defer r.pending.Done()
			r.count(k, r.replace(p))
		}()
	}
}

// --- the CRI probe ---

// dialProbe is a CRI client through inplaced that reconnects within a
// second, as kubelet's does, so that a failure lasts no longer than the
// outage.
func (r *run) dialProbe() *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+r.px.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		r.t.Fatal(err)
	}
	return conn
}

func (r *run) probe(conn *grpc.ClientConn) {
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	for _, m := range []string{"Version", "ListPodSandbox"} {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		sent := time.Now()
		if m == "Version" {
			_, err = rt.Version(c, &runtimeapi.VersionRequest{})
		} else {
			_, err = rt.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{})
		}
		cancel()
		r.mu.Lock()
		r.probeCalls++
		if err != nil {
			r.probeFails = append(r.probeFails, CallFailure{At: time.Now(), Took: time.Since(sent), Method: m, Code: status.Code(err).String(), Message: status.Convert(err).Message()})
		}
		r.mu.Unlock()
	}
}

// --- the footprint ---

func (r *run) sample() {
	pid := r.px.PID()
	if pid == 0 {
		return
	}
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return
	}
	s, err := ParseMetrics(string(b))
	if err != nil {
		return
	}
	s.At, s.PID = time.Now(), pid
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// --- faults ---

func (r *run) fault(f ScheduledFault) {
	rec := &faultRec{ScheduledFault: f, Start: time.Now()}
	r.mu.Lock()
	idx := len(r.faults)
	r.faults = append(r.faults, rec)
	r.mu.Unlock()
	backendDown := true
	var detail string
	var err error
	switch f.Kind {
	case FaultContainerdKill:
		r.ctrdDown.Store(true)
		if err = r.c.Kill(); err == nil {
			time.Sleep(3 * time.Second)
			err = r.c.Start()
		}
		r.ctrdDown.Store(false)
		detail = "SIGKILL, started again 3 s later"
	case FaultInplacedKill:
		r.pxDown.Store(true)
		if err = r.px.Kill(); err == nil {
			time.Sleep(time.Second)
			err = r.px.Start()
		}
		r.pxDown.Store(false)
		detail = "SIGKILL, started again 1 s later"
	case FaultInplacedUpgrade:
		rec.Start = time.Time{}
		detail, err = r.upgradeMidSwap(rec)
	case FaultAPIServerDown:
		backendDown = false
		r.apiDown.Store(true)
		if err = r.cp.StopAPIServer(); err == nil {
			time.Sleep(f.Hold)
			err = r.cp.StartAPIServer()
		}
		r.apiDown.Store(false)
		detail = fmt.Sprintf("stopped for %s", f.Hold)
	case FaultStateFull:
		backendDown = false
		detail, err = r.fillState(f.Hold)
	}
	rec.End = time.Now()
	if err != nil {
		r.t.Errorf("fault %q at %s: %v", f.Kind, r.since(rec.Start), err)
		detail += "; error: " + err.Error()
	}
	r.mu.Lock()
	rec.Detail = detail
	r.windows = append(r.windows, Window{Fault: idx, Start: rec.Start, End: rec.End, BackendDown: backendDown})
	r.mu.Unlock()
	r.t.Logf("%s fault %q done (%s): %s", r.since(rec.Start), f.Kind, rec.End.Sub(rec.Start).Round(time.Millisecond), detail)
}

// upgradeMidSwap starts an inplacectl swap with a long health gate, and
// while it runs stops inplaced (SIGTERM, as a package upgrade does: the
// shutdown waits 10 s for swaps, the gate lasts 20 s) and starts the other
// build on the same state. The swap must settle.
func (r *run) upgradeMidSwap(rec *faultRec) (string, error) {
	p := r.idlePod(3*time.Minute, nil)
	if p == nil {
		return "", errors.New("no idle pod to swap")
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.px.Ctl("swap", p.name, "-n", ns, "-c", "app", "--env", "UPGRADE=1", "--min-runtime", "20s")
		done <- err
	}()
	var id string
	deadline := time.Now().Add(time.Minute)
	for id == "" && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		for _, s := range r.swapRecords() {
			if s.Pod == p.name && s.Kind == "swap" && s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING && stepStarted(s, swap.StepHealthGate) {
				id = s.Id
			}
		}
	}
	if id == "" {
		return "", fmt.Errorf("the swap of %s did not reach its health gate within a minute", p.name)
	}
	r.mu.Lock()
	p.allowed += RestartsAllowed(ChurnCrashSwap) // committed: 1; rolled back: up to 2
	r.mu.Unlock()
	time.Sleep(2 * time.Second)
	rec.Start = time.Now()
	r.pxDown.Store(true)
	err := r.px.Stop()
	old := r.px.Bin
	r.px.Bin = r.upgrade
	if err == nil {
		err = r.px.Start()
	}
	r.pxDown.Store(false)
	if err != nil {
		r.px.Bin = old
		return "", err
	}
	ctlErr := <-done
	// The journal settles the swap on start: it is final now.
	version, final := "", ""
	if st := r.status(); st != nil {
		version = st.Version
	}
	for _, s := range r.swapRecords() {
		if s.Id == id {
			final = s.State.String()
		}
	}
	if version != upgradeBuild {
		return "", fmt.Errorf("after the upgrade inplaced says version %q, want %q", version, upgradeBuild)
	}
	return fmt.Sprintf("swap %s of %s in its health gate; SIGTERM, build %q started on the same state; the swap ended %s (inplacectl: %v)",
		id, p.name, version, strings.TrimPrefix(final, "SWAP_STATE_"), errText(ctlErr)), nil
}

func stepStarted(s *inplacedv1.SwapRecord, name string) bool {
	for _, st := range s.Steps {
		if st.Name == name {
			return true
		}
	}
	return false
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// fillState fills the state filesystem, holds it full, frees it, and
// reports what inplacectl status said meanwhile and how soon swaps were
// allowed again.
func (r *run) fillState(hold time.Duration) (string, error) {
	filler := filepath.Join(r.state, "filler")
	f, err := os.Create(filler)
	if err != nil {
		return "", err
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				f.Close()
				return "", fmt.Errorf("fill %s: %v", r.state, err)
			}
			break
		}
	}
	f.Close()
	full := time.Now()
	time.Sleep(hold / 2)
	var status string
	if st := r.status(); st != nil {
		status = fmt.Sprintf("swaps allowed %v", st.SwapsAllowed)
		if len(st.Problems) > 0 {
			status += ": " + st.Problems[0].What
		}
	}
	time.Sleep(hold - hold/2)
	if err := os.Remove(filler); err != nil {
		return "", err
	}
	freed := time.Now()
	during := map[string]int{}
	for _, s := range r.swapRecords() {
		if at := time.Unix(0, s.StartedUnixNano); !at.Before(full) && at.Before(freed) {
			during[strings.TrimPrefix(s.State.String(), "SWAP_STATE_")]++
		}
	}
	back := "not within 60 s"
	for time.Since(freed) < time.Minute {
		if st := r.status(); st != nil && st.SwapsAllowed {
			back = time.Since(freed).Round(100 * time.Millisecond).String()
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Sprintf("full for %s (inplacectl status meanwhile: %s; swaps started meanwhile by their end: %v); swaps allowed again %s after it was freed",
		hold, status, during, back), nil
}

func (r *run) status() *inplacedv1.StatusResponse {
	out, err := r.px.Ctl("status", "-o", "json")
	if err != nil {
		return nil
	}
	st := &inplacedv1.StatusResponse{}
	if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), st) != nil {
		return nil
	}
	return st
}

func (r *run) swapRecords() []*inplacedv1.SwapRecord {
	out, err := r.px.Ctl("swaps", "-o", "json")
	if err != nil {
		return nil
	}
	var l inplacedv1.ListSwapsResponse
	if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), &l) != nil {
		return nil
	}
	return l.Swaps
}

// --- invariants ---

// check looks at every invariant it can with what is up. final: the run is
// over and everything has had time to settle; no grace.
func (r *run) check(final bool) (problems int) {
	now := time.Now()
	r.mu.Lock()
	r.checksRun++
	r.mu.Unlock()
	c, cancel := bg()
	defer cancel()

	// Swap records: none stuck, none whose rollback failed.
	var recs []*inplacedv1.SwapRecord
	if !r.pxDown.Load() {
		recs = r.swapRecords()
	}
	if recs != nil {
		r.checked(invSwaps)
		states := map[string]int{}
		for _, s := range recs {
			states[s.Kind+" "+strings.TrimPrefix(s.State.String(), "SWAP_STATE_")]++
			started := time.Unix(0, s.StartedUnixNano)
			switch {
			case s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING && (final || now.Sub(started) > stuckAfter):
				if r.once("stuck " + s.Id) {
					r.violate(invSwaps, "swap %s (%s of %s/%s) still RUNNING, started %s", s.Id, s.Kind, s.Pod, s.Container, r.since(started))
					problems++
				}
			case s.State == inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED:
				if r.once("rbf " + s.Id) {
					r.violate(invSwaps, "swap %s of %s/%s: ROLLBACK_FAILED: %s", s.Id, s.Pod, s.Container, s.Error)
					problems++
				}
			}
		}
		r.mu.Lock()
		r.swapStates = states
		r.mu.Unlock()
	}
	// A swap rolled back (or aborted) after the old container stopped
	// starts the old config again: one more restart it may account for.
	undone := map[string]int{}
	// The containers the swaps started, per pod: one per swap that
	// committed, aborted or failed its rollback, two per rolled-back one.
	bySwaps := map[string]int{}
	for _, s := range recs {
		if s.State == inplacedv1.SwapState_SWAP_STATE_FAILED || s.State == inplacedv1.SwapState_SWAP_STATE_ABORTED {
			undone[s.Pod]++
		}
		if s.Kind == "override-dropped" {
			continue
		}
		switch s.State {
		case inplacedv1.SwapState_SWAP_STATE_COMMITTED, inplacedv1.SwapState_SWAP_STATE_ABORTED, inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED:
			bySwaps[s.Pod]++
		case inplacedv1.SwapState_SWAP_STATE_FAILED:
			bySwaps[s.Pod] += 2
		}
	}

	if r.ctrdDown.Load() {
		return problems
	}
	ctrs, err := r.direct.Runtime.ListContainers(c, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return problems
	}
	sbs, err := r.direct.Runtime.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return problems
	}
	running := map[string][]*runtimeapi.Container{} // uid/name → running containers
	anyOf := map[string]int{}                       // uid → containers and sandboxes in any state
	for _, ct := range ctrs.Containers {
		uid := ct.Labels["io.kubernetes.pod.uid"]
		anyOf[uid]++
		if ct.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			key := uid + "/" + ct.Labels["io.kubernetes.container.name"]
			running[key] = append(running[key], ct)
		}
	}
	readySB := map[string]int{}
	for _, sb := range sbs.Items {
		uid := sb.Labels["io.kubernetes.pod.uid"]
		anyOf[uid]++
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			readySB[uid]++
		}
	}

	// Deleted pods: nothing runs for them; at the end nothing is left.
	var overrides string
	if !r.pxDown.Load() {
		overrides, _ = r.px.Ctl("overrides", "-o", "json")
	}
	r.mu.Lock()
	deleted := append([]*podState(nil), r.deleted...)
	r.mu.Unlock()
	for _, p := range deleted {
		if !final && now.Sub(p.deletedAt) < goneAfter {
			continue
		}
		r.checked(invDeleted)
		var left []string
		for key, cs := range running {
			if strings.HasPrefix(key, p.uid+"/") {
				left = append(left, fmt.Sprintf("%d running %s", len(cs), strings.TrimPrefix(key, p.uid+"/")))
			}
		}
		if readySB[p.uid] > 0 {
			left = append(left, "a READY sandbox")
		}
		if final && anyOf[p.uid] > 0 {
			left = append(left, fmt.Sprintf("%d containers/sandboxes in any state", anyOf[p.uid]))
		}
		if strings.Contains(overrides, `"`+p.name+`"`) {
			left = append(left, "an override")
		}
		for _, s := range recs {
			if s.Pod == p.name && s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING {
				left = append(left, "swap "+shortID(s.Id)+" RUNNING")
			}
		}
		if len(left) > 0 {
			problems++
			if final || !p.leftReported {
				p.leftReported = true
				r.violate(invDeleted, "pod %s (uid %s) deleted %s: %s", p.name, p.uid, r.since(p.deletedAt), strings.Join(left, ", "))
			}
		}
	}

	// Live pods: Running, one running container per declared container on
	// the spec's image, restarts only by the swaps.
	if r.apiDown.Load() {
		return problems
	}
	l, err := r.cp.Admin.CoreV1().Pods(ns).List(c, metav1.ListOptions{LabelSelector: "soak=yes"})
	if err != nil {
		return problems
	}
	api := map[string]*corev1.Pod{}
	for i := range l.Items {
		api[l.Items[i].Name] = &l.Items[i]
	}
	r.mu.Lock()
	live := make([]*podState, 0, len(r.pods))
	for _, p := range r.pods {
		live = append(live, p)
	}
	r.mu.Unlock()
	for _, p := range deleted {
		if ap := api[p.name]; ap != nil && now.Sub(p.deletedAt) > goneAfter && (final || !p.leftReported) {
			p.leftReported = true
			r.violate(invDeleted, "pod %s deleted %s is still in the API (phase %s)", p.name, r.since(p.deletedAt), ap.Status.Phase)
			problems++
		}
	}
	for _, p := range live {
		ap := api[p.name]
		r.mu.Lock()
		image, allowed, busy := p.image, p.allowed, now.Before(p.busyUntil)
		r.mu.Unlock()
		if ap != nil && recs != nil {
			r.checked(invRestarts)
			for _, cs := range ap.Status.ContainerStatuses {
				// kubelet's own restarts for a change no swap could make
				// (inplaced down) count like the swap would have.
				byOps := int32(allowed + undone[p.name])
				limit := max(byOps, int32(bySwaps[p.name]))
				if cs.Name != "app" {
					byOps, limit = 0, 0
				}
				// A pod created as the runtime or inplaced went down: kubelet's
				// first create or start was cut off, and kubelet starts the
				// container again (as it would with containerd alone dying).
				if r.createdInOutage(p) {
					byOps, limit = byOps+1, limit+1
				}
				if cs.RestartCount > limit && r.once(fmt.Sprintf("restarts %s %s %d", p.name, cs.Name, cs.RestartCount)) {
					r.violate(invRestarts, "pod %s container %s restartCount %d; the swaps started %d containers, the churn asked for %d restarts",
						p.name, cs.Name, cs.RestartCount, bySwaps[p.name], byOps)
					problems++
				}
				if cs.RestartCount > byOps && cs.RestartCount <= limit && r.once(fmt.Sprintf("extra %s %s %d", p.name, cs.Name, cs.RestartCount)) {
					r.mu.Lock()
					r.extra = append(r.extra, fmt.Sprintf("%s: pod %s restartCount %d, the churn asked for %d (all by swaps: %d containers started)",
						r.since(now), p.name, cs.RestartCount, byOps, bySwaps[p.name]))
					r.mu.Unlock()
				}
			}
		}
		if busy && !final {
			continue
		}
		r.checked(invPods)
		why := r.podProblem(p, ap, image, running)
		r.mu.Lock()
		switch {
		case why == "":
			p.problemSince, p.reported = time.Time{}, false
		case p.problemSince.IsZero():
			p.problemSince = now
		}
		since, reported := p.problemSince, p.reported
		r.mu.Unlock()
		if why != "" {
			problems++
		}
		if why != "" && (final || now.Sub(since) > settleGrace) && !reported {
			r.mu.Lock()
			p.reported = true
			r.mu.Unlock()
			if final {
				r.mu.Lock()
				r.finalDetail = append(r.finalDetail, p.name+": "+why)
				r.mu.Unlock()
			} else {
				r.violate(invPods, "pod %s off for %s: %s", p.name, now.Sub(since).Round(time.Second), why)
			}
		}
	}
	return problems
}

// podProblem says how pod p is off its expected state, or "".
func (r *run) podProblem(p *podState, ap *corev1.Pod, image string, running map[string][]*runtimeapi.Container) string {
	if ap == nil {
		return "not in the API"
	}
	if ap.Status.Phase != corev1.PodRunning {
		return "phase " + string(ap.Status.Phase)
	}
	want := r.imageID[image]
	for _, ct := range ap.Spec.Containers {
		rs := running[p.uid+"/"+ct.Name]
		if len(rs) != 1 {
			return fmt.Sprintf("%d running %s containers at the runtime", len(rs), ct.Name)
		}
		if ct.Name != "app" {
			continue
		}
		if got := rs[0].ImageRef; got != want && rs[0].Image.GetImage() != want {
			return fmt.Sprintf("app runs image %s, the spec says %s (%s)", shortID(strings.TrimPrefix(got, "sha256:")), image, shortID(strings.TrimPrefix(want, "sha256:")))
		}
	}
	return ""
}

var onceSeen sync.Map

func (r *run) once(key string) bool {
	_, loaded := onceSeen.LoadOrStore(string(r.b)+" "+key, true)
	return !loaded
}

// checkEnv: every env-from-metadata pod's running app has TIER=<its label>.
func (r *run) checkEnv() {
	c, cancel := bg()
	defer cancel()
	r.mu.Lock()
	var metas []*podState
	for _, p := range r.pods {
		if p.meta {
			metas = append(metas, p)
		}
	}
	r.mu.Unlock()
	for _, p := range metas {
		r.checked(invEnv)
		resp, err := r.direct.Runtime.ListContainers(c, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
			LabelSelector: map[string]string{"io.kubernetes.pod.uid": p.uid, "io.kubernetes.container.name": "app"}}})
		if err != nil || len(resp.Containers) != 1 {
			r.violate(invEnv, "pod %s: running app containers %v %v", p.name, resp, err)
			continue
		}
		st, err := r.direct.Runtime.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: resp.Containers[0].Id, Verbose: true})
		if err != nil {
			r.violate(invEnv, "pod %s: status: %v", p.name, err)
			continue
		}
		var in struct {
			Pid int `json:"pid"`
		}
		_ = json.Unmarshal([]byte(st.Info["info"]), &in)
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", in.Pid))
		if err != nil {
			r.violate(invEnv, "pod %s: %v", p.name, err)
			continue
		}
		if !strings.Contains("\x00"+string(env), "\x00TIER="+p.tier+"\x00") {
			r.violate(invEnv, "pod %s: label tier=%s, the process has %q", p.name, p.tier, tierOf(string(env)))
		}
	}
}

func tierOf(env string) string {
	for _, kv := range strings.Split(env, "\x00") {
		if strings.HasPrefix(kv, "TIER=") {
			return kv
		}
	}
	return "no TIER"
}

// finish lets everything settle, runs the final checks and writes the report.
func (r *run) finish() {
	r.pending.Wait()
	settleStart := time.Now()
	var left int
	for time.Since(settleStart) < 4*time.Minute {
		if left = r.quietProblems(); left == 0 {
			break
		}
		time.Sleep(5 * time.Second)
	}
	settled := time.Since(settleStart)
	r.check(true)
	r.mu.Lock()
	fd := append([]string(nil), r.finalDetail...)
	r.mu.Unlock()
	for _, d := range fd {
		r.violate(invPods, "at the end, after %s to settle: %s", settled.Round(time.Second), d)
	}
	r.checkEnv()
	r.resizeEnd = r.kubeletResizes()

	// CRI calls through inplaced.
	r.mu.Lock()
	fails := append([]CallFailure(nil), r.probeFails...)
	ws := append([]Window(nil), r.windows...)
	r.mu.Unlock()
	fault, allowed := Attribute(fails, ws, 5*time.Second)
	r.checked(invCRI)
	for i, f := range fails {
		if !allowed[i] {
			where := "outside every fault"
			if fault[i] >= 0 {
				where = "during " + string(r.faults[fault[i]].Kind)
			}
			if r.once(fmt.Sprintf("cri %d", i)) {
				r.violate(invCRI, "%s %s %q at %s after %s (%s)", f.Method, f.Code, f.Message, r.since(f.At), f.Took.Round(time.Millisecond), where)
			}
		}
	}

	// The footprint: the end against minute 5 of the last inplaced process
	// (warm-up: 60 s after its start).
	ref, end, ok := r.footprintRef()
	r.checked(invFootprint)
	if ok {
		if flat, why := Flat(ref, end); !flat {
			r.violate(invFootprint, "%s (reference %s, end %s)", why, r.since(ref.At), r.since(end.At))
		}
	} else {
		r.violate(invFootprint, "no samples to judge: %d taken", len(r.samples))
	}
	r.t.Logf("settled %s after the churn stopped (%d pods still off then)", settled.Round(time.Second), left)
	r.report(settled, fault, allowed)
	if n := strings.Count(r.px.LogTail(1<<30), "panic:"); n > 0 {
		r.t.Errorf("inplaced panicked %d times", n)
	}
}

// outageMargin is how far before a backend outage a pod's creation counts as
// cut off by it (the API's create, scheduling and kubelet's sandbox come
// before kubelet's CreateContainer and StartContainer), and how far after
// (kubelet's retry while the client reconnects).
const outageMargin = 10 * time.Second

// createdInOutage: p was created in a window in which CRI calls through
// inplaced could fail (the backend or inplaced down).
func (r *run) createdInOutage(p *podState) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.windows {
		if w.BackendDown && !p.created.Before(w.Start.Add(-outageMargin)) && !p.created.After(w.End.Add(outageMargin)) {
			return true
		}
	}
	return false
}

// kubeletResizes says, for the pods a kubelet resize touched, whether the
// container's status reports the spec's CPU limit (applied) and which carry
// a PodResizePending or PodResizeInProgress condition.
func (r *run) kubeletResizes() string {
	c, cancel := bg()
	defer cancel()
	l, err := r.cp.Admin.CoreV1().Pods(ns).List(c, metav1.ListOptions{LabelSelector: "soak=yes"})
	if err != nil {
		return "unknown: " + err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	applied, notApplied := 0, 0
	conds := map[string]int{}
	for i := range l.Items {
		p := &l.Items[i]
		ps := r.pods[p.Name]
		if ps == nil || !ps.resized {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name != "app" {
				continue
			}
			if cs.Resources != nil && cs.Resources.Limits.Cpu().MilliValue() == int64(ps.cpu) {
				applied++
			} else {
				notApplied++
			}
		}
		for _, cd := range p.Status.Conditions {
			if cd.Type == corev1.PodResizePending || cd.Type == corev1.PodResizeInProgress {
				conds[string(cd.Type)+" "+cd.Reason]++
			}
		}
	}
	return fmt.Sprintf("of the live pods a kubelet resize touched, %d report the spec's CPU limit in their status, %d do not; conditions: %v", applied, notApplied, conds)
}

// quietProblems clears the busy marks and counts what is still off: pods
// off their expected state, deleted pods with anything left, running swaps.
func (r *run) quietProblems() int {
	r.mu.Lock()
	for _, p := range r.pods {
		p.busyUntil = time.Time{}
	}
	r.mu.Unlock()
	// A dry run: nothing is recorded (the final check decides).
	return r.dryCheck()
}

func (r *run) dryCheck() int {
	c, cancel := bg()
	defer cancel()
	ctrs, err := r.direct.Runtime.ListContainers(c, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 1
	}
	running := map[string][]*runtimeapi.Container{}
	anyOf := map[string]int{}
	for _, ct := range ctrs.Containers {
		anyOf[ct.Labels["io.kubernetes.pod.uid"]]++
		if ct.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			key := ct.Labels["io.kubernetes.pod.uid"] + "/" + ct.Labels["io.kubernetes.container.name"]
			running[key] = append(running[key], ct)
		}
	}
	sbs, err := r.direct.Runtime.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 1
	}
	for _, sb := range sbs.Items {
		anyOf[sb.Labels["io.kubernetes.pod.uid"]]++
	}
	l, err := r.cp.Admin.CoreV1().Pods(ns).List(c, metav1.ListOptions{LabelSelector: "soak=yes"})
	if err != nil {
		return 1
	}
	api := map[string]*corev1.Pod{}
	for i := range l.Items {
		api[l.Items[i].Name] = &l.Items[i]
	}
	n := 0
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pods {
		if r.podProblem(p, api[p.name], p.image, running) != "" {
			n++
		}
	}
	for _, p := range r.deleted {
		if anyOf[p.uid] > 0 || api[p.name] != nil {
			n++
		}
	}
	for _, s := range r.swapRecords() {
		if s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING {
			n++
		}
	}
	return n
}

// footprintRef returns the reference sample (the last process's first
// sample at least 60 s after its start and at or after minute 5 of the
// run when it lived that long) and the last sample.
func (r *run) footprintRef() (ref, end Sample, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) < 2 {
		return ref, end, false
	}
	end = r.samples[len(r.samples)-1]
	var first time.Time
	for _, s := range r.samples {
		if s.PID == end.PID && first.IsZero() {
			first = s.At
		}
	}
	want := first.Add(time.Minute)
	if m5 := r.started.Add(5 * time.Minute); m5.After(want) && m5.Before(end.At.Add(-2*time.Minute)) {
		want = m5
	}
	for _, s := range r.samples {
		if s.PID == end.PID && !s.At.Before(want) {
			return s, end, s.At.Before(end.At)
		}
	}
	return ref, end, false
}

// sampleAt is the sample closest to at.
func (r *run) sampleAt(at time.Time) (Sample, bool) {
	var best Sample
	var bestD time.Duration = -1
	for _, s := range r.samples {
		d := s.At.Sub(at)
		if d < 0 {
			d = -d
		}
		if bestD < 0 || d < bestD {
			best, bestD = s, d
		}
	}
	return best, bestD >= 0
}

// --- the report ---

func (r *run) report(settled time.Duration, fault []int, allowed []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	host, _ := os.Hostname()
	w("# Soak run: %s, %s, %d pods\n\n", r.b, r.s.Duration, r.s.Pods)
	w("- started %s (churn start), commit %s, machine %s (%d CPUs), Go %s\n", r.started.UTC().Format("2006-01-02 15:04:05 UTC"), r.commit, host, runtime.NumCPU(), runtime.Version())
	w("- bed: containerd %s, kubelet %s registered to kube-apiserver %s (node %s), inplaced in Kubernetes mode with its state on a 256 MiB tmpfs\n",
		r.b, harness.KubeletVersion, harness.KubeAPIServerVersion, r.node)
	w("- set-up %s; %d pods Running and Ready %s after the first was created\n", r.setupTook.Round(time.Second), r.s.Pods, r.podsUpTook.Round(time.Second))
	w("- a churn operation every %s, invariants checked every %s (%d checks), a CRI probe (Version, ListPodSandbox) every 250 ms through inplaced; settled %s after the churn stopped\n\n",
		r.s.ChurnEvery, r.s.CheckEvery, r.checksRun, settled.Round(time.Second))

	w("## Churn\n\n| operation | issued | accepted | failed | skipped (API server down) |\n|---|---|---|---|---|\n")
	for _, k := range ChurnKinds() {
		c := r.churn[k]
		w("| %s | %d | %d | %d | %d |\n", k, c.issued+c.skipped, c.ok, c.failed, c.skipped)
	}
	w("\n")
	for _, k := range ChurnKinds() {
		for _, e := range r.churnErrs[k] {
			w("- %s failed at %s\n", k, e)
		}
	}
	w("\nkubelet resizes at the end: %s.\n", r.resizeEnd)
	w("\nSwap records at the end (inplacectl swaps; FAILED is rolled back, the old config runs again):\n\n| kind | state | count |\n|---|---|---|\n")
	for _, k := range sortedKeys(r.swapStates) {
		kind, st, _ := strings.Cut(k, " ")
		w("| %s | %s | %d |\n", kind, st, r.swapStates[k])
	}
	w("\n## Faults\n\n| # | at | fault | lasted | CRI calls failed (codes) | what happened |\n|---|---|---|---|---|---|\n")
	for i, f := range r.faults {
		codes := map[string]int{}
		n := 0
		for j, ff := range r.probeFails {
			if fault[j] == i {
				codes[ff.Label()]++
				n++
			}
		}
		w("| %d | %s (%s) | %s | %s | %d %s | %s |\n", i+1, r.since(f.Start), f.Start.UTC().Format("15:04:05"), f.Kind,
			f.End.Sub(f.Start).Round(100*time.Millisecond), n, codeList(codes), f.Detail)
	}
	outside := 0
	for j := range r.probeFails {
		if fault[j] < 0 {
			outside++
		}
	}
	w("\nCRI probe: %d calls through inplaced, %d failed, %d of them outside any fault window (+5 s).\n\n", r.probeCalls, len(r.probeFails), outside)

	w("## Invariants\n\n| invariant | checks | violations | held |\n|---|---|---|---|\n")
	for _, i := range r.invs {
		held := "yes"
		if len(i.violations) > 0 {
			held = "**no**"
		}
		w("| %s | %d | %d | %s |\n", i.name, i.checks, len(i.violations), held)
	}
	for _, i := range r.invs {
		for j, v := range i.violations {
			if j == 10 {
				w("- … %d more\n", len(i.violations)-10)
				break
			}
			w("- %s: %s\n", i.name, v)
		}
	}
	if len(r.extra) > 0 {
		w("\nRestarted more often than the churn asked, every restart by a swap (%d times; not a violation, a cost):\n\n", len(r.extra))
		for i, e := range r.extra {
			if i == 10 {
				w("- … %d more\n", len(r.extra)-10)
				break
			}
			w("- %s\n", e)
		}
	}
	w("\n## inplaced's footprint (metrics endpoint)\n\n| when | pid | RSS | goroutines | fds |\n|---|---|---|---|---|\n")
	row := func(label string, s Sample) {
		w("| %s (%s) | %d | %s | %d | %d |\n", label, r.since(s.At), s.PID, MiB(s.RSS), s.Goroutines, s.FDs)
	}
	if s, ok := r.sampleAt(r.started.Add(5 * time.Minute)); ok {
		row("minute 5", s)
	}
	r.mu.Unlock()
	ref, _, ok := r.footprintRef()
	r.mu.Lock()
	if ok {
		row("flatness reference: the last process, warm", ref)
	}
	if len(r.samples) > 0 {
		row("end", r.samples[len(r.samples)-1])
	}
	w("\nFlat means: RSS ≤ 1.5× + 16 MiB, goroutines ≤ +60, fds ≤ +40 from the reference to the end (the faults restart inplaced, so the reference is the last process's, 60 s after its start or at minute 5).\n")
	text := b.String()
	r.t.Logf("report:\n%s", text)
	if dir, err := reportDir(r.s.ReportDir); err != nil {
		r.t.Errorf("report dir: %v", err)
	} else if dir != "" {
		path := filepath.Join(dir, "soak-"+string(r.b)+".md")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			r.t.Errorf("write report: %v", err)
		} else {
			r.t.Logf("report written to %s", path)
		}
	}
}

func codeList(codes map[string]int) string {
	if len(codes) == 0 {
		return ""
	}
	var parts []string
	for _, k := range sortedKeys(codes) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, codes[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
