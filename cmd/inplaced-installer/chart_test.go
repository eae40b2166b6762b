package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir     = "../../deploy/helm/inplaced"
	kustomizeDir = "../../deploy/daemonset"
	helmVersion  = "v4.3"
)

// helm is Helm v4, as hack/install-deps.sh installs it (built from the Go
// module proxy under $INPLACED_TOOLS/bin), or $INPLACED_HELM, or on PATH.
func helm(t *testing.T) string {
	t.Helper()
	tools := os.Getenv("INPLACED_TOOLS")
	if tools == "" {
		tools = "/var/cache/inplaced/tools"
	}
	for _, c := range []string{os.Getenv("INPLACED_HELM"), filepath.Join(tools, "bin", "helm"), "helm"} {
		if c == "" {
			continue
		}
		p, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		out, err := exec.Command(p, "version", "--short").Output()
		if err == nil && strings.HasPrefix(string(out), helmVersion) {
			return p
		}
	}
	t.Skipf("no Helm %s (hack/install-deps.sh builds it into $INPLACED_TOOLS/bin/helm)", helmVersion)
	return ""
}

type object = map[string]any

// render is `helm template` of the chart in kube-system with sets.
func render(t *testing.T, sets ...string) ([]object, error) {
	t.Helper()
	args := []string{"template", "inplaced", chartDir, "--namespace", "kube-system"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm(t), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return decode(t, out), nil
}

func mustRender(t *testing.T, sets ...string) []object {
	t.Helper()
	objs, err := render(t, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decode reads every YAML document, as JSON-shaped maps.
func decode(t *testing.T, b []byte) []object {
	t.Helper()
	d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []object
	for {
		var o object
		if err := d.Decode(&o); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if len(o) > 0 {
			out = append(out, o)
		}
	}
}

func get(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(object)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

func key(o object) string {
	ns, _ := get(o, "metadata", "namespace").(string)
	return fmt.Sprintf("%s %s/%s", get(o, "kind"), ns, get(o, "metadata", "name"))
}

func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if get(o, "kind") == kind && get(o, "metadata", "name") == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func isHook(o object) bool {
	a, _ := get(o, "metadata", "annotations").(object)
	_, ok := a["helm.sh/hook"]
	return ok
}

// container returns the pod template's only container.
func container(t *testing.T, o object) object {
	t.Helper()
	cs, _ := get(o, "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers", key(o), len(cs))
	}
	return cs[0].(object)
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestChartMatchesKustomize: `kubectl apply -k deploy/daemonset` creates the
// objects the chart does with its default values, hooks aside (the Helm
// labels dropped).
func TestChartMatchesKustomize(t *testing.T) {
	var chart []object
	for _, o := range mustRender(t) {
		if isHook(o) {
			continue
		}
		if l, ok := get(o, "metadata", "labels").(object); ok {
			delete(l, "helm.sh/chart")
			delete(l, "app.kubernetes.io/managed-by")
		}
		chart = append(chart, o)
	}
	kust := kustomizeObjects(t)
	byKey := map[string]object{}
	for _, o := range kust {
		byKey[key(o)] = o
	}
	var keys []string
	for _, o := range chart {
		keys = append(keys, key(o))
		k, ok := byKey[key(o)]
		if !ok {
			t.Errorf("%s: in the chart, not in %s", key(o), kustomizeDir)
			continue
		}
		if !reflect.DeepEqual(o, k) {
			a, _ := sigsyaml.Marshal(o)
			b, _ := sigsyaml.Marshal(k)
			t.Errorf("%s differs:\nchart:\n%s\nkustomize:\n%s", key(o), a, b)
		}
		delete(byKey, key(o))
	}
	for k := range byKey {
		t.Errorf("%s: in %s, not in the chart", k, kustomizeDir)
	}
	sort.Strings(keys)
	t.Logf("compared %s", strings.Join(keys, ", "))
}

// kustomizeObjects reads deploy/daemonset as kustomize would: its
// kustomization lists resources and does nothing else (a transformer added
// there would need this test to apply it).
func kustomizeObjects(t *testing.T) []object {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kustomizeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	var all object
	if err := sigsyaml.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	for f := range all {
		if f != "apiVersion" && f != "kind" && f != "resources" {
			t.Errorf("kustomization.yaml has %q: the drift test compares plain resources only", f)
		}
	}
	if err := sigsyaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(kustomizeDir, r))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decode(t, b)...)
	}
	return out
}

// parse runs the installer's own command line over args (the binary's
// arguments after the command) and returns the options they set.
func parse(t *testing.T, args []string) *options {
	t.Helper()
	o := &options{}
	root := newRootFor(o)
	cmd, rest, err := root.Find(args)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("the installer does not take %q: %v", args, err)
	}
	if cmd.Name() != args[0] {
		t.Fatalf("%q runs %s", args, cmd.Name())
	}
	return o
}

// TestChartValues: each value reaches the installer as a flag it takes.
func TestChartValues(t *testing.T) {
	objs := mustRender(t, "kubeletLayout=k3s", "kubernetesMode=false", "connectionHold=drop", "holdMax=5s",
		"extraArgs[0]=--log-level=debug", "extraArgs[1]=--metrics-listen=127.0.0.1:9470", "image.tag=v9",
		"image.pullPolicy=Always", "updateStrategy.maxUnavailable=3", "uninstall.maxUnavailable=10", "uninstall.timeout=20m",
		"nodeSelector.pool=edge")
	ds := find(t, objs, "DaemonSet", "inplaced-installer")
	c := container(t, ds)
	args := strs(c["args"])
	o := parse(t, args)
	if o.layout != "k3s" || o.kubernetesMode || o.connectionHold != "drop" || o.holdMax != "5s" ||
		!slices.Equal(o.extraArgs, []string{"--log-level=debug", "--metrics-listen=127.0.0.1:9470"}) {
		t.Errorf("the installer got %+v from %q", *o, args)
	}
	if c["image"] != "ghcr.io/inplaced/inplaced:v9" || c["imagePullPolicy"] != "Always" {
		t.Errorf("image %v %v", c["image"], c["imagePullPolicy"])
	}
	if ru := get(ds, "spec", "updateStrategy", "rollingUpdate").(object); fmt.Sprint(ru["maxUnavailable"]) != "3" || fmt.Sprint(ru["maxSurge"]) != "0" {
		t.Errorf("rolling update %v", ru)
	}
	if get(ds, "spec", "template", "spec", "nodeSelector", "pool") != "edge" {
		t.Errorf("node selector %v", get(ds, "spec", "template", "spec", "nodeSelector"))
	}

	job := find(t, objs, "Job", "inplaced-uninstall")
	jc := container(t, job)
	if jc["image"] != c["image"] {
		t.Errorf("the hook runs %v, the DaemonSet %v", jc["image"], c["image"])
	}
	ja := strs(jc["args"])
	parse(t, ja)
	for _, want := range []string{"--max-unavailable=10", "--timeout=20m", "--namespace=kube-system", "--daemonset=inplaced-installer"} {
		if !slices.Contains(ja, want) {
			t.Errorf("hook args %q lack %s", ja, want)
		}
	}
}

// TestChartDaemonSet: what the installer needs of its pod, and what keeps
// the DaemonSet's rollout node by node.
func TestChartDaemonSet(t *testing.T) {
	ds := find(t, mustRender(t), "DaemonSet", "inplaced-installer")
	spec := get(ds, "spec", "template", "spec").(object)
	c := container(t, ds)
	if spec["hostPID"] != true || get(c, "securityContext", "privileged") != true {
		t.Errorf("hostPID %v, privileged %v", spec["hostPID"], get(c, "securityContext", "privileged"))
	}
	if c["name"] != containerName {
		t.Errorf("container %v: the uninstall patch merges into %q", c["name"], containerName)
	}
	mounts := map[string]string{}
	for _, m := range c["volumeMounts"].([]any) {
		mounts[get(m, "name").(string)] = get(m, "mountPath").(string)
	}
	var hostRoot bool
	for _, v := range spec["volumes"].([]any) {
		hostRoot = hostRoot || (get(v, "hostPath", "path") == "/" && mounts[get(v, "name").(string)] == "/host")
	}
	if !hostRoot {
		t.Errorf("the host's root is not mounted at /host: %v %v", spec["volumes"], mounts)
	}
	o := parse(t, strs(c["args"]))
	if o.root != "/host" || o.payload != "/opt/inplaced" || o.readyFile != "/run/inplaced-installer/ready" || mounts["run"] != "/run/inplaced-installer" {
		t.Errorf("options %+v, mounts %v", *o, mounts)
	}
	if cmd := strs(c["command"]); filepath.Dir(cmd[0]) != o.binDir {
		t.Errorf("the chart runs %s, the binaries are looked for in %s", cmd[0], o.binDir)
	}
	probe := strs(get(c, "readinessProbe", "exec", "command"))
	if probe[0] != strs(c["command"])[0] {
		t.Errorf("probe %q runs another binary than %q", probe, c["command"])
	}
	parse(t, probe[1:])
	env := map[string]any{}
	for _, e := range c["env"].([]any) {
		env[get(e, "name").(string)] = e
	}
	if get(env[modeEnv], "value") != "install" || get(env["NODE_NAME"], "valueFrom", "fieldRef", "fieldPath") != "spec.nodeName" {
		t.Errorf("env %v", env)
	}
	if get(ds, "spec", "updateStrategy", "type") != "RollingUpdate" {
		t.Errorf("update strategy %v", get(ds, "spec", "updateStrategy"))
	}
}

// TestChartHooks: helm uninstall's work is all pre-delete hooks, the Job
// last, its RBAC before it.
func TestChartHooks(t *testing.T) {
	weights := map[string]string{}
	for _, o := range mustRender(t) {
		if !isHook(o) {
			continue
		}
		a := get(o, "metadata", "annotations").(object)
		if a["helm.sh/hook"] != "pre-delete" {
			t.Errorf("%s: hook %v", key(o), a["helm.sh/hook"])
		}
		weights[key(o)] = a["helm.sh/hook-weight"].(string)
	}
	want := map[string]string{
		"ServiceAccount kube-system/inplaced-uninstall": "-10", "Role kube-system/inplaced-uninstall": "-10",
		"RoleBinding kube-system/inplaced-uninstall": "-10", "Job kube-system/inplaced-uninstall": "0",
	}
	if !reflect.DeepEqual(weights, want) {
		t.Errorf("hooks %v, want %v", weights, want)
	}
}

// TestChartRejectsBadValues: values.schema.json stops a value the installer
// would refuse on every node.
func TestChartRejectsBadValues(t *testing.T) {
	for _, set := range []string{"kubeletLayout=rke2", "connectionHold=wait", "extraArgs[0]=log-level", "holdMax=ten"} {
		if _, err := render(t, set); err == nil {
			t.Errorf("--set %s rendered", set)
		}
	}
}

// TestUninstallPatchDocumented: the kubectl form in docs/upgrade.md sends
// the hook's own patch.
func TestUninstallPatchDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/upgrade.md")
	if err != nil {
		t.Fatal(err)
	}
	if p := string(uninstallPatch("100%")); !strings.Contains(string(b), "'"+p+"'") {
		t.Errorf("docs/upgrade.md does not give the uninstall patch %s", p)
	}
	var m object
	if err := json.Unmarshal(uninstallPatch("1"), &m); err != nil {
		t.Fatal(err)
	}
	c := get(m, "spec", "template", "spec", "containers").([]any)[0]
	if get(c, "name") != containerName || get(get(c, "env").([]any)[0], "value") != "uninstall" {
		t.Errorf("patch %v", m)
	}
}
