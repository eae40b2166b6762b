package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// The users of the auth registry. Each password is a marker that must
// never show in inplaced's log, state store or the pods' annotations.
var credUsers = map[string]string{
	"alice": "pw-alice-3f9c1e", // pod secrets, keys scoped to a path
	"dave":  "pw-dave-77b2a0",  // a pod secret's host-wide key
	"nora":  "pw-nora-51d8c4",  // the node's docker config
	"pete":  "pw-pete-c0ffee",  // the credential-provider plugin
}

// credenv is Kubernetes mode with an auth registry and every source of
// credentials kubelet has, given to kubelet and to inplaced alike.
type credenv struct {
	*kmenv
	ar        *harness.AuthRegistry
	pluginLog string
	refs      map[string]string // repo:tag → reference in ar
	// annotations of each pod once inplaced reported on it (the pods are
	// deleted when their subtest ends).
	annotations map[string][]byte
}

// keepAnnotations waits for inplaced's status annotation on pod and keeps
// the pod's annotations for testNoLeak.
func (ce *credenv) keepAnnotations(t *testing.T, pod string) {
	t.Helper()
	eventually(t, 30*time.Second, "inplaced's status annotation on "+pod, func() error {
		p, err := ce.cp.Admin.CoreV1().Pods(ce.ns).Get(ctx(t), pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Annotations["inplaced.io/swap-status"] == "" {
			return errorf("no inplaced.io/swap-status on %s yet", pod)
		}
		b, _ := json.Marshal(p.Annotations)
		ce.annotations[pod] = b
		return nil
	})
}

// pluginScript is the test credential provider: it logs who ran it (the
// parent's command name), its first argument, $PLUGIN_ENV and the request,
// and answers with pete's credentials for <registry>/plug, cached by
// registry for 30 s.
const pluginScript = `#!/bin/sh
req=$(cat)
echo "$(cat /proc/$PPID/comm) $1 $PLUGIN_ENV $req" >> %s
printf '%%s\n' '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"30s","auth":{"%s/plug":{"username":"pete","password":"%s"}}}'
`

// flakyScript is a credential provider that fails when inplaced runs it
// and answers kubelet with pete's credentials for <registry>/flaky: a
// source of credentials only kubelet has.
const flakyScript = `#!/bin/sh
cat >/dev/null
if [ "$(cat /proc/$PPID/comm)" = inplaced ]; then echo "simulated outage" >&2; exit 1; fi
printf '%%s\n' '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"0s","auth":{"%s/flaky":{"username":"pete","password":"%s"}}}'
`

const providerConfig = `apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: test-credential-provider
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: ["%[1]s/plug"]
  defaultCacheDuration: 1m
  args: ["from-args"]
  env: [{name: PLUGIN_ENV, value: from-env}]
- name: flaky-provider
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: ["%[1]s/flaky"]
  defaultCacheDuration: 0s
`

// TestKubernetesCredentials: an image patch to an image behind
// docker-registry's htpasswd goes in place with the credentials kubelet
// would use — a pod secret's path-scoped key, the node's docker config, a
// credential-provider plugin (called with kubelet's request, its answer
// cached for its duration); a key of another path is not used and the more
// specific of two keys is; with no credentials anywhere the old container
// runs on with the reason in kubelet's log, and the change lands once a
// secret appears; no password reaches inplaced's log, store or the pods.
func TestKubernetesCredentials(t *testing.T) {
	harness.KubeletPrerequisites(t)
	harness.ControlPlanePrerequisites(t)
	harness.AuthRegistryPrerequisites(t)
	harness.RequireRoot(t)
	backends := harness.BackendsFromEnv()
	harness.Require(t, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	// Finding credentials is inplaced's own (kubelet's keyring rules); the
	// pull hands them to containerd in the CRI request kubelet sends: one
	// containerd proves it.
	backends = firstBackendOnly(t, backends)
	reg := harness.StartRegistry(t)
	imgs := reg.PushTestImages(t)
	ar := harness.StartAuthRegistry(t, reg, credUsers)
	refs := map[string]string{}
	for _, rt := range []string{"team/app:v2", "team/solo:v2", "team/other:v2", "node/app:v2", "plug/app:v2", "plug/app:v3", "plug/app:v4", "late/app:v2", "flaky/app:v2"} {
		refs[rt] = ar.Copy(t, imgs.App2, rt, "alice")
	}
	cp := harness.StartControlPlane(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			start := time.Now()
			// The node's docker config, in kubelet's root dir, scoped to node/.
			kdir, err := os.MkdirTemp("/tmp", "ipkc")
			if err != nil {
				t.Fatal(err)
			}
			// The kubelet's cleanup removes kdir once it started; before, this does.
			kubeletStarted := false
			t.Cleanup(func() {
				if mounts, _ := os.ReadFile("/proc/mounts"); !kubeletStarted && !strings.Contains(string(mounts), " "+kdir+"/") {
					_ = os.RemoveAll(kdir)
				}
			})
			rootDir := harness.KubeletRootDirIn(kdir)
			writeFile(t, filepath.Join(rootDir, "config.json"), dockerConfigJSON(map[string]string{ar.Addr + "/node": "nora"}), 0o600)
			// The credential-provider plugin and its config, for kubelet and
			// inplaced alike.
			pdir := t.TempDir()
			pluginLog := filepath.Join(pdir, "calls.log")
			writeFile(t, filepath.Join(pdir, "test-credential-provider"), fmt.Sprintf(pluginScript, pluginLog, ar.Addr, credUsers["pete"]), 0o755)
			writeFile(t, filepath.Join(pdir, "flaky-provider"), fmt.Sprintf(flakyScript, ar.Addr, credUsers["pete"]), 0o755)
			providerCfg := filepath.Join(pdir, "credential-providers.yaml")
			writeFile(t, providerCfg, fmt.Sprintf(providerConfig, ar.Addr), 0o600)
			providerFlags := []string{"--image-credential-provider-config", providerCfg, "--image-credential-provider-bin-dir", pdir}
			km := startKubeMode(t, cp, b, reg, "ipkc-", kubeMode{pxArgs: append([]string{"--kubelet-root-dir", rootDir}, providerFlags...),
				kubelet: harness.KubeletOptions{Dir: kdir, ExtraArgs: providerFlags}})
			kubeletStarted = true
			ce := &credenv{kmenv: km, ar: ar, pluginLog: pluginLog, refs: refs, annotations: map[string][]byte{}}
			// A namespace per backend: the secrets and pod names repeat.
			ce.ns = "creds-" + randSuffix()
			if _, err := cp.Admin.CoreV1().Namespaces().Create(ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ce.ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := cp.Admin.CoreV1().ServiceAccounts(ce.ns).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}

			t.Run("pod secret with a path-scoped key", ce.testSecretPathScoped)
			t.Run("node docker config", ce.testNodeConfig)
			t.Run("credential-provider plugin", ce.testPlugin)
			t.Run("key of another path not used", ce.testOtherPath)
			t.Run("more specific key first", ce.testMoreSpecific)
			t.Run("no credentials, then a secret", ce.testNoCredentials)
			t.Run("credentials only kubelet has", ce.testKubeletOnly)
			t.Run("no password in logs, store or pods", ce.testNoLeak)
			t.Logf("TestKubernetesCredentials on %s took %s", b, time.Since(start).Round(time.Millisecond))
		})
	}
}

func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

// dockerConfigJSON is a config.json with one "auth" per key (key → user).
func dockerConfigJSON(keys map[string]string) string {
	auths := map[string]map[string]string{}
	for key, user := range keys {
		auths[key] = map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + credUsers[user]))}
	}
	b, _ := json.Marshal(map[string]any{"auths": auths})
	return string(b)
}

// pullSecret creates a kubernetes.io/dockerconfigjson secret (key → user).
func (ce *credenv) pullSecret(t *testing.T, name string, keys map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ce.ns}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(dockerConfigJSON(keys))}}
	if _, err := ce.cp.Admin.CoreV1().Secrets(ce.ns).Create(ctx(t), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func withPullSecrets(names ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, n := range names {
			p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
		}
	}
}

// inPlace patches pod's image and waits until the new image runs in the
// same pod and sandbox, swapped by inplaced with the pull before the stop.
func (ce *credenv) inPlace(t *testing.T, pod, image string) {
	t.Helper()
	before, err := ce.cp.Admin.CoreV1().Pods(ce.ns).Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldID := criID(appStatus(before))
	restarts := appStatus(before).RestartCount
	sb := ce.sandboxOf(t, pod)
	n := len(ce.kubeletSwaps(t, pod))
	ce.setImage(t, pod, image)
	after := ce.cp.WaitPod(t, ce.ns, pod, 2*time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || criID(s) == oldID || s.RestartCount != restarts+1 || s.State.Running == nil || !s.Ready || s.Image != image {
			return fmt.Errorf("want %s running and ready (not %s); app status %+v", image, short(oldID), s)
		}
		return podReady(p)
	})
	if after.UID != before.UID || ce.sandboxOf(t, pod) != sb {
		t.Fatalf("pod %s was recreated (UID %s→%s)", pod, before.UID, after.UID)
	}
	recs := ce.kubeletSwaps(t, pod)
	if len(recs) != n+1 {
		t.Fatalf("%d kubelet-driven swap records for %s, want %d", len(recs), pod, n+1)
	}
	rec := recs[0]
	for _, r := range recs {
		if r.StartedUnixNano > rec.StartedUnixNano {
			rec = r
		}
	}
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.To.GetImage() != image {
		t.Fatalf("swap record: %v", rec)
	}
	pull := stepOf(rec, "pull")
	oldSt, _ := containerInfo(t, ce.direct, oldID)
	if pull == nil || pull.StartedUnixNano+pull.DurationNs >= oldSt.FinishedAt {
		t.Fatalf("the pull (%v) did not end before the old container stopped (%d)", pull, oldSt.FinishedAt)
	}
	ce.keepAnnotations(t, pod)
}

// pulledBy checks that the registry's successful manifest requests for
// repo were all made as user.
func (ce *credenv) pulledBy(t *testing.T, repo, user string) {
	t.Helper()
	got := ce.ar.Pulls(repo)
	if len(got) == 0 {
		t.Fatalf("no successful pull of %s recorded by the registry", repo)
	}
	for _, u := range got {
		if u != user {
			t.Fatalf("pulls of %s were made as %q, want only %s", repo, got, user)
		}
	}
	t.Logf("registry: %s pulled as %s (%d manifest requests)", repo, user, len(got))
}

// testSecretPathScoped: a pod's pull secret with a key scoped to team/ is
// what pulls team/app (the registry sees alice).
func (ce *credenv) testSecretPathScoped(t *testing.T) {
	ce.pullSecret(t, "team-cred", map[string]string{ce.ar.Addr + "/team": "alice"})
	ce.createPodWith(t, "sec", ce.imgs.App1, withPullSecrets("team-cred"))
	ce.inPlace(t, "sec", ce.refs["team/app:v2"])
	ce.pulledBy(t, "team/app", "alice")
}

// testNodeConfig: with no pull secret, the node's docker config pulls
// node/app (the registry sees nora).
func (ce *credenv) testNodeConfig(t *testing.T) {
	ce.createPod(t, "nodecfg", ce.imgs.App1)
	ce.inPlace(t, "nodecfg", ce.refs["node/app:v2"])
	ce.pulledBy(t, "node/app", "nora")
}

// pluginCalls are the plugin's runs by inplaced: "inplaced <arg> <env> <request>".
func (ce *credenv) pluginCalls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(ce.pluginLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var calls []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "inplaced ") {
			calls = append(calls, l)
		}
	}
	return calls
}

// testPlugin: the credential-provider plugin gets kubelet's request, args
// and env; the answer (cacheKeyType Registry, cacheDuration 30s) serves a
// second pull without a call, and is asked again once 30 s have passed.
func (ce *credenv) testPlugin(t *testing.T) {
	ce.createPod(t, "plug", ce.imgs.App1)
	ce.createPod(t, "plug2", ce.imgs.App1)
	first := time.Now()
	ce.inPlace(t, "plug", ce.refs["plug/app:v2"])
	ce.pulledBy(t, "plug/app", "pete")
	calls := ce.pluginCalls(t)
	want := fmt.Sprintf(`inplaced from-args from-env {"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"%s/plug/app"}`, ce.ar.Addr)
	if len(calls) != 1 || calls[0] != want {
		t.Fatalf("plugin calls by inplaced:\n%s\nwant one:\n%s", strings.Join(calls, "\n"), want)
	}
	ce.inPlace(t, "plug2", ce.refs["plug/app:v3"])
	if d := time.Since(first); d >= 30*time.Second {
		t.Fatalf("the second swap ended %s after the first plugin call: the cache check needs it within 30 s", d)
	}
	if n := len(ce.pluginCalls(t)); n != 1 {
		t.Fatalf("%d plugin calls after a second pull within the answer's 30 s: want 1 (cached)", n)
	}
	time.Sleep(time.Until(first.Add(31 * time.Second)))
	ce.inPlace(t, "plug", ce.refs["plug/app:v4"])
	if n := len(ce.pluginCalls(t)); n != 2 {
		t.Fatalf("%d plugin calls after the answer's 30 s: want 2", n)
	}
	t.Logf("plugin run by inplaced with kubelet's request %s; its answer served the second pull, and was asked for again after 30 s",
		want[strings.Index(want, "{"):])
}

// refused checks that pod's old container runs on for two sync periods
// after a patch to image, and that kubelet logged inplaced's reason (want).
func (ce *credenv) refused(t *testing.T, pod, image, want string) {
	t.Helper()
	p, err := ce.cp.Admin.CoreV1().Pods(ce.ns).Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldID := criID(appStatus(p))
	st0, _ := containerInfo(t, ce.direct, oldID)
	ce.setImage(t, pod, image)
	deadline := time.Now().Add(2*kubeletSync + 5*time.Second)
	for time.Now().Before(deadline) {
		st, _ := containerInfo(t, ce.direct, oldID)
		if st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.StartedAt != st0.StartedAt {
			t.Fatalf("old container of %s %s while %s cannot be pulled", pod, st.State, image)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var lines []string
	eventually(t, 30*time.Second, "kubelet's log to carry inplaced's reason", func() error {
		if lines = ce.k.LogGrep(want); len(lines) == 0 {
			return errorf("no kubelet log line with %q; tail:\n%s", want, ce.k.LogTail(20))
		}
		return nil
	})
	t.Logf("kubelet logged inplaced's reason, e.g. %s", lines[len(lines)-1])
	ce.keepAnnotations(t, pod)
}

// testOtherPath: a key scoped to other/ is not used for team/.
func (ce *credenv) testOtherPath(t *testing.T) {
	ce.pullSecret(t, "other-cred", map[string]string{ce.ar.Addr + "/other": "alice"})
	ce.createPodWith(t, "wrongpath", ce.imgs.App1, withPullSecrets("other-cred"))
	ce.refused(t, "wrongpath", ce.refs["team/solo:v2"],
		"unauthorized: the registry refused the pull with the credentials kubelet would use too (no credentials for "+ce.ar.Addr+"/team/solo (looked in: pod secret "+ce.ns+"/other-cred;")
	if got := ce.ar.Pulls("team/solo"); len(got) != 0 {
		t.Fatalf("team/solo was pulled as %q with a key of another path", got)
	}
	ce.deletePod("wrongpath")
}

// testMoreSpecific: of a host-wide key and a team/ key, the
// team/ one is used.
func (ce *credenv) testMoreSpecific(t *testing.T) {
	ce.pullSecret(t, "two-keys", map[string]string{ce.ar.Addr: "dave", ce.ar.Addr + "/team": "alice"})
	ce.createPodWith(t, "specific", ce.imgs.App1, withPullSecrets("two-keys"))
	ce.inPlace(t, "specific", ce.refs["team/other:v2"])
	ce.pulledBy(t, "team/other", "alice")
}

// testNoCredentials: a pull secret the pod names does not
// exist and no other source covers late/: the registry refuses, kubelet's
// stop is refused with the reason, the old container runs on; once the
// secret is created the change lands in place at kubelet's next attempt.
func (ce *credenv) testNoCredentials(t *testing.T) {
	ce.createPodWith(t, "late", ce.imgs.App1, withPullSecrets("late-cred"))
	ce.refused(t, "late", ce.refs["late/app:v2"], "unauthorized: the registry refused the pull with the credentials kubelet would use too (no credentials for "+
		ce.ar.Addr+"/late/app (looked in: pod secret "+ce.ns+"/late-cred (does not exist);")
	if l := ce.k.LogGrep("To do: add or fix an imagePullSecret of the pod"); len(l) == 0 {
		t.Errorf("kubelet's log does not say what to do")
	}
	p, err := ce.cp.Admin.CoreV1().Pods(ce.ns).Get(ctx(t), "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid, sb := p.UID, ce.sandboxOf(t, "late")
	restored := time.Now()
	ce.pullSecret(t, "late-cred", map[string]string{ce.ar.Addr + "/late": "alice"})
	after := ce.cp.WaitPod(t, ce.ns, "late", 2*time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || s.Image != ce.refs["late/app:v2"] || s.State.Running == nil || !s.Ready || s.RestartCount != 1 {
			return fmt.Errorf("app status %+v", s)
		}
		return podReady(p)
	})
	if after.UID != uid || ce.sandboxOf(t, "late") != sb {
		t.Fatalf("pod late was recreated")
	}
	recs := ce.kubeletSwaps(t, "late")
	committed := 0
	for _, r := range recs {
		if r.State == inplacedv1.SwapState_SWAP_STATE_COMMITTED {
			committed++
		} else if !strings.Contains(r.Error, "unauthorized: the registry refused") || !strings.Contains(r.Error, "kubelet's stop refused") {
			t.Errorf("failed swap record does not say which case: %q", r.Error)
		}
	}
	if committed != 1 {
		t.Fatalf("%d committed swaps of late, want 1: %v", committed, recs)
	}
	if ev := ce.events(t, "late"); ev["InPlaceSwapFailed"] == 0 {
		t.Errorf("no InPlaceSwapFailed event for the refused pulls: %v", ev)
	}
	ce.pulledBy(t, "late/app", "alice")
	t.Logf("secret created → new image running in place in %s (%d refused attempts before)", time.Since(restored).Round(time.Millisecond), len(recs)-1)
}

// testKubeletOnly: a plugin fails for inplaced but serves kubelet, so the
// registry refuses inplaced's pull while a source kubelet reads was out of
// inplaced's reach: kubelet's stop goes ahead and kubelet's own pull lands
// the image (the usual restart, not in place).
func (ce *credenv) testKubeletOnly(t *testing.T) {
	before := ce.createPod(t, "flaky", ce.imgs.App1)
	oldID := criID(appStatus(before))
	image := ce.refs["flaky/app:v2"]
	ce.setImage(t, "flaky", image)
	after := ce.cp.WaitPod(t, ce.ns, "flaky", 2*time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || criID(s) == oldID || s.Image != image || s.State.Running == nil || !s.Ready {
			return fmt.Errorf("want %s running (not %s); app status %+v", image, short(oldID), s)
		}
		return podReady(p)
	})
	if after.UID != before.UID {
		t.Fatalf("pod recreated")
	}
	recs := ce.kubeletSwaps(t, "flaky")
	if len(recs) == 0 {
		t.Fatal("no swap record of the refused pull")
	}
	for _, want := range []string{"unauthorized: the registry refused the pull, and kubelet may hold credentials inplaced could not get",
		`credential provider "flaky-provider"`, "simulated outage", "kubelet's stop goes ahead"} {
		if !strings.Contains(recs[0].Error, want) {
			t.Errorf("swap record error %q lacks %q", recs[0].Error, want)
		}
	}
	if recs[0].State == inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Errorf("swap record %v committed: inplaced had no credentials", recs[0])
	}
	ce.pulledBy(t, "flaky/app", "pete")
	ce.keepAnnotations(t, "flaky")
	t.Logf("inplaced's pull refused with a plugin out of reach: kubelet's stop went ahead, kubelet pulled with its own credentials: %s", recs[0].Error)
}

// testNoLeak: no test credential (password, or user:password in base64)
// is in inplaced's log, its state store files, the pods' annotations or
// the namespace's events.
func (ce *credenv) testNoLeak(t *testing.T) {
	var markers []string
	for u, p := range credUsers {
		markers = append(markers, p, base64.StdEncoding.EncodeToString([]byte(u+":"+p)))
	}
	check := func(what string, data []byte) {
		for _, m := range markers {
			if strings.Contains(string(data), m) {
				t.Errorf("%s contains a test credential (%q)", what, m)
			}
		}
	}
	logData, err := os.ReadFile(ce.px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	check("inplaced's log", logData)
	files := 0
	err = filepath.Walk(filepath.Join(ce.px.Dir, "state"), func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		check("state store file "+p, b)
		return nil
	})
	if err != nil || files == 0 {
		t.Fatalf("state store: %d files, %v", files, err)
	}
	for pod, b := range ce.annotations {
		check("annotations of pod "+pod, b)
	}
	evs, err := ce.cp.Admin.CoreV1().Events(ce.ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(evs)
	check("events", b)
	t.Logf("no test credential in inplaced's log (%d bytes), %d state files, the annotations of %d pods, %d events",
		len(logData), files, len(ce.annotations), len(evs.Items))
}
