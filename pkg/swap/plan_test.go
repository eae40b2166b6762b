package swap

import (
	"os"
	"strings"
	"testing"

	"github.com/inplaced/inplaced/pkg/store"
)

// planned is a step as the table below spells it: name (or "(" action ")"
// for a step not shown), journal step, undo, and the flags.
type planned struct {
	name     string
	journal  store.JournalStep
	do       action
	undo     undo
	optional bool
	aborted  string
}

func summarize(plan []step) []planned {
	var out []planned
	for _, s := range plan {
		out = append(out, planned{s.name, s.journal, s.do, s.undo, s.optional, s.aborted})
	}
	return out
}

// The plans of every kind of swap, decided without a runtime: the order of
// the steps, what is journaled before each, and what undoes each.
func TestPlanFor(t *testing.T) {
	const (
		beforeStop = "aborted before the old container was stopped"
		afterStop  = "aborted after the old container was stopped"
		starting   = "aborted while the new container was starting"
	)
	pull := planned{name: StepPull, journal: store.StepPrepared, do: actPull}
	create := planned{name: StepCreateNew, journal: store.StepCreateNew, do: actCreateNew, undo: undoRemoveNew}
	preStop := planned{name: StepPreStop, journal: store.StepPreStop, do: actPreStop, undo: undoRemoveNew, optional: true}
	noHold := planned{do: actRecordNoHold, undo: undoRemoveNew, aborted: beforeStop}
	hold := planned{name: StepConnectionHold, do: actHoldConnections, undo: undoRemoveNew, optional: true, aborted: beforeStop}
	stop := planned{name: StepStopOld, journal: store.StepStopOld, do: actStopOld, undo: undoRollback}
	start := planned{name: StepStartNew, journal: store.StepStartNew, do: actStartNew, undo: undoRollback, aborted: afterStop}
	gate := planned{name: StepHealthGate, journal: store.StepHealthGate, do: actHealthGate, undo: undoRollback}
	commit := planned{name: StepCommit, do: actCommit, undo: undoRollback, optional: true}
	with := func(p planned, f func(*planned)) planned { f(&p); return p }
	guarded := func(p planned) planned { return with(p, func(p *planned) { p.aborted = starting }) }

	for _, tc := range []struct {
		kind string
		spec planSpec
		want []planned
	}{
		{"node-local", planSpec{kind: KindSwap, preStop: true},
			[]planned{pull, {do: actConfig}, create, preStop, noHold, stop, start, guarded(gate), commit}},
		{"node-local, no preStop, a postStart hook", planSpec{kind: KindSwap, postStart: true},
			[]planned{pull, {do: actConfig}, create, noHold, stop, start,
				{name: StepPostStart, do: actPostStart, undo: undoRollback, aborted: starting}, gate, commit}},
		{"request on the pod: drain and the spec's hash", planSpec{kind: KindSwap, drain: true, specHash: true, preStop: true},
			[]planned{pull, {do: actConfigSpec}, create, {name: StepDrain, do: actDrain, undo: undoRemoveNew, optional: true},
				preStop, noHold, stop, start, guarded(gate), commit}},
		{"node-local with a connection hold", planSpec{kind: KindSwap, preStop: true, hold: true},
			[]planned{pull, {do: actConfig}, create, preStop, hold, stop, start, guarded(gate), commit}},
		{"env from pod metadata", planSpec{kind: KindSwap, preStop: true},
			[]planned{pull, {do: actConfig}, create, preStop, noHold, stop, start, guarded(gate), commit}},
		{"revert", planSpec{kind: KindRevert, preStop: true},
			[]planned{pull, {do: actConfig}, create, preStop, noHold, stop, start, guarded(gate), with(commit, func(p *planned) { p.do = actCommitRevert })}},
		{"kubelet-driven: pull before kubelet's stop, no preStop, no health gate, step aside on failure", planSpec{kind: KindKubelet, preStop: true, hold: true},
			[]planned{
				{name: StepPull, do: actPullKubelet},
				{do: actProceed},
				{journal: store.StepPrepared, do: actKubeletConfig},
				create,
				hold,
				with(stop, func(p *planned) { p.do, p.undo = actStopOldKube, undoStepAside }),
				with(start, func(p *planned) { p.undo = undoStepAside }),
				{name: StepCommit, do: actCommitKubelet, undo: undoStepAside, optional: true, aborted: starting},
			}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			got := summarize(planFor(tc.spec))
			if len(got) != len(tc.want) {
				t.Fatalf("plan:\n%s\nwant:\n%s", show(got), show(tc.want))
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("step %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
	t.Run("rollback", func(t *testing.T) {
		got := summarize(rollbackPlan())
		want := []planned{{name: StepRollback, journal: store.StepRollingBack, do: actRollback}}
		if len(got) != 1 || got[0] != want[0] {
			t.Errorf("rollback plan %+v, want %+v", got, want)
		}
	})
}

// Every plan can be carried out: each action has its code, a step that can
// fail the swap names itself in the error, and no step before the old
// container is stopped rolls back.
func TestPlansAreExecutable(t *testing.T) {
	var plans [][]step
	for _, k := range planKinds {
		plans = append(plans, planFor(k.spec))
	}
	plans = append(plans, rollbackPlan())
	for _, p := range plans {
		stopped := false
		for _, s := range p {
			if actions[s.do] == nil {
				t.Errorf("step %q: action %q has no code", s.name, s.do)
			}
			if s.name != "" && !s.optional && s.failure == "" && s.do != actRollback {
				t.Errorf("step %q can fail the swap but has no failure text", s.name)
			}
			stopped = stopped || s.name == StepStopOld
			if !stopped && (s.undo == undoRollback || s.undo == undoStepAside) {
				t.Errorf("step %q comes before stop-old but its undo is %q", s.name, s.undo)
			}
			if stopped && (s.undo == undoNothing || s.undo == undoRemoveNew) && s.do != actRollback {
				t.Errorf("step %q comes after stop-old but its undo is %q", s.name, s.undo)
			}
		}
	}
}

// The package doc's step list is the planner's: rendered from planFor and
// compared with doc.go, so the doc cannot drift from the code.
func TestDocStepOrder(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// The list is the doc comment's first code block.
	var doc []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "//\t") {
			doc = append(doc, strings.TrimPrefix(line, "//"))
		} else if len(doc) > 0 {
			break
		}
	}
	want := strings.TrimSuffix(renderPlans(), "\n")
	if got := strings.Join(doc, "\n"); got != want {
		t.Errorf("pkg/swap/doc.go's step list (its first code block) is not the planner's; want:\n%s\ngot:\n%s", want, got)
	}
}

func show(p []planned) string {
	var b strings.Builder
	for _, s := range p {
		b.WriteString("  ")
		b.WriteString(strings.TrimSpace(strings.Join([]string{s.name, string(s.journal), string(s.do), string(s.undo)}, " | ")))
		b.WriteString("\n")
	}
	return b.String()
}
