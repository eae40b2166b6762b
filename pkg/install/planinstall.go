package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// PlanInstall decides what puts s on the node as f finds it, or says why
// the installer cannot do it here. Three phases: inplaced's files and units,
// up to inplaced answering CRI; kubelet's configuration, restart and Ready
// through inplaced (with the record written first); then, past the
// checkpoint, the Node's annotation and Event.
func PlanInstall(s Spec, f Facts) (*Plan, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rec, err := RecordOf(f)
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Layout != s.Layout {
		return nil, fmt.Errorf("installed with layout %s (%s), asked for %s: uninstall first", rec.Layout, RecordPath, s.Layout)
	}
	sd, err := newSide(s.Layout, f, rec)
	if err != nil {
		return nil, err
	}
	if err := sd.check(f); err != nil {
		return nil, err
	}
	b := &installer{s: s, f: f, rec: rec, side: sd, endpoint: inplacedEndpoint(s.Payload)}
	if rec != nil {
		b.prev = endpoints{rec.PreviousRuntimeEndpoint, rec.PreviousImageEndpoint}
	} else if b.prev.runtime, b.prev.image, err = sd.previous(f, b.endpoint); err != nil {
		return nil, err
	}
	return b.plan()
}

// installer builds one install plan.
type installer struct {
	s        Spec
	f        Facts
	rec      *Record
	side     side
	endpoint string // inplaced's CRI socket, as kubelet names it
	prev     endpoints
}

// fileChanges is what the inplaced phase's writes changed.
type fileChanges struct {
	steps   []Step
	written []string // every host path of inplaced's own files
	units   map[string]bool
	binary  bool // a binary a service runs
	config  bool // inplaced's config or flags
}

func (b *installer) plan() (*Plan, error) {
	fc, err := b.files()
	if err != nil {
		return nil, err
	}
	unitSteps, undoBefore, undoAfter := b.units(fc)
	inplaced := Phase{Name: "inplaced", Steps: append(fc.steps, unitSteps...), UndoBefore: undoBefore, UndoAfter: undoAfter}

	kc := b.side.point(b.f, b.rec, b.endpoint, b.prev, b.s.Payload)
	kubeletUnit := b.side.unit()
	restart := kc.config || b.stale(kubeletUnit)
	changed := len(fc.steps) > 0 || len(kc.steps) > 0 || restart || b.rec == nil || b.rec.Version != b.s.Version ||
		slices.ContainsFunc(unitSteps, func(s Step) bool { return !s.Op.check() })
	rec := b.record(kc, fc.written, changed)

	kubelet := Phase{Name: "kubelet"}
	if recData := rec.marshal(); !b.f.file(RecordPath).Exists || string(b.f.file(RecordPath).Data) != string(recData) {
		kubelet.Steps = append(kubelet.Steps, Step{Op: OpWrite, Path: RecordPath, Data: recData, Mode: 0o644,
			Why: "the record, before kubelet's configuration changes"})
	}
	kubelet.Steps = append(kubelet.Steps, kc.steps...)
	if kc.unitDropIn {
		kubelet.Steps = append(kubelet.Steps, Step{Op: OpReload, Why: kubeletUnit + "'s drop-in"})
		kubelet.UndoAfter = append(kubelet.UndoAfter, Step{Op: OpReload, Why: kubeletUnit + "'s drop-in as it was"})
	}
	if restart {
		kubelet.Steps = append(kubelet.Steps,
			unitOp(OpRestart, kubeletUnit, "reads its runtime endpoint when it starts"),
			unitOp(OpWaitReady, kubeletUnit, "kubelet's runtime status through inplaced"))
		kubelet.UndoAfter = append(kubelet.UndoAfter, unitOp(OpRestart, kubeletUnit, "back on "+b.prev.runtime))
	}

	reason, summary := b.summary(fc, restart, changed)
	return &Plan{Action: "install", Undoable: 2, Summary: summary,
		Phases: []Phase{inplaced, kubelet, b.records(rec, changed, reason, summary)}}, nil
}

// stale says whether the kubelet running is the one that ran when its
// configuration last changed, and so has not read the change.
func (b *installer) stale(unit string) bool {
	id := b.f.unit(unit).Identity()
	return b.rec != nil && b.rec.StaleKubelet != "" && b.rec.StaleKubelet == id
}

// files writes what differs of inplaced's own files: the payload's, the
// config and the flags drop-in.
func (b *installer) files() (fileChanges, error) {
	fc := fileChanges{units: map[string]bool{}}
	for _, pl := range placeAll(b.s.Payload) {
		fc.written = append(fc.written, pl.host)
		cur := b.f.file(pl.host)
		if cur.Exists && cur.Digest == pl.file.Digest && cur.Mode == pl.mode {
			continue
		}
		fc.steps = append(fc.steps, Step{Op: OpWrite, Path: pl.host, Data: pl.file.Data, Source: pl.file.Source, Mode: pl.mode,
			Why: whyWrite(cur, b.rec, b.s.Version)})
		if isUnit(pl.host) {
			fc.units[path.Base(pl.host)] = true
		} else {
			fc.binary = fc.binary || path.Base(pl.host) == "inplaced"
		}
	}
	fc.written = append(fc.written, ConfigPath)
	if writeIfDiffers(&fc.steps, b.f, ConfigPath, b.config(), "inplaced's configuration") {
		fc.config = true
	}
	if len(b.s.ExtraArgs) == 0 {
		fc.config = removeIfExists(&fc.steps, b.f, ArgsDropIn, "no extra flags") || fc.config
		return fc, nil
	}
	data, err := argsDropIn(b.s.Payload[payloadServiceUnitRel].Data, b.s.ExtraArgs)
	if err != nil {
		return fc, err
	}
	fc.written = append(fc.written, ArgsDropIn)
	if writeIfDiffers(&fc.steps, b.f, ArgsDropIn, data, "extra flags") {
		fc.config = true
		fc.units[ServiceUnit] = true
	}
	return fc, nil
}

func whyWrite(cur HostFile, rec *Record, version string) string {
	switch {
	case !cur.Exists:
		return "new"
	case rec != nil && rec.Version != version:
		return rec.Version + " → " + version
	}
	return "differs"
}

// units starts what is not running, restarts what runs old files, and
// waits for inplaced to answer; with the undo of each.
func (b *installer) units(fc fileChanges) (steps, undoBefore, undoAfter []Step) {
	services, sockets := unitNames(b.s.Payload)
	fresh := !b.f.unit(ServiceUnit).running()
	if len(fc.units) > 0 {
		steps = append(steps, Step{Op: OpReload, Why: "unit files changed"})
		undoAfter = append(undoAfter, Step{Op: OpReload, Why: "unit files as they were"})
	}
	var enable []string
	for _, u := range append(append([]string(nil), sockets...), services...) {
		if !b.f.unit(u).enabled() {
			enable = append(enable, u)
		}
	}
	if len(enable) > 0 {
		steps = append(steps, Step{Op: OpEnable, Units: enable, Why: "started at boot"})
		undoBefore = append(undoBefore, Step{Op: OpDisable, Units: enable})
	}
	var socketSteps []Step
	for _, u := range sockets {
		switch st := b.f.unit(u); {
		case !st.running():
			socketSteps = append(socketSteps, unitOp(OpStart, u, "holds the CRI socket"))
			undoBefore = append(undoBefore, unitOp(OpStop, u, ""))
		case fc.units[u]:
			socketSteps = append(socketSteps, unitOp(OpRestart, u, "unit changed"))
		}
	}
	svcChanged := fc.binary || fc.config || slices.ContainsFunc(services, func(u string) bool { return fc.units[u] })
	switch {
	case fresh:
		steps = append(append(steps, socketSteps...), unitOp(OpStart, ServiceUnit, "not running"))
		undoBefore = append([]Step{unitOp(OpStop, ServiceUnit, "")}, undoBefore...)
	case len(socketSteps) > 0:
		// A socket bound anew while the service holds the old one: the
		// service takes the new socket only when it starts again.
		steps = append(steps, unitOp(OpStop, ServiceUnit, "its socket changes"))
		steps = append(append(steps, socketSteps...), unitOp(OpStart, ServiceUnit, "on the new socket"))
		undoAfter = append(undoAfter, unitOp(OpRestart, ServiceUnit, "the old files"))
	case svcChanged:
		steps = append(steps, unitOp(OpRestart, ServiceUnit, "new "+changedWhat(fc)))
		undoAfter = append(undoAfter, unitOp(OpRestart, ServiceUnit, "the old files"))
	}
	steps = append(steps, Step{Op: OpWaitCRI, Path: strings.TrimPrefix(b.endpoint, "unix://"), Why: "inplaced answers CRI"})
	return steps, undoBefore, undoAfter
}

func changedWhat(fc fileChanges) string {
	var w []string
	if fc.binary {
		w = append(w, "binary")
	}
	if fc.config {
		w = append(w, "configuration")
	}
	if len(fc.units) > 0 {
		w = append(w, "unit")
	}
	return strings.Join(w, ", ")
}

// record is the host record after this plan.
func (b *installer) record(kc change, written []string, changed bool) *Record {
	r := &Record{Version: b.s.Version, Time: b.s.Now, Layout: b.s.Layout,
		PreviousRuntimeEndpoint: b.prev.runtime, PreviousImageEndpoint: b.prev.image,
		KubeletUnit: b.side.unit(), KubeletConfig: kc.kubeletConfig, Lines: kc.lines}
	files := append(append([]string(nil), written...), b.side.owned()...)
	if b.rec != nil {
		files = append(files, b.rec.Files...)
		r.StaleKubelet = b.rec.StaleKubelet
		if !changed {
			r.Time = b.rec.Time
		}
	}
	sort.Strings(files)
	r.Files = slices.Compact(files)
	if kc.config {
		r.StaleKubelet = b.f.unit(b.side.unit()).Identity()
	}
	return r
}

func (b *installer) records(rec *Record, changed bool, reason, summary string) Phase {
	ph := Phase{Name: "node record"}
	if want := rec.installed(); !want.equal(b.f.Annotation) {
		v := want.Value()
		ph.Steps = append(ph.Steps, Step{Op: OpAnnotate, Value: &v, Why: "the Node says what is installed"})
	}
	if changed {
		ph.Steps = append(ph.Steps, Step{Op: OpEvent, EventType: "Normal", Reason: reason, Message: summary})
	}
	return ph
}

func (b *installer) summary(fc fileChanges, restart, changed bool) (reason, summary string) {
	unit := b.side.unit()
	switch {
	case !changed:
		return "", fmt.Sprintf("inplaced %s in place, %s on %s: nothing to do", b.s.Version, unit, b.endpoint)
	case b.rec == nil:
		return ReasonInstalled, fmt.Sprintf("inplaced %s installed; %s talks CRI to %s (was %s), restarted once",
			b.s.Version, unit, b.endpoint, b.prev.runtime)
	}
	what := "inplaced " + b.rec.Version + " → " + b.s.Version
	reason = ReasonUpgraded
	if b.rec.Version == b.s.Version {
		what, reason = "inplaced "+b.s.Version+" updated", ReasonUpdated
	}
	restarted := []string{}
	if fc.binary || fc.config || len(fc.units) > 0 {
		restarted = append(restarted, ServiceUnit)
	}
	if restart {
		restarted = append(restarted, unit)
	} else {
		what += "; " + unit + " not restarted"
	}
	if len(restarted) > 0 {
		what += "; restarted " + strings.Join(restarted, ", ")
	}
	return reason, what
}

// config is inplaced's configuration: the payload's template with the
// node's values.
func (b *installer) config() []byte {
	out := []byte("# Written by inplaced-installer from deploy/inplaced/config.yaml; its uninstall removes it.\n")
	out = append(out, b.s.Payload[payloadConfig].Data...)
	out = setTemplateKey(out, "runtimeEndpoint", b.prev.runtime)
	if b.prev.image != "" {
		out = setTemplateKey(out, "imageEndpoint", b.prev.image)
	}
	if b.s.KubernetesMode {
		out = setTemplateKey(out, "kubeconfig", b.side.kubeconfig())
		out = setTemplateKey(out, "nodeName", b.s.NodeName)
	}
	if b.s.ConnectionHold != "" {
		out = setTemplateKey(out, "connectionHold", b.s.ConnectionHold)
	}
	if b.s.HoldMax != "" {
		out = setTemplateKey(out, "holdMax", b.s.HoldMax)
	}
	return out
}

// argsDropIn is inplaced.service's drop-in with extra flags: the unit's
// own ExecStart with the flags added.
func argsDropIn(unit []byte, args []string) ([]byte, error) {
	m := regexp.MustCompile(`(?m)^ExecStart=(.+)$`).FindAllSubmatch(unit, -1)
	if len(m) == 0 {
		return nil, fmt.Errorf("%s has no ExecStart= to add the extra flags to", payloadServiceUnitRel)
	}
	line := string(m[len(m)-1][1])
	for _, a := range args {
		line += " " + quoteExecArg(a)
	}
	return []byte("# Written by inplaced-installer: inplaced's extra flags (the chart's extraArgs).\n" +
		"[Service]\nExecStart=\nExecStart=" + line + "\n"), nil
}

func (s Spec) check() error {
	var errs []error
	for _, p := range []string{"bin/inplaced", payloadServiceUnitRel, payloadConfig} {
		if _, ok := s.Payload[p]; !ok {
			errs = append(errs, fmt.Errorf("the payload has no %s", p))
		}
	}
	if s.Version == "" {
		errs = append(errs, errors.New("no version"))
	}
	if s.KubernetesMode && s.NodeName == "" {
		errs = append(errs, errors.New("Kubernetes mode needs the node's name"))
	}
	return errors.Join(errs...)
}

// RecordOf parses the host record found, nil when there is none.
func RecordOf(f Facts) (*Record, error) {
	h := f.file(RecordPath)
	if !h.Exists {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal(h.Data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (move it away to install anew)", RecordPath, err)
	}
	return &r, nil
}

func (r *Record) marshal() []byte {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		panic(err) // strings, a time and a map of strings always marshal
	}
	return append(b, '\n')
}

// inplacedEndpoint is the CRI endpoint inplaced serves, from the config
// template's listen.
func inplacedEndpoint(p Payload) string {
	m, err := topLevel(p[payloadConfig].Data)
	if l := stringKey(m, "listen"); err == nil && l != "" {
		return "unix://" + l
	}
	return "unix://" + RuntimeDir + "/inplaced.sock"
}

// controlSocketOf is inplaced's control socket, from the config
// template's controlSocket.
func controlSocketOf(p Payload) string {
	m, err := topLevel(p[payloadConfig].Data)
	if c := stringKey(m, "controlSocket"); err == nil && c != "" {
		return c
	}
	return RuntimeDir + "/control.sock"
}

// placed is one payload file at its host path.
type placed struct {
	payload, host string
	mode          fs.FileMode
	file          PayloadFile
}

// placeAll expands HostFiles over the payload, in the rules' order.
func placeAll(p Payload) []placed {
	var out []placed
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, r := range HostFiles {
		for _, n := range names {
			if ok, _ := filepath.Match(r.Payload, n); !ok {
				continue
			}
			host := r.Host
			if strings.HasSuffix(host, "/") {
				host += path.Base(n)
			}
			out = append(out, placed{payload: n, host: host, mode: r.Mode, file: p[n]})
		}
	}
	return out
}

// unitNames lists the payload's services and sockets.
func unitNames(p Payload) (services, sockets []string) {
	for _, pl := range placeAll(p) {
		switch n := path.Base(pl.host); {
		case strings.HasSuffix(n, ".service") && isUnit(pl.host):
			services = append(services, n)
		case strings.HasSuffix(n, ".socket") && isUnit(pl.host):
			sockets = append(sockets, n)
		}
	}
	return services, sockets
}

func isUnit(p string) bool { return path.Dir(p) == UnitDir }
