package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// KruiseVersion is the OpenKruise built by hack/build-openkruise.sh, and
// KubeSchedulerVersion the kube-scheduler built with it.
const (
	KruiseVersion        = "v1.9.1"
	KubeSchedulerVersion = KubeAPIServerVersion
)

// KruiseDir holds kruise-manager, kruise-daemon and the module's CRDs and
// webhook manifests ($INPLACED_KRUISE overrides it).
func KruiseDir() string {
	return toolPath("INPLACED_KRUISE", filepath.Join(ToolsDir(), "kruise-"+KruiseVersion))
}

// KubeSchedulerPath is the kube-scheduler built by hack/build-openkruise.sh
// ($INPLACED_KUBE_SCHEDULER overrides it).
func KubeSchedulerPath() string {
	return toolPath("INPLACED_KUBE_SCHEDULER",
		filepath.Join(ToolsDir(), "kube-scheduler-"+KubeSchedulerVersion, "kube-scheduler"))
}

// KruisePrerequisites skips (or fails under CI=true) unless OpenKruise and
// kube-scheduler are built.
func KruisePrerequisites(tb testing.TB) {
	tb.Helper()
	build := " not found; run hack/build-openkruise.sh (or INPLACED_WITH_KUBELET=1 hack/install-deps.sh)"
	for _, p := range []string{filepath.Join(KruiseDir(), "kruise-manager"), filepath.Join(KruiseDir(), "kruise-daemon"), KubeSchedulerPath()} {
		Require(tb, filepath.Base(p)+" "+KruiseVersion, isExecutable(p), p+build)
	}
}

// Kruise is OpenKruise's kruise-manager and kube-scheduler running against a
// ControlPlane (ControlPlane.StartKruise), as its chart would run them but on
// loopback: the webhook server on 127.0.0.1 with kruise's own self-signed
// certificates (WEBHOOK_HOST), which kruise writes into the webhook
// configurations and conversion webhooks as URLs. kruise-daemons for nodes
// are started with StartDaemon.
//
// What it puts on the machine, and how Close takes it back: Dir (below the
// control plane's) holds the certificates, the logs and the daemons' plugin
// directories; every process has Dir in its command line. /hostvarrun (the
// only place kruise-daemon looks for a CRI socket) gets one symlink per
// daemon, removed with it, and the directory too if the harness made it.
// Close deletes kruise's two webhook configurations first: with
// failurePolicy Fail on pod create and delete, they would block every pod
// once kruise-manager is gone.
type Kruise struct {
	Dir         string
	ManagerLog  string
	SchedLog    string
	WebhookPort int
	// Dynamic is a dynamic client of the admin identity, for kruise's kinds.
	Dynamic dynamic.Interface

	cp      *ControlPlane
	tb      testing.TB
	health  int
	manager *daemon
	sched   *daemon
	daemons []*KruiseDaemon
}

// KruiseOptions configures StartKruise.
type KruiseOptions struct {
	// FeatureGates is kruise's --feature-gates for the manager and the
	// daemons (ImagePullJobGate=true is always added: ImagePullJob needs it).
	FeatureGates string
}

// GVRs of the kruise kinds the tests use.
var (
	CloneSetGVR         = schema.GroupVersionResource{Group: "apps.kruise.io", Version: "v1alpha1", Resource: "clonesets"}
	AdvancedStatefulSet = schema.GroupVersionResource{Group: "apps.kruise.io", Version: "v1beta1", Resource: "statefulsets"}
	ImagePullJobGVR     = schema.GroupVersionResource{Group: "apps.kruise.io", Version: "v1alpha1", Resource: "imagepulljobs"}
	crdGVR              = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// Namespaces kruise needs: its own, and the one the ImagePullJob controller
// keeps pull secrets in (every reconcile fails without it).
var kruiseNamespaces = []string{"kruise-system", "kruise-daemon-config"}

// StartKruise installs kruise's CRDs and webhook configurations and starts
// kube-scheduler and kruise-manager; it returns once kruise's webhooks are
// configured and its controllers run. tb.Cleanup takes it all back.
func (cp *ControlPlane) StartKruise(tb testing.TB, o KruiseOptions) *Kruise {
	tb.Helper()
	KruisePrerequisites(tb)
	start := time.Now()
	k := &Kruise{Dir: filepath.Join(cp.Dir, "kruise"), cp: cp, tb: tb}
	k.ManagerLog, k.SchedLog = filepath.Join(k.Dir, "kruise-manager.log"), filepath.Join(k.Dir, "kube-scheduler.log")
	tb.Cleanup(func() {
		if err := k.Close(); err != nil {
			tb.Errorf("kruise cleanup: %v", err)
		}
	})
	if err := k.start(o); err != nil {
		tb.Fatalf("kruise: %v\nkruise-manager log:\n%s", err, tailFile(k.ManagerLog, 40))
	}
	tb.Logf("kruise %s and kube-scheduler %s ready in %s (webhook 127.0.0.1:%d)", KruiseVersion, KubeSchedulerVersion,
		time.Since(start).Round(time.Millisecond), k.WebhookPort)
	return k
}

func (k *Kruise) start(o KruiseOptions) error {
	if err := os.MkdirAll(filepath.Join(k.Dir, "certs"), 0o755); err != nil {
		return err
	}
	var err error
	if k.Dynamic, err = dynamic.NewForConfig(k.cp.AdminConfig); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, ns := range kruiseNamespaces {
		_, err := k.cp.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	if err := k.applyCRDs(ctx); err != nil {
		return err
	}
	if err := k.createWebhookConfigurations(ctx); err != nil {
		return err
	}
	if err := k.startScheduler(); err != nil {
		return err
	}
	return k.startManager(ctx, o)
}

// applyCRDs creates every CRD of kruise's config/crd/bases.
func (k *Kruise) applyCRDs(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(KruiseDir(), "crd", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (hack/build-openkruise.sh copies them): %v", KruiseDir(), err)
	}
	for _, f := range files {
		for _, doc := range yamlDocs(f) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(obj) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			if _, err := k.Dynamic.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("CRD %s: %w", u.GetName(), err)
			}
		}
	}
	// Established before kruise's informers list them.
	for _, f := range files {
		for _, doc := range yamlDocs(f) {
			var meta struct {
				Metadata struct{ Name string } `json:"metadata"`
			}
			if yaml.Unmarshal(doc, &meta) != nil || meta.Metadata.Name == "" {
				continue
			}
			if err := k.waitEstablished(ctx, meta.Metadata.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

func (k *Kruise) waitEstablished(ctx context.Context, name string) error {
	for {
		u, err := k.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %v", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// yamlDocs splits a multi-document YAML file.
func yamlDocs(path string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// Names kruise updates its webhook configurations under (its kustomize
// namePrefix "kruise-" over config/webhook/manifests.yaml).
const (
	kruiseMutating   = "kruise-mutating-webhook-configuration"
	kruiseValidating = "kruise-validating-webhook-configuration"
)

// createWebhookConfigurations renders config/webhook/manifests.yaml with
// patch_manifests.yaml (selectors per webhook) and the chart's name prefix,
// as kustomize does: kruise only updates the two configurations (their
// clientConfig), they must exist.
func (k *Kruise) createWebhookConfigurations(ctx context.Context) error {
	dir := filepath.Join(KruiseDir(), "webhook")
	var mut admissionv1.MutatingWebhookConfiguration
	var val admissionv1.ValidatingWebhookConfiguration
	var pmut admissionv1.MutatingWebhookConfiguration
	var pval admissionv1.ValidatingWebhookConfiguration
	for file, targets := range map[string][2]any{
		"manifests.yaml":       {&mut, &val},
		"patch_manifests.yaml": {&pmut, &pval},
	} {
		for _, doc := range yamlDocs(filepath.Join(dir, file)) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			var into any
			switch tm.Kind {
			case "MutatingWebhookConfiguration":
				into = targets[0]
			case "ValidatingWebhookConfiguration":
				into = targets[1]
			default:
				continue
			}
			if err := yaml.Unmarshal(doc, into); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
		}
	}
	if len(mut.Webhooks) == 0 || len(val.Webhooks) == 0 {
		return fmt.Errorf("no webhooks in %s", dir)
	}
	for i := range mut.Webhooks {
		for _, p := range pmut.Webhooks {
			if p.Name == mut.Webhooks[i].Name {
				mergeSelectors(&mut.Webhooks[i].NamespaceSelector, &mut.Webhooks[i].ObjectSelector, p.NamespaceSelector, p.ObjectSelector)
			}
		}
	}
	for i := range val.Webhooks {
		for _, p := range pval.Webhooks {
			if p.Name == val.Webhooks[i].Name {
				mergeSelectors(&val.Webhooks[i].NamespaceSelector, &val.Webhooks[i].ObjectSelector, p.NamespaceSelector, p.ObjectSelector)
			}
		}
	}
	mut.ObjectMeta = metav1.ObjectMeta{Name: kruiseMutating}
	val.ObjectMeta = metav1.ObjectMeta{Name: kruiseValidating}
	adm := k.cp.Admin.AdmissionregistrationV1()
	if _, err := adm.MutatingWebhookConfigurations().Create(ctx, &mut, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: %w", kruiseMutating, err)
	}
	if _, err := adm.ValidatingWebhookConfigurations().Create(ctx, &val, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: %w", kruiseValidating, err)
	}
	return nil
}

func mergeSelectors(ns, obj **metav1.LabelSelector, pns, pobj *metav1.LabelSelector) {
	if pns != nil {
		*ns = pns
	}
	if pobj != nil {
		*obj = pobj
	}
}

func (k *Kruise) startScheduler() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	kc := k.cp.AdminKubeconfig
	k.sched, err = k.cp.spawn("kube-scheduler", KubeSchedulerPath(), k.SchedLog, []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
	}, nil)
	return err
}

func (k *Kruise) startManager(ctx context.Context, o KruiseOptions) error {
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	k.WebhookPort, k.health = ports[0], ports[1]
	var err error
	k.manager, err = k.cp.spawn("kruise-manager", filepath.Join(KruiseDir(), "kruise-manager"), k.ManagerLog, []string{
		"--enable-leader-election=false", "--enable-pprof=false",
		"--metrics-addr=127.0.0.1:" + strconv.Itoa(ports[2]),
		"--health-probe-addr=127.0.0.1:" + strconv.Itoa(k.health),
		"--protection-log-path=" + filepath.Join(k.Dir, "protection"),
		"--feature-gates=" + kruiseGates(o.FeatureGates),
		"--v=2",
	}, []string{
		"KUBECONFIG=" + k.cp.AdminKubeconfig, "POD_NAMESPACE=kruise-system",
		"WEBHOOK_HOST=127.0.0.1", "WEBHOOK_PORT=" + strconv.Itoa(k.WebhookPort),
		"WEBHOOK_CERT_DIR=" + filepath.Join(k.Dir, "certs"),
	})
	if err != nil {
		return err
	}
	// kruise starts its controllers after its webhook is ready, and writes
	// the loopback URL into the configurations when it is.
	return waitFor(k.manager, 2*time.Minute, func() error {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(k.health) + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		m, err := k.cp.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, kruiseMutating, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, w := range m.Webhooks {
			if w.ClientConfig.URL == nil || len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("webhook %s not configured yet", w.Name)
			}
		}
		return nil
	})
}

func kruiseGates(extra string) string {
	g := "ImagePullJobGate=true"
	if extra != "" {
		g += "," + extra
	}
	return g
}

// KruiseDaemon is a kruise-daemon for one node, on a given CRI socket.
type KruiseDaemon struct {
	Node    string
	LogPath string
	link    string
	madeDir bool
	d       *daemon
}

// hostVarRun is the only directory kruise-daemon looks for CRI sockets in
// (its DaemonSet mounts the host's /var/run there).
const hostVarRun = "/hostvarrun"

// StartDaemon starts kruise-daemon for Node node with criSocket (a path) as
// its runtime, the way its DaemonSet does with the node's socket mounted.
func (k *Kruise) StartDaemon(tb testing.TB, node, criSocket string) *KruiseDaemon {
	tb.Helper()
	d := &KruiseDaemon{Node: node, LogPath: filepath.Join(k.Dir, "kruise-daemon-"+node+".log")}
	if _, err := os.Stat(hostVarRun); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(hostVarRun, 0o755); err != nil {
			tb.Fatal(err)
		}
		d.madeDir = true
	}
	name := "inplaced-" + node + ".sock"
	d.link = filepath.Join(hostVarRun, name)
	_ = os.Remove(d.link)
	if err := os.Symlink(criSocket, d.link); err != nil {
		tb.Fatal(err)
	}
	k.daemons = append(k.daemons, d)
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	plugins := filepath.Join(k.Dir, "daemon-"+node)
	d.d, err = k.cp.spawn("kruise-daemon", filepath.Join(KruiseDir(), "kruise-daemon"), d.LogPath, []string{
		"--socket-file=" + name, "--addr=127.0.0.1:" + strconv.Itoa(port), "--enable-pprof=false",
		"--plugin-config-file=" + filepath.Join(plugins, "CredentialProviderPlugin.yaml"),
		"--plugin-bin-dir=" + filepath.Join(plugins, "bin"),
		"--feature-gates=" + kruiseGates(""), "--v=3",
	}, []string{"KUBECONFIG=" + k.cp.AdminKubeconfig, "NODE_NAME=" + node})
	if err != nil {
		tb.Fatal(err)
	}
	// Ready once it has made its NodeImage (the ImagePullJob controller
	// works through it).
	nodeImages := schema.GroupVersionResource{Group: "apps.kruise.io", Version: "v1alpha1", Resource: "nodeimages"}
	if err := waitFor(d.d, time.Minute, func() error {
		_, err := k.Dynamic.Resource(nodeImages).Get(context.Background(), node, metav1.GetOptions{})
		return err
	}); err != nil {
		tb.Fatalf("kruise-daemon for %s: %v\n%s", node, err, tailFile(d.LogPath, 30))
	}
	return d
}

// LogGrep returns the lines of kruise-daemon's log that contain s.
func (d *KruiseDaemon) LogGrep(s string) []string { return grepFile(d.LogPath, s) }

// ManagerLogGrep returns the lines of kruise-manager's log that contain s.
func (k *Kruise) ManagerLogGrep(s string) []string { return grepFile(k.ManagerLog, s) }

func grepFile(path, s string) []string {
	data, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// Close deletes the webhook configurations, stops the daemons,
// kruise-manager and kube-scheduler, and removes the /hostvarrun links.
func (k *Kruise) Close() error {
	if k.tb.Failed() {
		k.tb.Logf("kruise-manager log (last 30 lines):\n%s", tailFile(k.ManagerLog, 30))
		files := []string{k.ManagerLog, k.SchedLog}
		for _, d := range k.daemons {
			files = append(files, d.LogPath)
		}
		saveArtifacts(k.tb, "-kruise", files...)
	}
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := k.cp.Admin.AdmissionregistrationV1()
	if err := adm.MutatingWebhookConfigurations().Delete(ctx, kruiseMutating, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	if err := adm.ValidatingWebhookConfigurations().Delete(ctx, kruiseValidating, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	for _, d := range k.daemons {
		if d.d != nil {
			errs = append(errs, d.d.stop(syscall.SIGTERM, 10*time.Second))
		}
		if err := os.Remove(d.link); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if d.madeDir {
			_ = os.Remove(hostVarRun) // only if empty: another daemon's link keeps it
		}
	}
	for _, d := range []*daemon{k.manager, k.sched} {
		if d != nil {
			errs = append(errs, d.stop(syscall.SIGTERM, 10*time.Second))
		}
	}
	return errors.Join(errs...)
}
