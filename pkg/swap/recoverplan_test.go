package swap

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// The runtime a crash leaves, as the table below spells it: the old
// container (attempt 0), the swap's new one (attempt 1, the journaled
// NewAttempt), the container of a rollback that got that far (attempt 2),
// and another container of the pod, the newest and running, which recovery
// must neither touch nor take for the swap's.
func crashCtr(id, name string, attempt uint32, created int64, state runtimeapi.ContainerState) *runtimeapi.Container {
	return &runtimeapi.Container{Id: id, PodSandboxId: "sb", Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		State: state, CreatedAt: created}
}

var (
	oldRuns    = crashCtr("old", "app", 0, 1, runtimeapi.ContainerState_CONTAINER_RUNNING)
	oldExited  = crashCtr("old", "app", 0, 1, runtimeapi.ContainerState_CONTAINER_EXITED)
	newCreated = crashCtr("new", "app", 1, 2, runtimeapi.ContainerState_CONTAINER_CREATED)
	newRuns    = crashCtr("new", "app", 1, 2, runtimeapi.ContainerState_CONTAINER_RUNNING)
	newExited  = crashCtr("new", "app", 1, 2, runtimeapi.ContainerState_CONTAINER_EXITED)
	rbCreated  = crashCtr("rollback", "app", 2, 3, runtimeapi.ContainerState_CONTAINER_CREATED)
	rbRuns     = crashCtr("rollback", "app", 2, 3, runtimeapi.ContainerState_CONTAINER_RUNNING)
	sidecar    = crashCtr("sidecar", "sidecar", 5, 4, runtimeapi.ContainerState_CONTAINER_RUNNING)
)

// kindsCommit stands, in the table, for the commit of the swap's kind.
const kindsCommit action = "(the kind's commit)"

// rolledBackID stands, in the table, for the container the rollback step
// creates.
const rolledBackID = "(recreated)"

// settled is a recovery plan as the table spells it.
type settled struct {
	steps   string // the actions, " + "-joined
	state   inplacedv1.SwapState
	running string
	msg     string
	after   uint32 // the attempt the rollback step creates after (its restart count too); 0 without one
}

func (s settled) String() string {
	return fmt.Sprintf("[%s] → %s running %q after %d (%q)", s.steps, s.state, s.running, s.after, s.msg)
}

func actionList(as ...action) string {
	var names []string
	for _, a := range as {
		names = append(names, string(a))
	}
	return strings.Join(names, " + ")
}

// The outcomes the table is made of.
var (
	oldRunsOn = settled{state: inplacedv1.SwapState_SWAP_STATE_FAILED, running: "old", msg: msgStillRuns}
	removeNew = settled{steps: actionList(actRemoveNew), state: inplacedv1.SwapState_SWAP_STATE_FAILED, running: "old", msg: msgStillRuns}
	rollsBack = func(after uint32) settled {
		return settled{actionList(actRollback), inplacedv1.SwapState_SWAP_STATE_FAILED, rolledBackID, msgRolledBack, after}
	}
	rollsFwd   = settled{steps: actionList(actAdoptNew, actRecordNew, kindsCommit), state: inplacedv1.SwapState_SWAP_STATE_COMMITTED, running: "new"}
	rbRunsOn   = settled{state: inplacedv1.SwapState_SWAP_STATE_FAILED, running: "rollback", msg: msgStillRuns}
	crashTable = []struct {
		step store.JournalStep
		what string
		// idJournaled: the new container's ID is in the entry (written
		// with the step after create-new, or when the hold re-journals
		// create-new).
		idJournaled bool
		runtime     []*runtimeapi.Container
		want        settled
	}{
		{store.StepPrepared, "pulling: nothing touched", false, []*runtimeapi.Container{oldRuns}, oldRunsOn},

		{store.StepCreateNew, "not created yet", false, []*runtimeapi.Container{oldRuns}, oldRunsOn},
		{store.StepCreateNew, "created, its ID not journaled: found by its attempt", false, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		{store.StepCreateNew, "created, its ID journaled with the hold", true, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		// A previous build created the new container after stopping the
		// old one; its journal is recovered by this build.
		{store.StepCreateNew, "previous build, old stopped: not created", false, []*runtimeapi.Container{oldExited}, rollsBack(1)},
		{store.StepCreateNew, "previous build, old stopped: created", false, []*runtimeapi.Container{oldExited, newCreated}, rollsBack(1)},
		{store.StepCreateNew, "previous build, old stopped: started, its ID not journaled", false, []*runtimeapi.Container{oldExited, newRuns}, rollsFwd},

		{store.StepPreStop, "the hook runs or ran, the old container runs", true, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		{store.StepPreStop, "the hook ended the old container", true, []*runtimeapi.Container{oldExited, newCreated}, rollsBack(1)},

		{store.StepStopOld, "not stopped yet", true, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		{store.StepStopOld, "stopped", true, []*runtimeapi.Container{oldExited, newCreated}, rollsBack(1)},

		{store.StepStartNew, "not started", true, []*runtimeapi.Container{oldExited, newCreated}, rollsBack(1)},
		{store.StepStartNew, "started (its postStart hook may have run)", true, []*runtimeapi.Container{oldExited, newRuns}, rollsFwd},
		{store.StepStartNew, "started and exited", true, []*runtimeapi.Container{oldExited, newExited}, rollsBack(1)},

		{store.StepHealthGate, "runs: proving itself, or committing", true, []*runtimeapi.Container{oldExited, newRuns}, rollsFwd},
		{store.StepHealthGate, "exited", true, []*runtimeapi.Container{oldExited, newExited}, rollsBack(1)},

		// An overlap swap: the new container started while the old one
		// runs; nothing is journaled until the stop.
		{store.StepOverlap, "created, not started", true, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		{store.StepOverlap, "both run", true, []*runtimeapi.Container{oldRuns, newRuns}, removeNew},
		{store.StepOverlap, "the new one exited", true, []*runtimeapi.Container{oldRuns, newExited}, removeNew},
		{store.StepOverlap, "the old one exited, the new one serves", true, []*runtimeapi.Container{oldExited, newRuns}, rollsFwd},
		{store.StepStopOld, "overlap: both run, the stop not done", true, []*runtimeapi.Container{oldRuns, newRuns}, removeNew},
		{store.StepStopOld, "overlap: stopped, the new one serves", true, []*runtimeapi.Container{oldExited, newRuns}, rollsFwd},

		{store.StepRollingBack, "the new container still runs: the swap had given up on it", true, []*runtimeapi.Container{oldExited, newRuns}, rollsBack(1)},
		{store.StepRollingBack, "the new container removed", true, []*runtimeapi.Container{oldExited}, rollsBack(1)},
		{store.StepRollingBack, "the rollback container created, not started", true, []*runtimeapi.Container{oldExited, rbCreated}, rollsBack(2)},
		{store.StepRollingBack, "the rollback container runs", true, []*runtimeapi.Container{oldExited, rbRuns}, rbRunsOn},
		{store.StepRollingBack, "after a failed stop: the old container runs", true, []*runtimeapi.Container{oldRuns, newCreated}, removeNew},
		{store.StepRollingBack, "after a create that failed: no new container", false, []*runtimeapi.Container{oldExited}, rollsBack(1)},
	}
)

// crashConfig is a config of the app container at attempt a, with the
// restart count kubelet (and a swap) gives it.
func crashConfig(a uint32) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "app", Attempt: a},
		Annotations: map[string]string{AnnotationRestarts: fmt.Sprint(a)}}
}

// crashEntry is the journal entry a swap of kind has on disk during step,
// as run.journal writes it: the new config (attempt 1) from create-new on.
func crashEntry(kind string, step store.JournalStep, idJournaled, hold bool) *journaled {
	j := &store.JournalEntry{SwapID: "s", Kind: kind, Step: step, SandboxID: "sb", ContainerName: "app", OldContainerID: "old"}
	d := &journaled{JournalEntry: j, rec: &inplacedv1.SwapRecord{Id: "s", Kind: kind},
		oldReq: &runtimeapi.CreateContainerRequest{PodSandboxId: "sb", Config: crashConfig(0)}}
	if step != store.StepPrepared {
		j.NewAttempt = 1
		d.newReq = &runtimeapi.CreateContainerRequest{PodSandboxId: "sb", Config: crashConfig(1)}
	}
	if idJournaled {
		j.NewContainerID = "new"
	}
	if hold {
		j.Hold = &store.JournalHold{NetNS: "/var/run/netns/cni-1", Ports: []uint16{8080}, Mode: "park"}
	}
	return d
}

// journaledSteps are the journal steps a crash of a swap planned from spec
// can leave on disk: its plan's, and its rollback plan's when a step can
// roll back.
func journaledSteps(spec planSpec) []store.JournalStep {
	var out []store.JournalStep
	rollback := false
	for _, s := range planFor(spec) {
		if s.journal != "" {
			out = append(out, s.journal)
		}
		rollback = rollback || s.undo == undoRollback
	}
	if rollback {
		for _, s := range rollbackPlan() {
			out = append(out, s.journal)
		}
	}
	return out
}

// summarizePlan spells p as the table does.
func summarizePlan(p recoveryPlan, commit action) settled {
	var as []action
	for _, s := range p.steps {
		a := s.do
		if a == commit {
			a = kindsCommit
		}
		as = append(as, a)
	}
	got := settled{steps: actionList(as...), state: p.end.state, running: p.end.running, msg: p.end.msg}
	if p.end.rolledBack {
		got.running = rolledBackID
	}
	if p.after != nil {
		got.after = p.after.GetMetadata().GetAttempt()
		if rc := restartCount(p.after); rc != got.after {
			got.msg += fmt.Sprintf(" (restart count %d, attempt %d)", rc, got.after)
		}
	}
	return got
}

// TestPlanRecovery decides, without a runtime, how recovery settles a
// crash during every journal step of every kind of swap, in each state the
// runtime can be in by then (the step taken or not yet), with and without
// a connection hold in the journal, and with the pod gone.
func TestPlanRecovery(t *testing.T) {
	covered := map[store.JournalStep]bool{}
	for _, k := range planKinds {
		commit := actCommit
		if k.spec.kind == KindRevert {
			commit = actCommitRevert
		}
		for _, step := range journaledSteps(k.spec) {
			n := 0
			for _, tc := range crashTable {
				if tc.step != step {
					continue
				}
				n++
				covered[step] = true
				t.Run(k.name+"/"+string(step)+"/"+tc.what, func(t *testing.T) {
					for _, hold := range []bool{false, true} {
						j := crashEntry(k.spec.kind, step, tc.idJournaled, hold)
						want := tc.want
						if hold {
							want.steps = strings.Trim(actionList(actClearHold)+" + "+want.steps, " +")
						}
						p := planRecovery(j, runtimeView{containers: append(tc.runtime, sidecar)})
						if got := summarizePlan(p, commit); got != want {
							t.Errorf("hold %v:\n got  %s\n want %s", hold, got, want)
						}
						checkRecoveryPlan(t, j, tc.runtime, p)
						checkPodGone(t, j, tc.runtime)
					}
				})
			}
			if n == 0 {
				t.Errorf("%s: no case for a crash during journal step %s", k.name, step)
			}
		}
	}
	for _, tc := range crashTable {
		if !covered[tc.step] {
			t.Errorf("case %q: no kind of swap journals %s", tc.what, tc.step)
		}
	}
}

// checkPodGone: a pod that went away while inplaced was down ends the swap
// ABORTED whatever the step, with only the new container (if found)
// removed: kubelet is tearing the rest down.
func checkPodGone(t *testing.T, j *journaled, runtime []*runtimeapi.Container) {
	t.Helper()
	p := planRecovery(j, runtimeView{sandboxGone: true, containers: append(runtime, sidecar)})
	want := settled{state: inplacedv1.SwapState_SWAP_STATE_ABORTED, msg: msgPodGone}
	var as []action
	if j.Hold != nil {
		as = append(as, actClearHold)
	}
	for _, c := range runtime {
		if c.Id == "new" {
			as = append(as, actRemoveNew)
		}
	}
	want.steps = actionList(as...)
	if got := summarizePlan(p, ""); got != want {
		t.Errorf("pod gone:\n got  %s\n want %s", got, want)
	}
}

// checkRecoveryPlan checks every plan against what recovery promises, whatever
// the table says: each step can be carried out by the swap executor and
// none is shown or journaled; only bookkeeping is optional; the rollback
// step says how the swap ends when it fails and creates the old config
// after every attempt in use; the name ends with exactly one running
// container (the new one only when rolled forward) and no new container
// left behind otherwise.
func checkRecoveryPlan(t *testing.T, j *journaled, runtime []*runtimeapi.Container, p recoveryPlan) {
	t.Helper()
	did := checkRecoverySteps(t, p.steps)
	if did[actRollback] {
		checkRollback(t, j, runtime, p)
	}
	committed := p.end.state == inplacedv1.SwapState_SWAP_STATE_COMMITTED
	if p.newID != "" && !committed && !did[actRemoveNew] && !did[actRollback] {
		t.Errorf("the new container %s is left behind", p.newID)
	}
	if committed != (p.end.running == "new") {
		t.Errorf("ends %s with %q running", p.end.state, p.end.running)
	}
	for _, c := range runtime {
		if !p.end.rolledBack && c.Id == p.end.running && c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("ends with %s running, which is %s", c.Id, c.State)
		}
	}
}

// checkRecoverySteps checks each step of a recovery plan and returns the
// actions taken.
func checkRecoverySteps(t *testing.T, steps []step) map[action]bool {
	t.Helper()
	did := map[action]bool{}
	for _, s := range steps {
		did[s.do] = true
		if actions[s.do] == nil {
			t.Errorf("action %q has no code", s.do)
		}
		if s.name != "" || s.journal != "" {
			t.Errorf("step %q (journal %q) is shown or journaled: a recovery settles the journal, it does not add to it", s.name, s.journal)
		}
		bookkeeping := s.do == actRecordNew || s.do == actCommit || s.do == actCommitRevert
		if s.optional != bookkeeping {
			t.Errorf("step %q optional %v, want %v", s.do, s.optional, bookkeeping)
		}
	}
	return did
}

// checkRollback: a rollback that fails ends ROLLBACK_FAILED with its
// error, and the container it creates takes an attempt no container of the
// name has used, nor the swap's new one.
func checkRollback(t *testing.T, j *journaled, runtime []*runtimeapi.Container, p recoveryPlan) {
	t.Helper()
	if p.failed.state != inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED || !strings.Contains(p.failed.msg, "%v") {
		t.Errorf("a rollback that fails ends %s (%q), want ROLLBACK_FAILED with the error", p.failed.state, p.failed.msg)
	}
	after := p.after.GetMetadata().GetAttempt()
	if j.NewAttempt > after {
		t.Errorf("the rollback creates after attempt %d, the swap's new container has %d", after, j.NewAttempt)
	}
	for _, c := range runtime {
		if a := c.GetMetadata().GetAttempt(); a > after {
			t.Errorf("the rollback creates after attempt %d; %s has %d", after, c.Id, a)
		}
	}
}

// The runtime cannot be asked: nothing is settled and the entry stays for
// the next attempt, but a hold left by the crash goes at once.
func TestPlanRecoveryRuntimeDown(t *testing.T) {
	down := errors.New("list containers: connection refused")
	for _, hold := range []bool{false, true} {
		p := planRecovery(crashEntry(KindSwap, store.StepStopOld, true, hold), runtimeView{err: down})
		want := ""
		if hold {
			want = actionList(actClearHold)
		}
		if got := summarizePlan(p, ""); p.err != down || got.steps != want || got.state != 0 {
			t.Errorf("hold %v: %s, err %v; want [%s] and the runtime's error", hold, got, p.err, want)
		}
	}
}

// Containers of the swap's name are recognized by kubelet's label too, and
// the newest running one is what runs.
func TestPlanRecoveryNewestRunning(t *testing.T) {
	labelled := crashCtr("rollback", "", 2, 3, runtimeapi.ContainerState_CONTAINER_RUNNING)
	labelled.Labels = map[string]string{LabelContainerName: "app"}
	p := planRecovery(crashEntry(KindSwap, store.StepRollingBack, true, false),
		runtimeView{containers: []*runtimeapi.Container{oldRuns, labelled, newExited, sidecar}})
	want := settled{steps: actionList(actRemoveNew), state: inplacedv1.SwapState_SWAP_STATE_FAILED, running: "rollback", msg: msgStillRuns}
	if got := summarizePlan(p, ""); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
