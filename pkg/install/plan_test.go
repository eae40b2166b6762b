package install

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// repo is the repository root: the tests' payload is the repository's own
// units and templates, so a change to them is planned here first.
const repo = "../.."

var (
	t0 = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Hour)
)

const (
	containerd   = "unix:///run/containerd/containerd.sock"
	inplacedSock = "unix:///run/inplaced/inplaced.sock"
	kubeletCfg   = "/var/lib/kubelet/config.yaml"
	k3sCfg       = "/etc/rancher/k3s/config.yaml"
)

// kubeadmConfig is a kubelet configuration as kubeadm writes it.
const kubeadmConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
kind: KubeletConfiguration
`

// testPayload is the repository's units and templates, the binaries
// standing in as "inplaced <version>", plus extra files.
func testPayload(t *testing.T, version string, extra ...string) Payload {
	t.Helper()
	p := Payload{}
	add := func(rel string, data []byte, mode os.FileMode) {
		p[rel] = PayloadFile{Data: data, Digest: Digest(data), Mode: mode, Source: "/payload/" + rel}
	}
	for _, rel := range append([]string{payloadServiceUnitRel}, PayloadTemplates...) {
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		add(rel, b, 0o644)
	}
	add("bin/inplaced", []byte("inplaced "+version), 0o755)
	add("bin/inplacectl", []byte("inplacectl "+version), 0o755)
	for i := 0; i+1 < len(extra); i += 2 {
		add(extra[i], []byte(extra[i+1]), 0o644)
	}
	return p
}

func spec(t *testing.T, l Layout, version string, extra ...string) Spec {
	return Spec{Layout: l, Version: version, NodeName: "node-1", Payload: testPayload(t, version, extra...),
		KubernetesMode: true, Now: t0}
}

func hostFile(data string) HostFile {
	return HostFile{Exists: true, Data: []byte(data), Digest: Digest([]byte(data)), Mode: 0o644}
}

// kubeadmNode is a fresh kubeadm node: kubelet on containerd.
func kubeadmNode() Facts {
	return Facts{
		Files:       map[string]HostFile{kubeletCfg: hostFile(kubeadmConfig)},
		Dirs:        map[string][]string{},
		Units:       map[string]UnitState{KubeletUnit: running(100)},
		KubeletUnit: KubeletUnit,
		KubeletArgs: []string{"/usr/bin/kubelet", "--config=" + kubeletCfg, "--kubeconfig=/etc/kubernetes/kubelet.conf"},
	}
}

// k3sNode is a fresh k3s agent with containerd as its own service.
func k3sNode(cfg string) Facts {
	return Facts{
		Files:       map[string]HostFile{k3sCfg: hostFile(cfg)},
		Dirs:        map[string][]string{k3sCfg + ".d": {"10-cgroupv1.yaml"}},
		Units:       map[string]UnitState{"k3s-agent.service": running(200)},
		KubeletUnit: "k3s-agent.service",
		KubeletArgs: []string{"/usr/local/bin/k3s", "agent"},
	}
}

func running(pid uint32) UnitState {
	return UnitState{Load: "loaded", Active: "active", FileState: "enabled", MainPID: pid, Started: uint64(pid) * 1000}
}

// apply is what the executor would leave on the host after p, as facts;
// a restarted unit gets a new main PID.
func apply(t *testing.T, f Facts, p *Plan) Facts {
	t.Helper()
	out := Facts{Files: map[string]HostFile{}, Dirs: map[string][]string{}, Units: map[string]UnitState{},
		KubeletUnit: f.KubeletUnit, KubeletArgs: f.KubeletArgs, Annotation: f.Annotation}
	for k, v := range f.Files {
		out.Files[k] = v
	}
	for k, v := range f.Dirs {
		out.Dirs[k] = v
	}
	for k, v := range f.Units {
		out.Units[k] = v
	}
	for _, s := range p.Steps() {
		applyStep(t, &out, s)
	}
	return out
}

func applyStep(t *testing.T, f *Facts, s Step) {
	t.Helper()
	unit := func(fn func(u *UnitState)) {
		for _, n := range s.Units {
			u := f.Units[n]
			u.Load = "loaded"
			fn(&u)
			f.Units[n] = u
		}
	}
	switch s.Op {
	case OpWrite:
		data := s.Data
		if data == nil {
			data = []byte(s.Source) // a binary: its source names its version well enough
		}
		f.Files[s.Path] = HostFile{Exists: true, Data: data, Digest: Digest(data), Mode: s.Mode}
		if s.Data == nil {
			f.Files[s.Path] = HostFile{Exists: true, Digest: digestOfSource(t, s.Source), Mode: s.Mode}
		}
	case OpRemove:
		delete(f.Files, s.Path)
	case OpRemoveAll:
		delete(f.Dirs, s.Path)
	case OpEnable:
		unit(func(u *UnitState) { u.FileState = "enabled" })
	case OpDisable:
		unit(func(u *UnitState) { u.FileState = "disabled" })
	case OpStart, OpRestart:
		unit(func(u *UnitState) { u.Active, u.MainPID, u.Started = "active", u.MainPID+1, u.Started+1 })
	case OpStop:
		unit(func(u *UnitState) { u.Active, u.MainPID = "inactive", 0 })
	case OpResetFailed:
		unit(func(u *UnitState) { u.Load, u.Active = "not-found", "inactive" })
	case OpAnnotate:
		f.Annotation = nil
		if s.Value != nil {
			in, err := ParseInstalled(*s.Value)
			if err != nil {
				t.Fatal(err)
			}
			f.Annotation = in
		}
	}
}

// digestOfSource is the digest of the payload file at source, as
// testPayload made it.
var sources = map[string]string{}

func digestOfSource(t *testing.T, source string) string {
	d, ok := sources[source]
	if !ok {
		t.Fatalf("unknown source %s", source)
	}
	return d
}

func remember(p Payload) {
	for _, f := range p {
		sources[f.Source] = f.Digest
	}
}

// ops lists a plan's steps as "op target", for comparing.
func ops(p *Plan) []string {
	var out []string
	for _, s := range p.Steps() {
		target := s.Path
		if target == "" {
			target = strings.Join(s.Units, ",")
		}
		if target == "" {
			target = s.Reason
		}
		out = append(out, strings.TrimSpace(string(s.Op)+" "+target))
	}
	return out
}

func step(t *testing.T, p *Plan, op Op, target string) Step {
	t.Helper()
	for _, s := range p.Steps() {
		if s.Op == op && (s.Path == target || strings.Join(s.Units, ",") == target) {
			return s
		}
	}
	t.Fatalf("no %s %s in\n%s", op, target, p)
	return Step{}
}

func recordIn(t *testing.T, p *Plan) *Record {
	t.Helper()
	s := step(t, p, OpWrite, RecordPath)
	r, err := RecordOf(Facts{Files: map[string]HostFile{RecordPath: hostFile(string(s.Data))}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// must(t)(PlanInstall(...)) is the plan, or the test's end.
func must(t *testing.T) func(*Plan, error) *Plan {
	return func(p *Plan, err error) *Plan {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestPlanInstall: what an install does, node by node, as the planner's
// table.
func TestPlanInstall(t *testing.T) {
	fresh := []string{
		"write /usr/local/bin/inplaced", "write /usr/local/bin/inplacectl", "write /etc/systemd/system/inplaced.service",
		"write " + ConfigPath, "daemon-reload", "enable inplaced.service", "start inplaced.service", "wait-cri /run/inplaced/inplaced.sock",
	}
	for _, c := range []struct {
		name  string
		spec  Spec
		facts Facts
		want  []string
		check func(t *testing.T, p *Plan)
	}{{
		name:  "fresh kubeadm node",
		spec:  spec(t, Kubeadm, "v1"),
		facts: kubeadmNode(),
		want: append(slices.Clone(fresh), "write "+RecordPath, "write "+kubeletCfg,
			"write /etc/systemd/system/kubelet.service.d/10-inplaced.conf", "daemon-reload",
			"restart kubelet.service", "wait-node-ready kubelet.service", "annotate", "event "+ReasonInstalled),
		check: func(t *testing.T, p *Plan) {
			cfg := string(step(t, p, OpWrite, kubeletCfg).Data)
			want := strings.Replace(kubeadmConfig, "containerRuntimeEndpoint: "+containerd, "containerRuntimeEndpoint: "+inplacedSock, 1) +
				"imageServiceEndpoint: " + inplacedSock + "\n"
			if cfg != want {
				t.Errorf("kubelet config:\n%s\nwant:\n%s", cfg, want)
			}
			r := recordIn(t, p)
			if r.PreviousRuntimeEndpoint != containerd || r.StaleKubelet != running(100).Identity() || r.KubeletUnit != KubeletUnit ||
				r.Lines["containerRuntimeEndpoint"] != "containerRuntimeEndpoint: "+containerd || r.Lines["imageServiceEndpoint"] != "" {
				t.Errorf("record %+v", r)
			}
			conf := string(step(t, p, OpWrite, ConfigPath).Data)
			for _, l := range []string{`runtimeEndpoint: "` + containerd + `"`, `kubeconfig: "/etc/kubernetes/kubelet.conf"`, `nodeName: "node-1"`} {
				if !strings.Contains(conf, "\n"+l+"\n") {
					t.Errorf("inplaced's config lacks %q:\n%s", l, conf)
				}
			}
			if p.Undoable != 2 || len(p.Phases[0].UndoBefore) == 0 || len(p.Phases[1].UndoAfter) != 2 {
				t.Errorf("undo: %d phases, inplaced %v, kubelet %v", p.Undoable, p.Phases[0].UndoBefore, p.Phases[1].UndoAfter)
			}
		},
	}, {
		name:  "fresh k3s agent: k3s's own drop-in",
		spec:  spec(t, K3s, "v1"),
		facts: k3sNode("container-runtime-endpoint: " + containerd + "\n"),
		want: append(slices.Clone(fresh), "write "+RecordPath, "write "+k3sCfg+".d/90-inplaced.yaml",
			"write /etc/systemd/system/k3s-agent.service.d/10-inplaced.conf", "daemon-reload",
			"restart k3s-agent.service", "wait-node-ready k3s-agent.service", "annotate", "event "+ReasonInstalled),
		check: func(t *testing.T, p *Plan) {
			d := string(step(t, p, OpWrite, k3sCfg+".d/90-inplaced.yaml").Data)
			for _, l := range []string{"container-runtime-endpoint: " + inplacedSock, "image-service-endpoint: " + inplacedSock,
				"kubelet-arg+:\n  - containerd=/run/containerd/containerd.sock"} {
				if !strings.Contains(d, l) {
					t.Errorf("k3s drop-in lacks %q:\n%s", l, d)
				}
			}
			if conf := string(step(t, p, OpWrite, ConfigPath).Data); !strings.Contains(conf, `kubeconfig: "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"`) {
				t.Errorf("inplaced's config has not k3s's kubeconfig:\n%s", conf)
			}
		},
	}, {
		name:  "socket activation: the socket unit installed and started first",
		spec:  spec(t, Kubeadm, "v1", "systemd/inplaced.socket", "[Socket]\nListenStream=/run/inplaced/inplaced.sock\n"),
		facts: kubeadmNode(),
		check: func(t *testing.T, p *Plan) {
			got := ops(p)
			want := []string{"write /etc/systemd/system/inplaced.socket", "enable inplaced.socket,inplaced.service",
				"start inplaced.socket", "start inplaced.service"}
			if !isSubsequence(want, got) {
				t.Errorf("steps %q lack, in order, %q", got, want)
			}
		},
	}, {
		name: "extra flags: a drop-in with the unit's ExecStart",
		spec: func() Spec {
			s := spec(t, Kubeadm, "v1")
			s.ExtraArgs = []string{"--log-level=debug", "--metrics-listen=127.0.0.1:9470"}
			return s
		}(),
		facts: kubeadmNode(),
		check: func(t *testing.T, p *Plan) {
			d := string(step(t, p, OpWrite, ArgsDropIn).Data)
			if !strings.Contains(d, "ExecStart=\nExecStart=/usr/local/bin/inplaced --config /etc/inplaced/config.yaml "+
				`"--log-level=debug" "--metrics-listen=127.0.0.1:9470"`+"\n") {
				t.Errorf("drop-in:\n%s", d)
			}
		},
	}, {
		name: "kubeadm node installed by hand: the endpoint before comes from inplaced's config",
		spec: spec(t, Kubeadm, "v1"),
		facts: func() Facts {
			f := kubeadmNode()
			f.Files[kubeletCfg] = hostFile(strings.Replace(kubeadmConfig, containerd, inplacedSock, 1))
			f.Files[ConfigPath] = hostFile("runtimeEndpoint: unix:///run/k3s/containerd/containerd.sock\n")
			return f
		}(),
		check: func(t *testing.T, p *Plan) {
			r := recordIn(t, p)
			if r.PreviousRuntimeEndpoint != "unix:///run/k3s/containerd/containerd.sock" ||
				r.Lines["containerRuntimeEndpoint"] != "containerRuntimeEndpoint: unix:///run/k3s/containerd/containerd.sock" {
				t.Errorf("record %+v", r)
			}
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			remember(c.spec.Payload)
			p := must(t)(PlanInstall(c.spec, c.facts))
			if c.want != nil && !slices.Equal(ops(p), c.want) {
				t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(ops(p), "\n"), strings.Join(c.want, "\n"))
			}
			if c.check != nil {
				c.check(t, p)
			}
		})
	}
}

// TestPlanInstallRefuses: nodes the installer leaves alone, saying why.
func TestPlanInstallRefuses(t *testing.T) {
	flagNode := kubeadmNode()
	flagNode.KubeletArgs = append(flagNode.KubeletArgs, "--container-runtime-endpoint="+containerd)
	dropInNode := kubeadmNode()
	dropInNode.KubeletArgs = append(dropInNode.KubeletArgs, "--config-dir=/etc/kubernetes/kubelet.conf.d")
	dropInNode.Dirs["/etc/kubernetes/kubelet.conf.d"] = []string{"20-crio.conf"}
	dropInNode.Files["/etc/kubernetes/kubelet.conf.d/20-crio.conf"] = hostFile("containerRuntimeEndpoint: unix:///run/crio/crio.sock\n")
	noConfig := kubeadmNode()
	delete(noConfig.Files, kubeletCfg)
	for _, c := range []struct {
		name  string
		spec  Spec
		facts Facts
		want  string
	}{
		{"k3s with its embedded containerd", spec(t, K3s, "v1"), k3sNode("node-label: [a=b]\n"), "embedded containerd"},
		{"k3s on inplaced by hand", spec(t, K3s, "v1"), k3sNode("container-runtime-endpoint: " + inplacedSock + "\n"), "a hand install"},
		{"k3s not running", spec(t, K3s, "v1"), kubeadmNode(), "no k3s.service or k3s-agent.service"},
		{"kubelet's endpoint from a flag", spec(t, Kubeadm, "v1"), flagNode, "--container-runtime-endpoint"},
		{"kubelet's endpoint from a drop-in", spec(t, Kubeadm, "v1"), dropInNode, "20-crio.conf sets containerRuntimeEndpoint"},
		{"no kubelet configuration (k3s node, kubeadm layout)", spec(t, Kubeadm, "v1"), noConfig, "not a kubeadm node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := PlanInstall(c.spec, c.facts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// installed is node after a successful install of spec s: the executor's
// result, kubelet restarted.
func installed(t *testing.T, s Spec, node Facts) Facts {
	t.Helper()
	remember(s.Payload)
	return apply(t, node, must(t)(PlanInstall(s, node)))
}

// TestPlanInstallAgain: runs on a node that has inplaced: the same version
// restarts nothing, an upgrade restarts inplaced only, a run cut before
// kubelet's restart restarts it once.
func TestPlanInstallAgain(t *testing.T) {
	for _, layout := range []struct {
		l    Layout
		node Facts
	}{{Kubeadm, kubeadmNode()}, {K3s, k3sNode("container-runtime-endpoint: " + containerd + "\n")}} {
		t.Run(string(layout.l), func(t *testing.T) {
			v1 := spec(t, layout.l, "v1")
			done := installed(t, v1, layout.node)
			kubelet := done.KubeletUnit

			again := v1
			again.Now = t1
			p := must(t)(PlanInstall(again, done))
			if !p.Empty() || !strings.Contains(p.Summary, "nothing to do") {
				t.Errorf("second run with everything in place:\n%s", p)
			}

			v2 := spec(t, layout.l, "v2")
			v2.Now = t1
			remember(v2.Payload)
			p = must(t)(PlanInstall(v2, done))
			want := []string{"write /usr/local/bin/inplaced", "write /usr/local/bin/inplacectl", "restart inplaced.service",
				"wait-cri /run/inplaced/inplaced.sock", "write " + RecordPath, "annotate", "event " + ReasonUpgraded}
			if !slices.Equal(ops(p), want) {
				t.Errorf("upgrade:\n%s\nwant:\n%s", strings.Join(ops(p), "\n"), strings.Join(want, "\n"))
			}
			if r := recordIn(t, p); r.Version != "v2" || !r.Time.Equal(t1) || r.PreviousRuntimeEndpoint != containerd {
				t.Errorf("upgrade's record %+v", r)
			}
			if !strings.Contains(p.Summary, "v1 → v2") || !strings.Contains(p.Summary, kubelet+" not restarted") {
				t.Errorf("upgrade's summary %q", p.Summary)
			}
			upgraded := apply(t, done, p)
			if p := must(t)(PlanInstall(v2, upgraded)); !p.Empty() {
				t.Errorf("after the upgrade:\n%s", p)
			}

			// The run was cut after kubelet's configuration changed: the
			// kubelet running has not read it.
			cut := apply(t, layout.node, &Plan{Phases: must(t)(PlanInstall(v1, layout.node)).Phases[:1]})
			first := must(t)(PlanInstall(v1, cut))
			for _, s := range first.Phases[1].Steps {
				if s.Op == OpWrite {
					applyStep(t, &cut, s)
				}
			}
			p = must(t)(PlanInstall(v1, cut))
			want = []string{"wait-cri /run/inplaced/inplaced.sock", "restart " + kubelet, "wait-node-ready " + kubelet, "annotate", "event " + ReasonUpdated}
			if !slices.Equal(ops(p), want) {
				t.Errorf("after a cut run:\n%s\nwant:\n%s", strings.Join(ops(p), "\n"), strings.Join(want, "\n"))
			}
			if p := must(t)(PlanInstall(v1, apply(t, cut, p))); !p.Empty() {
				t.Errorf("after the restart:\n%s", p)
			}
		})
	}
}

// TestPlanInstallUpgradeAddsSocket: the release that brings inplaced.socket
// stops the service, starts the socket, starts the service on it.
func TestPlanInstallUpgradeAddsSocket(t *testing.T) {
	done := installed(t, spec(t, Kubeadm, "v1"), kubeadmNode())
	v2 := spec(t, Kubeadm, "v2", "systemd/inplaced.socket", "[Socket]\nListenStream=/run/inplaced/inplaced.sock\n")
	remember(v2.Payload)
	p := must(t)(PlanInstall(v2, done))
	want := []string{"write /usr/local/bin/inplaced", "write /usr/local/bin/inplacectl", "write /etc/systemd/system/inplaced.socket",
		"daemon-reload", "enable inplaced.socket", "stop inplaced.service", "start inplaced.socket", "start inplaced.service",
		"wait-cri /run/inplaced/inplaced.sock", "write " + RecordPath, "annotate", "event " + ReasonUpgraded}
	if !slices.Equal(ops(p), want) {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(ops(p), "\n"), strings.Join(want, "\n"))
	}
}

// TestPlanUninstall: kubelet back where the record says, everything of
// inplaced's gone, and nothing to do where nothing is.
func TestPlanUninstall(t *testing.T) {
	for _, layout := range []struct {
		l       Layout
		node    Facts
		kubelet string
		restore []string
	}{
		{Kubeadm, kubeadmNode(), KubeletUnit, []string{"write " + kubeletCfg, "remove /etc/systemd/system/kubelet.service.d/10-inplaced.conf",
			"remove-empty-dir /etc/systemd/system/kubelet.service.d"}},
		{K3s, k3sNode("container-runtime-endpoint: " + containerd + "\n"), "k3s-agent.service",
			[]string{"remove " + k3sCfg + ".d/90-inplaced.yaml", "remove-empty-dir " + k3sCfg + ".d",
				"remove /etc/systemd/system/k3s-agent.service.d/10-inplaced.conf", "remove-empty-dir /etc/systemd/system/k3s-agent.service.d"}},
	} {
		t.Run(string(layout.l)+" with the recorded endpoint", func(t *testing.T) {
			s := spec(t, layout.l, "v1")
			done := installed(t, s, layout.node)
			done.Dirs[StateDir] = []string{"state.db"}
			done.Dirs[RuntimeDir] = []string{"inplaced.sock"}
			p := must(t)(PlanUninstall(s, done))
			want := append(append([]string{"write " + RecordPath}, layout.restore...), "daemon-reload",
				"restart "+layout.kubelet, "wait-node-ready "+layout.kubelet,
				"wait-swaps /run/inplaced/control.sock", "stop inplaced.service", "disable inplaced.service",
				"remove /etc/inplaced/config.yaml", "remove /etc/systemd/system/inplaced.service",
				"remove /usr/local/bin/inplacectl", "remove /usr/local/bin/inplaced",
				"remove-empty-dir /etc/systemd/system/inplaced.service.d", "daemon-reload", "reset-failed inplaced.service",
				"remove-all "+StateDir, "remove-all "+RuntimeDir, "remove-hold-tables", "check-mounts",
				"annotate", "event "+ReasonUninstalled, "remove "+RecordPath, "remove-empty-dir "+ConfigDir)
			if !slices.Equal(ops(p), want) {
				t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(ops(p), "\n"), strings.Join(want, "\n"))
			}
			if p.Undoable != 0 {
				t.Errorf("an uninstall undoes %d phases", p.Undoable)
			}
			after := apply(t, done, p)
			if layout.l == Kubeadm && string(after.file(kubeletCfg).Data) != kubeadmConfig {
				t.Errorf("kubelet's config after uninstall:\n%s\nwant as it was:\n%s", after.file(kubeletCfg).Data, kubeadmConfig)
			}
			for p := range after.Files {
				if p != kubeletCfg && p != k3sCfg {
					t.Errorf("%s left after uninstall", p)
				}
			}
			if after.Annotation != nil {
				t.Errorf("annotation left: %+v", after.Annotation)
			}
			if p := must(t)(PlanUninstall(s, after)); len(p.Phases) != 0 {
				t.Errorf("a second uninstall:\n%s", p)
			}
		})
	}

	t.Run("nothing installed", func(t *testing.T) {
		for _, node := range []Facts{kubeadmNode(), k3sNode("container-runtime-endpoint: " + containerd + "\n")} {
			p := must(t)(PlanUninstall(spec(t, Kubeadm, "v1"), node))
			if len(p.Phases) != 0 || !p.Empty() {
				t.Errorf("plan on a node without inplaced:\n%s", p)
			}
		}
	})

	t.Run("no host record: the Node's annotation names the endpoint", func(t *testing.T) {
		node := kubeadmNode()
		node.Files[kubeletCfg] = hostFile(strings.Replace(kubeadmConfig, containerd, inplacedSock, 1))
		node.Files["/usr/local/bin/inplaced"] = hostFile("inplaced v0")
		node.Annotation = &Installed{Version: "v0", PreviousRuntimeEndpoint: "unix:///run/containerd/other.sock", Layout: Kubeadm}
		p := must(t)(PlanUninstall(spec(t, Kubeadm, "v1"), node))
		cfg := string(step(t, p, OpWrite, kubeletCfg).Data)
		if !strings.Contains(cfg, "containerRuntimeEndpoint: unix:///run/containerd/other.sock\n") {
			t.Errorf("kubelet's config:\n%s", cfg)
		}
		step(t, p, OpRestart, KubeletUnit)
		step(t, p, OpRemove, "/usr/local/bin/inplaced")
	})

	t.Run("cut after kubelet's config went back: restarted once more, nothing else twice", func(t *testing.T) {
		s := spec(t, Kubeadm, "v1")
		done := installed(t, s, kubeadmNode())
		first := must(t)(PlanUninstall(s, done))
		cut := done
		for _, st := range first.Phases[0].Steps {
			if st.Op == OpWrite || st.Op == OpRemove {
				applyStep(t, &cut, st)
			}
		}
		p := must(t)(PlanUninstall(s, cut))
		if got := ops(p)[:2]; !slices.Equal(got, []string{"restart kubelet.service", "wait-node-ready kubelet.service"}) {
			t.Errorf("first steps %q:\n%s", got, p)
		}
	})
}

func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestPlanStringNamesEveryStep: the plan printed for --dry-run and the log
// names each step's target.
func TestPlanStringNamesEveryStep(t *testing.T) {
	s := spec(t, Kubeadm, "v1")
	p := must(t)(PlanInstall(s, kubeadmNode()))
	out := p.String()
	for _, st := range p.Steps() {
		target := st.Path
		if target == "" && len(st.Units) > 0 {
			target = st.Units[0]
		}
		if !strings.Contains(out, fmt.Sprintf("%s %s", st.Op, target)) && target != "" {
			t.Errorf("plan text lacks %s %s:\n%s", st.Op, target, out)
		}
	}
	if !strings.Contains(out, "(undone on failure)") || path.Base(RecordPath) == "" {
		t.Errorf("plan text:\n%s", out)
	}
}
