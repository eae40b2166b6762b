package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// side is what one layout knows about kubelet's runtime endpoint: where it
// is configured, how to point it at inplaced and how to put it back.
type side interface {
	layout() Layout
	unit() string
	// kubeconfig is kubelet's own kubeconfig on this layout, which
	// inplaced's Kubernetes mode uses as it is.
	kubeconfig() string
	// paths and dirs are what Inspect reads for this layout.
	paths() []string
	dirs() []string
	// check fails when the installer cannot point kubelet at inplaced here.
	check(f Facts) error
	// previous is the endpoints kubelet uses without inplaced.
	previous(f Facts, endpoint string) (runtime, image string, err error)
	// point is the writes that put kubelet on endpoint.
	point(f Facts, rec *Record, endpoint string, prev endpoints, p Payload) change
	// restore is the writes that put back what point changed, as far as it
	// is still as point left it.
	restore(f Facts, rec *Record, endpoint string, prev endpoints) change
	// owned is the host files of this layout the installer writes.
	owned() []string
}

type endpoints struct{ runtime, image string }

// change is one layout's part of a plan.
type change struct {
	steps []Step
	// config: a file naming kubelet's endpoint changed; kubelet reads it
	// when it starts.
	config bool
	// unitDropIn: a unit drop-in changed; systemd reads it on reload.
	unitDropIn bool
	// kubeletConfig and lines are kubeadm's file and its lines as they
	// were, for the record.
	kubeletConfig string
	lines         map[string]string
}

// newSide returns the layout's side for the facts (and the record of an
// earlier install, whose kubelet unit and configuration file win).
func newSide(l Layout, f Facts, rec *Record) (side, error) {
	switch l {
	case Kubeadm:
		k := &kubeadm{config: KubeletConfigDefault}
		if v, ok := flagValue(f.KubeletArgs, "config"); ok {
			k.config = v
		}
		if rec != nil && rec.KubeletConfig != "" {
			k.config = rec.KubeletConfig
		}
		k.configDir, _ = flagValue(f.KubeletArgs, "config-dir")
		return k, nil
	case K3s:
		k := &k3s{unitName: f.KubeletUnit, config: K3sConfigDefault, dataDir: "/var/lib/rancher/k3s"}
		if rec != nil && rec.KubeletUnit != "" {
			k.unitName = rec.KubeletUnit
		}
		if v, ok := flagValue(f.KubeletArgs, "config", "c"); ok {
			k.config = v
		}
		if v, ok := flagValue(f.KubeletArgs, "data-dir", "d"); ok {
			k.dataDir = v
		}
		return k, nil
	}
	return nil, fmt.Errorf("layout %q: want %s or %s", l, Kubeadm, K3s)
}

// kubeadm: kubelet.service with a KubeletConfiguration file whose two
// endpoint lines are changed, and a unit drop-in that orders kubelet after
// inplaced.
type kubeadm struct {
	config    string // the KubeletConfiguration file (--config)
	configDir string // kubelet's --config-dir, if any
}

var kubeletKeys = []string{"containerRuntimeEndpoint", "imageServiceEndpoint"}

func (k *kubeadm) layout() Layout     { return Kubeadm }
func (k *kubeadm) unit() string       { return KubeletUnit }
func (k *kubeadm) kubeconfig() string { return "/etc/kubernetes/kubelet.conf" }
func (k *kubeadm) unitDropIn() string { return UnitDir + "/" + KubeletUnit + ".d/" + unitDropInName }
func (k *kubeadm) owned() []string    { return []string{k.unitDropIn()} }
func (k *kubeadm) paths() []string    { return []string{k.config, k.unitDropIn()} }
func (k *kubeadm) dirs() []string     { return nonEmpty(k.configDir) }
func (k *kubeadm) dropIns(f Facts) []string {
	return entries(f, k.configDir, ".conf", "")
}

func (k *kubeadm) check(f Facts) error {
	if err := refuseFlags(KubeletUnit, f.KubeletArgs); err != nil {
		return err
	}
	cfg := f.file(k.config)
	if !cfg.Exists {
		return fmt.Errorf("kubelet's configuration %s is not there: not a kubeadm node? (layout %s is for k3s)", k.config, K3s)
	}
	if isJSON(cfg.Data) {
		return fmt.Errorf("kubelet's configuration %s is JSON: set containerRuntimeEndpoint and imageServiceEndpoint "+
			"to inplaced's socket by hand, or make it YAML", k.config)
	}
	if _, err := topLevel(cfg.Data); err != nil {
		return fmt.Errorf("kubelet's configuration %s: %w", k.config, err)
	}
	for _, p := range k.dropIns(f) {
		m, err := topLevel(f.file(p).Data)
		if err != nil {
			return fmt.Errorf("kubelet's drop-in %s: %w", p, err)
		}
		for _, key := range kubeletKeys {
			if stringKey(m, key) != "" {
				return fmt.Errorf("kubelet's drop-in %s sets %s, which wins over %s: remove it there first", p, key, k.config)
			}
		}
	}
	return nil
}

func (k *kubeadm) previous(f Facts, endpoint string) (string, string, error) {
	m, err := topLevel(f.file(k.config).Data)
	if err != nil {
		return "", "", err
	}
	rt, im := stringKey(m, kubeletKeys[0]), stringKey(m, kubeletKeys[1])
	if rt == "" {
		rt = DefaultRuntimeEndpoint
	}
	if rt == endpoint {
		rt, im = handInstalled(f)
	}
	return rt, cleanImage(im, rt, endpoint), nil
}

func (k *kubeadm) point(f Facts, rec *Record, endpoint string, prev endpoints, p Payload) change {
	cur := f.file(k.config).Data
	c := change{kubeletConfig: k.config, lines: map[string]string{}}
	if rec != nil && rec.Lines != nil {
		c.lines = rec.Lines
	} else {
		for i, key := range kubeletKeys {
			c.lines[key] = originalLine(cur, key, endpoint, []string{prev.runtime, prev.image}[i])
		}
	}
	next := cur
	for _, key := range kubeletKeys {
		next = setLine(next, key, key+": "+endpoint)
	}
	if !bytes.Equal(next, cur) {
		c.config = true
		c.steps = append(c.steps, Step{Op: OpWrite, Path: k.config, Data: next, Mode: modeOr(f.file(k.config), 0o644),
			Why: "kubelet's endpoints → " + endpoint})
	}
	c.unitDropIn = writeIfDiffers(&c.steps, f, k.unitDropIn(), p[payloadKubeletDropIn].Data, "kubelet starts after inplaced")
	return c
}

// originalLine is key's line as it was before the first install: as found,
// unless it names inplaced already (a hand install), in which case the line
// that names prev (none for an empty prev).
func originalLine(cur []byte, key, endpoint, prev string) string {
	line := lineOf(cur, key)
	m, err := topLevel([]byte(line))
	if err != nil || stringKey(m, key) != endpoint {
		return line
	}
	if prev == "" {
		return ""
	}
	return key + ": " + prev
}

func (k *kubeadm) restore(f Facts, rec *Record, endpoint string, prev endpoints) change {
	c := change{}
	cfg := f.file(k.config)
	if cfg.Exists {
		m, _ := topLevel(cfg.Data)
		next := cfg.Data
		for i, key := range kubeletKeys {
			if stringKey(m, key) != endpoint {
				continue // not inplaced's any more: whoever changed it keeps it
			}
			line, ok := "", false
			if rec != nil {
				line, ok = rec.Lines[key]
			}
			if !ok {
				line = originalLine([]byte(key+": "+endpoint), key, endpoint, []string{prev.runtime, prev.image}[i])
			}
			next = setLine(next, key, line)
		}
		if !bytes.Equal(next, cfg.Data) {
			c.config = true
			c.steps = append(c.steps, Step{Op: OpWrite, Path: k.config, Data: next, Mode: modeOr(cfg, 0o644),
				Why: "kubelet's endpoints back to " + prev.runtime})
		}
	}
	c.unitDropIn = removeWithDir(&c.steps, f, k.unitDropIn(), "kubelet's order after inplaced")
	return c
}

// k3s: the k3s or k3s-agent service, pointed at inplaced by a file in
// k3s's config.yaml.d, ordered after inplaced by a unit drop-in.
type k3s struct {
	unitName string
	config   string // k3s's config.yaml (--config)
	dataDir  string // k3s's --data-dir
}

func (k *k3s) layout() Layout     { return K3s }
func (k *k3s) unit() string       { return k.unitName }
func (k *k3s) kubeconfig() string { return k.dataDir + "/agent/kubelet.kubeconfig" }
func (k *k3s) dropInDir() string  { return k.config + ".d" }
func (k *k3s) dropIn() string     { return k.dropInDir() + "/" + k3sDropInName }
func (k *k3s) unitDropIn() string { return UnitDir + "/" + k.unitName + ".d/" + unitDropInName }
func (k *k3s) owned() []string    { return []string{k.dropIn(), k.unitDropIn()} }
func (k *k3s) paths() []string    { return []string{k.config, k.dropIn(), k.unitDropIn()} }
func (k *k3s) dirs() []string     { return []string{k.dropInDir()} }

// sources are k3s's configuration files in the order k3s reads them, ours
// left out.
func (k *k3s) sources(f Facts) []string {
	out := []string{k.config}
	out = append(out, entries(f, k.dropInDir(), ".yaml", k3sDropInName)...)
	return append(out, entries(f, k.dropInDir(), ".yml", k3sDropInName)...)
}

func (k *k3s) check(f Facts) error {
	if !strings.HasPrefix(k.unitName, "k3s") {
		return errors.New("no k3s.service or k3s-agent.service runs here (layout kubeadm is for kubelet.service)")
	}
	return refuseFlags(k.unitName, f.KubeletArgs)
}

func (k *k3s) previous(f Facts, endpoint string) (string, string, error) {
	var rt, im, from string
	for _, p := range k.sources(f) {
		m, err := topLevel(f.file(p).Data)
		if err != nil {
			return "", "", fmt.Errorf("k3s's configuration %s: %w", p, err)
		}
		if v := stringKey(m, "container-runtime-endpoint"); v != "" {
			rt, from = v, p
		}
		if v := stringKey(m, "image-service-endpoint"); v != "" {
			im = v
		}
	}
	switch rt {
	case "":
		return "", "", fmt.Errorf("%s runs its embedded containerd, which its --container-runtime-endpoint turns off: "+
			"inplaced needs containerd as a service of its own, named by container-runtime-endpoint in %s (docs/k3s.md)",
			k.unitName, k.config)
	case endpoint:
		return "", "", fmt.Errorf("%s points k3s at inplaced already (a hand install): remove container-runtime-endpoint "+
			"and image-service-endpoint there, or name containerd's socket again, first", from)
	}
	return rt, cleanImage(im, rt, endpoint), nil
}

func (k *k3s) point(f Facts, _ *Record, endpoint string, prev endpoints, p Payload) change {
	c := change{}
	c.config = writeIfDiffers(&c.steps, f, k.dropIn(), k3sDropIn(endpoint, prev.runtime), "k3s's endpoints → "+endpoint)
	c.unitDropIn = writeIfDiffers(&c.steps, f, k.unitDropIn(), p[payloadK3sUnitDropIn].Data, k.unitName+" starts after inplaced")
	return c
}

func (k *k3s) restore(f Facts, _ *Record, _ string, prev endpoints) change {
	c := change{}
	c.config = removeWithDir(&c.steps, f, k.dropIn(), "k3s's endpoints back to "+prev.runtime)
	c.unitDropIn = removeWithDir(&c.steps, f, k.unitDropIn(), k.unitName+"'s order after inplaced")
	return c
}

// k3sDropIn is the config.yaml.d file that points k3s at inplaced.
func k3sDropIn(endpoint, prev string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by inplaced-installer, removed by its uninstall: k3s's kubelet talks\n"+
		"# CRI to inplaced, which forwards every call to %s.\n", prev)
	fmt.Fprintf(&b, "container-runtime-endpoint: %s\nimage-service-endpoint: %s\n", endpoint, endpoint)
	if sock := strings.TrimPrefix(prev, "unix://"); strings.Contains(sock, "containerd") {
		// cadvisor asks containerd directly, and k3s names containerd's
		// socket to it only when the endpoint's path says "containerd".
		fmt.Fprintf(&b, "kubelet-arg+:\n  - containerd=%s\n", sock)
	}
	return []byte(b.String())
}

// handInstalled is where a hand-installed inplaced forwards to, from its
// configuration: kubelet's endpoint before it.
func handInstalled(f Facts) (string, string) {
	m, err := topLevel(f.file(ConfigPath).Data)
	if err != nil {
		return DefaultRuntimeEndpoint, ""
	}
	rt := stringKey(m, "runtimeEndpoint")
	if rt == "" {
		rt = DefaultRuntimeEndpoint
	}
	return rt, stringKey(m, "imageEndpoint")
}

// cleanImage is the image endpoint worth recording: none when it is the
// runtime endpoint or inplaced's own.
func cleanImage(im, rt, endpoint string) string {
	if im == rt || im == endpoint {
		return ""
	}
	return im
}

// entries lists the files of dir whose names end in ext, sorted as kubelet
// and k3s read them, leaving out skip.
func entries(f Facts, dir, ext, skip string) []string {
	if dir == "" {
		return nil
	}
	var out []string
	for _, name := range f.Dirs[dir] {
		if strings.HasSuffix(name, ext) && name != skip {
			out = append(out, path.Join(dir, name))
		}
	}
	sort.Strings(out)
	return out
}

func writeIfDiffers(steps *[]Step, f Facts, p string, data []byte, why string) bool {
	cur := f.file(p)
	if cur.Exists && bytes.Equal(cur.Data, data) {
		return false
	}
	*steps = append(*steps, Step{Op: OpWrite, Path: p, Data: data, Mode: 0o644, Why: why})
	return true
}

func removeIfExists(steps *[]Step, f Facts, p, why string) bool {
	if !f.file(p).Exists {
		return false
	}
	*steps = append(*steps, Step{Op: OpRemove, Path: p, Why: why})
	return true
}

// removeWithDir removes a drop-in and then its directory if that is left
// empty (the install may have made it).
func removeWithDir(steps *[]Step, f Facts, p, why string) bool {
	if !removeIfExists(steps, f, p, why) {
		return false
	}
	*steps = append(*steps, Step{Op: OpRemoveEmptyDir, Path: path.Dir(p)})
	return true
}

func modeOr(h HostFile, m0 fs.FileMode) fs.FileMode {
	if h.Exists && h.Mode != 0 {
		return h.Mode
	}
	return m0
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}
