package install

import (
	"fmt"
	"io/fs"
	"strings"
)

// Op is what a step does.
type Op string

// The steps' operations. File operations act under the host root;
// unit operations go to the host's systemd.
const (
	// OpWrite writes Path from Data, or from the payload file Source, with
	// Mode, atomically (a rename over the old file).
	OpWrite Op = "write"
	// OpRemove removes the file Path; a missing file is no error.
	OpRemove Op = "remove"
	// OpRemoveAll removes the directory Path and all in it.
	OpRemoveAll Op = "remove-all"
	// OpRemoveEmptyDir removes the directory Path if nothing is left in it.
	OpRemoveEmptyDir Op = "remove-empty-dir"
	// OpReload is systemctl daemon-reload.
	OpReload Op = "daemon-reload"
	// OpEnable and OpDisable act on the unit files Units ([Install]).
	OpEnable  Op = "enable"
	OpDisable Op = "disable"
	// OpStart, OpStop and OpRestart act on the unit Units[0] and wait for
	// systemd's job to finish.
	OpStart   Op = "start"
	OpStop    Op = "stop"
	OpRestart Op = "restart"
	// OpResetFailed forgets Units' failed state, so that no unit of
	// inplaced's stays listed after its files are gone.
	OpResetFailed Op = "reset-failed"
	// OpWaitCRI waits until the CRI socket Path answers Version.
	OpWaitCRI Op = "wait-cri"
	// OpWaitReady waits until the Node is Ready with a heartbeat after
	// the plan's last restart of Units[0] (kubelet or k3s).
	OpWaitReady Op = "wait-node-ready"
	// OpWaitSwaps waits, at most the executor's SwapTimeout, until the
	// inplaced at control socket Path runs no swap (none is cut by the stop
	// that follows, with no later start to settle it).
	OpWaitSwaps Op = "wait-swaps"
	// OpRemoveHolds deletes every inplaced_hold_* netfilter table left in
	// any network namespace on the host (none after a clean stop).
	OpRemoveHolds Op = "remove-hold-tables"
	// OpCheckMounts reports any mount at or under Paths.
	OpCheckMounts Op = "check-mounts"
	// OpAnnotate sets the Node's AnnotationInstalled to Value (nil: removes it).
	OpAnnotate Op = "annotate"
	// OpEvent records an Event on the Node.
	OpEvent Op = "event"
)

// Step is one action of a plan.
type Step struct {
	Op     Op
	Path   string
	Data   []byte
	Source string
	Mode   fs.FileMode
	Units  []string
	Paths  []string
	Value  *string
	// EventType, Reason and Message make the Node event of OpEvent.
	EventType, Reason, Message string
	// Why says what in the facts called for the step.
	Why string
}

func (s Step) String() string {
	var b strings.Builder
	b.WriteString(string(s.Op))
	switch {
	case s.Path != "":
		b.WriteString(" " + s.Path)
	case len(s.Units) > 0:
		b.WriteString(" " + strings.Join(s.Units, " "))
	case s.Reason != "":
		b.WriteString(" " + s.Reason)
	}
	if s.Why != "" {
		b.WriteString(" (" + s.Why + ")")
	}
	return b.String()
}

// Phase is steps undone together.
type Phase struct {
	Name  string
	Steps []Step
	// Undo of a phase that failed or that a later one's failure rolls
	// back: UndoBefore, then every file the phase wrote or removed put
	// back as it was, then UndoAfter.
	UndoBefore, UndoAfter []Step
}

// Plan is what an install or uninstall does on one node.
type Plan struct {
	Action string
	Phases []Phase
	// Undoable is how many phases, from the first, are undone when one of
	// them fails: the checkpoint. Later phases (the Node's record) are
	// never undone; an uninstall undoes nothing.
	Undoable int
	// Summary says in one line what the plan changes.
	Summary string
}

// Empty says whether the plan does nothing but check.
func (p *Plan) Empty() bool {
	for _, ph := range p.Phases {
		for _, s := range ph.Steps {
			if !s.Op.check() {
				return false
			}
		}
	}
	return true
}

// Steps lists every step in order.
func (p *Plan) Steps() []Step {
	var out []Step
	for _, ph := range p.Phases {
		out = append(out, ph.Steps...)
	}
	return out
}

func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", p.Action, p.Summary)
	for i, ph := range p.Phases {
		if len(ph.Steps) == 0 {
			continue
		}
		undo := ""
		if i < p.Undoable {
			undo = " (undone on failure)"
		}
		fmt.Fprintf(&b, "  %s%s:\n", ph.Name, undo)
		for _, s := range ph.Steps {
			fmt.Fprintf(&b, "    %s\n", s)
		}
	}
	return b.String()
}

// check says whether op only looks.
func (op Op) check() bool {
	return op == OpWaitCRI || op == OpWaitReady || op == OpWaitSwaps || op == OpCheckMounts
}

func unitOp(op Op, unit, why string) Step { return Step{Op: op, Units: []string{unit}, Why: why} }
