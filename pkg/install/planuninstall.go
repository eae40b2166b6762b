package install

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
)

// knownFiles are inplaced's host files whatever the payload and the record
// say: an uninstall takes them even from a node installed by hand.
var knownFiles = []string{
	"/usr/local/bin/inplaced", "/usr/local/bin/inplacectl",
	UnitDir + "/inplaced.socket", UnitDir + "/" + ServiceUnit,
	ArgsDropIn, ConfigPath,
}

// PlanUninstall decides what takes inplaced off the node as f finds it:
// kubelet back on the endpoint recorded at install, restarted once and
// Ready; then inplaced's units stopped and disabled, its files, state and
// runtime directories removed, any hold table left in a network namespace
// deleted and the mounts checked; then the Node's annotation and the
// record. A node with nothing of inplaced on it gets an empty plan. Nothing
// is undone on failure: the next run plans from what is left.
func PlanUninstall(s Spec, f Facts) (*Plan, error) {
	rec, err := RecordOf(f)
	if err != nil {
		return nil, err
	}
	layout := s.Layout
	switch {
	case rec != nil:
		layout = rec.Layout
	case f.Annotation != nil && f.Annotation.Layout != "":
		layout = f.Annotation.Layout
	}
	sd, err := newSide(layout, f, rec)
	if err != nil {
		return nil, err
	}
	u := &uninstaller{s: s, f: f, rec: rec, side: sd, endpoint: inplacedEndpoint(s.Payload), prev: previousOf(f, rec)}
	kubelet, restarted, err := u.kubeletPhase()
	if err != nil {
		return nil, err
	}
	inplaced := u.inplacedPhase()
	p := &Plan{Action: "uninstall"}
	if len(kubelet.Steps) == 0 && len(inplaced.Steps) == 0 && rec == nil && f.Annotation == nil {
		p.Summary = "nothing of inplaced on this node"
		return p, nil
	}
	p.Summary = u.summary(restarted)
	p.Phases = []Phase{kubelet, u.withChecks(inplaced), u.records(p.Summary)}
	return p, nil
}

type uninstaller struct {
	s        Spec
	f        Facts
	rec      *Record
	side     side
	endpoint string
	prev     endpoints
}

// previousOf is where kubelet goes back to: the host's record, else the
// Node's annotation, else where inplaced's configuration forwards to.
func previousOf(f Facts, rec *Record) endpoints {
	switch {
	case rec != nil:
		return endpoints{rec.PreviousRuntimeEndpoint, rec.PreviousImageEndpoint}
	case f.Annotation != nil && f.Annotation.PreviousRuntimeEndpoint != "":
		return endpoints{f.Annotation.PreviousRuntimeEndpoint, f.Annotation.PreviousImageEndpoint}
	}
	rt, im := handInstalled(f)
	return endpoints{rt, im}
}

func (u *uninstaller) kubeletPhase() (Phase, bool, error) {
	kc := u.side.restore(u.f, u.rec, u.endpoint, u.prev)
	unit := u.side.unit()
	id := u.f.unit(unit).Identity()
	stale := u.rec != nil && u.rec.StaleKubelet != "" && u.rec.StaleKubelet == id
	restart := kc.config || stale
	ph := Phase{Name: "kubelet"}
	if restart && unit == "" {
		return ph, false, errors.New("kubelet's configuration names inplaced but no unit runs kubelet here to restart")
	}
	if kc.config {
		rec := Record{Layout: u.side.layout(), PreviousRuntimeEndpoint: u.prev.runtime, PreviousImageEndpoint: u.prev.image,
			KubeletUnit: unit}
		if u.rec != nil {
			rec = *u.rec
		}
		rec.StaleKubelet = id
		ph.Steps = append(ph.Steps, Step{Op: OpWrite, Path: RecordPath, Data: rec.marshal(), Mode: 0o644,
			Why: "the record, before kubelet's configuration changes"})
	}
	ph.Steps = append(ph.Steps, kc.steps...)
	if kc.unitDropIn {
		ph.Steps = append(ph.Steps, Step{Op: OpReload, Why: unit + "'s drop-in removed"})
	}
	if restart {
		ph.Steps = append(ph.Steps,
			unitOp(OpRestart, unit, "reads its runtime endpoint when it starts"),
			unitOp(OpWaitReady, unit, "kubelet's runtime status through "+u.prev.runtime))
	}
	return ph, restart, nil
}

// owned is every host file of inplaced's to remove (the layout's drop-ins
// are the kubelet phase's).
func (u *uninstaller) owned() []string {
	files := append([]string(nil), knownFiles...)
	for _, pl := range placeAll(u.s.Payload) {
		files = append(files, pl.host)
	}
	if u.rec != nil {
		files = append(files, u.rec.Files...)
	}
	sort.Strings(files)
	files = slices.Compact(files)
	return slices.DeleteFunc(files, func(p string) bool {
		return p == RecordPath || slices.Contains(u.side.owned(), p)
	})
}

func (u *uninstaller) inplacedPhase() Phase {
	files := u.owned()
	var units []string
	for _, p := range files {
		if st := u.f.unit(path.Base(p)); isUnit(p) && (u.f.file(p).Exists || st.running() || st.Active == "failed") {
			units = append(units, path.Base(p))
		}
	}
	// Sockets first: a service stopped while its socket listens is started
	// again by the next connection.
	sort.SliceStable(units, func(i, j int) bool {
		return strings.HasSuffix(units[i], ".socket") && !strings.HasSuffix(units[j], ".socket")
	})
	ph := Phase{Name: "inplaced"}
	if u.f.unit(ServiceUnit).running() {
		ph.Steps = append(ph.Steps, Step{Op: OpWaitSwaps, Path: controlSocketOf(u.s.Payload), Why: "no swap cut by the stop"})
	}
	var enabled []string
	for _, n := range units {
		st := u.f.unit(n)
		if st.running() {
			ph.Steps = append(ph.Steps, unitOp(OpStop, n, "kubelet is off it"))
		}
		if st.enabled() {
			enabled = append(enabled, n)
		}
	}
	if len(enabled) > 0 {
		ph.Steps = append(ph.Steps, Step{Op: OpDisable, Units: enabled})
	}
	removedUnit := false
	for _, p := range files {
		if removeIfExists(&ph.Steps, u.f, p, "") {
			removedUnit = removedUnit || isUnit(p) || p == ArgsDropIn
		}
	}
	if removedUnit {
		ph.Steps = append(ph.Steps, Step{Op: OpRemoveEmptyDir, Path: path.Dir(ArgsDropIn)}, Step{Op: OpReload})
	}
	if len(units) > 0 {
		ph.Steps = append(ph.Steps, Step{Op: OpResetFailed, Units: units, Why: "no failed unit of inplaced's stays listed"})
	}
	for _, d := range []string{StateDir, RuntimeDir} {
		if _, ok := u.f.Dirs[d]; ok {
			ph.Steps = append(ph.Steps, Step{Op: OpRemoveAll, Path: d})
		}
	}
	return ph
}

// withChecks adds what proves nothing is left in the kernel: hold tables
// (none after a clean stop: their owner flag; a kernel without it keeps the
// tables of a killed inplaced) and mounts.
func (u *uninstaller) withChecks(ph Phase) Phase {
	ph.Steps = append(ph.Steps,
		Step{Op: OpRemoveHolds, Why: "no inplaced_hold_* table in any network namespace"},
		Step{Op: OpCheckMounts, Paths: []string{RuntimeDir, StateDir}, Why: "no mount of inplaced's"})
	return ph
}

func (u *uninstaller) records(summary string) Phase {
	ph := Phase{Name: "node record"}
	if u.f.Annotation != nil {
		ph.Steps = append(ph.Steps, Step{Op: OpAnnotate, Why: "nothing installed"})
	}
	ph.Steps = append(ph.Steps, Step{Op: OpEvent, EventType: "Normal", Reason: ReasonUninstalled, Message: summary})
	// The kubelet phase may have written it even where there was none.
	ph.Steps = append(ph.Steps, Step{Op: OpRemove, Path: RecordPath, Why: "the record, last"})
	ph.Steps = append(ph.Steps, Step{Op: OpRemoveEmptyDir, Path: ConfigDir})
	return ph
}

func (u *uninstaller) summary(restarted bool) string {
	v := "inplaced"
	if u.rec != nil {
		v += " " + u.rec.Version
	}
	if !restarted {
		return fmt.Sprintf("%s removed; %s was not on inplaced", v, orNone(u.side.unit()))
	}
	return fmt.Sprintf("%s removed; %s back on %s, restarted once", v, u.side.unit(), u.prev.runtime)
}

func orNone(s string) string {
	if s == "" {
		return "no kubelet unit"
	}
	return s
}
